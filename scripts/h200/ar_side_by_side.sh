#!/usr/bin/env bash
# Issue #8's AR row on one H200 (device tool, no carry): our fastest bf16 AR step beside plain XLA's decode loop and
# PyTorch with CUDA graphs, in one bench_roofline run with no kernel flag: `xla_decode_loop` is then plain XLA, and
# `fast_decode_loop` sets our kernels and the tree-attention kernel in its own job. (With --matmul and the like the
# XLA row ran our kernels too: docs/results/2026-12-06-ar-side-by-side-h100/ and -round-ar-h200/.) Refuses any other
# GPU first (exit 3: give the machine back and draw again). Written as it goes: $OUT/device.txt,
# $OUT/side_by_side.log, $OUT/roofline.md, $OUT/roofline.json (copied even when the run is cut short).
# Usage (repo root): SPECPILOT_COMMIT=<hash> bash scripts/h200/ar_side_by_side.sh [BUDGET_S (default 375)]
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt | grep -q H200 || exit 3
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
budget=${1:-375}
timeout $((budget + 10)) python3 scripts/bench_roofline.py --out /tmp/side_by_side \
  --variants xla_decode_loop fast_decode_loop torch_peer_cudagraphs --timeout-scale 2 --budget-s "$budget" \
  > $OUT/side_by_side.log 2>&1
cp /tmp/side_by_side/roofline.md /tmp/side_by_side/roofline.json $OUT/ 2>/dev/null
grep -E "^\| (xla_decode_loop|fast_decode_loop|torch_peer)" $OUT/roofline.md || tail -n 20 $OUT/side_by_side.log
