#!/usr/bin/env bash
# The few-token bf16 kernel's persistent grid (`skinny_matmul.TuningConfig.persistent`) on any Hopper (device tool,
# carry `.whl`; the card is named in $OUT/device.txt, and its numbers compare only within the call):
# 1. the kernel's GPU tests, the persistent grid against one block an item bit for bit among them;
# 2. ROUNDS rounds of the 64-token verify on the kernels with and without the persistent grid (the default since the
#    forty-fifth session; --skinny-config persistent=False), the order reversed every other round, each with its
#    kernels split (--kernel-split: the skinny kernel's GPU µs a pass).
# Written: $OUT/device.txt, $OUT/persistent.log (the tests' tail, every bench's row or its log tail), $OUT/<bench>.md
# of round 1.
# Usage (repo root): SPECPILOT_COMMIT=<hash> bash scripts/h200/skinny_persistent.sh [ROUNDS (default 2)]
set -u
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit 1
log=$OUT/persistent.log
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_skinny_matmul.py > /tmp/tests.log 2>&1
echo "== tests" > $log
tail -n 5 /tmp/tests.log >> $log
verify=(--variants verify_loop --verify-attention pallas_tree --nodes 64 --kernel-split --matmul mosaic_gpu
  --norm mosaic_gpu --rope mosaic_gpu --swiglu-matmul mosaic_gpu --qkv-rope-matmul mosaic_gpu)
bench() {  # bench NAME [bench_roofline flags]
  local name=$1
  shift
  timeout 150 python3 scripts/bench_roofline.py --out /tmp/$name --timeout-scale 2 --budget-s 100 "$@" \
    > /tmp/$name.log 2>&1
  case $name in v_1_*) cp /tmp/$name/roofline.md $OUT/$name.md 2>/dev/null ;; esac
  echo "== $name: $*" >> $log
  grep -E "^\| verify_loop@64 \|" /tmp/$name/roofline.md >> $log 2>/dev/null || tail -n 15 /tmp/$name.log >> $log
  grep -E "skinny_matmul_body" /tmp/$name/roofline.md | head -n 3 >> $log 2>/dev/null
}
for n in $(seq 1 "${1:-2}"); do
  order=(grid persistent)
  if [ $((n % 2)) -eq 0 ]; then order=(persistent grid); fi
  for form in "${order[@]}"; do
    case $form in
      grid) bench v_${n}_grid "${verify[@]}" --skinny-config persistent=False ;;
      persistent) bench v_${n}_persistent "${verify[@]}" ;;
    esac
  done
done
cat $log
