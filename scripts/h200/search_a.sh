#!/usr/bin/env bash
# Issue #7, H200 call 1 of 2 (device tool, `carry: [".whl"]` — hydra, omegaconf, antlr4, pydantic wheels, see
# docs/search.md): train proxy_h200 (fixed steps, ~150 s), then search deployment A (h200, batch 1, offline
# proposer, 3 rounds) writing memory records. Commit the records it returns (A_records.tgz → memory_store/)
# before call 2 (search_b.sh). Usage (repo root): [PASSTHROUGH=n] [A_WORKERS=2] bash scripts/h200/search_a.sh
# PASSTHROUGH: deployment.target_passthrough_layers (search_setup.sh); A_WORKERS=2 on an x2 machine: the search's
# candidates run two at a time, one worker per GPU (training uses only the first GPU visible, so a short job can
# use the second one meanwhile).
T=$SECONDS
source scripts/h200/search_setup.sh
# copies of what finished so far, should the call be cut
(while sleep 30; do cp /tmp/xf/a/trials.jsonl $OUT/A_trials.jsonl; cp /tmp/xf/a.log $OUT/A_search.log
  tar -czf $OUT/A_records.tgz -C /tmp/xf/memory_a records; done 2> /dev/null) &
CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} python3 -m specpilot.training.proxy --size proxy_h200 --out /tmp/px > /tmp/px.log 2>&1
echo "proxy rc=$? at $((SECONDS-T)) s"; tail -n 1 /tmp/px.log; cp /tmp/px/results.json $OUT/A_proxy.json
R=$((548-(SECONDS-T)))
# shellcheck disable=SC2086
JAX_DEFAULT_MATMUL_PRECISION=highest python3 scripts/memory_transfer.py --work /tmp/xf --phase a --run-timeout-s $R \
  --a deployment.batch=1 --a search.min_rounds=3 --a search.max_seconds=$((R-130)) --a search.workers=${A_WORKERS:-0} -- $C > /tmp/xf.out 2> /tmp/xf.err
echo "search rc=$? at $((SECONDS-T)) s"
cp /tmp/xf/a/summary.json $OUT/A_summary.json; cp /tmp/xf/a/trials.jsonl $OUT/A_trials.jsonl
cp /tmp/xf/a.log $OUT/A_search.log; cp /tmp/xf/transfer.md $OUT/A_transfer.md
tar -czf $OUT/A_records.tgz -C /tmp/xf/memory_a records
grep -E "INFO\] -   (r[0-9]|base)|memory: " /tmp/xf/a.log | sed 's/^.*\]\[INFO\] - //' | cut -c 1-170
cat /tmp/xf/transfer.md; tail -n 1 /tmp/xf.out
