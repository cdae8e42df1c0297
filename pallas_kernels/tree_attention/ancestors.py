"""The tree's visibility, carried compactly: one ancestor bitmask per node.

Layout (the spec; every implementation reads it)
------------------------------------------------
``ancestor_bits`` is uint32 ``[B, n, num_words(n)]``: node ``i`` of request ``b``
sees tree node ``j`` iff bit ``j % 32`` of word ``ancestor_bits[b, i, j // 32]`` is
set. A verification tree sets exactly the ancestors of ``i`` and ``i`` itself. Bits
at ``j >= n`` must be zero. That is ``4 * ceil(n / 32)`` bytes per node (32 bytes at
n = 256) instead of a dense ``[n, context]`` mask; the cached prefix needs no mask
at all, only the per-request length.

A parent array ``[B, n]`` (``-1`` for a root, any other value the index of the
parent) converts with ``parents_to_ancestor_bits``; ``dense_to_ancestor_bits`` packs
a boolean ``[..., n, n]`` mask such as ``specpilot.decoding.tree.ancestor_mask``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

WORD_BITS = 32


def num_words(n: int) -> int:
    """uint32 words per node for ``n`` tree nodes."""
    return -(-n // WORD_BITS)


def dense_to_ancestor_bits(mask: jax.Array | np.ndarray) -> jax.Array | np.ndarray:
    """Packs a boolean ``[..., n, n]`` visibility mask into uint32 ``[..., n, num_words(n)]``.

    A numpy mask (a mask fixed at trace time: causal, or all-visible) packs on the host into a numpy constant, so a
    jitted step carries no kernels for it; a traced mask packs with jnp."""
    xp = np if isinstance(mask, np.ndarray) else jnp
    n = mask.shape[-1]
    words = num_words(n)
    padded = xp.pad(mask.astype(xp.uint32), [(0, 0)] * (mask.ndim - 1) + [(0, words * WORD_BITS - n)])
    padded = padded.reshape(*mask.shape[:-1], words, WORD_BITS)
    weights = np.left_shift(np.uint32(1), np.arange(WORD_BITS, dtype=np.uint32))
    return xp.sum(padded * weights, axis=-1, dtype=xp.uint32)  # distinct bits: the sum is an OR


def ancestor_bits_to_dense(bits: jax.Array, n: int) -> jax.Array:
    """Unpacks uint32 ``[..., n, words]`` into a boolean ``[..., n, n]`` mask."""
    j = jnp.arange(n)
    word = jnp.take(bits, j // WORD_BITS, axis=-1)
    return (jnp.right_shift(word, (j % WORD_BITS).astype(jnp.uint32)) & 1).astype(bool)


def parents_to_ancestor_bits(parents: jax.Array) -> jax.Array:
    """uint32 ``[B, n, num_words(n)]`` ancestors-or-self masks from parent indices ``[B, n]``.

    Pointer doubling on packed rows: after round ``r`` a node's row holds its ancestors
    up to distance ``2**r - 1``, and ``jump`` points ``2**r`` levels up (a root points
    at itself), so ``ceil(log2 n)`` rounds cover any tree, chains included. Any order of
    node indices is accepted; a parent array with a cycle is not a tree and gives rows
    that are not ancestor sets.
    """
    b, n = parents.shape
    words = num_words(n)
    node = jnp.arange(n)
    own = (
        jnp.zeros((n, words), jnp.uint32)
        .at[node, node // WORD_BITS]
        .set(jnp.left_shift(jnp.uint32(1), (node % WORD_BITS).astype(jnp.uint32)))
    )
    rows = jnp.broadcast_to(own, (b, n, words))
    jump = jnp.where(parents < 0, node[None, :], parents).astype(jnp.int32)
    for _ in range(max(1, math.ceil(math.log2(max(n, 2))))):
        rows = rows | jnp.take_along_axis(rows, jump[:, :, None], axis=1)
        jump = jnp.take_along_axis(jump, jump, axis=1)
    return rows
