"""DDTree at its best tree budget against SpecPilot's best configuration, per deployment, regenerated
from fresh runs on this device: every DDTree budget's speedup over AR, the best one, and SpecPilot's.

    python scripts/reproduce_ddtree_comparison.py --out OUT            # CPU: oracle pair (measured) + tiny (projected)
    python3 scripts/reproduce_ddtree_comparison.py --out $OUT --tau-profile tau_profile.json --no-real   # GPU

Real pairs give MEASURED speedups; synthetic shapes PROJECTED ones (labelled). Writes
OUT/ddtree_comparison.md and OUT/ddtree_comparison.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot.argtypes import positive_int  # noqa: E402
from specpilot.costmodel import reproduce as R  # noqa: E402


def main(argv=None) -> int:
    ap = R.base_parser(__doc__, batches=[1])
    ap.add_argument("--ddtree-budgets", nargs="+", type=positive_int, default=[4, 16, 64, 256])
    args = ap.parse_args(argv)
    configs = [{"name": "ddtree", "tree_budget": n} for n in args.ddtree_budgets] + R.specpilot_configs(args)
    res = R.run(args, configs, "reproduce_ddtree_comparison")
    lines = R.header(res, "DDTree at its best budget vs SpecPilot")
    rows = []
    for d, b, es in R.groups(res, args.batches):
        per_budget = {e["engine_cfg"]["tree_budget"]: e for e in es if e["engine_cfg"]["name"] == "ddtree"}
        dd = R.best(es, R.label_is("ddtree"))
        sp = R.best(es, R.is_specpilot_config)
        ratio = f"{sp['speedup'] / dd['speedup']:.2f}×" if dd and sp else "–"
        rows.append([d["name"], d["kind"].upper(), b,
                     *[f"{per_budget[n]['speedup']:.2f}×" if n in per_budget else "–"
                       for n in args.ddtree_budgets],
                     f"{dd['engine_cfg']['tree_budget']}: {R.fmt_speedup(dd)}" if dd else "–",
                     f"{sp['label']}: {R.fmt_speedup(sp)}" if sp else "–", ratio])
    from specpilot.costmodel.report import md_table

    lines += [md_table(["deployment", "kind", "batch", *[f"DDTree@{n}" for n in args.ddtree_budgets],
                        "DDTree best budget", "SpecPilot best", "SpecPilot ÷ best DDTree"], rows), ""]
    R.save(res, Path(args.out), "ddtree_comparison", "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
