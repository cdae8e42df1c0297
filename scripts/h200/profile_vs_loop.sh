#!/usr/bin/env bash
# The cost model's open question (docs/h200_runbook.md, forty-sixth session): why AR's round profiled stage by stage
# took 1.65x its fused loop's step on the 36-layer proxy at batch 8 (H100). scripts/profile_vs_loop.py on the proxy's
# shapes (random weights, f32 at the highest matmul precision as batched_order.sh runs them): per engine, the profiled
# round and its CUPTI kernel time beside the loop's step and its kernel time. Any Hopper (the numbers compare within
# the call). No carry. Writes $OUT/device.txt, $OUT/pvl.log, $OUT/profile_vs_loop.md / .json.
# Usage (repo root): SPECPILOT_COMMIT=<hash> bash scripts/h200/profile_vs_loop.sh [ENGINE ...]  (default: ar stock
# ddtree@64)
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 JAX_DEFAULT_MATMUL_PRECISION=highest JAX_COMPILATION_CACHE_DIR=/tmp/jc
engines=${*:-ar stock ddtree@64}
timeout 570 python3 scripts/profile_vs_loop.py --out /tmp/pvl --batch 8 --engines $engines > $OUT/pvl.log 2>&1
echo "rc $? at $SECONDS s" >> $OUT/pvl.log
cp /tmp/pvl/profile_vs_loop.md /tmp/pvl/profile_vs_loop.json $OUT/ 2> /dev/null
grep -E "^(ar|stock|ddtree)|^rc" $OUT/pvl.log
