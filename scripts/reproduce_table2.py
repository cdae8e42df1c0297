"""Table 2: batched speedup over AR (throughput at the same batch) of stock DFlash, DDTree and the best
SpecPilot configuration, per deployment and batch size, regenerated from fresh runs on this device.

    python scripts/reproduce_table2.py --out OUT        # CPU: oracle pair (measured) + tiny (projected), B = 4, 8
    python3 scripts/reproduce_table2.py --out $OUT --tau-profile tau_profile.json --no-real --batches 8 32   # GPU
    python3 scripts/reproduce_table2.py --out $OUT --proxy proxy_h200 --target-passthrough-layers 24 --models

The last measures a trained proxy pair (its target deepened to 36 layers) and no synthetic shapes: issue #8's batched
ordering with real acceptance (scripts/h200/batched_order.sh).

Real pairs give MEASURED speedups (wall time of the batched loop, AR at the same batch); synthetic shapes
give PROJECTED ones (measured step times × a real pair's τ). Writes OUT/table2.md and OUT/table2.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot.argtypes import positive_int  # noqa: E402
from specpilot.costmodel import reproduce as R  # noqa: E402


def main(argv=None) -> int:
    ap = R.base_parser(__doc__, batches=[4, 8])
    ap.add_argument("--ddtree-budget", type=positive_int, default=64)
    args = ap.parse_args(argv)
    configs = [{"name": "stock"}, {"name": "ddtree", "tree_budget": args.ddtree_budget}, *R.specpilot_configs(args)]
    res = R.run(args, configs, "reproduce_table2")
    lines = R.header(res, "Table 2 — batched speedup over autoregressive decoding")
    rows = []
    for d, b, es in R.groups(res, args.batches):
        sp = R.best(es, R.is_specpilot_config)
        rows.append([d["name"], d["kind"].upper(), b, R.fmt_speedup(R.best(es, R.label_is("stock"))),
                     R.fmt_speedup(R.best(es, R.label_is("ddtree"))), sp["label"] if sp else "–",
                     R.fmt_speedup(sp)])
    from specpilot.costmodel.report import md_table

    lines += [md_table(["deployment", "kind", "batch", "stock", f"DDTree (budget {args.ddtree_budget})",
                        "best SpecPilot config", "its speedup"], rows), ""]
    lines += ["All configurations:", ""]
    lines += R.configurations_table(res)
    R.save(res, Path(args.out), "table2", "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
