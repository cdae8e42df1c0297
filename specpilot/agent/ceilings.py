"""Hardware ceilings per round stage, from the cost model.

`specpilot.costmodel.ceilings_ms(target_cfg, drafter_cfg, engine_cfg, batch, context, hw, act_bytes, budgets)`
with
a calibrated `Hardware`. Where it cannot give them (not importable, no calibration, a cost-model error), every
ceiling is 0 — the gap report then ranks stages by their measured time — and the search says so once in its log and
in `summary.json` (`ceilings`).
"""

from __future__ import annotations

import logging

log = logging.getLogger("specpilot.search")

_state: dict = {}


def _hardware(gpu: str):
    """A calibrated Hardware from the cost model (cached per process), or None."""
    if "hw" in _state:
        return _state["hw"]
    import specpilot.costmodel as cm

    hw = None
    # the cached calibration first: measured once per machine, not once per search
    factories = [getattr(cm, n) for n in ("load_or_calibrate", "calibrate") if hasattr(cm, n)]
    for make in factories:
        try:
            hw = make()
            break
        except TypeError:
            continue
    _state["hw"] = hw
    return hw


def ceilings_for(target_cfg, drafter_cfg, engine_cfg: dict, batch: int, context: int, gpu: str,
                 act_bytes: int = 2, budgets: dict[int, float] | None = None) -> tuple[dict, str]:
    """({stage: ceiling ms per round}, source): source is "costmodel", or "none: <why>" with zeros. `context`:
    committed tokens per request (not the KV capacity); `act_bytes`: the weights' and activations' dtype size;
    `budgets`: {nodes: share of rounds} a `specpilot` engine chose (`predict.observed_budgets`), each budget's
    ceilings weighted by its share (else the engine's largest candidate)."""
    try:
        from specpilot.costmodel import ceilings_ms
    except ImportError:
        return _none("specpilot.costmodel.ceilings_ms is not available yet")
    try:
        out = ceilings_ms(target_cfg, drafter_cfg, engine_cfg, batch, context, _hardware(gpu), act_bytes, budgets)
        return {str(k): float(v) for k, v in dict(out).items()}, "costmodel"
    except Exception as e:  # a cost-model bug must not stop the search, but it must be visible
        return _none(f"ceilings_ms failed: {type(e).__name__}: {' '.join(str(e).split())[:160]}")


def _none(why: str) -> tuple[dict, str]:
    if _state.get("warned") != why:
        log.warning("hardware ceilings unavailable (%s): gaps are measured stage times (ceiling 0)", why)
        _state["warned"] = why
    return {}, f"none: {why}"
