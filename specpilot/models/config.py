"""Static model configs built from Hugging Face `config.json` files.

Configs are frozen, hashable dataclasses so they can be passed as static arguments to `jax.jit`.
Only what the forward pass needs is kept; anything we do not implement is rejected loudly here,
at load time, rather than producing silently wrong logits later.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path

SUPPORTED_TARGETS = {
    "Qwen3ForCausalLM": "qwen3",
    "LlamaForCausalLM": "llama",
}
SUPPORTED_DRAFTERS = {"DFlashDraftModel"}


class CheckpointError(ValueError):
    """A checkpoint folder or file is unusable; the message names the file or tensor."""


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    kind: str = "default"  # "default" or "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer (Qwen3 dense or Llama 3.x)."""

    family: str  # "qwen3" | "llama"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = RopeConfig()
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    eos_token_ids: tuple[int, ...] = ()

    @property
    def qk_norm(self) -> bool:
        return self.family == "qwen3"

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def replace(self, **kw) -> "ModelConfig":
        return dataclasses.replace(self, **kw)


@dataclasses.dataclass(frozen=True)
class DrafterConfig:
    """A DFlash block-diffusion drafter (z-lab layout).

    It has Qwen3-style layers but no embedding or LM head: it borrows the target's.
    `layers` describes the drafter's own transformer stack (vocab fields unused).
    """

    layers: ModelConfig
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f"missing file: {path}")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"unreadable JSON in {path}: {e}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got a {type(data).__name__}")
    return data


def _rope_from_hf(d: dict) -> RopeConfig:
    # transformers >= 5 writes `rope_parameters`; older files write `rope_theta` + `rope_scaling`. As in transformers 5,
    # a `rope_scaling` replaces `rope_parameters` whole (its theta, if not in it, is `rope_theta`).
    merged = dict(d.get("rope_scaling") or d.get("rope_parameters") or {})
    theta = float(merged.get("rope_theta", d.get("rope_theta", 10000.0)))
    kind = merged.get("rope_type", merged.get("type", "default")) or "default"
    if kind == "default":
        return RopeConfig(theta=theta)
    if kind == "llama3":
        return RopeConfig(
            theta=theta,
            kind="llama3",
            factor=float(merged["factor"]),
            low_freq_factor=float(merged["low_freq_factor"]),
            high_freq_factor=float(merged["high_freq_factor"]),
            original_max_position=int(merged.get("original_max_position_embeddings", d["max_position_embeddings"])),
        )
    raise CheckpointError(f"unsupported rope_type {kind!r} (supported: default, llama3)")


def _eos_ids(d: dict) -> tuple[int, ...]:
    eos = d.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))


def _layers_from_hf(d: dict, family: str, where: str, drafter: bool = False) -> ModelConfig:
    try:
        hidden = int(d["hidden_size"])
        heads = int(d["num_attention_heads"])
        split = hidden // heads
        # absent keys take the config class's defaults (Qwen3Config: head_dim 128, 32 KV heads); null ones fall back
        # to hidden / heads and heads, as transformers does
        qwen3 = {"head_dim": 128, "num_key_value_heads": 32} if family == "qwen3" else {}
        cfg = ModelConfig(
            family=family,
            vocab_size=int(d.get("vocab_size", 0)),
            hidden_size=hidden,
            intermediate_size=int(d["intermediate_size"]),
            num_layers=int(d["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(d.get("num_key_value_heads", qwen3.get("num_key_value_heads")) or heads),
            head_dim=int(d.get("head_dim", qwen3.get("head_dim")) or split),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope=_rope_from_hf(d),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
            eos_token_ids=_eos_ids(d),
        )
    except KeyError as e:
        raise CheckpointError(f"{where}: missing config key {e.args[0]!r}") from None
    except CheckpointError:  # ours already names the problem (a ValueError too: not to be wrapped again)
        raise
    except (TypeError, ValueError, ZeroDivisionError, AttributeError) as e:  # e.g. "hidden_size": "abc" or null
        raise CheckpointError(f"{where}: bad config value ({e})") from None
    _refuse_unsupported(d, where, drafter)
    if cfg.num_heads % cfg.num_kv_heads:
        raise CheckpointError(f"{where}: num_attention_heads {heads} not divisible by num_key_value_heads")
    return cfg


def _refuse_unsupported(d: dict, where: str, drafter: bool = False) -> None:
    """A config feature this forward does not implement changes the outputs: refused, never ignored. A drafter's
    sliding-window layers only move its drafts (output stays the target's), so they are run as full attention with a
    warning rather than refused."""
    if d.get("attention_bias"):
        raise CheckpointError(f"{where}: attention_bias=true is not supported")
    if d.get("mlp_bias"):
        raise CheckpointError(f"{where}: mlp_bias=true is not supported")
    if _has_sliding_layers(d):
        if drafter:
            logging.getLogger(__name__).warning("%s: sliding-window layers run as full attention (the drafts, and "
                                                "so the acceptance, may differ from the reference drafter's)", where)
        else:
            raise CheckpointError(f"{where}: sliding-window attention layers are not supported (full attention only)")
    quant = d.get("quantization_config")
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
        raise CheckpointError(f"{where}: quantized checkpoints ({method}) are not supported; give bf16 / fp32 weights")
    if d.get("hidden_act", "silu") not in ("silu", "swish"):  # transformers' "swish" is the same function
        raise CheckpointError(f"{where}: hidden_act={d.get('hidden_act')!r} is not supported (silu only)")


def _has_sliding_layers(d: dict) -> bool:
    """Whether any layer attends through a sliding window, read as transformers' Qwen3 config does: ``layer_types``
    where given, else ``use_sliding_window`` (with a ``sliding_window``) for the layers from ``max_window_layers``
    (default 28) on. So ``use_sliding_window`` with ``max_window_layers`` >= the layer count is full attention."""
    types = d.get("layer_types")
    if types is not None:
        return any(t != "full_attention" for t in types)
    if not d.get("use_sliding_window") or d.get("sliding_window", 4096) is None:
        return False
    return int(d.get("num_hidden_layers") or 0) > int(d.get("max_window_layers", 28))


def target_config_from_hf(path: str | Path) -> ModelConfig:
    path = Path(path)
    d = _read_json(path / "config.json")
    archs = d.get("architectures") or []
    family = next((SUPPORTED_TARGETS[a] for a in archs if a in SUPPORTED_TARGETS), None)
    if family is None:
        raise CheckpointError(
            f"{path / 'config.json'}: unsupported architectures {archs} (supported: {sorted(SUPPORTED_TARGETS)})"
        )
    cfg = _layers_from_hf(d, family, str(path / "config.json"))
    gen = path / "generation_config.json"
    if gen.is_file():  # its stop tokens are what HF's generate stops at (Qwen3 lists <|im_end|> and <|endoftext|>)
        generation = _read_json(gen)
        try:
            extra = _eos_ids(generation)
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{gen}: bad eos_token_id ({e})") from None
        cfg = cfg.replace(eos_token_ids=tuple(dict.fromkeys(cfg.eos_token_ids + extra)))
    return cfg


def drafter_config_from_hf(path: str | Path) -> DrafterConfig:
    path = Path(path)
    where = str(path / "config.json")
    d = _read_json(path / "config.json")
    archs = d.get("architectures") or []
    if not SUPPORTED_DRAFTERS.intersection(archs):
        raise CheckpointError(f"{where}: unsupported drafter architectures {archs} (supported: DFlashDraftModel)")
    dflash = d.get("dflash_config") or {}
    try:
        return DrafterConfig(
            layers=_layers_from_hf(d, "qwen3", where, drafter=True),
            block_size=int(d["block_size"]),
            mask_token_id=int(dflash["mask_token_id"]),
            target_layer_ids=tuple(int(i) for i in dflash["target_layer_ids"]),
            num_target_layers=int(d.get("num_target_layers", 0)),
        )
    except KeyError as e:
        raise CheckpointError(f"{where}: missing DFlash config key {e.args[0]!r}") from None
    except CheckpointError:
        raise
    except (TypeError, ValueError, AttributeError) as e:  # e.g. "mask_token_id": null, "dflash_config": [1]
        raise CheckpointError(f"{where}: bad DFlash config value ({e})") from None


def rope_inv_freq(rope: RopeConfig, head_dim: int):
    """Per-frequency inverse wavelengths (numpy, float64 then float32), incl. llama3 scaling."""
    import numpy as np

    inv = 1.0 / (rope.theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if rope.kind == "llama3":
        low_wl = rope.original_max_position / rope.low_freq_factor
        high_wl = rope.original_max_position / rope.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wl, inv / rope.factor, inv)
        smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = (wavelen >= high_wl) & (wavelen <= low_wl)
        inv = np.where(medium, smoothed, scaled)
    return inv.astype(np.float32)


def model_config_from_shapes(m: dict) -> ModelConfig:
    """A ModelConfig from a `conf/model/*.yaml` mapping (synthetic shapes; rope_scaling optional)."""
    rope = RopeConfig(theta=float(m.get("rope_theta", 10000.0)))
    s = m.get("rope_scaling")
    if s:
        rope = RopeConfig(
            theta=rope.theta,
            kind=s["rope_type"],
            factor=float(s["factor"]),
            low_freq_factor=float(s["low_freq_factor"]),
            high_freq_factor=float(s["high_freq_factor"]),
            original_max_position=int(s["original_max_position_embeddings"]),
        )
    return ModelConfig(
        family=m["family"],
        vocab_size=int(m["vocab_size"]),
        hidden_size=int(m["hidden_size"]),
        intermediate_size=int(m["intermediate_size"]),
        num_layers=int(m["num_layers"]),
        num_heads=int(m["num_heads"]),
        num_kv_heads=int(m["num_kv_heads"]),
        head_dim=int(m["head_dim"]),
        rms_norm_eps=float(m.get("rms_norm_eps", 1e-6)),
        rope=rope,
        tie_word_embeddings=bool(m.get("tie_word_embeddings", False)),
        max_position_embeddings=int(m.get("max_position_embeddings", 4096)),
        eos_token_ids=tuple(m.get("eos_token_ids") or ()),
    )


def default_target_layer_ids(num_drafter_layers: int, num_target_layers: int) -> tuple[int, ...]:
    """z-lab's spread of the drafter's context layers over the target (clamped for tiny targets)."""
    n, t = num_drafter_layers, num_target_layers
    ids = [t // 2] if n == 1 else [int(round(1 + i * (t - 4) / (n - 1))) for i in range(n)]
    return tuple(min(max(i, 0), t - 1) for i in ids)


def synthetic_drafter_config(
    target: ModelConfig,
    num_layers: int = 5,
    block_size: int = 16,
    target_layer_ids: tuple[int, ...] | None = None,
    mask_token_id: int | None = None,
) -> DrafterConfig:
    """A DFlash drafter shaped like z-lab's for `target`: Qwen3 layers of the target's width."""
    layers = target.replace(family="qwen3", num_layers=num_layers, tie_word_embeddings=False, eos_token_ids=())
    return DrafterConfig(
        layers=layers,
        block_size=block_size,
        mask_token_id=target.vocab_size - 1 if mask_token_id is None else mask_token_id,
        target_layer_ids=tuple(target_layer_ids or default_target_layer_ids(num_layers, target.num_layers)),
        num_target_layers=target.num_layers,
    )
