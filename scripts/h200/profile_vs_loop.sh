#!/usr/bin/env bash
# The cost model's open question: why a round profiled stage by stage takes 1.33-1.64x the fused loop's step on the
# 36-layer proxy at batch 8 (H200, docs/results/2026-12-07-profile-vs-loop-h200/: 272 s for three engines before the
# round columns). scripts/profile_vs_loop.py on the proxy's shapes (random weights, f32 at the highest matmul
# precision as batched_order.sh runs them): per engine, the profiled round and its CUPTI kernel time beside the
# loop's step and its kernel time, the round as one program on the same and on fresh buffers, the profile and the
# round again in the loop's layouts, the per-kernel tables (in the JSON) and each stage's kernels inside the loop
# (specpilot/costmodel/attribution.py). Any Hopper (the numbers compare within the call). All three engines took 415 s
# on an H100 before the per-stage loop kernels were added: run `ar stock`, then `ddtree@64`. No carry. Writes
# $OUT/device.txt, $OUT/pvl.log, $OUT/profile_vs_loop.md / .json.
# Usage (repo root): SPECPILOT_COMMIT=<hash> bash scripts/h200/profile_vs_loop.sh [ENGINE ...]  (default: ar stock
# ddtree@64)
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 JAX_DEFAULT_MATMUL_PRECISION=highest JAX_COMPILATION_CACHE_DIR=/tmp/jc
engines=${*:-ar stock ddtree@64}
timeout 570 python3 scripts/profile_vs_loop.py --out /tmp/pvl --batch 8 --engines $engines > $OUT/pvl.log 2>&1
echo "rc $? at $SECONDS s" >> $OUT/pvl.log
cp /tmp/pvl/profile_vs_loop.md /tmp/pvl/profile_vs_loop.json $OUT/ 2> /dev/null
grep -E "^(ar|stock|ddtree|specpilot)|^rc" $OUT/pvl.log
