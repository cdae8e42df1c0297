#!/usr/bin/env bash
# Issue #8's AR and 64-node verify rows on one H200 with the q|k|v projection's norm + rope epilogue (device tool, no
# carry). Refuses any other GPU first (exit 3: give the machine back and draw again; on H100s the same A/B ran as
# fusion_ab.sh at d8080f3, docs/results/2026-12-06-fusion-ab-h100/). In order:
# 1. ar_side_by_side.sh's run: plain XLA, ours (fast_decode_loop: hopper.yaml's kernels) and PyTorch with CUDA graphs;
# 2. ROUNDS rounds of our step without and with the epilogue (rope_decode_loop with hopper.yaml's kernels named flag
#    by flag, --qkv-rope-matmul mosaic_gpu in the second form), the order reversed every other round;
# 3. the 64-token verify on the same kernels, so its ratio to the AR step is of one machine.
# Written as it goes: $OUT/device.txt, $OUT/ar_row.log (every bench's rows or its log tail), $OUT/side_by_side.md and
# .json, $OUT/<bench>.md of round 1 and of the verify (eight files a call at most). Ran in the forty-fifth session
# (docs/results/2026-12-06-ar-row-h200/): the epilogue lost on the H200, and hopper.yaml has dropped it since.
# Usage (repo root): SPECPILOT_COMMIT=<hash> bash scripts/h200/ar_row.sh [ROUNDS (default 2)]
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt | grep -q H200 || exit 3
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
log=$OUT/ar_row.log
rounds=${1:-2}
timeout 260 python3 scripts/bench_roofline.py --out /tmp/side_by_side \
  --variants xla_decode_loop fast_decode_loop torch_peer_cudagraphs --timeout-scale 2 --budget-s 250 \
  > /tmp/side_by_side.log 2>&1
cp /tmp/side_by_side/roofline.md $OUT/side_by_side.md 2>/dev/null
cp /tmp/side_by_side/roofline.json $OUT/side_by_side.json 2>/dev/null
echo "== side by side" > $log
grep -E "^\| (xla_decode_loop|fast_decode_loop|torch_peer)" $OUT/side_by_side.md >> $log \
  || tail -n 20 /tmp/side_by_side.log >> $log
kernels=(--matmul mosaic_gpu --norm mosaic_gpu --rope mosaic_gpu --swiglu-matmul mosaic_gpu)
bench() {  # bench NAME ROW [bench_roofline flags]
  local name=$1 row=$2
  shift 2
  timeout 150 python3 scripts/bench_roofline.py --out /tmp/$name --timeout-scale 2 --budget-s 100 "$@" \
    > /tmp/$name.log 2>&1
  case $name in ab_1_* | verify*) cp /tmp/$name/roofline.md $OUT/$name.md 2>/dev/null ;; esac
  echo "== $name: $*" >> $log
  grep -E "^\| $row \|" /tmp/$name/roofline.md >> $log 2>/dev/null || tail -n 15 /tmp/$name.log >> $log
}
for n in $(seq 1 "$rounds"); do
  order=(unfused fused)
  if [ $((n % 2)) -eq 0 ]; then order=(fused unfused); fi
  for form in "${order[@]}"; do
    case $form in
      unfused) bench ab_${n}_unfused rope_decode_loop --variants rope_decode_loop --ar-attention pallas_tree \
                 "${kernels[@]}" ;;
      fused) bench ab_${n}_fused rope_decode_loop --variants rope_decode_loop --ar-attention pallas_tree \
               "${kernels[@]}" --qkv-rope-matmul mosaic_gpu ;;
    esac
  done
done
bench verify64 verify_loop@64 --variants verify_loop --verify-attention pallas_tree --nodes 64 "${kernels[@]}" \
  --qkv-rope-matmul mosaic_gpu
cat $log
