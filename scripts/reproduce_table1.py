"""Table 1: single-request speedup over AR of stock DFlash, DDTree and the best SpecPilot configuration,
per deployment, regenerated from fresh runs on this device.

    python scripts/reproduce_table1.py --out OUT                       # CPU: oracle pair (measured) + tiny (projected)
    python3 scripts/reproduce_table1.py --out $OUT --tau-profile tau_profile.json --no-real   # GPU: qwen3_8b, projected

Real pairs give MEASURED speedups (wall time, same prompts and tokens as AR); synthetic shapes give
PROJECTED ones (measured step times × a real pair's τ). Writes OUT/table1.md and OUT/table1.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot.argtypes import positive_int  # noqa: E402
from specpilot.costmodel import reproduce as R  # noqa: E402


def main(argv=None) -> int:
    ap = R.base_parser(__doc__, batches=[1])
    ap.add_argument("--ddtree-budget", type=positive_int, default=64,
                    help="DDTree's budget in this table (its default)")
    args = ap.parse_args(argv)
    args.batches = [1]
    configs = [{"name": "stock"}, {"name": "ddtree", "tree_budget": args.ddtree_budget}, *R.specpilot_configs(args)]
    res = R.run(args, configs, "reproduce_table1")
    lines = R.header(res, "Table 1 — single-request speedup over autoregressive decoding")
    rows = []
    for d in res["deployments"]:
        es = [e for e in res["entries"] if e["deployment"] == d["name"] and e["batch"] == 1]
        ar = next((e for e in es if e["label"] == "ar"), None)
        ar_ms = ar["ms_per_token"] if ar else next((e["t_ar_ms"] for e in es), None)
        sp = R.best(es, R.is_specpilot_config)
        rows.append([d["name"], d["kind"].upper(), res["provenance"]["device"],
                     f"{ar_ms:.3f}" if ar_ms else "–",
                     R.fmt_speedup(R.best(es, R.label_is("stock"))), R.fmt_speedup(R.best(es, R.label_is("ddtree"))),
                     sp["label"] if sp else "–", R.fmt_speedup(sp)])
    from specpilot.costmodel.report import md_table

    lines += [md_table(["deployment", "kind", "device", "AR ms/token", "stock", f"DDTree (budget {args.ddtree_budget})",
                        "best SpecPilot config", "its speedup"], rows), ""]
    lines += ["All configurations measured (speedup over AR at batch 1):", ""]
    lines += R.configurations_table(res)
    R.save(res, Path(args.out), "table1", "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
