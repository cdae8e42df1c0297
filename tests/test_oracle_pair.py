"""Fidelity to the public reference loops on a small trained target/drafter pair.

`shared/oracle_pair/oracle.json` holds, for 8 prompts × 48 greedy tokens, the target's own output
(`ar_greedy`, transformers `generate`) and the per-round committed counts of z-lab's stock DFlash loop
(`runs.stock`) and DDTree's loop at budgets 4 / 16 / 64 (`runs.ddtree_budget{b}`). With
`reference_loop=True` our engines reproduce those counts round by round, and the tokens are the target's.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import pytest

import models as tm
from specpilot.decoding.ar import AREngine
from specpilot.decoding.spec import SpecEngine
from specpilot.models.hf import load_drafter, load_target

ORACLE = Path(__file__).resolve().parents[2] / "shared" / "oracle_pair"
CONTEXT = 160

pytestmark = pytest.mark.skipif(
    not (ORACLE / "oracle.json").is_file(),
    reason=f"oracle pair not found at {ORACLE} (shared/oracle_pair beside the repository)",
)


@pytest.fixture(scope="module")
def oracle():
    return json.loads((ORACLE / "oracle.json").read_text())


@pytest.fixture(scope="module")
def models():
    cfg, tw = load_target(ORACLE / "target", dtype=jnp.float32)
    dcfg, dw = load_drafter(ORACLE / "drafter", dtype=jnp.float32)
    return cfg, tw, dcfg, dw


def test_ar_equals_ar_greedy(models, oracle):
    cfg, tw, _, _ = models
    r = tm.whole_batch(AREngine(cfg, tw, context=CONTEXT)).generate(oracle["prompts"], oracle["max_new_tokens"])
    for i, want in enumerate(oracle["ar_greedy"]):
        assert r.tokens[i] == want, f"prompt {i}"


@pytest.mark.parametrize("run", ["stock", "ddtree_budget4", "ddtree_budget16", "ddtree_budget64"])
def test_per_round_acceptance_matches_reference(run, models, oracle):
    cfg, tw, dcfg, dw = models
    assert dcfg.block_size == oracle["block_size"] and dcfg.mask_token_id == oracle["mask_token_id"]
    if run == "stock":
        eng = SpecEngine("stock", cfg, tw, dcfg, dw, context=CONTEXT, reference_loop=True, tree="chain")
    else:
        budget = int(run.removeprefix("ddtree_budget"))
        eng = SpecEngine("ddtree", cfg, tw, dcfg, dw, context=CONTEXT, reference_loop=True, tree="best_first",
                         tree_budget=budget)
    tm.whole_batch(eng)  # one loop compile per engine (dropping finished rows is covered in test_engines)
    r = eng.generate(oracle["prompts"], oracle["max_new_tokens"])
    for i, ref in enumerate(oracle["runs"][run]):
        assert r.acceptance_lengths[i] == ref["acceptance_lengths"], f"{run}: prompt {i}"
        assert r.tokens[i] == oracle["ar_greedy"][i], f"{run}: prompt {i}"
