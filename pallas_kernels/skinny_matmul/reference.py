"""Pure-jnp bf16 matmul: the ground truth for the kernel and the fallback (XLA's own dot)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def skinny_matmul_reference(x: jax.Array, w: jax.Array) -> jax.Array:
  """``x @ w`` with f32 accumulation, returned in ``x.dtype``: exactly what ``weights.linear`` ran before
  the kernel existed."""
  if x.shape[-1] != w.shape[0]:
    raise ValueError(f"skinny matmul: x has {x.shape[-1]} features, the weight expects {w.shape[0]}")
  return jnp.einsum("...k,kn->...n", x, w.astype(x.dtype), preferred_element_type=jnp.float32).astype(x.dtype)
