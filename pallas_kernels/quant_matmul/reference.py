"""Pure-jnp weight-only quantized matmul: the ground truth and the fallback off Hopper."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def quant_matmul_reference(x: jax.Array, q_t: jax.Array, scale: jax.Array) -> jax.Array:
    """``(x @ q_t.T.astype(x.dtype)) * scale`` with f32 accumulation, returned in ``x.dtype``.

    ``q_t`` is the quantized weight stored output-major, ``[N, K]`` (see ``QuantArray``);
    ``scale`` is ``[N]`` f32. Alone, at M = 1 on the H200, XLA fuses the conversion into its GEMM
    and this beats the bf16 matmul it replaces (24 vs 29 us at 12288x4096;
    docs/results/2026-11-30-kernels-h200-splitk); inside the whole level-1 pass an earlier bench
    saw a bf16 copy materialised (``ops`` module docstring).
    """
    _, k = q_t.shape
    if x.shape[-1] != k:
        raise ValueError(f"quant matmul: x has {x.shape[-1]} features, the weight expects {k}")
    y = jnp.einsum("...k,nk->...n", x, q_t.astype(x.dtype), preferred_element_type=jnp.float32)
    return (y * scale).astype(x.dtype)
