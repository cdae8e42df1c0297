"""From a validated `RootConfig` to models, prompts and an engine: the one path every script takes.

    cfg = validate(hydra_cfg)
    target_cfg, target_w, drafter_cfg, drafter_w, tokenizer = load_models(cfg)
    prompts = make_prompts(cfg, tokenizer)
    engine = build_engine(cfg, target_cfg, target_w, drafter_cfg, drafter_w)
    result = engine.generate(prompts, cfg.max_new_tokens, cfg.seed)

A target is an HF checkpoint (`target.path`) or random weights of the `model` group's shapes; a drafter
(every engine but `ar`) is a z-lab DFlash checkpoint (`drafter.path`) or random weights whose layers
follow the target's shapes.
"""

from __future__ import annotations

import os

from pathlib import Path

from specpilot.config import ConfigError, RootConfig
from specpilot.models.config import (
    CheckpointError,
    DrafterConfig,
    ModelConfig,
    default_target_layer_ids,  # noqa: F401  (re-exported: tests and docs name it here)
    model_config_from_shapes,
)
from specpilot.models.config import synthetic_drafter_config as shared_synthetic_drafter_config

# Used when no prompt is given and the target is random, so `scripts/generate.py` runs with no arguments.
DEFAULT_PROMPT_IDS = (1, 17, 42, 7, 99, 3)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def _dtype(name: str):
    import jax.numpy as jnp

    return {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[name]


def target_config_from_group(cfg: RootConfig) -> ModelConfig:
    """A ModelConfig from the `model` group (synthetic shapes)."""
    return model_config_from_shapes(cfg.model.model_dump())


def synthetic_drafter_config(cfg: RootConfig, target: ModelConfig) -> DrafterConfig:
    """A DrafterConfig of the `drafter` group's shapes whose layers match the target's width."""
    d = cfg.drafter
    t = target.num_layers
    bad = [i for i in (d.target_layer_ids or ()) if i >= t]
    if bad:
        raise ConfigError.at("drafter.target_layer_ids", f"layer {bad[0]} outside the target's {t} layers")
    if d.mask_token_id is not None and d.mask_token_id >= target.vocab_size:
        raise ConfigError.at(
            "drafter.mask_token_id", f"{d.mask_token_id} outside the target's vocabulary [0, {target.vocab_size})"
        )
    return shared_synthetic_drafter_config(
        target, d.num_layers, d.block_size, tuple(d.target_layer_ids) if d.target_layer_ids else None, d.mask_token_id
    )


def _check_drafter_fits(path: str, drafter: DrafterConfig, target: ModelConfig) -> None:
    if drafter.layers.hidden_size != target.hidden_size:
        raise CheckpointError(
            f"drafter {path}: hidden_size {drafter.layers.hidden_size} does not match the target's {target.hidden_size}"
        )
    bad = [i for i in drafter.target_layer_ids if not 0 <= i < target.num_layers]
    if bad:
        raise CheckpointError(f"drafter {path}: target layer {bad[0]} outside the target's {target.num_layers} layers")
    if not 0 <= drafter.mask_token_id < target.vocab_size:
        raise CheckpointError(
            f"drafter {path}: mask_token_id {drafter.mask_token_id} outside the target's vocabulary "
            f"[0, {target.vocab_size})"
        )


def load_tokenizer(path: str | Path):
    """The checkpoint's tokenizer, or None when the folder has no tokenizer files."""
    path = Path(path)
    if not has_tokenizer_files(path):
        return None
    # transformers warns at import that it found no PyTorch (only its tokenizers are used here): stderr stays ours
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # a half-written tokenizer must be a clear error, not a deep traceback
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: unreadable tokenizer files: {first}") from None


def apply_kernel_choices(cfg: RootConfig) -> None:
    """The `kernels` group's implementations set process-wide (`pallas_kernels.choices.use`), before any trace."""
    from pallas_kernels import choices

    choices.use(**cfg.kernels.model_dump())


def check_backend(cfg: RootConfig) -> None:
    """ConfigError for an engine this JAX backend cannot run: `engine.attention=cudnn` needs an NVIDIA GPU (on
    another backend `jax.nn.dot_product_attention` raises from inside the first trace)."""
    import jax

    platform = jax.devices()[0].platform
    if cfg.engine.attention == "cudnn" and platform != "gpu":
        raise ConfigError.at("engine.attention", f"cudnn needs an NVIDIA GPU; this backend is {platform!r} "
                             "(use xla or pallas_tree)")


def load_models(cfg: RootConfig, with_drafter: bool | None = None):
    """(target_cfg, target_weights, drafter_cfg | None, drafter_weights | None, tokenizer | None).

    The drafter is loaded when the engine needs one, or when `with_drafter` says so. Every script's path goes
    through here first, so the `kernels` group is applied here (`apply_kernel_choices`), before any trace, and
    what this backend cannot run fails here, before any weight loads (`check_backend`)."""
    from specpilot.models import hf, weights

    check_backend(cfg)
    apply_kernel_choices(cfg)

    dtype = _dtype(cfg.target.dtype)
    cache_dir = cfg.target.cache_dir
    tokenizer = None
    proxy_drafter = None
    if cfg.target.path:
        target_cfg, target_w = hf.load_target(cfg.target.path, dtype, cache_dir)
        tokenizer = load_tokenizer(cfg.target.path)
    elif proxy_backed(cfg):
        from specpilot.training.proxy import ensure_proxy

        # the deployment's trained pair: trained on first use, then loaded from the cache
        target_dir, proxy_drafter = ensure_proxy(cfg.proxy if cfg.proxy.name == cfg.deployment.models
                                                 else cfg.deployment.models)
        target_cfg, target_w = hf.load_target(target_dir, dtype, cache_dir)
        tokenizer = load_tokenizer(target_dir)
    else:
        target_cfg = target_config_from_group(cfg)
        target_w = weights.init_random_target(target_cfg, cfg.target.seed, dtype)
    drafter_cfg = drafter_w = None
    if cfg.needs_drafter if with_drafter is None else with_drafter:
        if cfg.drafter.path:
            drafter_cfg, drafter_w = hf.load_drafter(cfg.drafter.path, dtype, cache_dir)
            _check_drafter_fits(cfg.drafter.path, drafter_cfg, target_cfg)
        elif proxy_drafter is not None:
            drafter_cfg, drafter_w = hf.load_drafter(proxy_drafter, dtype, cache_dir)
        else:
            drafter_cfg = synthetic_drafter_config(cfg, target_cfg)
            drafter_w = weights.init_random_drafter(drafter_cfg, cfg.target.seed + 1, dtype)
    return target_cfg, target_w, drafter_cfg, drafter_w, tokenizer


def proxy_backed(cfg: RootConfig) -> bool:
    """Whether the target (and drafter) are the deployment's trained proxy pair (`deployment.models`, e.g.
    proxy_tiny) rather than random weights: only when `target.path` is null. The `proxy` group's recipe is
    used (with its overrides) when it is the one named; otherwise conf/proxy/<models>.yaml."""
    return not cfg.target.path and cfg.deployment.models != "config"


def has_tokenizer_files(path: str | Path) -> bool:
    return any((Path(path) / f).is_file() for f in _TOKENIZER_FILES)


def _no_tokenizer(cfg: RootConfig) -> ConfigError:
    owner = "target checkpoint" if cfg.target.path else "random target (target.path is null)"
    return ConfigError.at("prompt", f"{owner} has no tokenizer; use prompt_ids")


def _check_prompt_choice(cfg: RootConfig) -> None:
    if cfg.prompt is not None and cfg.prompt_ids is not None:
        raise ConfigError.at("prompt", "give either prompt or prompt_ids, not both")
    if cfg.prompt is None and cfg.prompt_ids is None and cfg.target.path is not None:
        raise ConfigError.at("prompt", "no prompt given; set prompt=TEXT or prompt_ids=[...]")


def check_prompt_source(cfg: RootConfig) -> None:
    """The prompt checks that need no weights, so a bad prompt config fails before a long load."""
    _check_prompt_choice(cfg)
    if cfg.prompt is not None and not (cfg.target.path and has_tokenizer_files(cfg.target.path)) \
            and not proxy_backed(cfg):
        raise _no_tokenizer(cfg)


def make_prompts(cfg: RootConfig, tokenizer) -> list[list[int]]:
    """Token-id prompts from `prompt_ids` or `prompt` (exactly one); a default one for a random target."""
    _check_prompt_choice(cfg)
    if cfg.prompt is not None and tokenizer is None:
        raise _no_tokenizer(cfg)
    if cfg.prompt_ids is not None:
        ids = cfg.prompt_ids
        rows = ids if isinstance(ids[0], list) else [ids]
        return [list(r) for r in rows]
    if cfg.prompt is not None:
        texts = [cfg.prompt] if isinstance(cfg.prompt, str) else list(cfg.prompt)
        return [list(tokenizer.encode(t)) for t in texts]
    return [[i % cfg.model.vocab_size for i in DEFAULT_PROMPT_IDS]]


def sampling_of(cfg: RootConfig):
    from specpilot.decoding.sampling import Sampling

    s = cfg.sampling
    return Sampling(temperature=float(s.temperature), top_k=s.top_k, top_p=float(s.top_p))


def build_engine(cfg: RootConfig, target_cfg: ModelConfig, target_w, drafter_cfg=None, drafter_w=None):
    """The engine named by `cfg.engine`, via `specpilot.decoding.make_engine`."""
    from specpilot.decoding import make_engine

    block = getattr(cfg.engine, "block_size", None)
    if drafter_cfg is not None and block is not None and block > drafter_cfg.block_size:
        raise ConfigError.at("engine.block_size", f"{block} exceeds the drafter's block_size {drafter_cfg.block_size} "
                                                  "(it fills blocks of at most the size it was trained on)")
    return make_engine(cfg.engine.model_dump(), target_cfg, target_w, drafter_cfg, drafter_w, sampling_of(cfg),
                       cfg.context)
