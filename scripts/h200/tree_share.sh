#!/usr/bin/env bash
# Issue #8's "tree build + accept + compaction <= 3 % of the step" beside the fast verify, on one H200 (device tool,
# no carry): AR and DDTree@64 at batch 1 with every fast kernel (skinny matmul, add + norm, q/k norm + rope,
# tree attention), each stage's GPU time from CUPTI, once per tree.RANK_TOP_K_MAX in RANKS (default "0 1024": the
# small top-k's sorted, then counted). The runs share a compile cache, so the second compiles only its tree stage.
# Refuses any other GPU first (exit 3). Written as it goes: $OUT/device.txt, $OUT/bench_rank<N>.{md,json,log}.
# Usage (repo root): SPECPILOT_COMMIT=<hash> bash scripts/h200/tree_share.sh [RANKS] [BUDGET_S per run (240)]
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt | grep -q H200 || exit 3
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
budget=${2:-240}
for rank in ${1:-0 1024}; do
  timeout $((budget + 60)) python3 scripts/bench.py --out /tmp/tree_share_$rank --batches 1 --engines ar ddtree \
    --budgets 64 --calibration off --gpu-time --matmul mosaic_gpu --norm mosaic_gpu --rope mosaic_gpu \
    --attentions pallas_tree --tree-rank-max "$rank" --compile-cache /tmp/tree_share_cache --budget-s "$budget" \
    > $OUT/bench_rank$rank.log 2>&1
  cp /tmp/tree_share_$rank/bench.md $OUT/bench_rank$rank.md 2>/dev/null
  cp /tmp/tree_share_$rank/bench.json $OUT/bench_rank$rank.json 2>/dev/null
  grep -A4 "^## GPU time per stage" $OUT/bench_rank$rank.md 2>/dev/null || tail -n 5 $OUT/bench_rank$rank.log
done
