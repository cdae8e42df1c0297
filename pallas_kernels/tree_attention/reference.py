"""Pure-jnp tree attention: the correctness oracle and the fallback off Hopper.

It builds the dense ``[B, n, S + n]`` mask (prefix positions below each request's
length, then the tree's ancestor bits) and runs softmax attention in f32. It exists
to be obviously right, not fast: the kernel never materialises that mask.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.tree_attention.ancestors import ancestor_bits_to_dense


def tree_attention_reference(q, k_cache, v_cache, lengths, k_tree, v_tree, ancestor_bits):
    """Attention of ``n`` tree nodes over their request's cached prefix and their ancestors.

    q ``[B, n, Hq, D]``; k_cache, v_cache ``[B, S, Hkv, D]`` with ``lengths`` ``[B]``
    visible positions; k_tree, v_tree ``[B, n, Hkv, D]``; ancestor_bits uint32
    ``[B, n, ceil(n / 32)]`` (see ``ancestors.py``). Returns ``[B, n, Hq, D]`` in q's
    dtype; a row that sees no key at all is 0.
    """
    b, n, hq, d = q.shape
    s, hkv = k_cache.shape[1], k_cache.shape[2]
    prefix_visible = jnp.arange(s)[None, None, :] < lengths[:, None, None]  # [B, 1, S]
    mask = jnp.concatenate(
        [jnp.broadcast_to(prefix_visible, (b, n, s)), ancestor_bits_to_dense(ancestor_bits, n)], axis=-1
    )  # [B, n, S + n]
    k = jnp.concatenate([k_cache, k_tree], axis=1).astype(jnp.float32)
    v = jnp.concatenate([v_cache, v_tree], axis=1).astype(jnp.float32)
    qg = q.astype(jnp.float32).reshape(b, n, hkv, hq // hkv, d)
    hi = jax.lax.Precision.HIGHEST
    scores = jnp.einsum("bnkgd,bskd->bkgns", qg, k, precision=hi) * d**-0.5
    scores = jnp.where(mask[:, None, None], scores, -jnp.inf)
    row_max = jnp.max(scores, axis=-1, keepdims=True)
    weights = jnp.exp(scores - jnp.where(jnp.isfinite(row_max), row_max, 0.0))
    total = jnp.sum(weights, axis=-1, keepdims=True)
    probs = weights / jnp.where(total > 0, total, 1.0)
    out = jnp.einsum("bkgns,bskd->bnkgd", probs, v, precision=hi)
    return out.reshape(b, n, hq, d).astype(q.dtype)
