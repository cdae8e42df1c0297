#!/usr/bin/env bash
# Issue #8's AR row on one H200 (device tool, no carry): our fastest bf16 AR step beside plain XLA's decode loop and
# PyTorch with CUDA graphs, all three in one bench_roofline run (the issue asks for them side by side in the same run).
# Refuses any other GPU first (exit 3: give the machine back and draw again). Written as it goes: $OUT/device.txt,
# $OUT/side_by_side.log, $OUT/roofline.md, $OUT/roofline.json (copied even when the run is cut short).
# Usage (repo root): SPECPILOT_COMMIT=<hash> bash scripts/h200/ar_side_by_side.sh [BUDGET_S (default 375)]
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt | grep -q H200 || exit 3
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
budget=${1:-375}
timeout $((budget + 10)) python3 scripts/bench_roofline.py --out /tmp/side_by_side \
  --variants xla_decode_loop rope_decode_loop torch_peer_cudagraphs --matmul mosaic_gpu --norm mosaic_gpu \
  --rope mosaic_gpu --ar-attention pallas_tree --timeout-scale 2 --budget-s "$budget" > $OUT/side_by_side.log 2>&1
cp /tmp/side_by_side/roofline.md /tmp/side_by_side/roofline.json $OUT/ 2>/dev/null
grep -E "^\| (xla_decode_loop|rope_decode_loop|torch_peer)" $OUT/roofline.md || tail -n 20 $OUT/side_by_side.log
