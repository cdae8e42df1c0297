"""Typed view of the composed Hydra config, validated once at start-up.

Hydra composes `conf/` and applies command-line overrides; `validate` resolves interpolations and
checks every key against the pydantic models below. Anything wrong — an unknown key (Hydra accepts any
key added with `+key=...`), a wrong type, a value out of range — is one `ConfigError` whose message is
one line naming the dotted key: `config error: engine.tree_budget: expected an integer, got 'abc'`.

The YAML files in `conf/` hold the defaults; the models here hold types and ranges only, so a field
that the YAML defines has no default here (a key missing from the YAML is an error, not a silent value).
"""

from __future__ import annotations

import re
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

ENGINE_NAMES = ("ar", "stock", "ddtree", "specpilot", "tlv")


class ConfigError(ValueError):
    """The composed config is invalid; the message is one line naming the dotted key."""

    @classmethod
    def at(cls, key: str, problem: str) -> "ConfigError":
        return cls(f"config error: {key}: {problem}")


def _field_error(field: str, problem: str) -> PydanticCustomError:
    """An error raised by a model-level check but reported at one of the model's fields."""
    return PydanticCustomError("field_error", "{problem}", {"field": field, "problem": problem})


PosInt = Annotated[int, Field(ge=1)]
NonNegInt = Annotated[int, Field(ge=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0)]
BlockSize = Annotated[int, Field(ge=2)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# ---- groups -------------------------------------------------------------------------------------------


class RopeScaling(_Strict):
    rope_type: Literal["llama3"]
    factor: PosFloat
    low_freq_factor: PosFloat
    high_freq_factor: PosFloat
    original_max_position_embeddings: PosInt

    @model_validator(mode="after")
    def _freqs(self):
        if self.high_freq_factor <= self.low_freq_factor:
            raise _field_error(
                "high_freq_factor", f"must be > low_freq_factor {self.low_freq_factor}, got {self.high_freq_factor}"
            )
        return self


class ModelGroup(_Strict):
    """Shapes of a synthetic (random-weight) target; ignored when `target.path` is set."""

    family: Literal["qwen3", "llama"]
    vocab_size: PosInt
    hidden_size: PosInt
    intermediate_size: PosInt
    num_layers: PosInt
    num_heads: PosInt
    num_kv_heads: PosInt
    head_dim: Annotated[int, Field(ge=2, multiple_of=2)]
    max_position_embeddings: PosInt
    tie_word_embeddings: bool
    rope_theta: PosFloat
    rope_scaling: RopeScaling | None = None
    rms_norm_eps: PosFloat = 1e-6
    eos_token_ids: list[NonNegInt] = []

    @model_validator(mode="after")
    def _consistent(self):
        if self.num_heads % self.num_kv_heads:
            raise _field_error("num_kv_heads", f"must divide num_heads {self.num_heads}, got {self.num_kv_heads}")
        bad = [t for t in self.eos_token_ids if t >= self.vocab_size]
        if bad:
            raise _field_error("eos_token_ids", f"token id {bad[0]} outside the vocabulary [0, {self.vocab_size})")
        return self


# A checkpoint folder, or null for random weights; an empty string (an unset shell variable in `target.path=$CKPT`) is
# neither, and would otherwise fall back to random weights without a word.
CheckpointPath = Annotated[str, Field(min_length=1)] | None


class TargetGroup(_Strict):
    path: CheckpointPath
    dtype: Literal["float32", "bfloat16"]
    cache_dir: str | None
    seed: NonNegInt


class DrafterGroup(_Strict):
    """A DFlash drafter: a checkpoint folder, or random weights of these shapes when `path` is null."""

    path: CheckpointPath
    block_size: BlockSize
    num_layers: PosInt
    target_layer_ids: Annotated[list[NonNegInt], Field(min_length=1)] | None
    mask_token_id: NonNegInt | None


class SamplingGroup(_Strict):
    temperature: NonNegFloat
    top_k: NonNegInt
    top_p: Annotated[float, Field(gt=0, le=1)]


class DeploymentGroup(_Strict):
    """What the search tunes for (scripts/search.py): hardware, models, workload and proposer."""

    name: str
    gpu: str
    models: Literal["config", "proxy_tiny", "proxy_gpu", "proxy_h200"]
    batch: PosInt
    temperature: NonNegFloat
    proposer: Literal["offline", "gemini"]
    prompts: Literal["auto", "synthetic", "code", "heldout"] | Annotated[list[str], Field(min_length=1)] | Annotated[
        list[Annotated[list[NonNegInt], Field(min_length=1)]], Field(min_length=1)
    ]
    num_prompts: PosInt
    prompt_len: PosInt
    max_new_tokens: PosInt
    max_tree_budget: PosInt
    # layers appended to the target that compute but leave its outputs unchanged (weights.add_passthrough_layers)
    target_passthrough_layers: NonNegInt

    @model_validator(mode="after")
    def _whole_batches(self):
        n = self.num_prompts if isinstance(self.prompts, str) else len(self.prompts)
        if n % self.batch:
            field = "num_prompts" if isinstance(self.prompts, str) else "prompts"
            raise _field_error(field, f"{n} prompts do not split into batches of {self.batch}")
        return self


class ForcingGroup(_Strict):
    """Token forcing's knobs, bounded so that no setting turns the gate off: a tie is a top-2 logit margin below
    `tie_tolerance` (≤ 1 logit: bf16 logits near 30 are 0.125 apart), and `max_restarts` (≤ 64) mismatches are judged a
    prompt. `reference` is what scripts/force.py compares with; the search always forces against stock."""

    reference: Literal["stock", "ar"]
    tie_tolerance: Annotated[float, Field(ge=0, le=1.0)]
    max_restarts: Annotated[int, Field(ge=0, le=64)]


class WandbGroup(_Strict):
    mode: Literal["offline", "online", "disabled"]
    project: str
    entity: str | None


class GeminiGroup(_Strict):
    model: str
    base_url: str | None
    timeout_s: PosFloat
    max_attempts: PosInt
    backoff_s: NonNegFloat


class SearchGroup(_Strict):
    rounds: PosInt
    candidates_per_round: PosInt
    min_gain: NonNegFloat
    min_rounds: PosInt
    max_seconds: PosFloat | None
    measure_repeats: PosInt
    profile_rounds: PosInt
    profile_all: bool
    workers: Literal["auto"] | NonNegInt
    resume: str | None
    memory_dir: str | None
    write_memory: bool
    compile_cache_dir: str | None
    wandb: WandbGroup
    gemini: GeminiGroup


KernelImpl = Literal["xla", "mosaic_gpu"]


class KernelsGroup(_Strict):
    """Which ops run on the Hopper kernels, process-wide (`pallas_kernels.choices`, applied by `build.load_models`)."""

    matmul: KernelImpl
    norm: KernelImpl
    rope: KernelImpl
    swiglu: KernelImpl
    swiglu_matmul: KernelImpl
    qkv_rope_matmul: KernelImpl
    pdl: bool


def _proxy_spec(v: Any):
    """The `proxy` group is checked by its own schema (`specpilot.training.spec`, which the GPU entry point
    also reads without pydantic); its errors are reported at the dotted key like every other group's."""
    from specpilot.training.spec import ProxySpec, SpecError

    if isinstance(v, ProxySpec):
        return v
    try:
        return ProxySpec.from_dict(v)
    except SpecError as e:
        if e.key:
            raise _field_error(e.key, e.problem) from None
        raise PydanticCustomError("proxy_error", "{problem}", {"problem": e.problem}) from None


# A trained proxy target/drafter pair (conf/proxy/): validated into a `specpilot.training.spec.ProxySpec`.
ProxyGroup = Annotated[Any, BeforeValidator(_proxy_spec)]


# ---- engines: a union discriminated on `name` ---------------------------------------------------------


class _EngineBase(_Strict):
    weight_format: Literal["bf16", "w12"] = "bf16"
    # verify attention: xla (dense mask) | cudnn (NVIDIA GPUs) | pallas_tree (pallas_kernels/tree_attention);
    # specpilot/models/target.py
    attention: Literal["xla", "cudnn", "pallas_tree"] = "xla"


class AREngineConfig(_EngineBase):
    name: Literal["ar"]


class StockEngineConfig(_EngineBase):
    name: Literal["stock"]
    block_size: BlockSize | None  # null = the drafter's block_size


class DDTreeEngineConfig(_EngineBase):
    name: Literal["ddtree"]
    block_size: BlockSize | None
    tree_budget: PosInt


class SpecPilotEngineConfig(_EngineBase):
    name: Literal["specpilot"]
    block_size: BlockSize | None
    tree_budget: PosInt
    budget_candidates: Annotated[list[PosInt], Field(min_length=1)]
    verify_cost_ms: Annotated[dict[PosInt, PosFloat], Field(min_length=1)]
    draft_cost_ms: NonNegFloat

    @model_validator(mode="after")
    def _a_candidate_within_budget(self):
        if min(self.budget_candidates) > self.tree_budget:  # the engine drops those above (decoding/budget.py)
            raise _field_error("budget_candidates", f"none is <= engine.tree_budget {self.tree_budget}, "
                                                    f"got {_short(self.budget_candidates)}")
        return self


class TLVEngineConfig(_EngineBase):
    name: Literal["tlv"]
    block_size: BlockSize | None
    tree_budget: PosInt
    level1_format: Literal["int8", "fp8"]


EngineConfig = Annotated[
    Union[AREngineConfig, StockEngineConfig, DDTreeEngineConfig, SpecPilotEngineConfig, TLVEngineConfig],
    Field(discriminator="name"),
]
_ENGINE_CLASSES = {
    "ar": AREngineConfig,
    "stock": StockEngineConfig,
    "ddtree": DDTreeEngineConfig,
    "specpilot": SpecPilotEngineConfig,
    "tlv": TLVEngineConfig,
}


# ---- root ---------------------------------------------------------------------------------------------


def _bad_prompt(what: str, got: Any) -> PydanticCustomError:
    return PydanticCustomError("prompt_error", "expected {what}, got {got}", {"what": what, "got": _short(got)})


class RootConfig(_Strict):
    model: ModelGroup
    drafter: DrafterGroup
    engine: EngineConfig
    deployment: DeploymentGroup
    search: SearchGroup
    kernels: KernelsGroup
    target: TargetGroup
    prompt: str | list[str] | None
    prompt_ids: list[int] | list[list[int]] | None
    max_new_tokens: PosInt
    context: PosInt | None
    seed: NonNegInt
    sampling: SamplingGroup
    forcing: ForcingGroup
    proxy: ProxyGroup

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, v):
        ok = v is None or isinstance(v, str) or (
            isinstance(v, list) and v and all(isinstance(s, str) for s in v)
        )
        if not ok:
            raise _bad_prompt("a string or a non-empty list of strings", v)
        return v

    @field_validator("prompt_ids", mode="before")
    @classmethod
    def _prompt_ids(cls, v):
        if v is None:
            return v
        what = "a non-empty list of token ids, or a list of such lists"
        if not isinstance(v, list) or not v:
            raise _bad_prompt(what, v)
        rows = v if all(isinstance(r, list) for r in v) else [v]
        for row in rows:
            if not row or not all(type(t) is int for t in row):
                raise _bad_prompt(what, v)
        return v

    @model_validator(mode="after")
    def _one_prompt(self):
        if self.prompt is not None and self.prompt_ids is not None:
            raise _field_error("prompt", "give either prompt or prompt_ids, not both")
        return self

    @model_validator(mode="after")
    def _w12_packs_bf16(self):
        if self.engine.weight_format == "w12" and self.target.dtype != "bfloat16":
            raise _field_error("engine.weight_format",
                               f"w12 packs bfloat16 weights; set target.dtype=bfloat16 (now {self.target.dtype})")
        return self

    @property
    def needs_drafter(self) -> bool:
        return self.engine.name != "ar"


# ---- validation and one-line errors -------------------------------------------------------------------


def _short(x: Any, limit: int = 60) -> str:
    s = repr(x)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _model_at(loc: list) -> type[BaseModel] | None:
    """The pydantic model class that a (tag-free) location points into, for 'known keys' hints."""
    cls: Any = RootConfig
    for part in loc:
        if cls is RootConfig and part == "engine":
            return None  # resolved by the caller from the tag
        field = getattr(cls, "model_fields", {}).get(part)
        if field is None:
            return None
        models = [a for a in (field.annotation, *typing.get_args(field.annotation)) if isinstance(a, type)
                  and issubclass(a, BaseModel)]
        if not models:
            return None
        cls = models[0]
    return cls


def is_known_key(dotted: str) -> bool:
    """Whether `a.b.c` names a field of the schema (any engine's field counts under `engine.`)."""
    parts = dotted.split(".")
    if parts[0] == "engine":
        return len(parts) == 2 and any(parts[1] in c.model_fields for c in _ENGINE_CLASSES.values())
    owner = _model_at(parts[:-1]) if len(parts) > 1 else RootConfig
    return owner is not None and parts[-1] in owner.model_fields


def _format(err: dict) -> str:
    loc = list(err["loc"])
    kind, inp, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    owner = None
    if loc[:1] == ["engine"] and len(loc) > 1 and loc[1] in _ENGINE_CLASSES:
        tag = loc.pop(1)
        owner = _ENGINE_CLASSES[tag] if len(loc) == 2 else None
    if kind == "field_error":
        loc.append(ctx["field"])
    key_kind = bool(loc) and loc[-1] == "[key]"
    if key_kind:
        loc.pop()
    key = ""
    for part in loc:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    key = key or "<root>"
    got = f", got {_short(inp)}"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        key += ".name"
        if kind == "union_tag_not_found":
            return f"config error: {key}: missing required key"
        names = ", ".join(repr(n) for n in ENGINE_NAMES)
        return f"config error: {key}: expected one of {names}, got {_short(ctx.get('tag'))}"
    if kind == "extra_forbidden":
        if owner is None:
            owner = _model_at(loc[:-1])
        hint = f" (known keys: {', '.join(owner.model_fields)})" if owner else ""
        return f"config error: {key}: unknown key{hint}"
    problems = {
        "missing": "missing required key",
        "int_type": "expected an integer" + got,
        "int_parsing": "expected an integer" + got,
        "int_from_float": "expected an integer" + got,
        "float_type": "expected a number" + got,
        "float_parsing": "expected a number" + got,
        "bool_type": "expected true or false" + got,
        "bool_parsing": "expected true or false" + got,
        "string_type": "expected a string" + got,
        "list_type": "expected a list" + got,
        "dict_type": "expected a mapping" + got,
        "model_type": "expected a mapping" + got,
        "model_attributes_type": "expected a mapping" + got,
        "literal_error": f"expected {ctx.get('expected')}" + got,
        "greater_than_equal": f"must be >= {ctx.get('ge')}" + got,
        "greater_than": f"must be > {ctx.get('gt')}" + got,
        "less_than_equal": f"must be <= {ctx.get('le')}" + got,
        "less_than": f"must be < {ctx.get('lt')}" + got,
        "multiple_of": f"must be a multiple of {ctx.get('multiple_of')}" + got,
        "too_short": "must not be empty",
        "string_too_short": "must not be empty (a checkpoint folder, or null for random weights)",
    }
    problem = problems.get(kind) or err["msg"].removeprefix("Value error, ")
    if key_kind:
        problem = "mapping key: " + problem
    return f"config error: {key}: {problem}"


def validate(cfg: Any) -> RootConfig:
    """Resolve interpolations and validate; raises ConfigError (one line) on the first problem."""
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(cfg, DictConfig):
        try:
            data = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        except OmegaConfBaseException as e:
            key = getattr(e, "full_key", None) or "<root>"
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError.at(key, first) from None
    elif isinstance(cfg, Mapping):
        data = dict(cfg)
    else:
        raise ConfigError(f"config error: <root>: expected a mapping, got {type(cfg).__name__}")
    data.pop("hydra", None)  # present only when composed with return_hydra_config=True
    try:
        return RootConfig.model_validate(data)
    except ValidationError as e:
        errs = e.errors()
        line, used = _format_union(errs) or (_format(errs[0]), 1)
        more = f" (and {len(errs) - used} more)" if len(errs) > used else ""
        raise ConfigError(line + more) from None


_UNION_MEMBER = re.compile(r"(literal\[.*\]|(constrained-)?(int|float|str|bool)|none|list\[.*\]|dict\[.*\])")


def _format_union(errs: list[dict]) -> tuple[str, int] | None:
    """One line for a value every member of a union refused (pydantic reports one error per member, each at a
    location ending in the member's tag, `search.workers.literal['auto']` and `search.workers.constrained-int`): the
    key without the tags, each member's expectation, the value once. None when the first error is not such a one."""
    loc = errs[0]["loc"]
    if not loc or not isinstance(loc[-1], str) or not _UNION_MEMBER.fullmatch(loc[-1]):
        return None
    members = [e for e in errs if e["loc"][:-1] == loc[:-1] and isinstance(e["loc"][-1], str)
               and _UNION_MEMBER.fullmatch(e["loc"][-1])]
    got = f", got {_short(errs[0].get('input'))}"
    lines = [_format({**e, "loc": e["loc"][:-1]}) for e in members]
    head = _format({"loc": loc[:-1], "type": "missing"}).removesuffix(": missing required key")
    wants = [line[len(head) + 2:].removesuffix(got) for line in lines]
    wants = list(dict.fromkeys(wants))  # two list members refusing [] alike: "must not be empty" once
    wants = [w if i == 0 else w.removeprefix("expected ") for i, w in enumerate(wants)]
    return f"{head}: {' or '.join(wants)}{got}", len(members)
