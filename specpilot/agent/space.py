"""The config space the search explores: every engine knob with its type, range and constraints.

A candidate is a *delta* — `{knob: value}` with the knob names below — applied to the incumbent engine
config (`conf/engine/<name>.yaml` keys). `ConfigSpace.apply` returns the new engine config or raises
`SpaceError` whose message says why the delta is outside the space; that message is what a proposer is
told next round. Knobs that exist in the design but not yet in the engines (`available=False`) are
listed so a proposer knows of them, and rejected with the reason when proposed.

Switching `engine` starts from that engine's YAML defaults and carries over the knobs both engines have
(weight format, attention, block size, tree budget), clamped into this deployment's ranges.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from specpilot.config import ENGINE_NAMES

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
TREE_ENGINES = ("ddtree", "specpilot", "tlv")
DRAFTING_ENGINES = ("stock", *TREE_ENGINES)
# Knobs the engines read but the search does not set: the search fits them from its own trials' stage times
# (`Search._with_fitted_costs`, the cost model's `StepTimeModel.specpilot_config`); before any tree engine
# was profiled they are conf/engine/specpilot.yaml's.
DERIVED = {
    "verify_cost_ms": "not searched: the specpilot budget policy's verify-cost curve is fitted from this search's "
                      "measured trials (the cost model)",
    "draft_cost_ms": "not searched: the specpilot budget policy's fixed per-round cost is fitted from this search's "
                     "measured trials (the cost model)",
}
# Knobs carried over when the engine kind changes (when the new engine has them).
_CARRIED = ("weight_format", "attention", "block_size", "tree_budget", "level1_format")


class SpaceError(ValueError):
    """A delta or config outside the config space; the message is the reason, in one line."""


@dataclasses.dataclass(frozen=True)
class Knob:
    name: str
    kind: str  # "categorical" | "int" | "int_list"
    engines: tuple[str, ...]
    description: str
    choices: tuple[str, ...] = ()
    low: int | None = None
    high: int | None = None
    nullable: bool = False
    null_means: str = ""
    available: bool = True
    unavailable_reason: str = ""

    def check(self, value: Any) -> Any:
        """The value if it is inside this knob's range, else SpaceError with the reason."""
        if not self.available:
            raise SpaceError(f"{self.name}: not available yet ({self.unavailable_reason})")
        if value is None:
            if self.nullable:
                return None
            raise SpaceError(f"{self.name}: null is not allowed")
        if self.kind == "categorical":
            if not isinstance(value, str):  # a list or dict from a proposer is no choice (and is unhashable)
                raise SpaceError(f"{self.name}: expected one of {', '.join(map(repr, self.choices))}, got {value!r}")
            if value not in self.choices:
                raise SpaceError(f"{self.name}: expected one of {', '.join(map(repr, self.choices))}, got {value!r}")
            return value
        if self.kind == "int":
            return self._int(value, self.name)
        if self.kind == "int_list":
            if not isinstance(value, list) or not value:
                raise SpaceError(f"{self.name}: expected a non-empty list of integers, got {value!r}")
            if len(value) > 16:
                raise SpaceError(f"{self.name}: at most 16 entries, got {len(value)}")
            return sorted({self._int(v, self.name) for v in value})
        raise AssertionError(self.kind)

    def _int(self, value: Any, where: str) -> int:
        if type(value) is not int:
            raise SpaceError(f"{where}: expected an integer, got {value!r}")
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            raise SpaceError(f"{where}: {value} outside [{self.low}, {self.high}]")
        return value

    def describe(self) -> dict:
        d: dict[str, Any] = {"name": self.name, "type": self.kind, "applies_to": list(self.engines),
                             "description": self.description}
        if self.choices:
            d["choices"] = list(self.choices)
        if self.low is not None:
            d["range"] = [self.low, self.high]
        if self.nullable:
            d["null_means"] = self.null_means
        if not self.available:
            d["available"] = False
            d["why_unavailable"] = self.unavailable_reason
        return d


def load_engine_defaults(conf_dir: Path | None = None) -> dict[str, dict]:
    """Each engine's defaults, from conf/engine/<name>.yaml (the single source of defaults)."""
    from omegaconf import OmegaConf

    folder = Path(conf_dir or CONF_DIR) / "engine"
    out = {}
    for name in ENGINE_NAMES:
        cfg = OmegaConf.to_container(OmegaConf.load(folder / f"{name}.yaml"), resolve=True)
        out[name] = normalize(cfg)
    return out


def normalize(cfg: dict) -> dict:
    """JSON round trips turn the int keys of `verify_cost_ms` into strings; turn them back."""
    cfg = dict(cfg)
    if isinstance(cfg.get("verify_cost_ms"), dict):
        cfg["verify_cost_ms"] = {int(k): float(v) for k, v in cfg["verify_cost_ms"].items()}
    return cfg


def config_key(cfg: dict) -> str:
    """Canonical text of an engine config: equal knobs, equal keys (also across JSON round trips). The
    DERIVED keys are left out: a specpilot config is the same candidate whatever cost table measurement has
    given it so far."""
    return json.dumps({k: v for k, v in normalize(cfg).items() if k not in DERIVED}, sort_keys=True, default=str)


def describe_config(cfg: dict) -> str:
    """Short human form: `ddtree tree_budget=32 weight_format=w12` (defaults of the kind left out)."""
    parts = [cfg["name"]]
    for k in ("block_size", "tree_budget", "budget_candidates", "level1_format", "weight_format", "attention"):
        if k in cfg and not (k == "weight_format" and cfg[k] == "bf16") and not (k == "attention" and cfg[k] == "xla"):
            if k == "block_size" and cfg[k] is None:
                continue
            parts.append(f"{k}={cfg[k]}")
    return " ".join(str(p) for p in parts)


class ConfigSpace:
    """The knobs of one deployment: ranges follow its drafter, target dtype and tree-budget limit."""

    def __init__(self, drafter_block_size: int, max_tree_budget: int, target_dtype: str,
                 engine_defaults: dict[str, dict] | None = None, platform: str = "gpu"):
        self.drafter_block_size = int(drafter_block_size)
        self.max_tree_budget = int(max_tree_budget)
        self.target_dtype = target_dtype
        self.platform = platform  # jax's: cudnn attention exists on "gpu" only
        self.engine_defaults = engine_defaults or load_engine_defaults()
        self.knobs: dict[str, Knob] = {k.name: k for k in self._knobs()}

    def _knobs(self) -> list[Knob]:
        b, t = self.drafter_block_size, self.max_tree_budget
        return [
            Knob("engine", "categorical", ENGINE_NAMES, choices=ENGINE_NAMES,
                 description="decoding loop: ar (target alone), stock (DFlash chain), ddtree (best-first tree, "
                             "fixed budget), specpilot (tree with a cost-aware budget per round), tlv (two-level "
                             "verification: a quantized target picks a path in a big tree, the exact target "
                             "verifies only that path)"),
            Knob("block_size", "int", DRAFTING_ENGINES, low=2, high=b, nullable=True,
                 null_means=f"the drafter's block size ({b})",
                 description="tokens per drafter block (draft depth + 1); smaller = cheaper draft, shorter chains"),
            Knob("tree_budget", "int", TREE_ENGINES, low=1, high=t,
                 description="draft tree nodes verified per round (specpilot: the largest budget considered; "
                             "tlv: the level-1 tree size)"),
            Knob("budget_candidates", "int_list", ("specpilot",), low=1, high=t,
                 description="budgets the cost-aware policy chooses from each round; each <= tree_budget"),
            Knob("level1_format", "categorical", ("tlv",), choices=("int8", "fp8"),
                 description="weight-only precision of tlv's level-1 target copy"),
            Knob("weight_format", "categorical", ENGINE_NAMES, choices=("bf16", "w12"),
                 description="target/drafter weight storage: bf16, or w12 (lossless 12-bit: fewer bytes per "
                             "verify; needs bfloat16 weights)"),
            Knob("attention", "categorical", ENGINE_NAMES, choices=("xla", "cudnn", "pallas_tree"),
                 description="attention implementation of every target pass (the AR step and verify)"),
            Knob("tlv_paths", "int", ("tlv",), low=1, high=8, available=False,
                 unavailable_reason="tlv verifies exactly one level-1 path today",
                 description="level-1 paths tlv hands to the exact target"),
            Knob("w12_tiling", "categorical", ENGINE_NAMES, available=False,
                 unavailable_reason="W12 kernel tile sizes are not wired through the engine config yet",
                 description="W12 matmul kernel TuningConfig (tile_n, tile_m, tile_k, stages, split_k)"),
            Knob("batch_scheduling", "categorical", ENGINE_NAMES, available=False,
                 unavailable_reason="the deployment fixes the batch; continuous batching is not implemented",
                 description="how requests are grouped into decode batches"),
        ]

    # ---- describing -------------------------------------------------------------------------------

    def describe(self) -> dict:
        """What a proposer is told: knobs, their ranges and the constraints between them."""
        return {
            "knobs": [k.describe() for k in self.knobs.values()],
            "constraints": [
                "a knob applies only to the engines listed in its applies_to",
                f"weight_format=w12 needs bfloat16 target weights (this deployment: {self.target_dtype})",
                f"attention=cudnn needs an NVIDIA GPU (this deployment's platform: {self.platform})",
                "every budget_candidates entry <= tree_budget",
                f"block_size <= the drafter's block size {self.drafter_block_size}",
                f"tree_budget <= {self.max_tree_budget} (this deployment's limit)",
                "changing engine starts from that engine's defaults and keeps weight_format, attention, "
                "block_size, tree_budget, level1_format where the new engine has them",
                "verify_cost_ms and draft_cost_ms are not proposed: fitted from this search's measured trials",
            ],
            "engine_defaults": {n: self._clamped(dict(d)) for n, d in self.engine_defaults.items()},
        }

    # ---- applying and checking --------------------------------------------------------------------

    def _clamped(self, cfg: dict) -> dict:
        if "tree_budget" in cfg:
            cfg["tree_budget"] = min(int(cfg["tree_budget"]), self.max_tree_budget)
        if "budget_candidates" in cfg:
            cands = sorted({int(c) for c in cfg["budget_candidates"] if int(c) <= cfg["tree_budget"]})
            cfg["budget_candidates"] = cands or [cfg["tree_budget"]]
        if cfg.get("block_size") is not None:
            cfg["block_size"] = min(int(cfg["block_size"]), self.drafter_block_size)
        return cfg

    def switched(self, base: dict, engine: str) -> dict:
        """`base` moved to another engine kind: that engine's defaults plus the carried knobs."""
        if engine not in self.engine_defaults:
            raise SpaceError(f"engine: expected one of {', '.join(map(repr, ENGINE_NAMES))}, got {engine!r}")
        cfg = dict(self.engine_defaults[engine])
        for k in _CARRIED:
            if k in cfg and k in base:
                cfg[k] = base[k]
        return self._clamped(cfg)

    def apply(self, base: dict, delta: dict) -> dict:
        """The engine config `base` with `delta` applied, checked against the space (SpaceError if not)."""
        if not isinstance(delta, dict) or not delta:
            raise SpaceError("empty change: a candidate must set at least one knob")
        for name in delta:
            if name in DERIVED:
                raise SpaceError(f"{name}: {DERIVED[name]}")
            if name == "name":
                raise SpaceError("name: use the knob 'engine' to change the engine kind")
            if name not in self.knobs:
                raise SpaceError(f"{name}: unknown knob (knobs: {', '.join(self.knobs)})")
        engine = self.knobs["engine"].check(delta.get("engine", base["name"]))
        cfg = self.switched(base, engine) if engine != base["name"] else dict(base)
        for name, value in delta.items():
            if name == "engine":
                continue
            knob = self.knobs[name]
            if not knob.available:
                knob.check(value)  # raises with the reason
            if engine not in knob.engines:
                raise SpaceError(f"{name}: applies to {', '.join(knob.engines)}, not {engine}")
            cfg[name] = knob.check(value)
        if engine == "specpilot" and "budget_candidates" not in delta:
            cfg = self._clamped(cfg)  # a smaller tree_budget drops the candidates above it
        self.check(cfg)
        return cfg

    def check(self, cfg: dict) -> None:
        """Raise SpaceError if a full engine config is outside the space."""
        from pydantic import ValidationError

        from specpilot.config import _ENGINE_CLASSES

        cfg = normalize(cfg)
        name = cfg.get("name")
        if not isinstance(name, str) or name not in self.engine_defaults:
            raise SpaceError(f"engine: expected one of {', '.join(map(repr, ENGINE_NAMES))}, got {name!r}")
        for key, value in cfg.items():
            knob = self.knobs.get(key)
            if knob is not None and key != "engine":
                knob.check(value)
        if cfg.get("weight_format") == "w12" and self.target_dtype != "bfloat16":
            raise SpaceError(
                f"weight_format=w12: needs bfloat16 target weights, this deployment's are {self.target_dtype}")
        if cfg.get("attention") == "cudnn" and self.platform != "gpu":
            raise SpaceError(f"attention=cudnn: needs an NVIDIA GPU, this deployment runs on {self.platform}")
        if name == "specpilot" and {"budget_candidates", "tree_budget"} <= set(cfg) and \
                max(cfg["budget_candidates"]) > cfg["tree_budget"]:  # a missing one: the engine schema names it
            raise SpaceError(
                f"budget_candidates: {max(cfg['budget_candidates'])} exceeds tree_budget {cfg['tree_budget']}")
        try:
            _ENGINE_CLASSES[name].model_validate(cfg)
        except ValidationError as e:
            err = e.errors()[0]
            raise SpaceError(f"{'.'.join(map(str, err['loc'])) or name}: {err['msg']}") from None

    def diff(self, base: dict, cfg: dict) -> dict:
        """The delta that `apply(base, delta)` turns into `cfg` (knob names; empty if equal)."""
        start = self.switched(base, cfg["name"]) if cfg["name"] != base["name"] else dict(base)
        delta = {"engine": cfg["name"]} if cfg["name"] != base["name"] else {}
        for k, v in cfg.items():
            if k in self.knobs and k != "engine" and start.get(k) != v:
                delta[k] = v
        return delta

    # ---- local moves ------------------------------------------------------------------------------

    def moves(self, cfg: dict) -> list[dict]:
        """Every single-knob delta one step from `cfg` that stays inside the space (engine kinds,
        categorical flips, numeric knobs scaled by 0.5, 0.75, 1.5, 2)."""
        out: list[dict] = []
        for e in ENGINE_NAMES:
            if e != cfg["name"]:
                out.append({"engine": e})
        for name in ("tree_budget", "block_size"):
            if name not in cfg:
                continue
            cur = cfg[name] if cfg[name] is not None else self.drafter_block_size
            for f in (0.5, 0.75, 1.5, 2.0):
                v = int(round(cur * f))
                if v != cur:
                    out.append({name: v})
        if cfg["name"] == "specpilot":
            powers = [2**i for i in range(2, 12) if 2**i <= cfg["tree_budget"]] or [cfg["tree_budget"]]
            if powers != cfg["budget_candidates"]:
                out.append({"budget_candidates": powers})
        for name in ("level1_format", "weight_format"):
            if name in cfg:
                for v in self.knobs[name].choices:
                    if v != cfg[name]:
                        out.append({name: v})
        valid, seen = [], set()
        for d in out:
            try:
                key = config_key(self.apply(cfg, d))
            except SpaceError:
                continue
            if key not in seen:
                seen.add(key)
                valid.append(d)
        return valid
