#!/usr/bin/env bash
# The W12 default's automatic split at one block an SM (490eb0d; timed on H100s only) against the previous two blocks
# an SM spelled out, on one H200 (device tool, `carry: [".whl"]`; check that the reply's device is an H200): the three
# Qwen3-8B layer shapes at M = 1 and 16 beside the bf16 kernels, each shape in one process. If the default is slower
# anywhere, set `DEFAULT_CONFIG.blocks_per_sm` back to 2. Written as it goes: $OUT/probe.txt.
# Usage (repo root): bash scripts/h200/w12_split_check.sh
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/probe.txt
OLD=decode=registers,blocks_per_sm=2,max_concurrent_steps=2,tile_k=256,escapes_in_kernel=True
for s in "4096 12288 3" "12288 4096 2" "4096 6144 5"; do set -- $s
  echo "== K=$1 N=$2" >> $OUT/probe.txt
  timeout 120 python3 scripts/h200/w12_probe.py --k $1 --n $2 --m 1 16 --copies $3 --bf16 \
    --config default $OLD >> $OUT/probe.txt 2>&1
done
cat $OUT/probe.txt
