#!/usr/bin/env bash
# Is the fused loop's wall beyond its kernels the host's while loop? On the 36-layer proxy at batch 8 (H100,
# docs/results/2026-12-07-profile-vs-loop-stages-h100/) AR's loop step took 2.42 ms on one machine and 2.98 on another
# with the same 2.00 ms of kernels. XLA's GPU runtime runs a while loop from the host (its condition read back every
# iteration, the body launched after it) unless the loop is a command buffer of its own (+WHILE,+CONDITIONAL, which the
# decode loops of bench.py --command-buffers and bench_roofline.py's W12 loop use). `profile_vs_loop.py --loop-only`
# per engine, once plain and once with those flags, each in its own process (XLA_FLAGS are read once). Any Hopper.
# No carry. Writes $OUT/device.txt, $OUT/graphs.log, $OUT/{plain,graphs}_loop_only.{md,json}.
# LIMIT (default 560) is the seconds both runs may take together, for a call that runs other work first.
# Usage (repo root): SPECPILOT_COMMIT=<hash> [LIMIT=560] bash scripts/h200/loop_graphs_ab.sh [ENGINE ...]  (default:
# ar stock ddtree@64)
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 JAX_DEFAULT_MATMUL_PRECISION=highest
engines=${*:-ar stock ddtree@64}
graphs="--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL --xla_gpu_graph_min_graph_size=1"
for run in plain graphs; do
  flags=""; limit=$((${LIMIT:-560} / 2)); [ $run = graphs ] && { flags=$graphs; limit=$((${LIMIT:-560} - SECONDS)); }
  echo "== $run ($limit s)" >> $OUT/graphs.log
  XLA_FLAGS="$flags" timeout $limit python3 scripts/profile_vs_loop.py --out /tmp/lg_$run --batch 8 \
    --loop-only --engines $engines >> $OUT/graphs.log 2>&1
  echo "rc $? at $SECONDS s" >> $OUT/graphs.log
  for f in md json; do cp /tmp/lg_$run/loop_only.$f $OUT/${run}_loop_only.$f 2> /dev/null; done
done
cat $OUT/graphs.log | grep -E "^(==|rc|ar|stock|ddtree|specpilot|  )"
