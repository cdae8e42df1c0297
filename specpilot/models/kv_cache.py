"""Fixed-capacity KV cache for a batch of requests with per-request lengths.

Slot `j` of request `b` holds a committed token iff `j < lengths[b]`. A forward step writes its T new
tokens' K/V at slots `lengths[b] .. lengths[b] + T - 1` without advancing `lengths`; the caller commits
what it accepted (`advance`, or `compact` for a tree, which first moves the accepted nodes' K/V into
place). Slots past `lengths` are scratch: invisible to attention and overwritten by the next step.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
    k: jax.Array  # [L, B, S, Hkv, D]
    v: jax.Array  # [L, B, S, Hkv, D]
    lengths: jax.Array  # [B] int32

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    @property
    def batch(self) -> int:
        return self.k.shape[1]


def init_cache(num_layers: int, batch: int, capacity: int, num_kv_heads: int, head_dim: int, dtype) -> KVCache:
    shape = (num_layers, batch, capacity, num_kv_heads, head_dim)
    return KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype), lengths=jnp.zeros((batch,), jnp.int32))


def write_layer(buf: jax.Array, layer: int | jax.Array | slice, new: jax.Array, lengths: jax.Array) -> jax.Array:
    """Scatter `new` [B, T, Hkv, D] into `buf` [L, B, S, Hkv, D] at layer `layer`, slots lengths[b] + t; with
    `layer=slice(None)`, `new` is [L, B, T, Hkv, D]: every layer in one scatter (on the H200 each per-layer
    write is a 2.3 us copy).

    A scatter into the whole (donated) buffer updates it in place; writes past capacity are dropped,
    never clamped onto committed slots. Its slots are distinct (one row per request, consecutive slots), so it is
    declared `unique_indices`: then the compaction's two scatters take 3.8 us together on an H100 and its stage went
    45 -> 32 us (docs/results/2026-12-06-kv-scatter-tree-rows-h100/).
    """
    b, t = new.shape[-4:-2]
    slots = lengths[:, None] + jnp.arange(t)[None, :]
    return buf.at[layer, jnp.arange(b)[:, None], slots].set(new.astype(buf.dtype), mode="drop", unique_indices=True)


def write_every_layer(cache: KVCache, ks: jax.Array, vs: jax.Array) -> KVCache:
    """A step's new K and V, every layer's ([L, B, T, Hkv, D] each), written at slots lengths[b] + t in one scatter
    each (`write_layer` with every layer); lengths unchanged."""
    every = slice(None)
    return KVCache(k=write_layer(cache.k, every, ks, cache.lengths), v=write_layer(cache.v, every, vs, cache.lengths),
                   lengths=cache.lengths)


def advance(cache: KVCache, n: jax.Array) -> KVCache:
    """Commit the first `n[b]` freshly written tokens of each request."""
    return dataclasses.replace(cache, lengths=cache.lengths + n.astype(jnp.int32))


def compact(cache: KVCache, src: jax.Array, n: jax.Array) -> KVCache:
    """Commit tree nodes: for each request move the K/V of nodes `src[b, :n[b]]` (indices into the step's
    new tokens) to slots `lengths[b] + 0 .. n[b]-1`, then advance by `n`.

    `src` is [B, P] with P the longest possible accepted path; entries past `n[b]` are ignored (they
    copy scratch onto scratch). Only P slots per layer move, not the whole tree.
    """
    pos_src = cache.lengths[:, None] + src  # [B, P] absolute slots of the accepted nodes

    def move(x):  # x: [L, B, S, Hkv, D]
        # clip: a finished row near a full cache may point past its end; it reads the last slot, never NaN
        picked = jnp.take_along_axis(x, pos_src[None, :, :, None, None], axis=2, mode="clip")  # [L, B, P, Hkv, D]
        slots = cache.lengths[:, None] + jnp.arange(src.shape[1])[None, :]
        return x.at[:, jnp.arange(x.shape[1])[:, None], slots].set(picked, mode="drop", unique_indices=True)

    return KVCache(k=move(cache.k), v=move(cache.v), lengths=cache.lengths + n.astype(jnp.int32))
