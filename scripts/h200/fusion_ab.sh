#!/usr/bin/env bash
# The AR step's two cluster fusions against the kernels they replace, on one machine (any Hopper: the numbers compare
# within the call): the tree-attention kernel's KV-split merge inside its cluster (--cluster-merge, against XLA's
# merge kernel) and the q|k|v projection with its q/k norm + rope in the epilogue (--qkv-rope-matmul mosaic_gpu,
# against the skinny kernel + the rope kernel). First the GPU tests of both kernels, then the fast decode loop
# (fast_decode_loop) in four forms (neither, each, both), ROUNDS rounds, the order reversed every other round.
# Device tool, carry .whl. Written as it goes: $OUT/fusion_ab.log (the tests, every bench's command and
# fast_decode_loop row, or its log tail) and the first round's tables $OUT/ab_1_<form>.md (eight files a call at most).
# Usage (repo root): SPECPILOT_COMMIT=<hash> bash scripts/h200/fusion_ab.sh [ROUNDS (default 2)]
set -u
log=$OUT/fusion_ab.log
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $log
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >> $log 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
rounds=${1:-2}
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_tree_attention.py -k cluster >> $log 2>&1
echo "pytest tree attention rc=$?" >> $log
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_qkv_rope_matmul.py >> $log 2>&1
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
forms=(xla cluster qkv both)
for n in $(seq 1 "$rounds"); do
  order=("${forms[@]}")
  if [ $((n % 2)) -eq 0 ]; then order=(both qkv cluster xla); fi
  for form in "${order[@]}"; do
    case $form in
      xla) bench ab_${n}_xla ;;
      cluster) bench ab_${n}_cluster --cluster-merge ;;
      qkv) bench ab_${n}_qkv --qkv-rope-matmul mosaic_gpu ;;
      both) bench ab_${n}_both --cluster-merge --qkv-rope-matmul mosaic_gpu ;;
    esac
  done
done
cat $log
