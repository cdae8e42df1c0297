#!/usr/bin/env bash
# Issue #4 / #8 on one H200 (device tool, `carry: [".whl"]`): the W12 GPU tests, then the W12 kernel forms at M = 1
# and 16 on the four Qwen3-8B layer shapes and the LM head (default, the one-wave splits), and the LM head at 64 rows
# with wider channel blocks (as run on 2026-12-05 at eed339f it also timed the early x loads, since removed).
# Written as it goes: $OUT/tests.txt, $OUT/probe.txt.
# Usage (repo root): bash scripts/h200/w12_m1_forms.sh
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit 1
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_w12_matmul.py 2>&1 | tail -n 15 > $OUT/tests.txt
cat $OUT/tests.txt
R=decode=registers,blocks_per_sm=4,max_concurrent_steps=2,tile_k=256,escapes_in_kernel=True
for s in "4096 24576 1 1" "12288 4096 2 6" "4096 12288 3 2" "4096 6144 5 4"; do set -- $s
  echo "== K=$1 N=$2" >> $OUT/probe.txt
  timeout 100 python3 scripts/h200/w12_probe.py --k $1 --n $2 --m 1 16 --copies $3 --bf16 \
    --config default $R,split_k=$4 >> $OUT/probe.txt 2>&1
done
echo "== LM head" >> $OUT/probe.txt
timeout 100 python3 scripts/h200/w12_probe.py --k 4096 --n 151936 --m 1 16 --copies 1 --bf16 \
  --config default >> $OUT/probe.txt 2>&1
timeout 100 python3 scripts/h200/w12_probe.py --k 4096 --n 151936 --m 64 --copies 1 --bf16 \
  --config default $R,tile_k=128,tile_n=128 >> $OUT/probe.txt 2>&1
cat $OUT/probe.txt
