#!/usr/bin/env bash
# Issue #4 on one H200 (device tool, `carry: [".whl"]` for pytest — `make wheels`): the GPU-only kernel tests
# (tree attention, W12 matmul, the skinny bf16 matmul, the int8 level-1 matmul, the cudnn / pallas_tree attention choices in the
# model), then the kernel benchmarks, each case isolated with a time limit. Results: $OUT/kernels.json, $OUT/kernels.md, $OUT/log.txt.
# Usage (repo root): SPECPILOT_COMMIT=<hash> bash scripts/h200/kernels.sh [--sweep]
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit 1
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_tree_attention.py tests/test_w12_matmul.py tests/test_quant_matmul.py tests/test_skinny_matmul.py tests/test_add_rms_norm.py tests/test_pdl.py \
  tests/test_attention_choice.py 2>&1 | tail -n 15 | tee $OUT/log.txt
timeout 330 python3 scripts/bench_kernels.py --out /tmp/k --total-time-limit 310 "$@" >> $OUT/log.txt 2>&1
echo "bench rc $?" | tee -a $OUT/log.txt
cp /tmp/k/kernels_bench.json $OUT/kernels.json; cp /tmp/k/kernels_bench.md $OUT/kernels.md; cat $OUT/kernels.md
