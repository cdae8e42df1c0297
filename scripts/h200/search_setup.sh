# Sourced by search_a.sh and search_b.sh (issue #7 on the H200): the carried .whl/ packages
# installed, the environment, and $C, the Hydra overrides every search of deployments A and B shares (B must
# match A's deployment, or A's memory records would not meet B's preconditions). PASSTHROUGH (default 0) sets
# deployment.target_passthrough_layers.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export SPECPILOT_CACHE=/tmp/spc WANDB_MODE=disabled PYTHONUNBUFFERED=1
C="deployment=h200 deployment.proposer=offline deployment.num_prompts=4 deployment.prompt_len=64 deployment.max_new_tokens=64 deployment.max_tree_budget=256 deployment.target_passthrough_layers=${PASSTHROUGH:-0} search.rounds=3 search.candidates_per_round=3 search.measure_repeats=2 search.profile_all=false search.workers=0 search.wandb.mode=disabled"
