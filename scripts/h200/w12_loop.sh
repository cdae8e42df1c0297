#!/usr/bin/env bash
# Issue #8 on one H200 (device tool, `carry: [".whl"]`): the W12 decode loop against the best bf16 loop in the same
# process (hopper.yaml's kernels: Mosaic GPU matmuls, gate|up + SwiGLU, q|k|v + norm + rope, add + norm, q/k norm +
# rope, the tree-attention kernel as a one-node tree; command buffers over the loop), with each step's kernel split.
# Extra arguments go to bench_roofline.py (for example `--w12-config blocks_per_sm=4`). Results: $OUT/roofline.md,
# $OUT/roofline.json, $OUT/logs.tgz.
# Usage (repo root): SPECPILOT_COMMIT=<hash> bash scripts/h200/w12_loop.sh [bench_roofline.py arguments]
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit 1
timeout 560 python3 scripts/bench_roofline.py --out /tmp/w --variants w12_kernel_decode_loop --matmul mosaic_gpu \
  --norm mosaic_gpu --rope mosaic_gpu --swiglu-matmul mosaic_gpu --qkv-rope-matmul mosaic_gpu \
  --ar-attention pallas_tree \
  --w12-xla-flags "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL --xla_gpu_graph_min_graph_size=1" \
  --kernel-split --timeout-scale 5 --budget-s 540 "$@"
cp /tmp/w/roofline.md /tmp/w/roofline.json $OUT/ 2>/dev/null; tar czf $OUT/logs.tgz -C /tmp/w logs 2>/dev/null
cat $OUT/roofline.md
