#!/usr/bin/env bash
# Issue #4's W12 must-show table on one H200 (device tool, `carry: [".whl"]`), every number from one process a shape:
# first gate|up at 64 / 48 rows with the default (two K splits at a wide activation tile, WIDE_TILE_BLOCKS_PER_SM)
# against one split and against a 256-wide step, then the default W12 kernel against the skinny bf16 kernel and XLA's
# dot on the four Qwen3-8B layer shapes and the LM head at M = 1, 16, 64, then the W12 GPU tests.
# Written as it goes: $OUT/probe.txt, $OUT/tests.txt.
# Usage (repo root): bash scripts/h200/w12_table.sh
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit 1
R=decode=registers,blocks_per_sm=2,max_concurrent_steps=2,escapes_in_kernel=True
echo "== gate|up split" >> $OUT/probe.txt
timeout 90 python3 scripts/h200/w12_probe.py --k 4096 --n 24576 --m 64 48 --copies 1 \
  --config default $R,tile_k=128,split_k=1 $R,tile_k=256,split_k=2 >> $OUT/probe.txt 2>&1
for s in "4096 12288 3" "12288 4096 2" "4096 6144 5" "4096 151936 1"; do set -- $s
  echo "== K=$1 N=$2" >> $OUT/probe.txt
  timeout 120 python3 scripts/h200/w12_probe.py --k $1 --n $2 --m 1 16 64 --copies $3 --bf16 \
    --config default >> $OUT/probe.txt 2>&1
done
cat $OUT/probe.txt
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_w12_matmul.py 2>&1 | tail -n 15 > $OUT/tests.txt
cat $OUT/tests.txt
