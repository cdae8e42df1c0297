"""Pure-jnp q/k norm + rotary embedding of a fused q|k|v projection: the ground truth for the kernel and the
fallback, and exactly what the target model computed before the kernel existed (Qwen3's per-head RMSNorm of q and
k, then HF's half-rotation RoPE; v as projected)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.add_rms_norm.reference import rms_norm
from pallas_kernels.split_k import SplitKPartials


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """x ``[B, T, H, D]``; cos/sin ``[B, T, D]`` (HF's layout: each frequency twice). In f32, rounded once."""
  half = x.shape[-1] // 2
  x32 = x.astype(jnp.float32)
  rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
  return (x32 * cos[:, :, None] + rotated * sin[:, :, None]).astype(x.dtype)


def split_heads(qkv: jax.Array | SplitKPartials, head_dim: int) -> jax.Array:
  """``[B, T, H D]`` (or its unsummed K splits, summed here as the matmul would have) as ``[B, T, H, D]``."""
  if isinstance(qkv, SplitKPartials):
    qkv = qkv.sum()
  b, t, n = qkv.shape
  return qkv.reshape(b, t, n // head_dim, head_dim)


def qk_norm_rope_reference(qkv: jax.Array | SplitKPartials, q_norm: jax.Array | None, k_norm: jax.Array | None,
                           cos: jax.Array, sin: jax.Array, *, num_kv_heads: int, eps: float) -> jax.Array:
  """The heads ``[B, T, Hq + 2 Hkv, D]`` of ``qkv`` ``[B, T, (Hq + 2 Hkv) D]``: q's and k's RMS-normed per head
  (``q_norm`` / ``k_norm`` ``[D]``; both None: no norm, as Llama) and rotated, v's as projected."""
  heads = split_heads(qkv, cos.shape[-1])
  n_qk = heads.shape[2] - num_kv_heads
  qk, v = heads[:, :, :n_qk], heads[:, :, n_qk:]
  if q_norm is not None:  # the per-head weight picked by a select, not concatenated: a concatenation of the two
    g = jnp.where((np.arange(n_qk) < n_qk - num_kv_heads)[:, None], q_norm, k_norm)  # is a kernel of its own
    qk = rms_norm(qk, g, eps)
  return jnp.concatenate([apply_rope(qk, cos, sin), v], axis=2)
