"""Pure-jnp SwiGLU: the ground truth for the kernel and the fallback (what the models computed before the kernel)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.split_k import SplitKPartials


def swiglu_reference(gate_up: jax.Array | SplitKPartials) -> jax.Array:
  """``silu(gate) * up`` of a fused gate|up projection ``[..., 2 I]`` (gate first), in f32 from the 16-bit
  projections, rounded once to their dtype. Why once: HF's bf16 MLP also rounds the activation, but XLA on the GPU
  drops such a round trip inside a fusion (excess precision), so the rounding would depend on the backend
  (docs/results/2026-12-01-rope-swiglu-h200/). A ``SplitKPartials`` is summed first, as the matmul would have
  returned it."""
  if isinstance(gate_up, SplitKPartials):
    gate_up = gate_up.sum()
  gate, up = jnp.split(gate_up.astype(jnp.float32), 2, axis=-1)
  return (jax.nn.silu(gate) * up).astype(gate_up.dtype)
