#!/usr/bin/env bash
# Issue #7, H200 call 2 of 2 (`carry: [".whl"]`): retrain proxy_h200 (fixed steps), then deployment B (batch B_BATCH, default 2)
# searched unseeded, then seeded from memory_store/ (call 1's records, committed); transfer.md says which
# reached its best first. On an nvidia-h200-x2, pass "x2" to run the two searches side by side, one per GPU.
# Usage (repo root): [PASSTHROUGH=n] [B_BATCH=2] bash scripts/h200/search_b.sh [x2]   (PASSTHROUGH as for A: they
# must match). Batch 2, not 4: at 4 the proxy's verify costs more than speculation adds, and A's records do not
# hold there (docs/results/2026-11-30-search-h200-ab/).
T=$SECONDS
source scripts/h200/search_setup.sh
ls memory_store/records
CUDA_VISIBLE_DEVICES=0 python3 -m specpilot.training.proxy --size proxy_h200 --out /tmp/px > /tmp/px.log 2>&1
echo "proxy rc=$? at $((SECONDS-T)) s"; tail -n 1 /tmp/px.log; cp /tmp/px/results.json $OUT/B_proxy.json
if [ "${1:-}" = x2 ]; then R=$((548-(SECONDS-T))); PAR="--parallel-devices 0,1"; MS=$((R-110))
else R=$(((548-(SECONDS-T))/2)); PAR=""; MS=$((R-85)); fi
# shellcheck disable=SC2086
JAX_DEFAULT_MATMUL_PRECISION=highest python3 scripts/memory_transfer.py --work /tmp/xf --phase b $PAR --run-timeout-s $R \
  --b deployment.batch=${B_BATCH:-2} --b search.max_seconds=$MS -- $C > /tmp/xf.out 2> /tmp/xf.err
echo "transfer rc=$? at $((SECONDS-T)) s"
cp /tmp/xf/transfer.json $OUT/B_transfer.json; cp /tmp/xf/transfer.md $OUT/B_transfer.md
cp /tmp/xf/b_seeded/summary.json $OUT/B_seeded_summary.json; cp /tmp/xf/b_unseeded/summary.json $OUT/B_unseeded_summary.json
tar -czf $OUT/B_runs.tgz -C /tmp/xf b_seeded b_unseeded b_seeded.log b_unseeded.log memory_b_seeded memory_b_unseeded
for r in b_unseeded b_seeded; do echo "== $r"; grep -E "INFO\] -   (r[0-9]|base)|memory: " /tmp/xf/$r.log | sed 's/^.*\]\[INFO\] - //' | cut -c 1-170; done
cat /tmp/xf/transfer.md; tail -n 1 /tmp/xf.out
