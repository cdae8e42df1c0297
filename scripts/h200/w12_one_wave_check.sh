#!/usr/bin/env bash
# The W12 default at two blocks an SM (one wave), without early_escape_x, on one H200 (device tool,
# `carry: [".whl"]`): gate|up at 48 and 64 rows, where the new default runs one K split (the old: two), then the W12
# GPU tests. Written as it goes: $OUT/probe.txt, $OUT/tests.txt.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit 1
R=decode=registers,max_concurrent_steps=2,tile_k=256,escapes_in_kernel=True
timeout 100 python3 scripts/h200/w12_probe.py --k 4096 --n 24576 --m 64 48 --copies 1 --bf16 \
  --config default $R,blocks_per_sm=4 $R,blocks_per_sm=2,split_k=2 > $OUT/probe.txt 2>&1
cat $OUT/probe.txt
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_w12_matmul.py 2>&1 | tail -n 15 > $OUT/tests.txt
cat $OUT/tests.txt
