"""Pure-jnp weight-only quantized matmul: the ground truth and the fallback off Hopper."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def quant_matmul_reference(x: jax.Array, q_t: jax.Array, scale: jax.Array) -> jax.Array:
    """``(x @ q_t.T.astype(x.dtype)) * scale`` with f32 accumulation, returned in ``x.dtype``.

    ``q_t`` is the quantized weight stored output-major, ``[N, K]`` (see ``QuantArray``);
    ``scale`` is ``[N]`` f32. Plain XLA materialises ``q_t.astype(x.dtype)`` as a bf16 copy
    before the dot on the H200, so this reads more bytes than the bf16 matmul it replaces.
    """
    _, k = q_t.shape
    if x.shape[-1] != k:
        raise ValueError(f"quant matmul: x has {x.shape[-1]} features, the weight expects {k}")
    y = jnp.einsum("...k,nk->...n", x, q_t.astype(x.dtype), preferred_element_type=jnp.float32)
    return (y * scale).astype(x.dtype)
