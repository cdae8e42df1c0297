#!/usr/bin/env bash
# The three reproduction scripts on one H200 for qwen3_8b shapes (PROJECTED speedups, τ from the oracle pair
# measured on the H200), then the tree-attention kernel bench. Same packing as costmodel.sh: results under
# /tmp/r, packed into $OUT/r.tgz every 30 s and at the end. `--gpu-time` (since the fifty-first session): each projected
# row also projected on the profiled stages' CUPTI kernel time, which the host does not enter.
# Usage: SPECPILOT_COMMIT=<hash> bash scripts/h200/reproduce.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R; TAU=docs/results/2026-11-30-reproduce-h200/tau_profile.json
pack() { tar czf /tmp/r.tgz -C $R . && cp /tmp/r.tgz "$OUT/r.tgz.part" && mv "$OUT/r.tgz.part" "$OUT/r.tgz"; }
(while true; do sleep 30; pack; done) &
step() {  # step NAME SECONDS CMD...
  local name=$1 secs=$2; shift 2
  echo "== $name ($(date +%T))" | tee -a $R/log.txt
  timeout "$secs" "$@" >> $R/$name.log 2>&1; echo "   rc $?" | tee -a $R/log.txt
}
common="--no-real --tau-profile $TAU --compile-workers 4 --specpilot-candidates 64 256 --gpu-time"
step table1 90 python3 scripts/reproduce_table1.py --out $R/table1 --budget-s 70 $common
step table2 110 python3 scripts/reproduce_table2.py --out $R/table2 --batches 8 --budget-s 85 $common
step ddtree_comparison 90 python3 scripts/reproduce_ddtree_comparison.py --out $R/ddtree_comparison \
  --ddtree-budgets 16 64 128 256 --budget-s 70 $common
step tree_attention 90 python3 -m pallas_kernels.tree_attention.bench --out $R/tree_attention.json
pack; tail -n 3 $R/*.log
