#!/usr/bin/env bash
# Why SpecPilot's profiled round showed 1.67 ms of CUPTI kernel time where DDTree@64's showed 11.98
# (docs/results/2026-12-07-batched-order-gpu-time-h100/): its verify is the one stage with a lax.switch.
# 1. scripts/h200/cupti_switch_probe.py (a switch over 16 matmuls, its branch alone, donated, the small branch) under
#    three XLA_FLAGS: default, command buffers off, conditionals and loops in command buffers (one process each),
#    each at two shapes: 16 long matmuls (4096 wide, 64 rows) and 64 short ones (1024 wide, 8 rows: launch-bound, as
#    a batch-1 verify's kernels are), where `prefix, switch` over `prefix, branch` measures the conditional's drain.
# 2. the engines themselves: bench.py on the tiny synthetic model, DDTree@64 and SpecPilot[16,64] at batch 8,
#    `--gpu-time`, default flags and command buffers off: each stage's kernel ms and launches a round.
# Any Hopper, ~3-4 min, no carry. Writes $OUT/device.txt, $OUT/cupti_switch.log.
# Usage (repo root): SPECPILOT_COMMIT=<hash> bash scripts/h200/cupti_switch.sh
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
log=$OUT/cupti_switch.log
for flags in "" "--xla_gpu_enable_command_buffer=" "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"; do
  for shape in "" "--layers 64 --hidden 1024 --rows 8"; do
    echo "== probe $shape, XLA_FLAGS='$flags'" >> $log
    XLA_FLAGS="$flags" timeout 90 python3 scripts/h200/cupti_switch_probe.py $shape >> $log 2>&1
    echo "rc $? at $SECONDS s" >> $log
  done
done
for flags in "" "--xla_gpu_enable_command_buffer="; do
  echo "== engines, XLA_FLAGS='$flags'" >> $log
  XLA_FLAGS="$flags" timeout 120 python3 scripts/bench.py --out /tmp/cs --model tiny --batches 8 \
    --engines ddtree specpilot --budgets 64 --specpilot-candidates 16 64 --gpu-time --calibration off \
    --context 128 --rounds 3 --compile-cache none >> $log 2>&1
  echo "rc $? at $SECONDS s" >> $log
  python3 -c "
import json
for r in json.load(open('/tmp/cs/bench.json'))['rows']:
    k = r.get('stage_gpu_kernels') or {}
    print(r['label'], 'kernel ms', {s: round(v, 4) for s, v in (r.get('stage_gpu_ms') or {}).items()},
          'wall ms', {s: round(v, 4) for s, v in r['stage_ms'].items()}, 'launches', r.get('stage_gpu_launches'),
          'verify kernel names', len(k.get('verify', {})), 'budgets', r.get('nodes_mix'),
          r.get('stage_gpu_error') or '')" >> $log 2>&1
done
grep -E "^(==|rc|\||ddtree|specpilot)" $log
