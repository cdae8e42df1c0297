"""Weight pytrees → Hugging Face checkpoint folders: the inverse of `specpilot.models.hf`.

- Target: `config.json` (transformers-5 style, with `rope_parameters` and the older `rope_theta`),
  `generation_config.json` and `model.safetensors` with HF names; Q/K/V and gate/up are split again and every
  linear weight is transposed back to `[out, in]`. Tokenizer files are copied in when given.
- Drafter: the z-lab DFlash layout (`architectures: [DFlashDraftModel]`, `block_size`, `num_target_layers`,
  `dflash_config.{mask_token_id, target_layer_ids}`; tensors `fc`, `hidden_norm`, `layers.*`, `norm`).

`hf.load_target` / `hf.load_drafter` read the result back to the same trees (bit-exact at the same dtype).
Only plain array leaves are exported: quantized or W12 trees are a runtime format, not a checkpoint.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import ml_dtypes
import numpy as np

from specpilot.models.config import DrafterConfig, ModelConfig
from specpilot.models.weights import DrafterWeights, Layer, TargetWeights

_ST_DTYPES = {
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(ml_dtypes.bfloat16): "BF16",
}
_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def write_safetensors(path: str | Path, tensors: dict[str, np.ndarray], metadata: dict | None = None) -> None:
    """One .safetensors file: 8-byte little-endian header length, JSON header, raw little-endian data."""
    header: dict = {"__metadata__": {"format": "pt", **(metadata or {})}}
    offset = 0
    arrays = []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        if a.dtype not in _ST_DTYPES:
            raise TypeError(f"tensor {name!r}: unsupported dtype {a.dtype}")
        header[name] = {"dtype": _ST_DTYPES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        arrays.append(a)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for a in arrays:
            f.write(a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes())
    tmp.replace(path)


def _np(x, dtype) -> np.ndarray:
    if type(x).__name__ in ("QuantArray", "W12Array"):
        raise TypeError("export needs plain weight arrays, not a quantized or W12-packed tree")
    return np.asarray(np.asarray(x, np.float32), dtype=dtype)


def _layer_tensors(lw: Layer, cfg: ModelConfig, prefix: str, dtype) -> dict[str, np.ndarray]:
    q, kv, inter = cfg.q_size, cfg.kv_size, cfg.intermediate_size
    qkv, gate_up = _np(lw.w_qkv, dtype), _np(lw.w_gate_up, dtype)
    out = {
        "input_layernorm.weight": _np(lw.attn_norm, dtype),
        "self_attn.q_proj.weight": qkv[:, :q].T,
        "self_attn.k_proj.weight": qkv[:, q : q + kv].T,
        "self_attn.v_proj.weight": qkv[:, q + kv :].T,
        "self_attn.o_proj.weight": _np(lw.w_o, dtype).T,
        "post_attention_layernorm.weight": _np(lw.mlp_norm, dtype),
        "mlp.gate_proj.weight": gate_up[:, :inter].T,
        "mlp.up_proj.weight": gate_up[:, inter:].T,
        "mlp.down_proj.weight": _np(lw.w_down, dtype).T,
    }
    if cfg.qk_norm:
        out["self_attn.q_norm.weight"] = _np(lw.q_norm, dtype)
        out["self_attn.k_norm.weight"] = _np(lw.k_norm, dtype)
    return {prefix + k: v for k, v in out.items()}


def _rope_json(cfg: ModelConfig) -> dict:
    r = cfg.rope
    params = {"rope_theta": r.theta, "rope_type": r.kind}
    if r.kind == "llama3":
        params.update(factor=r.factor, low_freq_factor=r.low_freq_factor, high_freq_factor=r.high_freq_factor,
                      original_max_position_embeddings=r.original_max_position)
    elif r.kind != "default":
        raise ValueError(f"cannot export rope kind {r.kind!r}")
    out = {"rope_theta": r.theta, "rope_parameters": params}
    if r.kind != "default":  # transformers < 5 reads `rope_scaling` only; without it, plain rope (wrong logits)
        out["rope_scaling"] = {k: v for k, v in params.items() if k != "rope_theta"}
    return out


def _layers_json(cfg: ModelConfig, dtype_name: str) -> dict:
    return {
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        **_rope_json(cfg),
        "max_position_embeddings": cfg.max_position_embeddings,
        "attention_bias": False,
        "hidden_act": "silu",
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "dtype": dtype_name,
        "torch_dtype": dtype_name,
    }


def _eos_json(cfg: ModelConfig):
    eos = list(cfg.eos_token_ids)
    return None if not eos else eos[0] if len(eos) == 1 else eos


def export_target(
    folder: str | Path,
    cfg: ModelConfig,
    weights: TargetWeights,
    dtype: str = "float32",
    tokenizer_dir: str | Path | None = None,
) -> Path:
    """Write an HF Qwen3 / Llama checkpoint folder that `hf.load_target` (and transformers) read."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    dt = _NP_DTYPES[dtype]
    tensors = {"model.embed_tokens.weight": _np(weights.embed, dt), "model.norm.weight": _np(weights.final_norm, dt)}
    for i, lw in enumerate(weights.layers):
        tensors.update(_layer_tensors(lw, cfg, f"model.layers.{i}.", dt))
    if not cfg.tie_word_embeddings:
        tensors["lm_head.weight"] = _np(weights.lm_head, dt).T
    write_safetensors(folder / "model.safetensors", tensors)
    arch, model_type = {"qwen3": ("Qwen3ForCausalLM", "qwen3"), "llama": ("LlamaForCausalLM", "llama")}[cfg.family]
    config = {
        "architectures": [arch],
        "model_type": model_type,
        **_layers_json(cfg, dtype),
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "bos_token_id": None,
        "eos_token_id": _eos_json(cfg),
        "pad_token_id": None,
        "use_cache": True,
    }
    if cfg.family == "qwen3":
        config.update(layer_types=["full_attention"] * cfg.num_layers, max_window_layers=cfg.num_layers,
                      sliding_window=None, use_sliding_window=False)
    else:
        config.update(mlp_bias=False, pretraining_tp=1)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    gen = {"eos_token_id": _eos_json(cfg), "do_sample": False}
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    if tokenizer_dir is not None:
        for f in Path(tokenizer_dir).iterdir():
            if f.is_file() and (f.name.startswith("tokenizer") or f.name in ("special_tokens_map.json", "vocab.json",
                                                                             "merges.txt")):
                shutil.copy2(f, folder / f.name)
    return folder


def export_drafter(folder: str | Path, cfg: DrafterConfig, weights: DrafterWeights, dtype: str = "float32") -> Path:
    """Write a z-lab-layout DFlash drafter folder that `hf.load_drafter` reads."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    dt = _NP_DTYPES[dtype]
    tensors = {
        "fc.weight": _np(weights.fc, dt).T,
        "hidden_norm.weight": _np(weights.hidden_norm, dt),
        "norm.weight": _np(weights.final_norm, dt),
    }
    for i, lw in enumerate(weights.layers):
        tensors.update(_layer_tensors(lw, cfg.layers, f"layers.{i}.", dt))
    write_safetensors(folder / "model.safetensors", tensors)
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": cfg.block_size,
        "num_target_layers": cfg.num_target_layers,
        "dflash_config": {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids)},
        **_layers_json(cfg.layers, dtype),
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder
