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
every valid block row (an all-ones "ancestor" mask), reading q, k and v from one array (as `qk_norm_rope` writes them): no
concatenation, no dense mask, no q/k/v copies, one kernel a layer.

Residual adds and norms go through `add_rms_norm` as the target's do (the o and down projections' K splits handed
over unsummed where the skinny kernel ran them); in a round the new context rows, which skip the input norm, ride
each input norm's output ahead of the block's normed rows (its `prefix`).

The context K/V are cached per layer (`ingest`), so a round only projects the newly committed tokens'
features; the block's own K/V are never cached. A round does both at once (`ingest_and_draft`, what the engine's
draft stage runs): each layer projects the new context rows and the block rows with one matmul, so its QKV weight is
read once a round, not twice, with every row's arithmetic unchanged.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.add_rms_norm import add_rms_norm
from pallas_kernels.add_rms_norm.reference import rms_norm
from pallas_kernels.qk_norm_rope import apply_rope, qk_norm_rope
from pallas_kernels.tree_attention import dense_to_ancestor_bits, tree_attention_packed, unpack_heads
from specpilot.models.config import DrafterConfig
from specpilot.models.kv_cache import KVCache, init_cache, write_layer
from specpilot.models.target import ATTENTION, fused_attention, rope_tables
from specpilot.models.target import attention as dense_attention
from specpilot.models.weights import DrafterWeights, linear, linear_swiglu


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
    return _block_pass(weights, cfg, embed, lm_head, ctx, block_tokens, block_valid, attention)[0]


def ingest_and_draft(
    weights: DrafterWeights,
    cfg: DrafterConfig,
    embed: jax.Array,
    lm_head,
    ctx: KVCache,
    feats: jax.Array,
    n_new: jax.Array,
    block_tokens: jax.Array,
    block_valid: jax.Array | None = None,
    attention: str = "xla",
) -> tuple[jax.Array, KVCache]:
    """``ingest(ctx, feats, n_new)`` then ``draft_logits`` on the new context, as one pass: (logits, new context).

    Each layer projects the new context rows and the block rows with one matmul over their rows side by side, so
    its fused QKV weight is read once a round, not twice (5 x 50 MB on a Qwen3-8B-sized drafter: on the H200 the
    round went 1.036 -> 0.979 ms of GPU time, docs/results/2026-12-01-fusion-prefetch-h200/). Every row is the same
    arithmetic as in the two calls: the projection of a row does not depend on the other rows, the context rows' q is
    computed and dropped, and their k is normed and rotated at their own positions (``qk_norm_rope`` per head is
    ``_ctx_kv``'s k_norm and rope); the drafts were the same on the H200, and bit-identical on the CPU (tests)."""
    c = rms_norm(linear(feats.astype(ctx.k.dtype), weights.fc), weights.hidden_norm, cfg.layers.rms_norm_eps)
    return _block_pass(weights, cfg, embed, lm_head, ctx, block_tokens, block_valid, attention, c, n_new)


def _block_pass(weights, cfg, embed, lm_head, ctx: KVCache, block_tokens, block_valid, attention, new=None,
                n_new=None):
    """The block pass of ``draft_logits``; with ``new`` (the hidden-normed fc output of ``n_new`` committed rows,
    ``[B, Tn, H]``) those rows are ingested layer by layer on the way (``ingest_and_draft``). Returns the logits and
    the context the block attended to."""
    if attention not in ATTENTION:
        raise ValueError(f"attention: unknown implementation {attention!r} (choose from {', '.join(ATTENTION)})")
    lc = cfg.layers
    b, t = block_tokens.shape
    tn = 0 if new is None else new.shape[1]
    old_lengths = ctx.lengths
    lengths = old_lengths if new is None else old_lengths + n_new.astype(jnp.int32)
    h = embed[block_tokens].astype(ctx.k.dtype)
    pos = lengths[:, None] + jnp.arange(t)[None, :]
    if new is not None:  # the new context rows sit at old_lengths + 0 .. Tn - 1, before the block's rows
        pos = jnp.concatenate([old_lengths[:, None] + jnp.arange(tn)[None, :], pos], axis=1)
    cos, sin = rope_tables(lc, pos)
    # every block row is a key unless block_valid says otherwise; as a host constant, its ancestor bits are too
    blk_visible = np.ones((b, t), bool) if block_valid is None else jnp.arange(t)[None, :] < block_valid[:, None]
    if attention == "pallas_tree":
        bits = dense_to_ancestor_bits(blk_visible[:, None, :].repeat(t, axis=1))
    else:
        ctx_visible = jnp.arange(ctx.capacity)[None, :] < lengths[:, None]  # [B, S]
        visible = jnp.concatenate([ctx_visible, blk_visible], axis=1)  # [B, S + T], same for every query row
        mask = jnp.broadcast_to(visible[:, None, :], (b, t, visible.shape[1]))
    k_all, v_all = ctx.k, ctx.v
    update = None  # the last layer's MLP output: the next add_rms_norm adds it to h and norms the sum in one go
    for i, lw in enumerate(weights.layers):
        # the new context rows skip the input norm: they ride the norm's output ahead of the block's normed rows
        h, rows = add_rms_norm(h, update, lw.attn_norm, lc.rms_norm_eps, prefix=new)
        heads = qk_norm_rope(linear(rows, lw.w_qkv, reduce=False), lw.q_norm, lw.k_norm, cos, sin,
                             num_kv_heads=lc.num_kv_heads, eps=lc.rms_norm_eps)
        if new is not None:  # the context rows' k and v into the cache (their q is dropped); the block's go on
            _, k_new, v_new = unpack_heads(heads[:, :tn], lc.num_kv_heads)
            k_all = write_layer(k_all, i, k_new, old_lengths)
            v_all = write_layer(v_all, i, v_new, old_lengths)
            heads = heads[:, tn:]
        if attention == "pallas_tree":
            attn = tree_attention_packed(heads.astype(k_all.dtype), k_all[i], v_all[i], lengths, bits,
                                         cache_settled=new is None).reshape(b, t, -1)  # else written just now
        else:
            q, k, v = unpack_heads(heads, lc.num_kv_heads)
            keys = jnp.concatenate([k_all[i], k.astype(k_all.dtype)], axis=1)
            vals = jnp.concatenate([v_all[i], v.astype(v_all.dtype)], axis=1)
            attn = (dense_attention(q, keys, vals, mask) if attention == "xla"
                    else fused_attention(q, keys, vals, mask, attention))
        h, x = add_rms_norm(h, linear(attn, lw.w_o, reduce=False), lw.mlp_norm, lc.rms_norm_eps)
        update = linear(linear_swiglu(x, lw.w_gate_up), lw.w_down, reduce=False)
    h = add_rms_norm(h, update, weights.final_norm, lc.rms_norm_eps)[1]
    return linear(h, lm_head).astype(jnp.float32), KVCache(k=k_all, v=v_all, lengths=lengths)
