"""Qwen3 / Llama 3 forward pass: pure functions over a `TargetWeights` pytree and an explicit KV cache.

One function serves prefill, decode, chain verification and tree verification: it takes T new tokens
per request at arbitrary positions, with an arbitrary visibility mask among them (causal for prefill and
decode, ancestor-only for a tree), on top of each request's committed cache prefix.

Attention implementations (`forward(..., attention=)`, the engines' `attention` knob):
- `xla`: masked softmax attention over the whole cache buffer with a dense [B, T, S] mask (the reference);
- `cudnn`: cuDNN's fused attention (`jax.nn.dot_product_attention(implementation="cudnn")`) under the same dense
  mask; NVIDIA GPUs with 16-bit activations only;
- `pallas_tree`: `pallas_kernels.tree_attention` — the prefix read up to each request's length plus the new
  tokens' own K/V under the [B, T, T] mask packed as ancestor bits; its Mosaic GPU kernel on an H100/H200
  (16-bit weights, head_dim a multiple of 64, any GQA group up to 8: 3, 5, 6 and 7 run padded to the next
  that tiles, `mosaic_gpu.padded_group`; other shapes fall back to its jnp reference with a warning),
  the jnp reference elsewhere. It does not read the new tokens from the cache, so their K/V are written after the
  last layer, for all layers at once (`kv_cache.write_every_layer`: 2 scatters a step, not 2 per layer),
  so no kernel of the forward writes the prefix it reads (`cache_settled`: under PDL its loads start early).
  Above one new token the kernel reads their q, k and v from one array (`tree_attention_packed`), as
  `qk_norm_rope` writes them: in the H200's DFlash drafter pass (16 rows) that removed three copies a layer
  (docs/results/2026-12-01-drafter-tree-h200/). A one-token step has them written as three arrays. A step of 9+
  tokens off a multiple of 8 (DDTree@64's root and 64 nodes) runs padded to one (`pad_tree_rows`), so no kernel
  pads its operands layer by layer; the padded nodes' outputs and K/V are dropped.

After the q|k|v projection, `pallas_kernels.qk_norm_rope` norms q's and k's heads (Qwen3) and rotates them: XLA's
fusions, or with its `DEFAULT` set to `mosaic_gpu` one kernel that also adds the projection's K splits; with
`qkv_rope_matmul`'s `DEFAULT` set, a step of up to 8 rows does both in the projection's epilogue
(`weights.linear_qk_norm_rope`). The MLP's activation is `pallas_kernels.swiglu` (XLA's fusion, or its kernel
reading the gate|up kernel's padded output), or with `swiglu_matmul`'s `DEFAULT` set the gate|up kernel's epilogue
(`weights.linear_swiglu`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.add_rms_norm import add_rms_norm
from pallas_kernels.tree_attention import dense_to_ancestor_bits, tree_attention, tree_attention_packed, unpack_heads
from specpilot.models.config import ModelConfig, rope_inv_freq
from specpilot.models.kv_cache import KVCache, write_every_layer, write_layer
from specpilot.models.weights import Layer, TargetWeights, linear, linear_qk_norm_rope, linear_swiglu

NEG_INF = -1e30


def rope_tables(cfg: ModelConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos/sin of shape [..., D] for integer `positions` (HF's half-rotation layout: each frequency twice).

    The frequencies are doubled on the host, not the angles on the device: the same products, and each table is a
    plain elementwise kernel (1.0 µs on the H200) instead of a concatenation kernel (1.2–1.4 µs)."""
    inv = rope_inv_freq(cfg.rope, cfg.head_dim)
    ang = positions.astype(jnp.float32)[..., None] * np.concatenate([inv, inv])
    return jnp.cos(ang), jnp.sin(ang)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Grouped-query attention. q: [B, T, Hq, D]; k, v: [B, S, Hkv, D]; mask: [B, T, S] bool."""
    b, t, hq, d = q.shape
    hkv = k.shape[2]
    qg = q.reshape(b, t, hkv, hq // hkv, d)
    s = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32) * (d**-0.5)
    s = jnp.where(mask[:, None, None], s, NEG_INF)
    p = jax.nn.softmax(s, axis=-1)
    o = jnp.einsum("bkgts,bskd->btkgd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return o.reshape(b, t, hq * d).astype(q.dtype)


def cache_mask(lengths: jax.Array, block_mask: jax.Array, capacity: int) -> jax.Array:
    """Visibility [B, T, S] over the cache buffer: the committed prefix, plus new tokens per `block_mask`.

    `block_mask` [B, T, T] says which of this step's new tokens (written at slots lengths..lengths+T-1)
    each new token sees: lower-triangular for causal steps, ancestor-or-self for a tree.
    """
    t = block_mask.shape[-1]
    rel = jnp.arange(capacity)[None, :] - lengths[:, None]  # [B, S]
    in_block = (rel >= 0) & (rel < t)
    from_block = jnp.take_along_axis(block_mask, jnp.clip(rel, 0, t - 1)[:, None, :].repeat(t, axis=1), axis=2)
    return (rel < 0)[:, None, :] | (in_block[:, None, :] & from_block)


def causal_block_mask(batch: int, t: int) -> np.ndarray:
    """Lower-triangular ``[batch, t, t]``, a host constant: its ancestor bits (``dense_to_ancestor_bits``) are then
    computed once at trace time, not by kernels in every step."""
    return np.broadcast_to(np.tril(np.ones((t, t), bool)), (batch, t, t))


class StepOutput(NamedTuple):
    logits: jax.Array  # [B, T, V] float32
    cache: KVCache  # with the new tokens' K/V written (unless deferred), lengths unchanged
    hidden: jax.Array | None  # [B, T, len(ids) * H]: outputs of the requested layers, concatenated
    new_kv: tuple[jax.Array, jax.Array] | None = None  # deferred writes: every layer's new K, V [L, B, T, Hkv, D]


ATTENTION = ("xla", "cudnn", "pallas_tree")

TREE_ROW_TILE = 8
"""With `pallas_tree`, a step of more than this many new tokens and not a multiple of it runs padded up to one
(`pad_tree_rows`): its kernels tile rows by 8 (`pallas_kernels.tma.pad_for_tma`), and padding each layer's operands
instead cost four XLA pad kernels a layer, 274 us of DDTree@64's 65-token verify on an H100
(docs/results/2026-12-06-kv-scatter-tree-rows-h100/)."""


def pad_tree_rows(tokens: jax.Array, positions: jax.Array, block_mask) -> tuple[jax.Array, jax.Array, jax.Array]:
    """tokens, positions [B, T] and block_mask [B, T, T] padded to the next multiple of `TREE_ROW_TILE` nodes: each
    padded node is token 0 at the last node's position and sees only itself, and no real node sees it, so the real
    nodes' outputs are unchanged. A host (numpy) mask stays a host constant."""
    b, t = tokens.shape
    extra = -t % TREE_ROW_TILE
    xp = np if isinstance(block_mask, np.ndarray) else jnp
    own = np.broadcast_to(np.eye(t + extra, dtype=bool)[t:], (b, extra, t + extra))
    mask = xp.concatenate([xp.pad(block_mask, ((0, 0), (0, 0), (0, extra))), own], axis=1)
    positions = jnp.concatenate([positions, jnp.broadcast_to(positions[:, -1:], (b, extra))], axis=1)
    return jnp.pad(tokens, ((0, 0), (0, extra))), positions, mask


def fused_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, implementation: str) -> jax.Array:
    """`attention` through `jax.nn.dot_product_attention` (GQA native there): "cudnn" on an NVIDIA GPU; its
    "xla" form is the same call on any backend (the tests check it equals `attention`)."""
    b, t, hq, d = q.shape
    out = jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], implementation=implementation)
    return out.reshape(b, t, hq * d)


def _layer(cfg: ModelConfig, lw: Layer, i: int, x, h, cos, sin, cache: KVCache, mask, tree_bits=None,
           fused: str | None = None):
    """Layer `i` on the residual stream `x` entering it and `h`, its input-normed form. Returns the stream after
    the attention block, the MLP block's output (the next residual update: the next `add_rms_norm` adds it and
    norms the sum in one go), the cache and this step's K/V."""
    b, t, _ = x.shape
    packed = tree_bits is not None and t > 1  # the tree-attention kernel reads the heads as one array
    heads = linear_qk_norm_rope(h, lw.w_qkv, lw.q_norm, lw.k_norm, cos, sin,  # no q_norm: Llama
                                num_kv_heads=cfg.num_kv_heads, eps=cfg.rms_norm_eps, split=not packed)
    q, k, v = unpack_heads(heads, cfg.num_kv_heads) if packed else heads
    if tree_bits is None:  # XLA / cuDNN attention read the new tokens' K/V from the cache: write them first
        cache = dataclasses.replace(
            cache, k=write_layer(cache.k, i, k, cache.lengths), v=write_layer(cache.v, i, v, cache.lengths)
        )
    if fused is not None:
        attn = fused_attention(q, cache.k[i], cache.v[i], mask, fused)
    elif tree_bits is None:
        attn = attention(q, cache.k[i], cache.v[i], mask)
    elif t == 1:  # the kernel reads the prefix below `lengths` and the new token's q, k, v (not from the cache)
        attn = tree_attention(q, cache.k[i], cache.v[i], cache.lengths, k, v, tree_bits,
                              cache_settled=True).reshape(b, t, -1)
    else:  # the same with the new tokens' q, k and v read from one array, so none is copied out for the kernel
        attn = tree_attention_packed(heads, cache.k[i], cache.v[i], cache.lengths, tree_bits, cache_settled=True)
        attn = attn.reshape(b, t, -1)
    x, h = add_rms_norm(x, linear(attn, lw.w_o, reduce=False), lw.mlp_norm, cfg.rms_norm_eps)
    return x, linear(linear_swiglu(h, lw.w_gate_up), lw.w_down, reduce=False), cache, (k, v)


def forward(
    weights: TargetWeights,
    cfg: ModelConfig,
    tokens: jax.Array,
    positions: jax.Array,
    cache: KVCache,
    block_mask: jax.Array | None = None,
    hidden_layer_ids: tuple[int, ...] = (),
    attention: str = "xla",
    defer_kv_write: bool = False,
) -> StepOutput:
    """Run T new tokens per request through the target.

    tokens, positions: [B, T] int32 (positions are RoPE positions: start + depth for a tree).
    block_mask: [B, T, T] visibility among the new tokens (default causal); the committed cache prefix
    is always visible. hidden_layer_ids: layers whose outputs to return, as HF's `hidden_states[i + 1]`:
    the residual stream after layer i, except that the last layer's entry is the final-RMSNormed state
    (HF replaces it with `last_hidden_state`; DFlash drafters were trained on exactly that).
    attention: "xla" | "cudnn" | "pallas_tree" (module docstring).
    defer_kv_write (`pallas_tree` only, whose attention reads the new K/V from the step, not the cache): the cache
    comes back unwritten and `new_kv` holds every layer's new K/V for the caller to write
    (`kv_cache.write_every_layer`) — outside a `lax.switch` whose branches would otherwise all write the cache.
    """
    b, t = tokens.shape
    if attention not in ATTENTION:
        raise ValueError(f"attention: unknown implementation {attention!r} (choose from {', '.join(ATTENTION)})")
    if defer_kv_write and attention != "pallas_tree":
        raise ValueError(f"defer_kv_write: attention={attention!r} reads the new K/V from the cache; only "
                         "pallas_tree can defer the write")
    if attention == "cudnn" and jax.devices()[0].platform != "gpu":
        raise ValueError(f"attention=cudnn needs an NVIDIA GPU; this backend is {jax.devices()[0].platform!r}")
    if block_mask is None:
        block_mask = causal_block_mask(b, t)
    mask = tree_bits = None
    rows = t  # the real new tokens; with `pallas_tree` the step may run more (`TREE_ROW_TILE`)
    if attention == "pallas_tree" and t > TREE_ROW_TILE and t % TREE_ROW_TILE:
        tokens, positions, block_mask = pad_tree_rows(tokens, positions, block_mask)
    if attention == "pallas_tree":
        tree_bits = dense_to_ancestor_bits(block_mask)
    else:
        mask = cache_mask(cache.lengths, block_mask, cache.capacity)
    cos, sin = rope_tables(cfg, positions)
    x, update = weights.embed[tokens].astype(cache.k.dtype), None
    hidden, layer_kv = {}, []
    for i, lw in enumerate(weights.layers):
        x, h = add_rms_norm(x, update, lw.attn_norm, cfg.rms_norm_eps)  # x: the stream after layer i - 1
        if i - 1 in hidden_layer_ids:
            hidden[i - 1] = x
        x, update, cache, kv = _layer(cfg, lw, i, x, h, cos, sin, cache, mask, tree_bits,
                                      "cudnn" if attention == "cudnn" else None)
        layer_kv.append(kv)
    deferred = None
    if tree_bits is not None:  # the kernel read the new K/V from k, v: write every layer's in one scatter each
        # stacked before the scatter, not inside it: fused in, the 36-way concatenate made each scatter ~13 us
        ks, vs = jax.lax.optimization_barrier(tuple(jnp.stack(parts)[:, :, :rows] for parts in zip(*layer_kv)))
        if defer_kv_write:
            deferred = (ks, vs)
        else:
            cache = write_every_layer(cache, ks, vs)
    hidden = {i: hid[:, :rows] for i, hid in hidden.items()}  # the padded rows' outputs are dropped here
    x = add_rms_norm(x, update, weights.final_norm, cfg.rms_norm_eps)[1][:, :rows]
    if cfg.num_layers - 1 in hidden_layer_ids:
        hidden[cfg.num_layers - 1] = x
    logits = linear(x, weights.lm_head).astype(jnp.float32)
    hid = jnp.concatenate([hidden[i] for i in hidden_layer_ids], axis=-1) if hidden_layer_ids else None
    return StepOutput(logits=logits, cache=cache, hidden=hid, new_kv=deferred)
