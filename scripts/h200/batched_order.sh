#!/usr/bin/env bash
# Issue #8's batched row MEASURED: stock, DDTree@64 and SpecPilot against AR at each batch, on a trained pair with
# real acceptance (`reproduce_table2.py --proxy`): proxy_h200, its target deepened to 36 layers by 24 passthrough
# layers as the search's deployments A and B were (docs/results/2026-11-30-search-h200-ab/), 32 held-out prompts x 64
# greedy tokens, f32 weights at the highest matmul precision (as the search ran them), every engine's tokens checked
# against AR's. The pair is trained first, outside the measured runs and at the default matmul precision (as the
# search trained it), when /tmp/spc does not hold it yet; compiled programs go to /tmp/jc. Both stay for the next call
# on a warm machine.
# What a call holds (H100, docs/results/2026-12-07-batched-order-proxy-h100/): training + a cold batch 8 did not fit
# one call (586 s, cut in its generation); batch 8 with the pair cached took 410 s. So on a fresh machine: `train`
# (the pair only), then one batch a call, the machine kept warm between them. On an H200
# (docs/results/2026-12-07-batched-order-32-h200/): `train` 182 s; batch 32 586 s, its table written just before the
# timeout cut the process in its exit (164 s compile and profile, 403 s for the four generations).
# `--gpu-time` (since the fiftieth session) adds the profiled stages' CUPTI kernel time and the lockstep model on it
# to the measured rows: the profiled wall is largely the host's (docs/results/2026-12-07-profile-vs-loop-stages-h100/).
# Batch 8 with --gpu-time after `train` took 580 s on an H100 (docs/results/2026-12-07-batched-order-gpu-time-h100/),
# ~355 s of it compiling the four engines' generation loops one after another; since the fifty-first session they
# compile in 4 threads first (`measure.warm_up_generation`): expected ~150 s for them, ~380 s for the call.
# `cmdbuf` first: every engine runs with while loops and conditionals in XLA's command buffers
# (`reproduce_table2.py --command-buffers`; SpecPilot's switch cost 0.45 ms a round with them at batch 8 on an H100,
# 1.09 without: docs/results/2026-12-07-switch-conditional-graphs-h100/), its tables named table2_<batch>_cmdbuf.
# No carry. Writes $OUT/device.txt, $OUT/order.log, $OUT/table2_<batch>[_cmdbuf].md / .json.
# Usage (repo root): SPECPILOT_COMMIT=<hash> bash scripts/h200/batched_order.sh [train | [cmdbuf] BATCH ...]
# (default: 8)
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SPECPILOT_CACHE=/tmp/spc
echo "== the pair" >> $OUT/order.log
timeout 585 python3 -c "from specpilot.training.proxy import ensure_proxy; print(ensure_proxy('proxy_h200'))" \
  >> $OUT/order.log 2>&1
echo "rc $? at $SECONDS s" >> $OUT/order.log
batches=${*:-8}
batches=${batches#train}
flag= suffix=
case " $batches " in *" cmdbuf "*) flag=--command-buffers suffix=_cmdbuf batches=${batches/cmdbuf/} ;; esac
for b in $batches; do
  left=$((585 - SECONDS))
  echo "== batch $b $flag ($left s left)" >> $OUT/order.log
  [ $left -lt 60 ] && { echo "skipped: under 60 s left" >> $OUT/order.log; continue; }
  JAX_DEFAULT_MATMUL_PRECISION=highest timeout $left python3 scripts/reproduce_table2.py --out /tmp/t2_$b$suffix \
    --proxy proxy_h200 --models --batches $b --target-passthrough-layers 24 --num-prompts 32 --max-new 64 \
    --specpilot-candidates 16 64 --tlv-budgets --compile-cache /tmp/jc --gpu-time $flag >> $OUT/order.log 2>&1
  echo "rc $? at $SECONDS s" >> $OUT/order.log
  cp /tmp/t2_$b$suffix/table2.md $OUT/table2_$b$suffix.md 2> /dev/null
  cp /tmp/t2_$b$suffix/table2.json $OUT/table2_$b$suffix.json 2> /dev/null
done
grep -E "^generate|^rc|^==|^skipped|^\(" $OUT/order.log
