"""Cost model: where a round's time goes and how far each stage is from the hardware's limits.

    hw = load_or_calibrate()                                   # measured bandwidth and matmul peak, cached
    ceil = ceilings_ms(target_cfg, drafter_cfg, engine_cfg, batch, context, hw)
    report = gap_report(engine.profile(prompts, max_new), ceil) # measured vs ceiling, ranked per token
    model = StepTimeModel.fit(rows)                            # t_stage(x, B) from measured rounds
    model.predict_step(engine_cfg, batch, block)               # any (engine, budget, batch)

See docs/costmodel.md.
"""

from specpilot.costmodel.counts import Cost, ceilings_ms, stage_costs
from specpilot.costmodel.gaps import gap_report
from specpilot.costmodel.hardware import Hardware, calibrate, load_or_calibrate
from specpilot.costmodel.predict import (
    StepTimeModel,
    TauProfile,
    choose_budget,
    config_label,
    leave_one_out,
    speedup,
    stage_points,
)

__all__ = [
    "Cost", "Hardware", "StepTimeModel", "TauProfile", "calibrate", "ceilings_ms", "choose_budget", "config_label",
    "gap_report", "leave_one_out", "load_or_calibrate", "speedup", "stage_costs", "stage_points",
]
