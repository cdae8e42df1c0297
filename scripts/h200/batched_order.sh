#!/usr/bin/env bash
# Issue #8's batched row MEASURED: stock, DDTree@64 and SpecPilot against AR at each batch, on a trained pair with
# real acceptance (`reproduce_table2.py --proxy`): proxy_h200 (trained here on first use, ~150 s; cached in /tmp/spc
# for the next call on a warm machine), its target deepened to 36 layers by 24 passthrough layers as the search's
# deployments A and B were (docs/results/2026-11-30-search-h200-ab/), 32 held-out prompts x 64 greedy tokens, f32
# weights at the highest matmul precision (as the search ran them), every engine's tokens checked against AR's.
# One process a batch, so a batch that finishes keeps its table when a later one is cut. No carry.
# Writes $OUT/device.txt, $OUT/order.log, $OUT/table2_<batch>.md / .json.
# Usage (repo root): SPECPILOT_COMMIT=<hash> bash scripts/h200/batched_order.sh [BATCH ...] (default: 8 32)
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SPECPILOT_CACHE=/tmp/spc JAX_DEFAULT_MATMUL_PRECISION=highest
for b in ${*:-8 32}; do
  left=$((585 - SECONDS))
  echo "== batch $b ($left s left)" >> $OUT/order.log
  timeout $left python3 scripts/reproduce_table2.py --out /tmp/t2_$b --proxy proxy_h200 --target-passthrough-layers 24 \
    --models --batches $b --num-prompts 32 --max-new 64 --specpilot-candidates 16 64 --tlv-budgets \
    --compile-cache /tmp/jc >> $OUT/order.log 2>&1
  echo "rc $? at $SECONDS s" >> $OUT/order.log
  cp /tmp/t2_$b/table2.md $OUT/table2_$b.md; cp /tmp/t2_$b/table2.json $OUT/table2_$b.json
done 2> /dev/null
grep -E "^generate|^rc|^==" $OUT/order.log
