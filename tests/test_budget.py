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


def test_step_time_beyond_the_table_follows_its_last_slope():
    """Past the last measured size the verify gets dearer at the last segment's rate (not clamped), never cheaper; below
    the first size it costs the first time."""
    policy = CostAwareBudget.from_config({"tree_budget": 64, "budget_candidates": [8, 64],
                                          "verify_cost_ms": {1: 1.0, 8: 1.5, 16: 2.0}, "draft_cost_ms": 0.5})
    assert policy.step_ms(64) == pytest.approx(0.5 + 2.0 + 0.5 / 8 * 48)
    assert policy.step_ms(0) == pytest.approx(1.5)
    falling = CostAwareBudget.from_config({"tree_budget": 64, "verify_cost_ms": {8: 2.0, 16: 1.5}})
    assert falling.step_ms(64) == pytest.approx(1.5)
    # nodes at probability 0.03: 64 nodes buy E = 2.92 in 5.5 ms, 8 nodes 1.24 in 2.0 ms; clamped, 64 would cost 2.5
    valid = jnp.ones((1, 64), bool)
    assert policy.candidates[int(policy.choose(scores(0.03, 64)[None], valid))] == 8
