#!/usr/bin/env bash
# Two jobs side by side on an nvidia-h200-x2 (device tool), one per GPU: each sees only its own GPU
# (CUDA_VISIBLE_DEVICES) and its own $OUT/gpu<i>, so two of the other scripts here fit one call's 10 minutes.
# Each job's stdout and stderr go to $OUT/gpu<i>/stdout.txt as it runs; a job must keep to ~540 s on its own.
# Usage (repo root): SPECPILOT_COMMIT=<hash> bash scripts/h200/pair.sh "<job on GPU 0>" "<job on GPU 1>"
set -u
[ $# -eq 2 ] || { echo "usage: pair.sh '<job on GPU 0>' '<job on GPU 1>'" >&2; exit 2; }
ROOT=$OUT
for i in 0 1; do
  mkdir -p "$ROOT/gpu$i"
  job=$1; shift
  (CUDA_VISIBLE_DEVICES=$i OUT=$ROOT/gpu$i bash -c "$job" > "$ROOT/gpu$i/stdout.txt" 2>&1; echo "rc $?" >> "$ROOT/gpu$i/stdout.txt") &
done
wait
for i in 0 1; do echo "===== GPU $i"; tail -n 40 "$ROOT/gpu$i/stdout.txt"; done
