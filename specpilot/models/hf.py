"""Hugging Face checkpoints (config.json + safetensors, single file or sharded) → weight pytrees.

No torch at run time: safetensors files are parsed directly (8-byte header length, JSON header, raw
little-endian data) and memory-mapped, so every failure mode — a missing or truncated file, a missing
tensor, a wrong shape — is caught here and reported with the file or tensor name. Converted trees are
cached with orbax so a second load of the same checkpoint skips conversion. The W12 (lossless 12-bit)
tree of a checkpoint is cached the same way, once, by `scripts/convert_w12.py` (`load_w12`); engines with
`weight_format=w12` then restore it instead of packing at start-up (`packed_w12`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import struct
import uuid
import weakref
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


_FLOAT_DTYPES = {np.dtype(t) for t in (np.float32, np.float16, np.float64, ml_dtypes.bfloat16)}


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
    if not isinstance(header, dict):
        raise CheckpointError(f"unreadable safetensors header in {path}: not a JSON object")
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n) if size > 8 + n else np.zeros(0, np.uint8)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _DTYPES.get(info.get("dtype"))
            start, end = (int(o) for o in info["data_offsets"])
            shape = tuple(int(s) for s in info["shape"])
        except (AttributeError, KeyError, TypeError, ValueError):
            raise CheckpointError(f"corrupt safetensors header in {path}: tensor {name!r}") from None
        if dtype is None:
            raise CheckpointError(f"{path}: tensor {name!r} has unsupported dtype {info.get('dtype')!r}")
        if (start < 0 or any(d < 0 for d in shape) or end > data.size
                or end - start != int(np.prod(shape)) * np.dtype(dtype).itemsize):
            raise CheckpointError(f"truncated or corrupt safetensors file {path}: tensor {name!r} data out of range")
        out[name] = data[start:end].view(dtype).reshape(shape)
    return out


def read_checkpoint_tensors(folder: Path) -> dict[str, np.ndarray]:
    """Tensors of a checkpoint folder: `model.safetensors`, else a sharded `model.safetensors.index.json` (the order
    in which transformers looks)."""
    index = folder / "model.safetensors.index.json"
    single = folder / "model.safetensors"
    if index.is_file() and not single.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
            raise CheckpointError(f"unreadable shard index {index}") from None
        if not isinstance(weight_map, dict) or not all(isinstance(s, str) for s in weight_map.values()):
            raise CheckpointError(f"unreadable shard index {index}: weight_map is not a name -> file mapping")
        tensors: dict[str, np.ndarray] = {}
        for shard in sorted(set(weight_map.values())):
            tensors.update(read_safetensors(folder / shard))
        missing = sorted(k for k in weight_map if k not in tensors)
        if missing:
            raise CheckpointError(f"{index}: tensor {missing[0]!r} listed in the index is in no shard")
        return tensors
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
        if a.dtype not in _FLOAT_DTYPES:
            raise CheckpointError(f"{self.where}: tensor {name!r} is {a.dtype}; quantized weights are not supported")
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
    """Cache key: resolved path, dtype, and size + mtime + ctime of every file in the checkpoint folder (ctime
    because `cp -p`, `rsync -a` and `tar -x` keep a replaced file's mtime; nothing sets ctime back)."""
    h = hashlib.sha256(f"{path.resolve()}|{jnp.dtype(dtype).name}|v1".encode())
    for f in sorted(path.iterdir()):
        if f.is_file():
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}".encode())
    return h.hexdigest()[:16]


def _cache_entry(path: Path, dtype, cache_dir: str | Path, variant: str = "") -> Path:
    """Where the cache keeps one conversion of `path`: `<cache_dir>/<fingerprint><variant>`."""
    return (Path(cache_dir) / (_fingerprint(path, dtype) + variant)).resolve()


def _restore_cache(where: Path, abstract_of, decode=lambda tree: tree):
    """The tree cached at `where` (`decode`d), or None when there is none or it cannot be read.

    `abstract_of(checkpointer, where)` gives orbax's restore target."""
    if not where.exists():
        return None
    import orbax.checkpoint as ocp

    ckptr = ocp.StandardCheckpointer()
    try:
        return decode(ckptr.restore(where, abstract_of(ckptr, where)))
    except Exception as e:  # a stale or partial cache entry must never break loading
        log.warning("ignoring unreadable weight cache %s: %s", where, e)
        return None


def _save_cache(where: Path, tree) -> None:
    """Writes `tree` at `where`, replacing an entry that `_restore_cache` could not read. The tree is saved
    into a folder of this process's own and renamed to `where` once complete, so `where` exists only whole,
    and processes that convert the same checkpoint at once (the search's workers, one per GPU) do not share a
    temporary folder; the first rename wins and the others' copies are dropped.

    OSError when the cache cannot be written. The save is synchronous: orbax's asynchronous checkpointer left
    threads behind after a failed save, and the process never exited."""
    import orbax.checkpoint as ocp

    tmp = where.with_name(f"{where.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        ocp.Checkpointer(ocp.StandardCheckpointHandler()).save(tmp, args=ocp.args.StandardSave(tree))
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(f"cannot write the weight cache at {where}: {e}") from None
    if where.exists() and _restore_cache(where, lambda c, w: jax.eval_shape(lambda: tree)) is None:
        shutil.rmtree(where, ignore_errors=True)  # the unreadable entry this save replaces
    try:
        os.rename(tmp, where)
    except OSError:  # another process completed the same entry first
        shutil.rmtree(tmp, ignore_errors=True)


def _cached(convert, abstract_init, path: Path, dtype, cache_dir: str | Path | None):
    """`convert()`, or its orbax copy from an earlier load. The restore target's shapes come from
    `abstract_init` (random init under eval_shape: the one weight description), so a cache hit reads
    no safetensors at all."""
    if cache_dir is None:
        return convert()
    where = _cache_entry(path, dtype, cache_dir)
    tree = _restore_cache(where, lambda ckptr, where: jax.eval_shape(abstract_init))
    if tree is None:
        tree = convert()
        try:
            _save_cache(where, tree)
        except OSError as e:  # a cache is an optimisation: loading goes on without it
            log.warning("%s; going on without the cache (target.cache_dir=null turns it off)", e)
    return tree


def load_target(path: str | Path, dtype=jnp.bfloat16, cache_dir: str | Path | None = None):
    """(ModelConfig, TargetWeights) from an HF Qwen3/Llama checkpoint folder."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"target checkpoint folder not found: {path}")
    cfg = target_config_from_hf(path)
    tree = _cached(
        lambda: _convert_target(path, cfg, dtype), lambda: init_random_target(cfg, 0, dtype), path, dtype, cache_dir
    )
    _remember_source(tree, path, "target", cfg, dtype, cache_dir)
    return cfg, tree


def load_drafter(path: str | Path, dtype=jnp.bfloat16, cache_dir: str | Path | None = None):
    """(DrafterConfig, DrafterWeights) from a z-lab-layout DFlash checkpoint folder."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"drafter checkpoint folder not found: {path}")
    cfg = drafter_config_from_hf(path)
    tree = _cached(
        lambda: _convert_drafter(path, cfg, dtype), lambda: init_random_drafter(cfg, 0, dtype), path, dtype, cache_dir
    )
    _remember_source(tree, path, "drafter", cfg, dtype, cache_dir)
    return cfg, tree


# ---- W12: the packed tree, converted once per checkpoint (scripts/convert_w12.py) -----------------------
#
# The entry sits beside the bf16 one, keyed by the same fingerprint (taken at bf16) plus the W12 layout's
# FORMAT_VERSION, so a changed checkpoint or layout is a miss, never a misread. Orbax refuses zero-size
# arrays and a W12 leaf's escape lists may be empty, so the cache stores a flat {path: array} dict in which
# every escape array (the channel lists flattened, the overflow) carries one trailing sentinel (index -1) and
# `group_k` is a 1-element array; the tree is rebuilt on the one weight description (random init under
# eval_shape), as for the bf16 cache.

_W12_KINDS = {
    "target": (target_config_from_hf, _convert_target, init_random_target),
    "drafter": (drafter_config_from_hf, _convert_drafter, init_random_drafter),
}
_ESCAPE_SENTINEL = -1


def w12_cache_entry(path: str | Path, cache_dir: str | Path) -> Path:
    """Where the W12 tree of checkpoint `path` is cached under `cache_dir`."""
    from pallas_kernels.w12.format import FORMAT_VERSION

    return _cache_entry(Path(path), jnp.bfloat16, cache_dir, f"-w12v{FORMAT_VERSION}")


def stored_dtypes(path: str | Path) -> dict[str, str]:
    """dtype name → the first 2-D tensor (a linear or embedding matrix) the checkpoint stores in it."""
    found: dict[str, str] = {}
    for name, a in sorted(read_checkpoint_tensors(Path(path)).items()):
        if a.ndim == 2:
            found.setdefault(np.dtype(a.dtype).name, name)
    return found


def _path_name(path) -> str:
    return "/".join(str(getattr(k, "name", getattr(k, "idx", getattr(k, "key", k)))) for k in path)


def _w12_to_storage(tree) -> dict[str, jax.Array]:
    from specpilot.models.weights import _is_w12

    flat = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_w12)[0]:
        name = _path_name(path)
        if not _is_w12(leaf):
            flat[name] = leaf
            continue
        flat |= {
            f"{name}/sign_mantissa": leaf.sign_mantissa,
            f"{name}/exponent_codes": leaf.exponent_codes,
            f"{name}/base_exponent": leaf.base_exponent,
            f"{name}/column_escape_rows": jnp.append(leaf.column_escape_rows, jnp.int32(_ESCAPE_SENTINEL)),
            f"{name}/column_escape_bits": jnp.append(leaf.column_escape_bits, jnp.uint16(0)),
            f"{name}/escape_index": jnp.append(leaf.escape_index, jnp.int32(_ESCAPE_SENTINEL)),
            f"{name}/escape_bits": jnp.append(leaf.escape_bits, jnp.uint16(0)),
            f"{name}/group_k": jnp.array([leaf.group_k], jnp.int32),
        }
    return flat


def _w12_from_storage(flat: dict, template):
    """The packed tree from its stored dict; `template` is the bf16 tree's abstract shapes. Raises on any
    mismatch (a missing or extra array, a wrong plane shape, a missing sentinel)."""
    from pallas_kernels.w12.format import W12Array, padded_k

    used = set()
    leaves = []
    paths, treedef = jax.tree_util.tree_flatten_with_path(template)
    for path, spec in paths:
        name = _path_name(path)
        if f"{name}/sign_mantissa" not in flat:
            if flat[name].shape != spec.shape:
                raise ValueError(f"{name}: cached shape {flat[name].shape}, expected {spec.shape}")
            leaves.append(jnp.asarray(flat[name]))
            used.add(name)
            continue
        part = {p: flat[f"{name}/{p}"] for p in ("sign_mantissa", "exponent_codes", "base_exponent",
                                                  "column_escape_rows", "column_escape_bits", "escape_index",
                                                  "escape_bits", "group_k")}
        used |= {f"{name}/{p}" for p in part}
        k, n = spec.shape
        if part["sign_mantissa"].shape != (n, padded_k(k)):
            raise ValueError(f"{name}: cached W12 planes {part['sign_mantissa'].shape} do not fit a {k}x{n} weight")
        tables = {}
        for index_name, bits_name in (("column_escape_rows", "column_escape_bits"), ("escape_index", "escape_bits")):
            index, bits = part[index_name], part[bits_name]
            if index.shape[0] < 1 or int(index[-1]) != _ESCAPE_SENTINEL or bits.shape != index.shape:
                raise ValueError(f"{name}: cached {index_name} has no sentinel")
            tables[index_name], tables[bits_name] = jnp.asarray(index[:-1]), jnp.asarray(bits[:-1])
        if tables["column_escape_rows"].size % n:
            raise ValueError(f"{name}: cached escape lists do not fit {n} channels")
        for p in ("column_escape_rows", "column_escape_bits"):
            tables[p] = tables[p].reshape(n, -1)
        leaves.append(W12Array(
            sign_mantissa=jnp.asarray(part["sign_mantissa"]),
            exponent_codes=jnp.asarray(part["exponent_codes"]),
            base_exponent=jnp.asarray(part["base_exponent"]),
            **tables,
            shape=(k, n),
            group_k=int(part["group_k"][0]),
        ))
    extra = sorted(set(flat) - used)
    if extra:
        raise ValueError(f"unexpected cached array {extra[0]!r}")
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _abstract_from_metadata(ckptr, where: Path) -> dict:
    """Restore target read from the entry's own metadata (escape counts are known only there)."""
    meta = ckptr.metadata(where)
    items = getattr(meta, "item_metadata", meta)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return {name: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device) for name, m in items.items()}


def _restore_w12(where: Path, kind: str, cfg):
    init = _W12_KINDS[kind][2]
    template = jax.eval_shape(lambda: init(cfg, 0, jnp.bfloat16))
    return _restore_cache(where, _abstract_from_metadata, lambda flat: _w12_from_storage(flat, template))


def load_w12(path: str | Path, cache_dir: str | Path, *, kind: str = "target", create: bool = True):
    """(config, W12 tree, cache hit) for the checkpoint folder `path` (`kind`: "target" or "drafter").

    A hit restores the packed tree and reads no safetensors. A miss converts the checkpoint to bf16,
    packs every linear leaf (`weights.pack_w12`) and writes the entry, or returns None when `create` is
    False. A checkpoint stored in another float dtype is rounded to bf16 first, as `load_target(path,
    bfloat16)` does; `scripts/convert_w12.py` asks before doing that."""
    from specpilot.models.weights import pack_w12

    read_config, convert, _ = _W12_KINDS[kind]
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{kind} checkpoint folder not found: {path}")
    cfg = read_config(path)
    where = w12_cache_entry(path, cache_dir)
    tree = _restore_w12(where, kind, cfg)
    if tree is not None:
        log.info("W12 cache hit: %s", where)
        return cfg, tree, True
    if not create:
        return None
    tree = pack_w12(convert(path, cfg, jnp.bfloat16))
    try:
        _save_cache(where, _w12_to_storage(tree))
    except OSError as e:  # the W12 entry is what this call is for
        raise CheckpointError(str(e)) from None
    log.info("W12 cache written: %s", where)
    return cfg, tree, False


# Which checkpoint a loaded bf16 tree came from, so that `packed_w12` (called where an engine needs W12
# weights) can restore the converted tree instead of packing. Keyed by id, checked with a weak reference
# (an id may be reused once its tree is gone); any copy or transformation of the tree is simply unknown
# here and gets packed, which is always correct.
_SOURCES: dict[int, dict] = {}


def _remember_source(tree, path: Path, kind: str, cfg, dtype, cache_dir) -> None:
    for key in [k for k, v in _SOURCES.items() if v["tree"]() is None]:
        del _SOURCES[key]
    if cache_dir is None or jnp.dtype(dtype) != jnp.bfloat16:
        return
    _SOURCES[id(tree)] = dict(tree=weakref.ref(tree), path=path, kind=kind, cfg=cfg,
                              where=w12_cache_entry(path, cache_dir), packed=None)


def packed_w12(weights):
    """`weights` with every linear leaf in W12: the converted tree from the W12 cache when `weights` is what
    `load_target` / `load_drafter` returned (bf16, with a cache_dir) for a checkpoint that
    `scripts/convert_w12.py` converted, else packed now (`weights.pack_w12`)."""
    from specpilot.models.weights import pack_w12

    source = _SOURCES.get(id(weights))
    if source is None or source["tree"]() is not weights:
        return pack_w12(weights)
    packed = source["packed"]() if source["packed"] is not None else None
    if packed is None:
        packed = _restore_w12(source["where"], source["kind"], source["cfg"])
        if packed is None:
            log.info("no W12 cache for %s: packing at start-up (python scripts/convert_w12.py %s%s caches it)",
                     source["path"], "--drafter " if source["kind"] == "drafter" else "", source["path"])
            return pack_w12(weights)
        log.info("W12 weights restored from %s (no packing)", source["where"])
        source["packed"] = weakref.ref(packed)
    return packed
