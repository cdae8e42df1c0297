"""Pure-jnp gate|up projection + SwiGLU: the ground truth for the fused kernel and the fallback."""

from __future__ import annotations

import jax

from pallas_kernels.skinny_matmul.reference import skinny_matmul_reference
from pallas_kernels.swiglu.reference import swiglu_reference


def swiglu_matmul_reference(x: jax.Array, w_gate_up: jax.Array) -> jax.Array:
  """``silu(x @ W_gate) * (x @ W_up)`` for ``w_gate_up`` ``[K, 2 I]`` (gate columns first): the projection rounded
  to ``x.dtype`` as the matmul returns it, then SwiGLU in f32 rounded once, as the models computed it before the
  fused kernel (``swiglu(linear(x, w_gate_up))``)."""
  return swiglu_reference(skinny_matmul_reference(x, w_gate_up))
