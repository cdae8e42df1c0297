#!/usr/bin/env bash
# Issue #8's "tree build + accept + compaction <= 3 % of the step" beside the fast verify, on one H200 (device tool,
# no carry): AR and DDTree@64 at batch 1 with every fast kernel (skinny matmul, add + norm, q/k norm + rope, tree
# attention), each stage's GPU time from CUPTI, the tree build as the defaults have it (tree.RANK_TOP_K_MAX and
# VOCAB_TOPK_CHUNKS; a RANK argument sets --tree-rank-max). Its compile took 245.6 s on the H200 before each kernel was
# lowered once a program (pallas_kernels/lowering.py) and 32.4 s after, on an H100
# (docs/results/2026-12-06-lowered-once-bench-h100/: the whole run 80 s), so the default budget is 240 s.
# Refuses any other GPU first (exit 3). Written as it goes: $OUT/device.txt, $OUT/bench.{md,json,log}.
# Usage (repo root): SPECPILOT_COMMIT=<hash> bash scripts/h200/tree_share.sh [BUDGET_S (240)] [RANK]
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt | grep -q H200 || exit 3
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
budget=${1:-240}
rank=${2:+--tree-rank-max $2}
# shellcheck disable=SC2086
timeout $((budget + 60)) python3 scripts/bench.py --out /tmp/tree_share --batches 1 --engines ar ddtree \
  --budgets 64 --calibration off --gpu-time --matmul mosaic_gpu --norm mosaic_gpu --rope mosaic_gpu \
  --attentions pallas_tree $rank --budget-s "$budget" > $OUT/bench.log 2>&1
cp /tmp/tree_share/bench.md /tmp/tree_share/bench.json $OUT/ 2>/dev/null
grep -A4 "^## GPU time per stage" $OUT/bench.md 2>/dev/null || tail -n 5 $OUT/bench.log
