"""DFlash block-diffusion drafter (z-lab layout): pure functions over `DrafterWeights`.

Semantics (matching z-lab/dflash's model code; see docs/dflash_semantics.md):
- Context: the target's features at `target_layer_ids` (HF `hidden_states[id + 1]`, concatenated) go
  through `fc` then `hidden_norm` once; every drafter layer projects that same context with its own
  k_proj / v_proj, applies k_norm and RoPE at the context's positions (no input_layernorm on context).
- Block: queries come from the block [last token, mask × (block−1)] embedded with the target's
  embedding; it is a normal Qwen3 layer stream. Attention is non-causal over (all context, all block).
- Output: final `norm`, then the target's LM head; block rows 1..block−1 are the drafts.

Attention (`draft_logits(..., attention=)`, the engine's `attention` knob, as the target's): `xla` and `cudnn`
concatenate the cached context's K/V with the block's and mask the concatenation densely; `pallas_tree` hands the
context (read up to `ctx.lengths`) and the block's own K/V to the tree-attention kernel with every block row seeing
every valid block row (an all-ones "ancestor" mask), reading q, k and v from one array (`target.pack_heads`): no
concatenation, no dense mask, no q/k/v copies, one kernel a layer.

The context K/V are cached per layer (`ingest`), so a round only projects the newly committed tokens'
features; the block's own K/V are never cached.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.tree_attention import dense_to_ancestor_bits, tree_attention_packed
from specpilot.models.config import DrafterConfig
from specpilot.models.kv_cache import KVCache, init_cache, write_layer
from specpilot.models.target import ATTENTION, apply_rope, fused_attention, pack_heads, rms_norm, rope_tables, rotate_qk
from specpilot.models.target import attention as dense_attention
from specpilot.models.weights import DrafterWeights, linear


def init_context(cfg: DrafterConfig, batch: int, capacity: int, dtype) -> KVCache:
    c = cfg.layers
    return init_cache(c.num_layers, batch, capacity, c.num_kv_heads, c.head_dim, dtype)


def _ctx_kv(cfg, lw, c, cos, sin):
    b, t, _ = c.shape
    lc = cfg.layers
    kv = linear(c, lw.w_qkv)[..., lc.q_size :]  # the q columns are wasted work, but keep QKV one fused leaf
    k = kv[..., : lc.kv_size].reshape(b, t, lc.num_kv_heads, lc.head_dim)
    v = kv[..., lc.kv_size :].reshape(b, t, lc.num_kv_heads, lc.head_dim)
    k = apply_rope(rms_norm(k, lw.k_norm, lc.rms_norm_eps), cos, sin)
    return k, v


def ingest(weights: DrafterWeights, cfg: DrafterConfig, ctx: KVCache, feats: jax.Array, n_new: jax.Array) -> KVCache:
    """Append committed tokens' target features [B, T, len(ids)·H] (first n_new[b] valid) to the context.

    They sit at positions ctx.lengths .. ctx.lengths + n_new − 1, i.e. the context always mirrors the
    target's committed prefix.
    """
    b, t, _ = feats.shape
    c = rms_norm(linear(feats.astype(ctx.k.dtype), weights.fc), weights.hidden_norm, cfg.layers.rms_norm_eps)
    pos = ctx.lengths[:, None] + jnp.arange(t)[None, :]
    cos, sin = rope_tables(cfg.layers, pos)
    k_all, v_all = ctx.k, ctx.v
    for i, lw in enumerate(weights.layers):
        k, v = _ctx_kv(cfg, lw, c, cos, sin)
        k_all = write_layer(k_all, i, k, ctx.lengths)
        v_all = write_layer(v_all, i, v, ctx.lengths)
    return KVCache(k=k_all, v=v_all, lengths=ctx.lengths + n_new.astype(jnp.int32))


def draft_logits(
    weights: DrafterWeights,
    cfg: DrafterConfig,
    embed: jax.Array,
    lm_head,
    ctx: KVCache,
    block_tokens: jax.Array,
    block_valid: jax.Array | None = None,
    attention: str = "xla",
) -> jax.Array:
    """Logits [B, T, V] for every block row; block row i sits at position ctx.lengths + i.

    block_valid [B] (optional): only the first block_valid[b] block rows exist as keys (reproduces the
    reference DDTree loop's shortened block near its buffer end). attention: "xla" | "cudnn" | "pallas_tree"
    (module docstring).
    """
    if attention not in ATTENTION:
        raise ValueError(f"attention: unknown implementation {attention!r} (choose from {', '.join(ATTENTION)})")
    lc = cfg.layers
    b, t = block_tokens.shape
    h = embed[block_tokens].astype(ctx.k.dtype)
    pos = ctx.lengths[:, None] + jnp.arange(t)[None, :]
    cos, sin = rope_tables(lc, pos)
    # every block row is a key unless block_valid says otherwise; as a host constant, its ancestor bits are too
    blk_visible = np.ones((b, t), bool) if block_valid is None else jnp.arange(t)[None, :] < block_valid[:, None]
    if attention == "pallas_tree":
        bits = dense_to_ancestor_bits(blk_visible[:, None, :].repeat(t, axis=1))
    else:
        ctx_visible = jnp.arange(ctx.capacity)[None, :] < ctx.lengths[:, None]  # [B, S]
        visible = jnp.concatenate([ctx_visible, blk_visible], axis=1)  # [B, S + T], same for every query row
        mask = jnp.broadcast_to(visible[:, None, :], (b, t, visible.shape[1]))
    for i, lw in enumerate(weights.layers):
        x = rms_norm(h, lw.attn_norm, lc.rms_norm_eps)
        qk, v = rotate_qk(linear(x, lw.w_qkv), lc, lw.q_norm, lw.k_norm, cos, sin)
        if attention == "pallas_tree":
            attn = tree_attention_packed(pack_heads(qk, v).astype(ctx.k.dtype), ctx.k[i], ctx.v[i], ctx.lengths,
                                         bits).reshape(b, t, -1)
        else:
            q, k = qk[:, :, : lc.num_heads], qk[:, :, lc.num_heads :]
            keys = jnp.concatenate([ctx.k[i], k.astype(ctx.k.dtype)], axis=1)
            vals = jnp.concatenate([ctx.v[i], v.astype(ctx.v.dtype)], axis=1)
            attn = (dense_attention(q, keys, vals, mask) if attention == "xla"
                    else fused_attention(q, keys, vals, mask, attention))
        h = h + linear(attn, lw.w_o)
        x = rms_norm(h, lw.mlp_norm, lc.rms_norm_eps)
        gate, up = jnp.split(linear(x, lw.w_gate_up), 2, axis=-1)
        h = h + linear(jax.nn.silu(gate) * up, lw.w_down)
    h = rms_norm(h, weights.final_norm, lc.rms_norm_eps)
    return linear(h, lm_head).astype(jnp.float32)
