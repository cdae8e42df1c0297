"""Decoding engines. `make_engine` builds one from its validated config section."""

from __future__ import annotations

from specpilot.decoding.sampling import Sampling

ENGINES = ("ar", "stock", "ddtree", "specpilot", "tlv")


def make_engine(engine_cfg: dict, target_cfg, target_weights, drafter_cfg=None, drafter_weights=None,
                sampling: Sampling = Sampling(), context: int | None = None):
    """engine_cfg: {"name": one of ENGINES, plus that engine's knobs (see conf/engine/*.yaml)}."""
    from specpilot.decoding.ar import AREngine
    from specpilot.decoding.spec import SpecEngine

    name = engine_cfg["name"]
    if engine_cfg.get("weight_format", "bf16") == "w12":
        # the checkpoint's converted tree when scripts/convert_w12.py cached one, else packed here
        from specpilot.models.hf import packed_w12

        target_weights = packed_w12(target_weights)
        drafter_weights = None if drafter_weights is None else packed_w12(drafter_weights)
    attention = engine_cfg.get("attention", "xla")
    if name == "ar":
        return AREngine(target_cfg, target_weights, sampling, context, attention)
    if name not in ENGINES:
        raise ValueError(f"engine.name: unknown engine {name!r} (choose from {', '.join(ENGINES)})")
    if drafter_cfg is None or drafter_weights is None:
        raise ValueError(f"engine {name!r} needs a drafter (set drafter.path or use random drafter shapes)")
    common = dict(sampling=sampling, context=context, block_size=engine_cfg.get("block_size"), attention=attention)
    if name == "stock":
        return SpecEngine("stock", target_cfg, target_weights, drafter_cfg, drafter_weights, tree="chain", **common)
    if name == "ddtree":
        return SpecEngine("ddtree", target_cfg, target_weights, drafter_cfg, drafter_weights, tree="best_first",
                          tree_budget=engine_cfg.get("tree_budget", 64), **common)
    if name == "tlv":
        return SpecEngine("tlv", target_cfg, target_weights, drafter_cfg, drafter_weights, tree="best_first",
                          tree_budget=engine_cfg.get("tree_budget", 128),
                          level1_format=engine_cfg.get("level1_format", "int8"), **common)
    from specpilot.decoding.budget import CostAwareBudget

    policy = CostAwareBudget.from_config(engine_cfg)
    return SpecEngine("specpilot", target_cfg, target_weights, drafter_cfg, drafter_weights, tree="best_first",
                      tree_budget=policy.max_budget, budget_for_round=policy, **common)
