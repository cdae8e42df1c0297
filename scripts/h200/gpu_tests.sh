#!/usr/bin/env bash
# Every GPU-only test (`-m gpu`: the kernels against their references on the real hardware, the engines on our
# kernels) in one call, spread test by test over WORKERS pytest processes (pytest-xdist, from `make wheels`; the GPU
# tests share no module fixtures, so nothing is built twice). One process ran 78 of the 172 in 520 s on a cold H100,
# most of it compiling (docs/results/2026-12-08-gpu-tests-partial-h100/); the machine has 16 host cores, so 4 workers
# share the compiling, and none preallocates GPU memory. Pass test files to run only those. Writes $OUT/device.txt
# and $OUT/gpu_tests.log (failures, skips with their reasons, the slowest tests).
# Device tool: carry [".whl"]. Usage (repo root): [WORKERS=4] [LIMIT=560] bash scripts/h200/gpu_tests.sh [FILE ...]
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false || exit 1
timeout ${LIMIT:-560} python3 -m pytest -q -m gpu -p no:cacheprovider -n ${WORKERS:-4} --dist load -rfEs \
  --durations=15 "${@:-tests}" > $OUT/gpu_tests.log 2>&1
echo "rc $? at $SECONDS s" >> $OUT/gpu_tests.log
grep -E " in [0-9.]+s|^FAILED|^ERROR|^rc " $OUT/gpu_tests.log | tail -n 40
