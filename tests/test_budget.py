"""The cost-aware tree budget (`specpilot.decoding.budget`): expected tokens per millisecond decide, over live rows."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from specpilot.decoding.budget import CostAwareBudget

POLICY = CostAwareBudget.from_config({"tree_budget": 8, "budget_candidates": [2, 8],
                                      "verify_cost_ms": {1: 1.0, 8: 1.5}, "draft_cost_ms": 0.5})


def scores(prob: float, n: int = 8) -> jnp.ndarray:
    return jnp.log(jnp.full((n,), prob))


def test_confident_drafts_buy_the_big_tree_and_weak_ones_the_small():
    valid = jnp.ones((1, 8), bool)
    assert POLICY.candidates[int(POLICY.choose(scores(0.9)[None], valid))] == 8  # E: 8.2 / 2.0 ms beats 2.8 / 1.57
    assert POLICY.candidates[int(POLICY.choose(scores(0.01)[None], valid))] == 2


def test_a_finished_row_does_not_vote():
    """Row 1 is done (its confident tree would pick 8 nodes for the whole batch); the live row's weak tree picks 2."""
    score = jnp.stack([scores(0.01), scores(0.99)])
    valid = jnp.ones((2, 8), bool)
    assert POLICY.candidates[int(POLICY.choose(score, valid))] == 8
    assert POLICY.candidates[int(POLICY.choose(score, valid, jnp.array([True, False])))] == 2


def test_finished_rows_do_not_tip_the_balance():
    """A finished row adds no expected tokens: the live row's tree alone decides (its E: 1.8 / 2.0 ms for 8 nodes
    beats 1.2 / 1.57 ms for 2), however many finished rows sit beside it."""
    live_alone = POLICY.choose(scores(0.1)[None], jnp.ones((1, 8), bool))
    assert POLICY.candidates[int(live_alone)] == 8
    score = jnp.stack([scores(0.1)] + [scores(0.5)] * 3)
    live = jnp.array([True, False, False, False])
    assert POLICY.candidates[int(POLICY.choose(score, jnp.ones((4, 8), bool), live))] == 8


def test_bad_tables_are_refused():
    with pytest.raises(ValueError, match="none is <= engine.tree_budget"):
        CostAwareBudget.from_config({"tree_budget": 4, "budget_candidates": [8]})
    with pytest.raises(ValueError, match="must be > 0"):
        CostAwareBudget.from_config({"tree_budget": 4, "verify_cost_ms": {1: 0.0}})
