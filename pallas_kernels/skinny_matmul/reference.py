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


def swiglu(gate: jax.Array, up: jax.Array) -> jax.Array:
  """``silu(gate) * up`` in f32, rounded once to the dtype. Why once: HF's bf16 MLP also rounds the activation, but
  XLA on the GPU drops such a round trip inside a fusion (excess precision), so "round twice" would be what the
  kernel does and not what XLA does (the H200 found 23 % of the outputs one step apart, thirteenth session)."""
  return (jax.nn.silu(gate.astype(jnp.float32)) * up.astype(jnp.float32)).astype(gate.dtype)


def swiglu_matmul_reference(x: jax.Array, w: jax.Array) -> jax.Array:
  """``swiglu(x @ w_gate, x @ w_up)`` for a fused ``w = [w_gate | w_up]`` ``[K, 2 F]``: each projection rounded to
  ``x.dtype`` first, as two matmuls return them."""
  gate, up = jnp.split(skinny_matmul_reference(x, w), 2, axis=-1)
  return swiglu(gate, up)
