"""Weight pytrees, one abstract description of them, and the matmul that dispatches on the weight leaf.

Linear weights are stored `[in_features, out_features]` and used as `x @ w`. Q/K/V and gate/up are
fused at load time (one weight read per step instead of three / two). A linear leaf is one of:

- a plain `jax.Array` (bf16 or f32), multiplied by `pallas_kernels.skinny_matmul`: XLA's dot, or (opt-in,
  `skinny_matmul.ops.DEFAULT`) a Hopper kernel for few token rows,
- a `QuantArray` (int8 or fp8 weight-only, per-output-column scale; TLV's cheap level-1 target;
  multiplied by `pallas_kernels.quant_matmul`: its jnp reference, or an opt-in Hopper int8 kernel),
- a `pallas_kernels.w12.W12Array` (lossless 12-bit bf16).

`linear(x, w)` is the only place that knows about formats, so model code never changes when the
weight format does; `linear_swiglu(x, w_gate_up)` is the MLP's gate|up projection with its activation, which a
bf16 or W12 leaf may run as one kernel (`pallas_kernels.swiglu_matmul`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from specpilot.models.config import DrafterConfig, ModelConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class QuantArray:
    """Weight-only quantized matrix: `w ≈ q * scale`, scale per output column.

    Logically `[K, N]` like every linear leaf (`shape`), but `q` is stored transposed, output-major,
    as `q_t` `[N, K]`: the Hopper int8 kernel (`pallas_kernels/quant_matmul`) takes the weight as the
    row-major LHS of `y.T = q_t @ x.T`, and transposing per call would re-read and re-write it.
    """

    q_t: jax.Array  # [N, K] int8 or float8_e4m3fn
    scale: jax.Array  # [N] float32

    @property
    def shape(self):
        n, k = self.q_t.shape
        return (k, n)


def quantize(w: jax.Array, fmt: str) -> QuantArray:
    """Symmetric per-output-column weight-only quantization ("int8" or "fp8") of a `[K, N]` weight: a bf16 / f32
    array, or a `W12Array` (TLV's level 1 of a W12 target quantizes the bf16 weights the W12 leaf holds)."""
    if _is_w12(w):
        from pallas_kernels import w12

        w = w12.unpack(w)
    w32 = jnp.asarray(w, jnp.float32)
    amax = jnp.max(jnp.abs(w32), axis=0)
    qmax = {"int8": 127.0, "fp8": 448.0}.get(fmt)
    if qmax is None:
        raise ValueError(f"unknown quantization format {fmt!r} (expected 'int8' or 'fp8')")
    # test the scale, not amax: a tiny column's amax / qmax underflows (or is flushed) to 0, and w / 0 is NaN
    scale = jnp.where(amax / qmax > 0, amax / qmax, 1.0)
    if fmt == "int8":
        q = jnp.clip(jnp.round(w32 / scale), -127, 127).astype(jnp.int8)
    else:
        q = (w32 / scale).astype(jnp.float8_e4m3fn)
    return QuantArray(q_t=q.T, scale=scale.astype(jnp.float32))


def _is_w12(w) -> bool:
    return type(w).__name__ == "W12Array"


def linear(x: jax.Array, w: Any, reduce: bool = True):
    """`x @ w` with float32 accumulation, dispatching on the weight leaf's format. `reduce=False` is for an output
    that goes straight into `add_rms_norm`, `qk_norm_rope` or `swiglu`: a bf16 leaf's kernel may then return its K
    splits unsummed, or its padded output (`pallas_kernels.split_k.SplitKPartials`), which those kernels read
    themselves."""
    if isinstance(w, QuantArray):
        from pallas_kernels import quant_matmul

        return quant_matmul.matmul(x, w)
    if _is_w12(w):
        from pallas_kernels import w12

        return w12.matmul(x, w, reduce=reduce)
    from pallas_kernels import skinny_matmul

    return skinny_matmul.matmul(x, w, reduce=reduce)


def linear_swiglu(x: jax.Array, w_gate_up: Any) -> jax.Array:
    """The MLP's activation of its fused gate|up projection, `swiglu(linear(x, w_gate_up))`: for a bf16 or W12 leaf
    `pallas_kernels.swiglu_matmul` (the SwiGLU in the matmul's epilogue where its `DEFAULT` asks for it, else the
    two steps as before); a `QuantArray` takes the two steps."""
    from pallas_kernels.swiglu import swiglu

    if isinstance(w_gate_up, QuantArray):
        return swiglu(linear(x, w_gate_up, reduce=False))
    from pallas_kernels.swiglu_matmul import swiglu_matmul

    return swiglu_matmul(x, w_gate_up)


def linear_qk_norm_rope(x: jax.Array, w_qkv: Any, q_norm, k_norm, cos, sin, *, num_kv_heads: int, eps: float,
                        split: bool) -> Any:
    """The attention's heads from its q|k|v projection, `qk_norm_rope(linear(x, w_qkv, reduce=False), ...)`: for a
    bf16 leaf `pallas_kernels.qkv_rope_matmul` (the norm + rope in the matmul's epilogue where its `DEFAULT` asks for
    it, else the two steps as before); other formats take the two steps."""
    from pallas_kernels.qk_norm_rope import qk_norm_rope

    kwargs = {"num_kv_heads": num_kv_heads, "eps": eps, "split": split}
    if isinstance(w_qkv, QuantArray) or _is_w12(w_qkv):
        return qk_norm_rope(linear(x, w_qkv, reduce=False), q_norm, k_norm, cos, sin, **kwargs)
    from pallas_kernels.qkv_rope_matmul import qkv_rope_matmul

    return qkv_rope_matmul(x, w_qkv, q_norm, k_norm, cos, sin, **kwargs)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Layer:
    attn_norm: jax.Array  # [H]
    w_qkv: Any  # [H, (Hq + 2 Hkv) D]
    q_norm: jax.Array | None  # [D] (Qwen3 only)
    k_norm: jax.Array | None  # [D]
    w_o: Any  # [Hq D, H]
    mlp_norm: jax.Array  # [H]
    w_gate_up: Any  # [H, 2 I]
    w_down: Any  # [I, H]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TargetWeights:
    embed: jax.Array  # [V, H]
    layers: list[Layer]
    final_norm: jax.Array  # [H]
    lm_head: Any  # [H, V]; for tied embeddings, the transpose of `embed` is stored here too


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DrafterWeights:
    fc: Any  # [len(target_layer_ids) H, H]
    hidden_norm: jax.Array  # [H]
    layers: list[Layer]
    final_norm: jax.Array  # [H]


# ---- one abstract description drives random init and checkpoint validation -------------------------


@dataclasses.dataclass(frozen=True)
class LeafSpec:
    shape: tuple[int, ...]
    kind: str  # "norm" | "linear" | "embed"


def _layer_spec(cfg: ModelConfig) -> dict[str, LeafSpec]:
    h, d = cfg.hidden_size, cfg.head_dim
    spec = {
        "attn_norm": LeafSpec((h,), "norm"),
        "w_qkv": LeafSpec((h, cfg.q_size + 2 * cfg.kv_size), "linear"),
        "w_o": LeafSpec((cfg.q_size, h), "linear"),
        "mlp_norm": LeafSpec((h,), "norm"),
        "w_gate_up": LeafSpec((h, 2 * cfg.intermediate_size), "linear"),
        "w_down": LeafSpec((cfg.intermediate_size, h), "linear"),
        "q_norm": LeafSpec((d,), "norm") if cfg.qk_norm else None,
        "k_norm": LeafSpec((d,), "norm") if cfg.qk_norm else None,
    }
    return spec


def _init_leaf(spec: LeafSpec | None, key, dtype):
    if spec is None:
        return None
    if spec.kind == "norm":
        return jnp.ones(spec.shape, dtype) + 0.1 * jax.random.normal(key, spec.shape, dtype)
    scale = 0.02 if spec.kind == "embed" else spec.shape[0] ** -0.5
    return (scale * jax.random.normal(key, spec.shape, jnp.float32)).astype(dtype)


def _init_layers(cfg: ModelConfig, key, dtype) -> list[Layer]:
    spec = _layer_spec(cfg)
    layers = []
    for lk in jax.random.split(key, cfg.num_layers):
        keys = dict(zip(spec, jax.random.split(lk, len(spec))))
        layers.append(Layer(**{n: _init_leaf(s, keys[n], dtype) for n, s in spec.items()}))
    return layers


def init_random_target(cfg: ModelConfig, seed: int = 0, dtype=jnp.bfloat16) -> TargetWeights:
    """Random weights of the right shapes, for synthetic-shape benchmarks and tests."""
    k_embed, k_layers, k_head, k_norm = jax.random.split(jax.random.key(seed), 4)
    embed = _init_leaf(LeafSpec((cfg.vocab_size, cfg.hidden_size), "embed"), k_embed, dtype)
    head = embed.T if cfg.tie_word_embeddings else _init_leaf(
        LeafSpec((cfg.hidden_size, cfg.vocab_size), "linear"), k_head, dtype
    )
    return TargetWeights(
        embed=embed,
        layers=_init_layers(cfg, k_layers, dtype),
        final_norm=_init_leaf(LeafSpec((cfg.hidden_size,), "norm"), k_norm, dtype),
        lm_head=head,
    )


def init_random_drafter(cfg: DrafterConfig, seed: int = 0, dtype=jnp.bfloat16) -> DrafterWeights:
    h = cfg.layers.hidden_size
    k_fc, k_layers, k_n1, k_n2 = jax.random.split(jax.random.key(seed), 4)
    return DrafterWeights(
        fc=_init_leaf(LeafSpec((len(cfg.target_layer_ids) * h, h), "linear"), k_fc, dtype),
        hidden_norm=_init_leaf(LeafSpec((h,), "norm"), k_n1, dtype),
        layers=_init_layers(cfg.layers, k_layers, dtype),
        final_norm=_init_leaf(LeafSpec((h,), "norm"), k_n2, dtype),
    )


def pack_w12(weights):
    """Every linear leaf of a target or drafter tree as a lossless `W12Array` (needs bf16 weights).

    Leaves that are already `W12Array`s are kept, so packing a packed tree (e.g. one restored from the
    W12 weight cache, `specpilot/models/hf.py`) costs nothing."""
    from pallas_kernels import w12

    def pack(w):
        return w if _is_w12(w) else w12.pack(w)

    def pack_layer(layer: Layer) -> Layer:
        return dataclasses.replace(
            layer,
            w_qkv=pack(layer.w_qkv),
            w_o=pack(layer.w_o),
            w_gate_up=pack(layer.w_gate_up),
            w_down=pack(layer.w_down),
        )

    packed = dataclasses.replace(weights, layers=[pack_layer(lw) for lw in weights.layers])
    if isinstance(weights, TargetWeights):
        packed = dataclasses.replace(packed, lm_head=pack(weights.lm_head))
    else:
        packed = dataclasses.replace(packed, fc=pack(weights.fc))
    return packed


def add_passthrough_layers(cfg: ModelConfig, w: TargetWeights, n: int) -> tuple[ModelConfig, TargetWeights]:
    """The target with `n` more layers that read and compute like the last one but write nothing to the
    residual stream (zero attention and MLP output projections): the same tokens and hidden states, every
    target pass (AR step, verify) as long as a deeper model's, the drafter and its acceptance unchanged.
    For a proxy pair trained in minutes, which is launch-bound on a big GPU (AR beats every speculative
    engine there; docs/search.md). Every new leaf is its own buffer, so each layer's weights are really read."""
    if n < 0:
        raise ValueError(f"passthrough layers: {n} < 0")
    if n == 0:
        return cfg, w
    last = w.layers[-1]

    def fresh(a):
        return None if a is None else jnp.array(a, copy=True)

    extra = [dataclasses.replace(jax.tree.map(fresh, last), w_o=jnp.zeros_like(last.w_o),
                                 w_down=jnp.zeros_like(last.w_down)) for _ in range(n)]
    return (dataclasses.replace(cfg, num_layers=cfg.num_layers + n),
            dataclasses.replace(w, layers=[*w.layers, *extra]))


def cast_floats(tree, dtype):
    """Cast every floating leaf of a weight tree (not quantized/packed leaves' integer planes)."""
    return jax.tree.map(lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)

