"""Train the proxy target (tokenizer + Qwen3-architecture model) of a `proxy` recipe; resumable.

    python scripts/train_target.py hydra.run.dir=runs/tiny                       # proxy_tiny
    python scripts/train_target.py proxy=proxy_gpu proxy.target_train.time_budget_s=60 hydra.run.dir=runs/gpu

The run folder (`hydra.run.dir`) gets `tokenizer/`, `run/target/` (orbax checkpoints, W&B offline files) and
`target/` (HF folder: config.json + model.safetensors + tokenizer). Run the same command again after an
interruption: it resumes from the last checkpoint. The last stdout line is JSON (held-out loss, folder).
`scripts/train_drafter.py` with the same `hydra.run.dir` trains the drafter for it.
"""

from __future__ import annotations

import json
import logging

import hydra
from omegaconf import DictConfig

from specpilot.cli import guarded, run_cli


def run(hydra_cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from specpilot.config import validate

    for noisy in ("jax", "absl", "orbax"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    cfg = validate(hydra_cfg)
    from pathlib import Path

    from specpilot.training.proxy import build_target, make_tracker

    work = Path(HydraConfig.get().runtime.output_dir)
    tracker = make_tracker(cfg.proxy, work)
    try:
        report = build_target(cfg.proxy, work, tracker)
    finally:
        tracker.finish()
    print(json.dumps({"target_dir": str(work / "target"), "held_out_loss": report["held_out_loss"],
                      "train_loss": report["train_loss"], "steps": report["steps"], "params": report["params"]}),
          flush=True)


@hydra.main(config_path="../conf", config_name="config", version_base=None)
def main(hydra_cfg: DictConfig) -> None:
    guarded(run, hydra_cfg)


if __name__ == "__main__":
    run_cli(main)
