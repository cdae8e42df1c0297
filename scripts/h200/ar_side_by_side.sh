#!/usr/bin/env bash
# Issue #8's AR row on one H200 (device tool, no carry): our fastest bf16 AR step beside plain XLA's decode loop and
# PyTorch with CUDA graphs, back to back on one machine start. Two bench_roofline runs, because its kernel flags
# (--matmul, --norm, --rope, --ar-attention) set every JAX job's ops: run together, its `xla_decode_loop` row ran our
# kernels too (docs/results/2026-12-06-ar-side-by-side-h100/ measured our step twice). First plain XLA and PyTorch
# with no kernel flag, then our step. Refuses any other GPU first (exit 3: give the machine back and draw again).
# Written as it goes: $OUT/device.txt, $OUT/{plain,ours}.log, $OUT/{plain,ours}_roofline.{md,json}.
# Usage (repo root): SPECPILOT_COMMIT=<hash> bash scripts/h200/ar_side_by_side.sh [BUDGET_S (default 375)]
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt | grep -q H200 || exit 3
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
budget=${1:-375}
plain=$((budget * 2 / 3))
timeout $((plain + 10)) python3 scripts/bench_roofline.py --out /tmp/side_plain \
  --variants xla_decode_loop torch_peer_cudagraphs --timeout-scale 2 --budget-s "$plain" > $OUT/plain.log 2>&1
timeout $((budget - plain + 10)) python3 scripts/bench_roofline.py --out /tmp/side_ours \
  --variants rope_decode_loop --matmul mosaic_gpu --norm mosaic_gpu --rope mosaic_gpu --ar-attention pallas_tree \
  --timeout-scale 2 --budget-s "$((budget - plain))" > $OUT/ours.log 2>&1
for run in plain ours; do
  cp /tmp/side_$run/roofline.md $OUT/${run}_roofline.md 2>/dev/null
  cp /tmp/side_$run/roofline.json $OUT/${run}_roofline.json 2>/dev/null
done
grep -hE "^\| (xla_decode_loop|rope_decode_loop|torch_peer)" $OUT/plain_roofline.md $OUT/ours_roofline.md \
  || tail -n 20 $OUT/plain.log $OUT/ours.log
