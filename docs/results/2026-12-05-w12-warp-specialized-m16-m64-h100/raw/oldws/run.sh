#!/usr/bin/env bash
# One-off: 854cbfd's warp-specialised W12 form at 16 / 64 rows, kernel time without the in-kernel correction (that
# tree's correction ran in the first split only). Usage (repo root, device): bash .oldws/run.sh
set -u
export PYTHONPATH=$PWD/.oldws PYTHONUNBUFFERED=1
B=decode=registers,max_concurrent_steps=2
for s in "4096 12288 3" "12288 4096 2" "4096 24576 1" "4096 6144 5"; do set -- $s
  echo "== K=$1 N=$2" >> $OUT/ws.txt
  timeout 150 python3 .oldws/ws_probe.py $1 $2 $3 64 $B,tile_k=128,split_k=2 $B,tile_k=128,split_k=2,warp_specialized=True \
    $B,tile_k=128,split_k=4,warp_specialized=True $B,tile_k=256,split_k=2,warp_specialized=True >> $OUT/ws.txt 2>&1
  timeout 90 python3 .oldws/ws_probe.py $1 $2 $3 16 $B,blocks_per_sm=2,tile_k=256 \
    $B,blocks_per_sm=2,tile_k=256,warp_specialized=True $B,blocks_per_sm=4,tile_k=256,warp_specialized=True >> $OUT/ws.txt 2>&1
done
cat $OUT/ws.txt
