#!/usr/bin/env bash
# The q|k|v projection with its q/k norm + rope in the epilogue (--qkv-rope-matmul mosaic_gpu) against the skinny
# kernel + the rope kernel it replaces, in the AR step, on one machine (any Hopper: the numbers compare within the
# call). First the kernel's GPU tests, then the fast decode loop (fast_decode_loop) without it and with it in three
# configs (TILE_K STEPS SPLITS), ROUNDS rounds, the order reversed every other round. (The forty-first session's first
# call timed the tree-attention cluster merge here too: no gain, docs/results/2026-12-06-fusion-ab-h100/.)
# Device tool, carry .whl. Written as it goes: $OUT/fusion_ab.log (the tests, every bench's flags and
# fast_decode_loop row, or its log tail) and the first round's tables $OUT/ab_1_<form>.md (eight files a call at most).
# Usage (repo root): SPECPILOT_COMMIT=<hash> bash scripts/h200/fusion_ab.sh [ROUNDS (default 2)]
set -u
log=$OUT/fusion_ab.log
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $log
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >> $log 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
rounds=${1:-2}
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_qkv_rope_matmul.py >> $log 2>&1
echo "pytest qkv rope rc=$?" >> $log
bench() {  # bench NAME [bench_roofline flags]
  local name=$1
  shift
  timeout 150 python3 scripts/bench_roofline.py --out /tmp/$name --variants fast_decode_loop --timeout-scale 2 \
    --budget-s 100 "$@" > /tmp/$name.log 2>&1
  case $name in ab_1_*) cp /tmp/$name/roofline.md $OUT/$name.md 2>/dev/null ;; esac
  echo "== $name: $*" >> $log
  grep -E "^\| fast_decode_loop \|" /tmp/$name/roofline.md >> $log 2>/dev/null || tail -n 15 /tmp/$name.log >> $log
}
forms=(xla k128s2 k64s4 split2)
for n in $(seq 1 "$rounds"); do
  order=("${forms[@]}")
  if [ $((n % 2)) -eq 0 ]; then order=(split2 k64s4 k128s2 xla); fi
  for form in "${order[@]}"; do
    case $form in
      xla) bench ab_${n}_xla ;;
      k128s2) bench ab_${n}_k128s2 --qkv-rope-matmul mosaic_gpu --qkv-rope-matmul-config 128 2 4 ;;
      k64s4) bench ab_${n}_k64s4 --qkv-rope-matmul mosaic_gpu --qkv-rope-matmul-config 64 4 4 ;;
      split2) bench ab_${n}_split2 --qkv-rope-matmul mosaic_gpu --qkv-rope-matmul-config 128 3 2 ;;
    esac
  done
done
cat $log
