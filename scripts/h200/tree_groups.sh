#!/usr/bin/env bash
# The tree-attention kernel at a GQA group that needs padding (fifty-fourth session: G = 5, Qwen3-14B's 40 query
# heads over 8, runs as 8 heads a KV head, 3 of them zeros), beside Qwen3-8B's G = 4:
# 1. the GPU tests of tests/test_tree_attention.py (Qwen3-8B's and Qwen3-14B's heads against the float64 oracle);
# 2. pallas_kernels/tree_attention/bench.py at both head counts, B = 1, a 2k prefix, n = 1, 16, 64, 256, the default
#    config only: the kernel against XLA's dense-mask attention, wall and CUPTI time.
# Any Hopper, ~7-8 min on a fresh machine (its tests compile ~30 cases), carry [".whl"] (pytest: `make wheels`).
# Writes $OUT/device.txt, $OUT/tree_groups.log and the two benchmarks' JSON.
# Usage (repo root): SPECPILOT_COMMIT=<hash> bash scripts/h200/tree_groups.sh
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit 1
log=$OUT/tree_groups.log
echo "commit ${SPECPILOT_COMMIT:-unknown}" > $log
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_tree_attention.py 2>&1 | tail -n 8 >> $log
echo "tests rc ${PIPESTATUS[0]} at $SECONDS s" >> $log
for heads in "32 8 128" "40 8 128"; do
  echo "== bench --heads $heads" >> $log
  timeout 120 python3 -m pallas_kernels.tree_attention.bench --out $OUT/tree_bench_${heads// /_}.json --heads $heads \
    --batches 1 --nodes 1 16 64 256 --no-sweep --trials 20 >> $log 2>&1
  echo "rc $? at $SECONDS s" >> $log
done
grep -vE "^(W|I)[0-9]{4}" $log | tail -n 60
