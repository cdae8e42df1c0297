"""The public tree attention: one entry point, the implementation picked per backend."""

from __future__ import annotations

import logging
from typing import Literal

import jax

from pallas_kernels.device import on_hopper as _on_hopper  # a module name tests can patch
from pallas_kernels.tree_attention.config import TuningConfig
from pallas_kernels.tree_attention.reference import tree_attention_reference

_log = logging.getLogger(__name__)

Implementation = Literal["pallas", "reference"]
_IMPLEMENTATIONS = ("pallas", "reference")


def _pallas(name, *args, config, interpret, cache_settled):
    """``mosaic_gpu.<name>(*args)``: ``tree_attention`` or ``tree_attention_packed``."""
    from jax.experimental.pallas import mosaic_gpu as plgpu  # lazy: importing the package stays cheap

    from pallas_kernels.tree_attention import mosaic_gpu

    if not interpret and not _on_hopper():
        raise NotImplementedError("the tree attention kernel needs an H100/H200 (or interpret=True)")
    return getattr(mosaic_gpu, name)(*args, config=config, cache_settled=cache_settled,
                                      interpret=plgpu.InterpretGPUParams() if interpret else None)


def _dispatch(name, reference, args, implementation, interpret, config, what, cache_settled):
    """The implementation choice shared by ``tree_attention`` and ``tree_attention_packed`` (their docstrings)."""
    if implementation not in (None, *_IMPLEMENTATIONS):
        raise ValueError(
            f"unknown tree attention implementation {implementation!r}; expected one of {_IMPLEMENTATIONS}"
        )
    if implementation == "reference":
        return reference(*args)
    if implementation == "pallas":
        return _pallas(name, *args, config=config, interpret=interpret, cache_settled=cache_settled)
    if not (interpret or _on_hopper()):
        return reference(*args)
    try:
        return _pallas(name, *args, config=config, interpret=interpret, cache_settled=cache_settled)
    except NotImplementedError as e:
        _log.warning("tree attention falls back to the reference for %s, k_cache%s: %s", what, args[1].shape, e)
        return reference(*args)


def tree_attention(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    lengths: jax.Array,
    k_tree: jax.Array,
    v_tree: jax.Array,
    ancestor_bits: jax.Array,
    *,
    implementation: Implementation | None = None,
    interpret: bool = False,
    config: TuningConfig | None = None,
    cache_settled: bool = False,
) -> jax.Array:
    """Attention of a draft tree's nodes over their cached prefix and their ancestors.

    q ``[B, n, Hq, D]``; k_cache, v_cache ``[B, S, Hkv, D]`` of which the first
    ``lengths[b]`` positions are visible; k_tree, v_tree ``[B, n, Hkv, D]``, the tree
    nodes' own keys and values; ancestor_bits uint32 ``[B, n, ceil(n / 32)]`` (node i
    sees node j iff bit j is set, ancestors-or-self; ``ancestors.py``). Returns
    ``[B, n, Hq, D]`` in q's dtype (f32 softmax, scale ``D**-0.5``).

    ``implementation="pallas"`` runs the Mosaic GPU kernel (on CPU with
    ``interpret=True``) and raises for shapes it does not support; ``"reference"`` the
    jnp reference. ``None`` picks the kernel on Hopper (or when interpreting) and the
    reference elsewhere; a shape the kernel does not support then falls back to the
    reference with a warning at trace time, so the result is never silently wrong.

    ``cache_settled``: no kernel launched in the two launches before this call wrote the cache prefix or ``lengths``
    (the model's forward writes its new K/V after the last layer, and its lengths come in with the cache). With
    ``pallas_kernels.pdl`` on, the kernel then reads ``lengths`` and starts its prefix loads before its
    grid-dependency wait, behind the kernel before it.
    """
    args = (q, k_cache, v_cache, lengths, k_tree, v_tree, ancestor_bits)
    return _dispatch("tree_attention", tree_attention_reference, args, implementation, interpret, config,
                     f"q{q.shape}", cache_settled)


def unpack_heads(qkv: jax.Array, num_kv_heads: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(q, k, v)`` from heads packed as ``[B, n, Hq + 2 Hkv, D]`` (query heads, then key, then value heads)."""
    hq = qkv.shape[2] - 2 * num_kv_heads
    return qkv[:, :, :hq], qkv[:, :, hq : hq + num_kv_heads], qkv[:, :, hq + num_kv_heads :]


def _packed_reference(qkv, k_cache, v_cache, lengths, ancestor_bits):
    q, k_tree, v_tree = unpack_heads(qkv, k_cache.shape[2])
    return tree_attention_reference(q, k_cache, v_cache, lengths, k_tree, v_tree, ancestor_bits)


def tree_attention_packed(
    qkv: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    lengths: jax.Array,
    ancestor_bits: jax.Array,
    *,
    implementation: Implementation | None = None,
    interpret: bool = False,
    config: TuningConfig | None = None,
    cache_settled: bool = False,
) -> jax.Array:
    """``tree_attention`` with the nodes' q, k and v heads in one array ``[B, n, Hq + 2 Hkv, D]`` (``unpack_heads``'s
    layout; Hkv is the cache's): the kernel reads each part at its head offset, so no slice of q, k or v is copied
    out first (at 16 rows those were three XLA kernels a layer). Implementations, fallback and ``cache_settled`` as
    ``tree_attention``.
    """
    args = (qkv, k_cache, v_cache, lengths, ancestor_bits)
    return _dispatch("tree_attention_packed", _packed_reference, args, implementation, interpret, config,
                     f"qkv{qkv.shape}", cache_settled)
