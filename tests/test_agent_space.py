"""The config space: deltas inside it apply, deltas outside it are refused with a reason a proposer can act on."""

from __future__ import annotations

import json

import pytest

from specpilot.agent.space import ConfigSpace, SpaceError, config_key
from specpilot.config import _ENGINE_CLASSES


@pytest.fixture(scope="module")
def space():
    return ConfigSpace(drafter_block_size=16, max_tree_budget=128, target_dtype="float32", platform="cpu")


@pytest.fixture(scope="module")
def stock(space):
    return space.switched(space.engine_defaults["ar"], "stock")


def reason(space, base, delta) -> str:
    with pytest.raises(SpaceError) as e:
        space.apply(base, delta)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_engine_switch_starts_from_defaults_and_clamps(space, stock):
    cfg = space.apply(stock, {"engine": "specpilot"})
    assert cfg["name"] == "specpilot" and cfg["tree_budget"] == 128  # YAML default 255, clamped to the deployment
    assert max(cfg["budget_candidates"]) <= 128
    _ENGINE_CLASSES["specpilot"].model_validate(cfg)
    smaller = space.apply(cfg, {"tree_budget": 32})  # the cost-aware candidates follow a smaller budget
    assert smaller["budget_candidates"] == [4, 7, 15, 31]
    assert space.diff(stock, smaller) == {"engine": "specpilot", "tree_budget": 32, "budget_candidates": [4, 7, 15, 31]}
    assert space.apply(stock, space.diff(stock, smaller)) == smaller


@pytest.mark.parametrize("delta, expected", [
    ({"tree_budget": 32}, "tree_budget: applies to ddtree, specpilot, tlv, not stock"),
    ({"engine": "ddtree", "tree_budget": 5000}, "tree_budget: 5000 outside [1, 128]"),
    ({"engine": "ddtree", "tree_budget": "32"}, "tree_budget: expected an integer, got '32'"),
    ({"block_size": 32}, "block_size: 32 outside [2, 16]"),
    ({"weight_format": "w12"}, "weight_format=w12: needs bfloat16 target weights"),
    ({"attention": "cudnn"}, "attention=cudnn: needs an NVIDIA GPU, this deployment runs on cpu"),
    ({"tlv_paths": 2}, "tlv_paths: not available yet"),
    ({"engine": "beam"}, "engine: expected one of 'ar'"),
    ({"engine": {"x": 1}}, "engine: expected one of 'ar'"),  # unhashable values are reasons, not tracebacks
    ({"attention": ["xla"]}, "attention: expected one of 'xla'"),
    ({"tree_size": 8}, "tree_size: unknown knob"),
    ({"verify_cost_ms": {1: 2.0}}, "verify_cost_ms: not searched"),
    ({"engine": "specpilot", "budget_candidates": [4, 256]}, "budget_candidates: 256 outside"),
    ({"engine": "specpilot", "tree_budget": 16, "budget_candidates": [4, 64]},
     "budget_candidates: 64 exceeds tree_budget 16"),
    ({}, "empty change"),
])
def test_out_of_space_deltas_name_the_reason(space, stock, delta, expected):
    assert expected in reason(space, stock, delta)


def test_w12_allowed_with_bfloat16_weights(stock):
    space = ConfigSpace(drafter_block_size=16, max_tree_budget=128, target_dtype="bfloat16")
    assert space.apply(stock, {"weight_format": "w12"})["weight_format"] == "w12"


def test_moves_stay_inside_the_space_and_are_distinct(space, stock):
    for base in (stock, space.apply(stock, {"engine": "specpilot"}), space.apply(stock, {"engine": "tlv"})):
        moves = space.moves(base)
        configs = [space.apply(base, m) for m in moves]
        keys = {config_key(c) for c in configs}
        assert len(keys) == len(moves) and config_key(base) not in keys
        assert {"engine": "ar"} in moves


def test_description_is_json_and_lists_unavailable_knobs(space):
    d = json.loads(json.dumps(space.describe()))
    names = {k["name"]: k for k in d["knobs"]}
    assert names["tree_budget"]["range"] == [1, 128]
    assert names["tlv_paths"]["available"] is False and names["tlv_paths"]["why_unavailable"]
    assert {"cudnn", "pallas_tree"} <= set(names["attention"]["choices"])
    assert any("w12" in c for c in d["constraints"])


def test_offline_proposer_moves_from_the_runners_up_when_the_incumbent_has_no_moves_left(space):
    """An AR incumbent's only moves are engine kinds; once all are measured, the offline proposer takes the
    single-knob moves of the fastest token-forced runner-up (the H200 search had empty rounds without it)."""
    from specpilot.agent.proposers import ProposalContext
    from specpilot.agent.proposers.offline import OfflineProposer

    ar = space.engine_defaults["ar"]
    passed = {"passed": True}
    history = [{"id": "baseline/ar", "status": "ok", "config": ar, "speedup": 1.0}]
    for i, (engine, speedup) in enumerate([("stock", 0.84), ("ddtree", 0.76), ("specpilot", 0.53), ("tlv", 0.64)]):
        history.append({"id": f"r1/c{i}", "status": "ok", "config": space.apply(ar, {"engine": engine}),
                        "speedup": speedup, "forcing": passed})
    tried = {config_key(t["config"]) for t in history[1:]}
    ctx = ProposalContext(round=3, k=2, deployment={}, space=space, incumbent={**history[0], "tau": 1.0},
                          gap_report={"components": [{"stage": "verify", "gap_ms_per_token": 1.0}]}, history=history,
                          tried=tried, memory=[], feedback=[], measured={})
    props = OfflineProposer().propose(ctx).proposals
    assert len(props) == 2
    for p in props:
        assert p.source == "offline:runner-up:r1/c0" and p.delta["engine"] == "stock"  # the fastest runner-up
        cfg = space.apply(ar, p.delta)
        assert config_key(cfg) not in tried and "stock" in p.hypothesis


def test_an_edited_memory_config_is_refused_with_a_reason_not_a_crash(space, stock):
    """A record's config (edited by hand, or older) that lacks a knob: SpaceError naming it, which the offline
    proposer skips; it was a KeyError that ended the search."""
    from specpilot.agent.memory import Evidence, MemoryRecord
    from specpilot.agent.proposers import ProposalContext
    from specpilot.agent.proposers.offline import OfflineProposer

    full = space.apply(stock, {"engine": "specpilot", "tree_budget": 8})
    for missing in ("budget_candidates", "tree_budget"):
        with pytest.raises(SpaceError, match=f"{missing}: Field required"):
            space.check({k: v for k, v in full.items() if k != missing})
    ev = Evidence(run_id="r", trial_id="r1/c0", run_dir="/tmp/x", date="2026-01-01T00:00:00Z", speedup_over_ar=2.0,
                  base_speedup_over_ar=1.0, relative_gain=1.0, tau=3.0, ms_per_token=1.0,
                  forcing={"passed": True, "num_violations": 0})
    edited = {k: v for k, v in full.items() if k != "budget_candidates"}
    rec = MemoryRecord(name="engine=specpilot", mechanism="m", delta={"engine": "specpilot"}, base_config=stock,
                       config=edited, addresses="tau", deployment={}, preconditions={}, gain=ev)
    ctx = ProposalContext(round=1, k=2, deployment={}, space=space, incumbent={"config": stock, "tau": 3.0},
                          gap_report={"components": []}, history=[], tried=set(), memory=[rec], feedback=[])
    props = OfflineProposer().propose(ctx).proposals
    assert props[0].source == "memory:engine=specpilot" and props[0].delta == {"engine": "specpilot"}
