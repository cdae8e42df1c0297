"""Hugging Face checkpoints (config.json + safetensors, single file or sharded) → weight pytrees.

No torch at run time: safetensors files are parsed directly (8-byte header length, JSON header, raw
little-endian data) and memory-mapped, so every failure mode — a missing or truncated file, a missing
tensor, a wrong shape — is caught here and reported with the file or tensor name. Converted trees are
cached with orbax so a second load of the same checkpoint skips conversion.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy before any bf16 tensor is read)
import numpy as np

from specpilot.models.config import (
    CheckpointError,
    DrafterConfig,
    ModelConfig,
    drafter_config_from_hf,
    target_config_from_hf,
)
from specpilot.models.weights import (
    DrafterWeights,
    Layer,
    TargetWeights,
    init_random_drafter,
    init_random_target,
)

log = logging.getLogger(__name__)

_DTYPES = {
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "F64": np.float64,
    "I64": np.int64,
    "I32": np.int32,
    "I8": np.int8,
    "U8": np.uint8,
}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """All tensors of one .safetensors file as read-only memory-mapped numpy arrays."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"truncated safetensors file (no header): {path}")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise CheckpointError(f"truncated safetensors file (header runs past end): {path}")
            header = json.loads(f.read(n))
    except FileNotFoundError:
        raise CheckpointError(f"missing file: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"unreadable safetensors header in {path}") from None
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n) if size > 8 + n else np.zeros(0, np.uint8)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise CheckpointError(f"{path}: tensor {name!r} has unsupported dtype {info.get('dtype')!r}")
        start, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if end > data.size or end - start != int(np.prod(shape)) * np.dtype(dtype).itemsize:
            raise CheckpointError(f"truncated or corrupt safetensors file {path}: tensor {name!r} data out of range")
        out[name] = data[start:end].view(dtype).reshape(shape)
    return out


def read_checkpoint_tensors(folder: Path) -> dict[str, np.ndarray]:
    """Tensors of a checkpoint folder: `model.safetensors` or a sharded `model.safetensors.index.json`."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError):
            raise CheckpointError(f"unreadable shard index {index}") from None
        tensors: dict[str, np.ndarray] = {}
        for shard in sorted(set(weight_map.values())):
            tensors.update(read_safetensors(folder / shard))
        missing = sorted(k for k in weight_map if k not in tensors)
        if missing:
            raise CheckpointError(f"{index}: tensor {missing[0]!r} listed in the index is in no shard")
        return tensors
    single = folder / "model.safetensors"
    if not single.is_file():
        raise CheckpointError(f"no model.safetensors or model.safetensors.index.json in {folder}")
    return read_safetensors(single)


class _Tensors:
    """Name → array lookup that checks presence and shape and names the tensor on failure."""

    def __init__(self, tensors: dict[str, np.ndarray], where: Path, dtype):
        self.tensors, self.where, self.dtype = tensors, where, dtype

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in self.tensors:
            raise CheckpointError(f"{self.where}: missing tensor {name!r}")
        a = self.tensors[name]
        if a.shape != shape:
            raise CheckpointError(f"{self.where}: tensor {name!r} has shape {a.shape}, expected {shape}")
        return a

    def linear(self, *names_shapes) -> jax.Array:
        """HF Linear weights are [out, in]; ours are [in, out], fused along `out`."""
        parts = [self.get(n, s).T for n, s in names_shapes]
        return jnp.asarray(np.concatenate(parts, axis=1).astype(np.float32)).astype(self.dtype)

    def vector(self, name: str, size: int) -> jax.Array:
        return jnp.asarray(self.get(name, (size,)).astype(np.float32)).astype(self.dtype)


def _layers(t: _Tensors, cfg: ModelConfig, prefix: str) -> list[Layer]:
    h, i_size, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    layers = []
    for i in range(cfg.num_layers):
        p = f"{prefix}layers.{i}."
        layers.append(
            Layer(
                attn_norm=t.vector(p + "input_layernorm.weight", h),
                w_qkv=t.linear(
                    (p + "self_attn.q_proj.weight", (cfg.q_size, h)),
                    (p + "self_attn.k_proj.weight", (cfg.kv_size, h)),
                    (p + "self_attn.v_proj.weight", (cfg.kv_size, h)),
                ),
                q_norm=t.vector(p + "self_attn.q_norm.weight", d) if cfg.qk_norm else None,
                k_norm=t.vector(p + "self_attn.k_norm.weight", d) if cfg.qk_norm else None,
                w_o=t.linear((p + "self_attn.o_proj.weight", (h, cfg.q_size))),
                mlp_norm=t.vector(p + "post_attention_layernorm.weight", h),
                w_gate_up=t.linear(
                    (p + "mlp.gate_proj.weight", (i_size, h)), (p + "mlp.up_proj.weight", (i_size, h))
                ),
                w_down=t.linear((p + "mlp.down_proj.weight", (h, i_size))),
            )
        )
    return layers


def _convert_target(path: Path, cfg: ModelConfig, dtype) -> TargetWeights:
    t = _Tensors(read_checkpoint_tensors(path), path, dtype)
    v, h = cfg.vocab_size, cfg.hidden_size
    embed = jnp.asarray(t.get("model.embed_tokens.weight", (v, h)).astype(np.float32)).astype(dtype)
    if cfg.tie_word_embeddings and "lm_head.weight" not in t.tensors:
        head = embed.T
    else:
        head = t.linear(("lm_head.weight", (v, h)))
    return TargetWeights(
        embed=embed,
        layers=_layers(t, cfg, "model."),
        final_norm=t.vector("model.norm.weight", h),
        lm_head=head,
    )


def _convert_drafter(path: Path, cfg: DrafterConfig, dtype) -> DrafterWeights:
    t = _Tensors(read_checkpoint_tensors(path), path, dtype)
    h = cfg.layers.hidden_size
    n = len(cfg.target_layer_ids)
    return DrafterWeights(
        fc=t.linear(("fc.weight", (h, n * h))),
        hidden_norm=t.vector("hidden_norm.weight", h),
        layers=_layers(t, cfg.layers, ""),
        final_norm=t.vector("norm.weight", h),
    )


def _fingerprint(path: Path, dtype) -> str:
    """Cache key: resolved path, dtype, and size + mtime of every file in the checkpoint folder."""
    h = hashlib.sha256(f"{path.resolve()}|{jnp.dtype(dtype).name}|v1".encode())
    for f in sorted(path.iterdir()):
        if f.is_file():
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _cached(convert, abstract_init, path: Path, dtype, cache_dir: str | Path | None):
    """`convert()`, or its orbax copy from an earlier load. The restore target's shapes come from
    `abstract_init` (random init under eval_shape: the one weight description), so a cache hit reads
    no safetensors at all."""
    if cache_dir is None:
        return convert()
    import orbax.checkpoint as ocp

    where = (Path(cache_dir) / _fingerprint(path, dtype)).resolve()
    ckptr = ocp.StandardCheckpointer()
    if where.exists():
        try:
            abstract = jax.eval_shape(abstract_init)
            return ckptr.restore(where, abstract)
        except Exception as e:  # a stale or partial cache entry must never break loading
            log.warning("ignoring unreadable weight cache %s: %s", where, e)
    tree = convert()
    if not where.exists():
        ckptr.save(where, tree)
        ckptr.wait_until_finished()
    return tree


def load_target(path: str | Path, dtype=jnp.bfloat16, cache_dir: str | Path | None = None):
    """(ModelConfig, TargetWeights) from an HF Qwen3/Llama checkpoint folder."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"target checkpoint folder not found: {path}")
    cfg = target_config_from_hf(path)
    return cfg, _cached(
        lambda: _convert_target(path, cfg, dtype), lambda: init_random_target(cfg, 0, dtype), path, dtype, cache_dir
    )


def load_drafter(path: str | Path, dtype=jnp.bfloat16, cache_dir: str | Path | None = None):
    """(DrafterConfig, DrafterWeights) from a z-lab-layout DFlash checkpoint folder."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"drafter checkpoint folder not found: {path}")
    cfg = drafter_config_from_hf(path)
    return cfg, _cached(
        lambda: _convert_drafter(path, cfg, dtype), lambda: init_random_drafter(cfg, 0, dtype), path, dtype, cache_dir
    )
