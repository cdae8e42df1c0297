"""The proxy deployment's recipe (`conf/proxy/<name>.yaml`) as frozen dataclasses, checked key by key.

This module is the one schema of the `proxy` group: `specpilot.config` validates the Hydra-composed
`proxy` section through `ProxySpec.from_dict`, and the GPU entry point (`python -m specpilot.training.proxy`,
where hydra/omegaconf/pydantic are not installed) reads the YAML file directly with `load_spec`. Like the
rest of the config, defaults live in the YAML only: every field here is required, and an unknown key, a
wrong type or a value out of range is one `SpecError` naming the dotted key.

No JAX import here: the config validator imports this module before JAX starts.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any

CONF_DIR = Path(__file__).resolve().parents[2] / "conf" / "proxy"


class SpecError(ValueError):
    """A bad proxy recipe; `key` is the dotted key inside the group ('' for the group itself)."""

    def __init__(self, key: str, problem: str):
        self.key, self.problem = key, problem
        super().__init__(f"config error: proxy{'.' + key if key else ''}: {problem}")


def _range(ge=None, gt=None, le=None):
    return {"ge": ge, "gt": gt, "le": le}


def _field(**rng):
    return dataclasses.field(metadata=_range(**rng))


@dataclasses.dataclass(frozen=True)
class CorpusSpec:
    include_tests: bool  # the stdlib's own test suites (test/, */tests/, idle_test/)
    site_packages: bool  # also the interpreter's site-packages (differs per machine)
    held_out_fraction: float = _field(gt=0, le=0.5)
    max_file_bytes: int = _field(ge=1)  # skip larger files (generated tables)
    max_train_bytes: int | None = _field(ge=1)  # cap on training text (files in stable hash order); null = all


@dataclasses.dataclass(frozen=True)
class TokenizerSpec:
    # model vocabulary; the BPE may use fewer ids on a small corpus, never fewer than its 256 bytes + 2 special tokens
    vocab_size: int = _field(ge=258)
    min_frequency: int = _field(ge=1)
    max_train_bytes: int | None = _field(ge=1)  # text the BPE merges are learnt from; null = the whole train split


@dataclasses.dataclass(frozen=True)
class ShapeSpec:
    """Qwen3 target shapes (vocab from the tokenizer section)."""

    hidden_size: int = _field(ge=8)
    intermediate_size: int = _field(ge=8)
    num_layers: int = _field(ge=1)
    num_heads: int = _field(ge=1)
    num_kv_heads: int = _field(ge=1)
    head_dim: int = _field(ge=2)
    rope_theta: float = _field(gt=0)
    max_position_embeddings: int = _field(ge=16)


@dataclasses.dataclass(frozen=True)
class TrainSpec:
    """One optimisation run: AdamW, linear warmup then cosine decay to `lr * final_lr_fraction`."""

    batch_size: int = _field(ge=1)
    steps: int = _field(ge=1)  # planned steps (an upper bound when time_budget_s is set)
    time_budget_s: float | None = _field(gt=0)  # fit the step count to this wall time (measured after warm-up)
    lr: float = _field(gt=0)
    final_lr_fraction: float = _field(ge=0, le=1)
    warmup_steps: int = _field(ge=0)
    weight_decay: float = _field(ge=0)
    grad_clip: float = _field(gt=0)
    dtype: str  # compute dtype: float32 | bfloat16 (master weights stay float32)
    checkpoint_every: int = _field(ge=1)
    log_every: int = _field(ge=1)
    eval_batches: int = _field(ge=1)


@dataclasses.dataclass(frozen=True)
class TargetTrainSpec(TrainSpec):
    seq_len: int = _field(ge=8)


@dataclasses.dataclass(frozen=True)
class DrafterShapeSpec:
    num_layers: int = _field(ge=1)
    intermediate_size: int = _field(ge=8)
    block_size: int = _field(ge=2)
    target_layer_ids: list[int] | None  # null = z-lab's spread over the target's layers


@dataclasses.dataclass(frozen=True)
class DrafterTrainSpec(TrainSpec):
    prompt_tokens: int = _field(ge=1)  # corpus prefix the target continues greedily
    generate_tokens: int = _field(ge=1)  # length of each greedy continuation
    num_sequences: int = _field(ge=1)  # greedy sequences generated for training
    generate_batch: int = _field(ge=1)
    anchors_per_sequence: int = _field(ge=1)
    loss_decay: float = _field(gt=0)  # block row k (1-based) weighs exp(-(k - 1) / loss_decay)


@dataclasses.dataclass(frozen=True)
class EvalSpec:
    num_prompts: int = _field(ge=1)
    prompt_tokens: int = _field(ge=1)  # held-out snippets; HumanEval prompts keep their last this-many tokens
    max_new_tokens: int = _field(ge=1)
    batch_size: int = _field(ge=1)  # prompts per generate call


@dataclasses.dataclass(frozen=True)
class WandbSpec:
    mode: str  # offline | online | disabled
    project: str


@dataclasses.dataclass(frozen=True)
class ProxySpec:
    name: str
    seed: int = _field(ge=0)
    corpus: CorpusSpec
    tokenizer: TokenizerSpec
    target: ShapeSpec
    target_train: TargetTrainSpec
    drafter: DrafterShapeSpec
    drafter_train: DrafterTrainSpec
    eval: EvalSpec
    wandb: WandbSpec

    @classmethod
    def from_dict(cls, data: Any) -> "ProxySpec":
        spec = _parse(cls, data, "")
        _check(spec)
        return spec

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def fingerprint_dict(self) -> dict:
        """What decides the trained weights (not where they are used or how the run is logged)."""
        d = self.to_dict()
        for k in ("name", "wandb"):
            d.pop(k)
        return d

    def replace(self, **sections) -> "ProxySpec":
        return dataclasses.replace(self, **sections)


_CHOICES = {
    ("target_train", "dtype"): ("float32", "bfloat16"),
    ("drafter_train", "dtype"): ("float32", "bfloat16"),
    ("wandb", "mode"): ("offline", "online", "disabled"),
}


def _describe(x: Any) -> str:
    s = repr(x)
    return s if len(s) <= 60 else s[:57] + "..."


def _parse(cls, data: Any, prefix: str):
    if not isinstance(data, dict):
        raise SpecError(prefix, f"expected a mapping, got {_describe(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for k in data:
        if k not in fields:
            raise SpecError(f"{prefix}{k}", f"unknown key (known keys: {', '.join(fields)})")
    out = {}
    for name, f in fields.items():
        key = f"{prefix}{name}"
        if name not in data:
            raise SpecError(key, "missing required key")
        out[name] = _value(hints[name], data[name], key, f.metadata)
        choices = _CHOICES.get(tuple(key.split(".")))
        if choices and out[name] not in choices:
            raise SpecError(key, f"expected one of {', '.join(map(repr, choices))}, got {_describe(out[name])}")
    return cls(**out)


def _value(tp, v: Any, key: str, rng) -> Any:
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        if v is None:
            if type(None) in args:
                return None
            raise SpecError(key, "must not be null")
        tp = next(a for a in args if a is not type(None))
        args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return _parse(tp, v, key + ".")
    if typing.get_origin(tp) is list:
        if not isinstance(v, list):
            raise SpecError(key, f"expected a list, got {_describe(v)}")
        return [_value(args[0], x, f"{key}[{i}]", {}) for i, x in enumerate(v)]
    if tp is bool:
        if not isinstance(v, bool):
            raise SpecError(key, f"expected true or false, got {_describe(v)}")
        return v
    if tp is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise SpecError(key, f"expected an integer, got {_describe(v)}")
    elif tp is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise SpecError(key, f"expected a number, got {_describe(v)}")
        v = float(v)
    elif tp is str:
        if not isinstance(v, str):
            raise SpecError(key, f"expected a string, got {_describe(v)}")
        return v
    if rng.get("ge") is not None and v < rng["ge"]:
        raise SpecError(key, f"must be >= {rng['ge']}, got {_describe(v)}")
    if rng.get("gt") is not None and v <= rng["gt"]:
        raise SpecError(key, f"must be > {rng['gt']}, got {_describe(v)}")
    if rng.get("le") is not None and v > rng["le"]:
        raise SpecError(key, f"must be <= {rng['le']}, got {_describe(v)}")
    return v


def _check(s: ProxySpec) -> None:
    t = s.target
    if t.num_heads % t.num_kv_heads:
        raise SpecError("target.num_kv_heads", f"must divide num_heads {t.num_heads}, got {t.num_kv_heads}")
    if t.head_dim % 2:
        raise SpecError("target.head_dim", f"must be even, got {t.head_dim}")
    if s.target_train.seq_len > t.max_position_embeddings:
        raise SpecError("target_train.seq_len", f"exceeds target.max_position_embeddings {t.max_position_embeddings}")
    ids = s.drafter.target_layer_ids
    if ids is not None:
        if not ids:
            raise SpecError("drafter.target_layer_ids", "must not be empty")
        bad = [i for i in ids if not 0 <= i < t.num_layers]
        if bad:
            raise SpecError("drafter.target_layer_ids", f"layer {bad[0]} outside the target's {t.num_layers} layers")
    d = s.drafter_train
    seq = d.prompt_tokens + d.generate_tokens
    if seq > t.max_position_embeddings:
        raise SpecError("drafter_train.generate_tokens", "prompt_tokens + generate_tokens exceed the target's "
                        f"max_position_embeddings {t.max_position_embeddings}")
    if d.generate_tokens < s.drafter.block_size:  # anchors: prompt_tokens <= a <= len - block
        raise SpecError("drafter_train.generate_tokens", f"must be >= drafter.block_size {s.drafter.block_size} "
                        f"(a block after an anchor in the generated part), got {d.generate_tokens}")
    if seq < s.drafter.block_size + 2:
        raise SpecError("drafter_train.generate_tokens", f"sequences of {seq} tokens are shorter than a block + 2")


def spec_path(name: str) -> Path:
    return CONF_DIR / f"{name}.yaml"


def available() -> list[str]:
    return sorted(p.stem for p in CONF_DIR.glob("*.yaml"))


def load_spec(name_or_path: str | Path, overrides: list[str] = ()) -> ProxySpec:
    """A recipe by name (`proxy_tiny`) or YAML path, with `a.b=value` overrides (values parsed as YAML)."""
    import yaml

    p = Path(name_or_path)
    if not p.suffix:
        p = spec_path(str(name_or_path))
        if not p.is_file():
            raise SpecError("", f"no recipe {str(name_or_path)!r} (available: {', '.join(available())})")
    data = yaml.safe_load(p.read_text())
    for ov in overrides:
        dotted, sep, raw = ov.partition("=")
        if not sep:
            raise SpecError(dotted, f"override {ov!r} is not KEY=VALUE")
        node = data
        parts = dotted.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                raise SpecError(dotted, "unknown key")
            node = node[part]
        if parts[-1] not in node:
            raise SpecError(dotted, "unknown key")
        node[parts[-1]] = yaml.safe_load(raw)
    return ProxySpec.from_dict(data)


def dumps(spec: ProxySpec) -> str:
    return json.dumps(spec.to_dict(), indent=1, sort_keys=True)
