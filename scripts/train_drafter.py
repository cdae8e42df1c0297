"""Train a DFlash drafter against a frozen proxy target on the target's own greedy continuations; resumable.

    python scripts/train_drafter.py hydra.run.dir=runs/tiny           # the target of scripts/train_target.py there
    python scripts/train_drafter.py target.path=DIR hydra.run.dir=runs/d   # another exported proxy target

The target comes from `target.path`, else from `<hydra.run.dir>/target`; it needs the proxy tokenizer
(its `<|mask|>` token is the drafter's mask). The run folder gets `run/drafter/` (greedy sequences, orbax
checkpoints) and `drafter/` (z-lab DFlash layout). The last stdout line is JSON (held-out loss, folder).
"""

from __future__ import annotations

import json
import logging

import hydra
from omegaconf import DictConfig

from specpilot.cli import guarded, run_cli


def run(hydra_cfg: DictConfig) -> None:
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig

    from specpilot.config import ConfigError, validate

    for noisy in ("jax", "absl", "orbax"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    cfg = validate(hydra_cfg)
    from specpilot.training.proxy import build_drafter, make_tracker

    work = Path(HydraConfig.get().runtime.output_dir)
    target = Path(cfg.target.path) if cfg.target.path else work / "target"
    if not (target / "config.json").is_file():
        raise ConfigError.at("target.path", f"no target checkpoint in {target}; run scripts/train_target.py "
                             "with the same hydra.run.dir first, or set target.path")
    tracker = make_tracker(cfg.proxy, work)
    try:
        report = build_drafter(cfg.proxy, work, target, tracker)
    finally:
        tracker.finish()
    held = report["held_out"]
    print(json.dumps({"drafter_dir": str(work / "drafter"), "held_out_loss": held["loss"],
                      "held_out_stock_tau_simulated": held["stock_tau_simulated"],
                      "row_accuracy": held["row_accuracy"], "steps": report["steps"]}), flush=True)


@hydra.main(config_path="../conf", config_name="config", version_base=None)
def main(hydra_cfg: DictConfig) -> None:
    guarded(run, hydra_cfg)


if __name__ == "__main__":
    run_cli(main)
