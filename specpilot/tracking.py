"""Experiment tracking: one W&B run per search, offline unless the user asks for online, and a no-op when
W&B is disabled or cannot start (logged once; the search never fails for its tracker).

Nothing secret leaves through here: every config, metric and table passes `scrub`, which drops values
under secret-looking keys and replaces any value equal to a secret from the environment (API keys).
The same `scrub` guards the trial log, `summary.json` and memory records.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("specpilot.tracking")

SECRET_ENV = ("GEMINI_API_KEY", "GOOGLE_API_KEY", "WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
_SECRET_KEY = re.compile(
    r"(api[_-]?key|secret|password|passwd|credential|authorization|access[_-]?token|^token$)", re.I)
REDACTED = "<redacted>"
# `key=value` inside a string (a Hydra override such as `+search.gemini.api_key=...`) under a secret-looking key
_SECRET_ASSIGNMENT = re.compile(
    r"([\w.+-]*(?:api[_-]?key|secret|password|passwd|credential|authorization|access[_-]?token)[\w.-]*=)([^\s,]+)",
    re.I)


def _secret_values() -> set[str]:
    return {v for k in SECRET_ENV if len(v := os.environ.get(k, "")) >= 8}


def scrub(obj: Any, _secrets: set[str] | None = None, also: tuple[str, ...] = ()) -> Any:
    """A copy of `obj` (dicts, lists, scalars) with secrets redacted: the environment's, and `also` (e.g. a key
    passed to a client directly; values shorter than 8 characters are not matched)."""
    secrets = (_secret_values() if _secrets is None else _secrets) | {s for s in also if len(s) >= 8}
    if isinstance(obj, dict):
        return {k: (REDACTED if isinstance(k, str) and _SECRET_KEY.search(k) else scrub(v, secrets))
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub(v, secrets) for v in obj]
    if isinstance(obj, str):
        for s in secrets:
            if s in obj:
                obj = obj.replace(s, REDACTED)
        return _SECRET_ASSIGNMENT.sub(rf"\1{REDACTED}", obj)
    return obj


def resolve_mode(configured: str) -> str:
    """WANDB_MODE (or WANDB_DISABLED) in the environment wins over the config; default offline."""
    if os.environ.get("WANDB_DISABLED", "").lower() in ("1", "true", "yes"):
        return "disabled"
    env = os.environ.get("WANDB_MODE", "").lower()
    if env in ("offline", "online", "disabled"):
        return env
    if env == "dryrun":
        return "offline"
    return configured


class Tracker:
    """Thin W&B wrapper. `mode`: offline | online | disabled."""

    def __init__(self, mode: str, project: str, run_dir: str | Path, run_id: str, config: dict,
                 entity: str | None = None, name: str | None = None):
        self.mode = resolve_mode(mode)
        self.run = None
        self.run_dir = Path(run_dir)
        if self.mode == "disabled":
            log.info("W&B disabled")
            return
        try:
            import wandb

            self._wandb = wandb
            self.run = wandb.init(
                project=project, entity=entity, id=run_id, name=name or run_id, dir=str(self.run_dir),
                mode=self.mode, resume="allow", config=scrub(config), reinit="finish_previous",
                settings=wandb.Settings(console="off", silent=True, save_code=False, disable_git=True),
            )
            where = self.run_dir / "wandb" if self.mode == "offline" else getattr(self.run, "url", "")
            log.info("W&B %s run %s (%s)", self.mode, run_id, where)
        except Exception as e:  # tracking must never take the search down
            log.warning("W&B unavailable (%s): tracking disabled", " ".join(str(e).split())[:200])
            self.run = None

    @property
    def active(self) -> bool:
        return self.run is not None

    def log(self, metrics: dict, step: int | None = None) -> None:
        if self.run is not None:
            self.run.log(scrub(metrics), step=step)

    def summary(self, values: dict) -> None:
        if self.run is not None:
            for k, v in scrub(values).items():
                self.run.summary[k] = v

    def table(self, name: str, columns: list[str], rows: list[list], step: int | None = None) -> None:
        if self.run is not None:
            self.run.log({name: self._wandb.Table(columns=columns, data=scrub(rows))}, step=step)

    def artifact(self, name: str, kind: str, paths: list[str | Path]) -> None:
        if self.run is None or not paths:
            return
        art = self._wandb.Artifact(name, type=kind)
        for p in paths:
            p = Path(p)
            if p.is_dir():
                art.add_dir(str(p), name=p.name)
            elif p.is_file():
                art.add_file(str(p), name=p.name)
        self.run.log_artifact(art)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None
