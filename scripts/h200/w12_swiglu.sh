#!/usr/bin/env bash
# The W12 gate|up with SwiGLU in its epilogue (`w12.mosaic_gpu.w12_swiglu_matmul`) on any Hopper (device tool, carry
# `.whl`; the card is named in $OUT/device.txt, and its numbers compare only within the call):
# 1. (TESTS=1, the default) its GPU tests and the bf16 kernel's, whose epilogue it shares
#    (tests/test_swiglu_matmul.py -m gpu);
# 2. the W12 decode loop with the fused kernel and with gate|up and SwiGLU as two kernels (--w12-swiglu-ab), beside
#    the bf16 loop, in one process, on hopper.yaml's kernels, each step's kernels split (--kernel-split); with command
#    buffers over the loop as w12_loop.sh (`graphs`, the default) or with XLA's default ones (`plain`).
#    XLA's command buffer conversion logs what it converts and what it refuses (TF_CPP_VMODULE) into the W12 job's
#    log: which thunk, if any, keeps a loop out of one graph.
# Written: $OUT/device.txt, $OUT/tests.log, $OUT/roofline.md and .json, $OUT/logs.tgz, $OUT/conversion.txt.
# Usage (repo root): SPECPILOT_COMMIT=<hash> [TESTS=0] bash scripts/h200/w12_swiglu.sh [graphs|plain]
set -u
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit 1
if [ "${TESTS:-1}" = 1 ]; then
  timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_swiglu_matmul.py > $OUT/tests.log 2>&1
  tail -n 3 $OUT/tests.log
fi
graphs="--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL --xla_gpu_graph_min_graph_size=1"
if [ "${1:-graphs}" = plain ]; then graphs=""; fi  # no XLA_FLAGS added
export TF_CPP_VMODULE=command_buffer_conversion_pass=2,command_buffer_scheduling=2 TF_CPP_MIN_LOG_LEVEL=0
timeout 400 python3 scripts/bench_roofline.py --out /tmp/w --variants w12_kernel_decode_loop --w12-swiglu-ab \
  --matmul mosaic_gpu --norm mosaic_gpu --rope mosaic_gpu --swiglu-matmul mosaic_gpu --qkv-rope-matmul mosaic_gpu \
  --ar-attention pallas_tree --w12-xla-flags "$graphs" --kernel-split --timeout-scale 3 --budget-s 380 \
  > /tmp/w12_swiglu.log 2>&1
cp /tmp/w/roofline.md /tmp/w/roofline.json $OUT/ 2>/dev/null; tar czf $OUT/logs.tgz -C /tmp/w logs 2>/dev/null
grep -ihE "unsupported|convertible|command.?buffer" /tmp/w/logs/w12.log \
  | sed -E 's/^[IWE][0-9]{4} [0-9:.]+ +[0-9]+ //' | cut -c1-300 | sort | uniq -c | sort -rn | head -n 40 \
  > $OUT/conversion.txt
grep -E "^\| w12_kernel_decode_loop" $OUT/roofline.md || tail -n 20 /tmp/w12_swiglu.log
