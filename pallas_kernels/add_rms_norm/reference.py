"""Pure-jnp residual add + RMSNorm: the ground truth for the kernel and the fallback, and exactly what the
target model computed before the kernel existed (``rms_norm`` after ``x = x + delta``; the model imports both from here)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.split_k import SplitKPartials


def rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
  """``w * x / rms(x)`` over the last axis, statistics in f32, each factor rounded to ``x.dtype`` as HF's
  Qwen3 / Llama norms do."""
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return w.astype(x.dtype) * y.astype(x.dtype)


def add_rms_norm_reference(x: jax.Array, delta: jax.Array | SplitKPartials | None, w: jax.Array, eps: float,
                           prefix: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """``(s, rms_norm(s) * w)`` with ``s = x + delta`` in ``x.dtype`` (``delta=None``: ``s = x``; a ``SplitKPartials``
  is summed first, into its own dtype, as the matmul would have returned it). ``prefix`` ``[..., P, H]`` (x
  ``[..., T, H]``): rows that skip the norm, put before each request's normed rows (``[..., P + T, H]``)."""
  if isinstance(delta, SplitKPartials):
    delta = delta.sum()
  s = x if delta is None else x + delta.astype(x.dtype)
  out = rms_norm(s, w, eps)
  return s, out if prefix is None else jnp.concatenate([prefix.astype(out.dtype), out], axis=-2)
