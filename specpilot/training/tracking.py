"""W&B logging for training runs, offline by default and optional everywhere.

`wandb` is imported lazily: on a machine without it (the GPU machine) or with `mode: disabled`, `Tracker` is
a no-op. Offline runs write under the run folder (`<run_dir>/wandb`); `wandb sync` uploads them later. Only
the recipe and metrics are logged: never the environment, never credentials.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


class Tracker:
    def __init__(self, mode: str, project: str, run_dir: str | Path, name: str, config: dict | None = None):
        self.run = None
        mode = os.environ.get("SPECPILOT_WANDB_MODE", mode)  # e.g. `disabled` for a quick local run
        if mode == "disabled":
            return
        try:
            import wandb
        except ImportError:
            log.info("wandb is not installed: metrics go to the log only")
            return
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("WANDB_SILENT", "true")
        run_id = f"{name}-{hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:8]}"  # resumes
        try:
            self.run = wandb.init(
                project=project, name=name, id=run_id, resume="allow", mode=mode, dir=str(run_dir),
                config=config or {}, settings=wandb.Settings(x_disable_stats=True, console="off"),
            )
        except Exception as e:  # logging must never stop training
            log.warning("wandb.init failed (%s): metrics go to the log only", str(e).splitlines()[0] if str(e) else e)
            self.run = None

    def log(self, metrics: dict, step: int) -> None:
        if self.run is not None:
            self.run.log(metrics, step=step)

    def summary(self, metrics: dict) -> None:
        if self.run is not None:
            self.run.summary.update(metrics)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None
