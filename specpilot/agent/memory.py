"""Structured memory: one JSON record per validated mechanism (memory_store/README.md has the schema).

A mechanism is validated when a candidate that applies it passed token forcing against stock and beat
the incumbent by at least `search.min_gain`. Its record holds the delta, the full engine config, the
deployment it was measured on, the measured gain with its evidence (run, trial, token-forcing summary)
and preconditions — the deployment properties under which the gain is expected to carry over. A new
search loads the records whose preconditions its deployment meets, most similar deployment first.

Records are written atomically (a temporary file, fsync, `os.replace`), indented and sorted, so people
can read and diff them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from specpilot.tracking import scrub

log = logging.getLogger("specpilot.search")

SCHEMA_VERSION = 1
DEFAULT_DIR = Path(__file__).resolve().parents[2] / "memory_store"
MAX_HISTORY = 10


class Evidence(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run_id: str
    trial_id: str
    run_dir: str
    commit: str | None = None
    date: str
    speedup_over_ar: float
    base_speedup_over_ar: float
    relative_gain: float
    tau: float
    ms_per_token: float
    forcing: dict  # token-forcing summary: passed, reference, positions_checked, num_violations, num_ties

    @model_validator(mode="after")
    def _validated(self) -> "Evidence":
        """Only evidence of a validated mechanism is memory: forcing passed with no violation, and a gain."""
        if self.forcing.get("passed") is not True or self.forcing.get("num_violations", 0) != 0:
            raise ValueError(f"trial {self.trial_id}: token forcing did not pass ({self.forcing.get('num_violations')} "
                             "violations)")
        if not self.relative_gain > 0:
            raise ValueError(f"trial {self.trial_id}: relative_gain {self.relative_gain} is no gain")
        return self


class MemoryRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: int = SCHEMA_VERSION
    name: str
    mechanism: str  # one line: what changed and the hypothesis it confirmed
    delta: dict[str, Any]  # knob -> value, relative to base_config
    base_config: dict[str, Any]
    config: dict[str, Any]  # the full engine config measured
    addresses: str  # the round stage (or "tau") whose cost per token it cut most
    deployment: dict[str, Any]
    preconditions: dict[str, Any]
    gain: Evidence  # the latest measurement
    history: list[Evidence] = Field(default_factory=list)

    @field_validator("config", "base_config")
    @classmethod
    def _int_keys(cls, v: dict) -> dict:
        from specpilot.agent.space import normalize

        return normalize(v)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", text).strip("_")[:120]


def delta_name(delta: dict) -> str:
    return "+".join(f"{k}={v}" for k, v in sorted(delta.items(), key=lambda kv: (kv[0] != "engine", kv[0])))


def deployment_fingerprint(descriptor: dict) -> str:
    keys = ("gpu", "device_kind", "models", "target", "drafter", "batch", "temperature")
    text = json.dumps({k: descriptor.get(k) for k in keys}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def preconditions_for(descriptor: dict, config: dict, stock_tau: float) -> dict:
    """Where the gain should carry over: the same platform (cpu / gpu) and sampling regime, a batch within
    4×, a stock τ within 2× (how well the drafter matches the target), and what the config itself needs
    from the deployment."""
    pre: dict[str, Any] = {
        "platform": [descriptor.get("platform")],  # CPU and GPU timings are different worlds
        "greedy": descriptor.get("temperature", 0.0) == 0.0,
        "batch": {"min": max(1, descriptor.get("batch", 1) // 4), "max": descriptor.get("batch", 1) * 4},
        "stock_tau": {"min": round(stock_tau / 2, 3), "max": round(stock_tau * 2, 3)},
    }
    if config.get("weight_format") == "w12":
        pre["target.dtype"] = ["bfloat16"]
    if config.get("block_size"):
        pre["drafter.block_size"] = {"min": config["block_size"]}
    if "tree_budget" in config:
        pre["max_tree_budget"] = {"min": config["tree_budget"]}
    return pre


def _lookup(descriptor: dict, dotted: str) -> Any:
    cur: Any = descriptor
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def unmet(preconditions: dict, descriptor: dict) -> str | None:
    """None if `descriptor` (plus `stock_tau`, `greedy`) meets every precondition, else the first unmet one."""
    facts = {**descriptor, "greedy": descriptor.get("temperature", 0.0) == 0.0}
    for key, want in preconditions.items():
        have = _lookup(facts, key)
        if isinstance(want, dict):
            if have is None or ("min" in want and have < want["min"]) or ("max" in want and have > want["max"]):
                return f"{key}={have} outside {want}"
        elif isinstance(want, list):
            if have not in want:
                return f"{key}={have} not in {want}"
        elif have != want:
            return f"{key}={have} != {want}"
    return None


def similarity(a: dict, b: dict) -> int:
    """How alike two deployments are (higher = more): GPU, models, shapes, batch."""
    score = 0
    score += 4 * (a.get("gpu") == b.get("gpu") and a.get("device_kind") == b.get("device_kind"))
    score += 3 * (a.get("models") == b.get("models"))
    score += 2 * (a.get("target") == b.get("target"))
    score += 1 * (a.get("drafter") == b.get("drafter"))
    score += 1 * (a.get("batch") == b.get("batch"))
    return score


class MemoryStore:
    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root else DEFAULT_DIR
        self.records_dir = self.root / "records"

    def check_writable(self) -> None:
        """OSError now, not after a search's last round, when records cannot be written here: the folder is made and
        a file written into it and removed."""
        self.records_dir.mkdir(parents=True, exist_ok=True)
        probe = self.records_dir / f".write-check-{os.getpid()}"
        probe.write_text("")
        probe.unlink()

    def load_all(self) -> list[tuple[Path, MemoryRecord]]:
        out = []
        if not self.records_dir.is_dir():
            return out
        for path in sorted(self.records_dir.glob("*.json")):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError) as e:  # ValueError: bad JSON, or bytes that are not UTF-8
                log.warning("memory: skipping unreadable %s (%s)", path.name, e)
                continue
            if not isinstance(data, dict):
                log.warning("memory: skipping %s (a JSON %s, not a record)", path.name, type(data).__name__)
                continue
            if data.get("schema_version") != SCHEMA_VERSION:
                log.warning("memory: skipping %s (schema_version %s, this code reads %s)", path.name,
                            data.get("schema_version"), SCHEMA_VERSION)
                continue
            try:
                out.append((path, MemoryRecord.model_validate(data)))
            except ValidationError as e:
                log.warning("memory: skipping invalid %s (%s)", path.name, e.errors()[0]["msg"])
        return out

    def matching(self, descriptor: dict, exclude_run: str | None = None) -> list[MemoryRecord]:
        """Records whose preconditions `descriptor` meets; most similar deployment, then largest gain first.
        `exclude_run`: the evidence of that run is left out (a record only it measured is skipped, one it updated
        keeps its previous measurement), so a resumed search sees the memory it started with."""
        found = []
        for path, rec in self.load_all():
            if exclude_run is not None and rec.gain.run_id == exclude_run:
                older = [e for e in rec.history if e.run_id != exclude_run]
                if not older:
                    continue
                rec = rec.model_copy(update={"gain": older[0], "history": older[1:]})
            try:
                why = unmet(rec.preconditions, descriptor)
            except TypeError as e:  # a precondition of the wrong type for its fact, e.g. {"min": "4"}
                log.warning("memory: skipping %s (precondition not comparable: %s)", path.name, e)
                continue
            if why is None:
                found.append(rec)
            else:
                log.debug("memory: %s does not apply (%s)", path.name, why)
        found.sort(key=lambda r: (-similarity(r.deployment, descriptor), -r.gain.relative_gain, r.name))
        return found

    def path_for(self, descriptor: dict, delta: dict, base_engine: str) -> Path:
        name = f"{slug(descriptor.get('name', 'deployment'))}-{deployment_fingerprint(descriptor)}" \
               f"--{slug(base_engine)}--{slug(delta_name(delta))}.json"
        return self.records_dir / name

    def write(self, record: MemoryRecord) -> Path:
        """Write (or update: the previous measurement moves to `history`) the record, atomically."""
        path = self.path_for(record.deployment, record.delta, record.base_config.get("name", "engine"))
        if path.exists():
            try:
                old = MemoryRecord.model_validate(json.loads(path.read_text()))
                seen = {(e.run_id, e.trial_id) for e in [old.gain, *old.history]}
                if (record.gain.run_id, record.gain.trial_id) in seen:
                    return path  # the same evidence (a resumed search replaying its round): nothing new
                record = record.model_copy(update={"history": ([old.gain] + old.history)[:MAX_HISTORY]})
            except (OSError, ValueError):  # unreadable or invalid (a ValidationError is a ValueError): replaced
                pass
        atomic_write(path, json.dumps(scrub(record.model_dump()), indent=2, sort_keys=True) + "\n")
        return path


def atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` so a reader sees the old file or the whole new one, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
