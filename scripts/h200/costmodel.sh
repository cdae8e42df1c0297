#!/usr/bin/env bash
# Issue #6 on one H200 (device tool), in one command of < 10 minutes: the bench of qwen3_8b shapes at batch
# 1/8/32 (calibration grid + configurations, cost-model check), then the three reproduction scripts (the
# oracle pair measured, qwen3_8b projected). Everything is written under /tmp/r and packed into $OUT/r.tgz
# every 15 s, so a run cut short still returns what it finished. Usage (repo root, shared/oracle_pair copied
# into the checkout): SPECPILOT_COMMIT=<hash> bash scripts/h200/costmodel.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R
pack() { tar czf /tmp/r.tgz -C $R . && cp /tmp/r.tgz "$OUT/r.tgz.part" && mv "$OUT/r.tgz.part" "$OUT/r.tgz"; }
(while true; do sleep 15; pack; done) &
step() {  # step NAME SECONDS CMD...
  local name=$1 secs=$2; shift 2
  echo "== $name ($(date +%T))" | tee -a $R/log.txt
  timeout "$secs" "$@" >> $R/$name.log 2>&1; echo "   rc $?" | tee -a $R/log.txt
}
step bench 300 python3 scripts/bench.py --out $R/bench --batches 1 8 32 --budgets 128 \
  --specpilot-candidates 64 256 --calibration-ddtree-budgets 64 256 --calibration-tlv-budgets 64 256 \
  --budget-s 270 --compile-workers 3
step table1 70 python3 scripts/reproduce_table1.py --out $R/table1 --budget-s 35 --compile-workers 3 \
  --specpilot-candidates 64 256
step table2 90 python3 scripts/reproduce_table2.py --out $R/table2 --batches 8 32 --budget-s 50 \
  --compile-workers 3 --specpilot-candidates 64 256
step ddtree_comparison 70 python3 scripts/reproduce_ddtree_comparison.py --out $R/ddtree_comparison \
  --ddtree-budgets 16 64 128 256 --budget-s 35 --compile-workers 3 --specpilot-candidates 64 256
pack; tail -3 $R/*.log
