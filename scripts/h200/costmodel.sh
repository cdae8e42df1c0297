#!/usr/bin/env bash
# Issue #6 on one H200 (device tool), one command of < 10 minutes per call: the bench of qwen3_8b shapes
# (calibration grid + configurations, cost-model check) at the batches given (default "1 8"; a batch-32 sweep
# needs a call of its own). Results go under /tmp/r.<pid> and are packed into $OUT/r.tgz every 60 s (niced) and at
# the end, so a run cut short still returns what it finished; `python scripts/bench.py --replot DIR` fits and
# checks a partial bench.json here. Usage (repo root): SPECPILOT_COMMIT=<hash> bash scripts/h200/costmodel.sh "1 8"
# Extra bench.py arguments go in BENCH_ARGS, e.g. BENCH_ARGS="--matmul mosaic_gpu --command-buffers".
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
BATCHES=${1:-1 8}
R=/tmp/r.$$; mkdir -p $R  # one per job: pair.sh may run two on one host
pack() { tar czf $R.tgz -C $R . && cp $R.tgz "$OUT/r.tgz.part" && mv "$OUT/r.tgz.part" "$OUT/r.tgz"; }
(while true; do sleep 60; nice -n 19 bash -c "$(declare -f pack); R=$R OUT=$OUT pack"; done) &
echo "== bench B=$BATCHES ${BENCH_ARGS:-} ($(date +%T))" | tee -a $R/log.txt
# shellcheck disable=SC2086
timeout 540 python3 scripts/bench.py --out $R/bench --batches $BATCHES --budgets 128 --specpilot-candidates 64 256 \
  --calibration-ddtree-budgets 64 256 --calibration-tlv-budgets 64 256 --budget-s 480 --compile-workers 3 \
  ${BENCH_ARGS:-} >> $R/bench.log 2>&1
echo "   rc $?" | tee -a $R/log.txt
pack; grep -v "^external\|cuda_timer" $R/bench.log | tail -n 25
