#!/usr/bin/env bash
# The W12 kernel's machine code and where its warps stall, per SASS instruction (issue #4: why the register decode
# streams ~2.7-3.2 TB/s of stored bytes where the bf16 kernel streams ~4). One process per config; each writes
#   $OUT/<name>.dump.tgz     Mosaic GPU's PTX / SASS / ptxas report (MOSAIC_GPU_DUMP_*)
#   $OUT/<name>.source.csv   Nsight Compute's source page: each SASS instruction with its stall samples
#   $OUT/<name>.details.txt  Nsight Compute's sections (speed of light, warp states, instruction mix, scheduler),
#                            then the profiled run's last log lines
# Usage (repo root, on the H200): OUT=... bash scripts/h200/w12_sass_profile.sh NAME=CONFIG [NAME=CONFIG ...]
# with CONFIG as w12_probe.py's --config (TuningConfig fields, k=v,k=v). Shape: K=... N=... (default down, 12288x4096), M = 1.
set -u
K=${K:-12288} N=${N:-4096}  # the weight shape: down by default
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$PWD
for spec in "$@"; do
  name=${spec%%=*}
  config=${spec#*=}
  dump=/tmp/dump_$name
  mkdir -p "$dump"
  MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_SASS=1 MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_TO=$dump \
    timeout 120 python3 scripts/h200/w12_probe.py --k $K --n $N --m 1 --plain --config "$config" \
    > "$dump/probe.log" 2>&1
  # the PTX, assembled here too, in case the dump holds no SASS
  for ptx in "$dump"/*.ptx; do
    [ -e "$ptx" ] || continue
    ptxas -arch=sm_90a "$ptx" -o "${ptx%.ptx}.cubin" 2> "${ptx%.ptx}.ptxas.txt" \
      && cuobjdump -sass "${ptx%.ptx}.cubin" > "${ptx%.ptx}.sass" 2>&1
  done
  tar czf "$OUT/$name.dump.tgz" -C /tmp "dump_$name"
  timeout 240 ncu --target-processes all --kernel-name regex:w12_matmul_body --launch-skip 1 --launch-count 1 \
    --set full --import-source yes -o "/tmp/$name" -f \
    python3 scripts/h200/w12_probe.py --k $K --n $N --m 1 --plain --config "$config" > "/tmp/$name.ncu.log" 2>&1
  ncu --import "/tmp/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/$name.source.csv" 2>&1
  { ncu --import "/tmp/$name.ncu-rep" --page details 2>&1; echo "--- ncu run log (last lines)"; \
    tail -n 20 "/tmp/$name.ncu.log"; } > "$OUT/$name.details.txt"
done
