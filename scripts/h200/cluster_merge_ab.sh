#!/usr/bin/env bash
# The tree-attention kernel's KV-split merge inside its cluster (tree_attention.mosaic_gpu.CLUSTER_MERGE) against
# XLA's merge kernel: the GPU test of the cluster form (thirty calls, plain and packed), then the fast decode loop
# (our kernels, as fast_decode_loop) without and with --cluster-merge, twice, alternating, on one machine (any Hopper:
# the numbers compare within the call). Device tool, carry .whl. Written as it goes: $OUT/cluster_merge_ab.log (the
# test, then every bench's fast_decode_loop row and its log tail) and
# $OUT/ab_<n>_<form>.md (eight files a call at most).
# Usage (repo root): SPECPILOT_COMMIT=<hash> bash scripts/h200/cluster_merge_ab.sh [BUDGET_S a bench (default 100)]
set -u
log=$OUT/cluster_merge_ab.log
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $log
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >> $log 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
budget=${1:-100}
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_tree_attention.py -k cluster >> $log 2>&1
echo "pytest rc=$?" >> $log
bench() {  # bench NAME [bench_roofline flags]
  local name=$1
  shift
  timeout $((budget + 20)) python3 scripts/bench_roofline.py --out /tmp/$name --variants fast_decode_loop \
    --timeout-scale 2 --budget-s "$budget" "$@" > /tmp/$name.log 2>&1
  cp /tmp/$name/roofline.md $OUT/$name.md 2>/dev/null
  echo "== $name" >> $log
  grep -E "^\| fast_decode_loop" /tmp/$name/roofline.md >> $log 2>/dev/null || tail -n 15 /tmp/$name.log >> $log
}
for n in 1 2; do
  bench ab_${n}_xla
  bench ab_${n}_cluster --cluster-merge
done
cat $log
