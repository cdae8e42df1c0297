#!/usr/bin/env bash
# Issue #7 in one call on an nvidia-h200-x2 (`carry: [".whl"]`): train proxy_h200 once; make its target a
# deeper one with passthrough layers (deployment.target_passthrough_layers, default 24: 36 layers that compute,
# the 12 trained ones' tokens), so AR and verify grow while the drafter and commit do not (docs/search.md: an
# estimate puts DDTree at ~1.1x AR there; unmeasured; each layer also adds compile time); then
# scripts/memory_transfer.py --phase all: deployment A (batch 1) writes memory records, and deployment B (batch 4)
# is searched seeded with them on GPU 0 and unseeded on GPU 1 at the same time. Results are packed into
# $OUT/xf.tgz every 30 s and at the end (a cut call still returns what finished).
# Usage (repo root): bash scripts/h200/search_ab.sh [PASSTHROUGH_LAYERS]
T=$SECONDS
PASSTHROUGH=${1:-24}
source scripts/h200/search_setup.sh
mkdir -p /tmp/xf
pack() { tar czf /tmp/xf.tgz --exclude='jax_*' -C /tmp xf && cp /tmp/xf.tgz "$OUT/xf.tgz.part" && mv "$OUT/xf.tgz.part" "$OUT/xf.tgz"; }
(while true; do sleep 30; nice -n 19 bash -c "$(declare -f pack); OUT=$OUT pack"; done) &
CUDA_VISIBLE_DEVICES=0 python3 -m specpilot.training.proxy --size proxy_h200 --out /tmp/px > /tmp/xf/proxy.log 2>&1
echo "proxy rc=$? at $((SECONDS-T)) s"; tail -n 1 /tmp/xf/proxy.log
R=$(((540-(SECONDS-T))/2))
# shellcheck disable=SC2086
JAX_DEFAULT_MATMUL_PRECISION=highest CUDA_VISIBLE_DEVICES=0 python3 scripts/memory_transfer.py --work /tmp/xf --phase all \
  --parallel-devices 0,1 --run-timeout-s $R --a deployment.batch=1 --a search.min_rounds=3 --a search.max_seconds=$((R-40)) \
  --b deployment.batch=4 --b search.max_seconds=$((R-50)) -- $C > /tmp/xf/transfer.out 2> /tmp/xf/transfer.err
echo "transfer rc=$? at $((SECONDS-T)) s"
pack
for r in a b_unseeded b_seeded; do echo "== $r"; grep -E "INFO\] -   (r[0-9]|base)|memory: " /tmp/xf/$r.log | sed 's/^.*\]\[INFO\] - //' | cut -c 1-170; done
cat /tmp/xf/transfer.md; tail -n 1 /tmp/xf/transfer.out
