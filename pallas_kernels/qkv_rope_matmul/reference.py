"""Pure-jnp q|k|v projection + q/k norm + rope: the ground truth for the fused kernel and its fallback's numbers."""

from __future__ import annotations

import jax

from pallas_kernels.qk_norm_rope.reference import qk_norm_rope_reference
from pallas_kernels.skinny_matmul.reference import skinny_matmul_reference


def qkv_rope_matmul_reference(x: jax.Array, w_qkv: jax.Array, q_norm: jax.Array | None, k_norm: jax.Array | None,
                              cos: jax.Array, sin: jax.Array, *, num_kv_heads: int, eps: float) -> jax.Array:
  """The heads ``[B, T, Hq + 2 Hkv, D]`` of ``x @ w_qkv`` (``x`` ``[B, T, K]``): the projection rounded to
  ``x.dtype`` as the matmul returns it, then ``qk_norm_rope_reference``, as the models computed it before the fused
  kernel (``qk_norm_rope(linear(x, w_qkv))``)."""
  return qk_norm_rope_reference(skinny_matmul_reference(x, w_qkv), q_norm, k_norm, cos, sin,
                                num_kv_heads=num_kv_heads, eps=eps)
