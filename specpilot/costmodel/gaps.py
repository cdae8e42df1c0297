"""The gap report: each round stage's measured time against its hardware ceiling, ranked by what the gap
costs per committed token. This is what the search loop reads first every round.

Inputs are plain dicts so any engine (real, fake) and any ceiling model can feed it:
- `profile`: `Engine.profile(...)` output — {"stage_ms": {stage: ms per round}, "tokens_per_round": ...}
- `ceilings_ms`: {stage: ms per round at the hardware limit} (bytes ÷ bandwidth or FLOPs ÷ peak, larger).
"""

from __future__ import annotations


def gap_report(profile: dict, ceilings_ms: dict) -> dict:
    tokens = max(float(profile["tokens_per_round"]), 1e-9)
    components = []
    for stage, measured in profile["stage_ms"].items():
        ceiling = float(ceilings_ms.get(stage, 0.0))
        gap = max(float(measured) - ceiling, 0.0)
        components.append(
            {
                "stage": stage,
                "measured_ms": float(measured),
                "ceiling_ms": ceiling,
                "gap_ms": gap,
                "gap_ms_per_token": gap / tokens,
                "ratio": float(measured) / ceiling if ceiling > 0 else None,
            }
        )
    components.sort(key=lambda c: c["gap_ms_per_token"], reverse=True)
    round_ms = sum(c["measured_ms"] for c in components)
    return {
        "engine": profile.get("engine"),
        "round_ms": round_ms,
        "tokens_per_round": tokens,
        "ms_per_token": round_ms / tokens,
        "components": components,
    }
