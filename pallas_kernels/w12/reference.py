"""Pure-jnp W12 matmul: the ground truth for kernels and the fallback off Hopper."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.w12.format import W12Array, unpack


def w12_matmul_reference(x: jax.Array, packed: W12Array) -> jax.Array:
  """``x @ unpack(packed)`` with f32 accumulation, returned in ``x.dtype``.

  Materialises the bf16 weight, so it moves more bytes than the bf16 matmul it
  replaces; it exists to be obviously right, not fast.
  """
  k, _ = packed.shape
  if x.shape[-1] != k:
    raise ValueError(f"w12 matmul: x has {x.shape[-1]} features, the weight expects {k}")
  w = unpack(packed)
  # HIGHEST: f32 activations must not be rounded to TF32 on GPU; bf16 ones are unaffected
  return jnp.matmul(x, w, precision=jax.lax.Precision.HIGHEST,
                    preferred_element_type=jnp.float32).astype(x.dtype)
