#!/usr/bin/env bash
# What is left of SpecPilot's lax.switch cost, in one call on any Hopper (~8-9 min; the fifty-third session's
# docs/results/2026-12-07-switch-kernels-h100/ found two memcpys and two memsets a layer in the branch and 0.7-1.8 ms
# of host time beyond its kernels):
# 1. runbook call 0e: scripts/h200/loop_copies.py on the 4-layer proxy (compile only): the branch's layer-sized copies,
#    and both loops' optimized HLO ($OUT/hlo.tgz) to name the memcpys and memsets;
# 2. runbook call 0d: scripts/h200/loop_graphs_ab.sh ddtree@64 specpilot@63,64: the loop steps plain and with the
#    while loop and the conditional in command buffers (where the host no longer reads the branch index back).
# No carry. Writes $OUT/device.txt, $OUT/loop_copies.log, $OUT/hlo.tgz, and loop_graphs_ab.sh's files.
# Usage (repo root): SPECPILOT_COMMIT=<hash> bash scripts/h200/switch_followups.sh
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 150 python3 scripts/h200/loop_copies.py --model proxy_h200_deep --layers 4 --batch 8 --dtype float32 \
  --engines ddtree@64 specpilot@63,64 --attentions xla --dump /tmp/hlo > $OUT/loop_copies.log 2>&1
echo "rc $? at $SECONDS s" >> $OUT/loop_copies.log
tar czf $OUT/hlo.tgz -C /tmp hlo 2> /dev/null
grep -E "^\||^rc" $OUT/loop_copies.log
LIMIT=$((575 - SECONDS)) bash scripts/h200/loop_graphs_ab.sh ddtree@64 specpilot@63,64
