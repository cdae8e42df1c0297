"""TMA operands shared by the Mosaic GPU kernels (``skinny_matmul``, ``w12``, ``tree_attention``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _round_up(a: int, b: int) -> int:
  return -(-a // b) * b


def pad_for_tma(x: jax.Array, tiles: tuple[int, ...]) -> jax.Array:
  """``x`` ready to be a TMA source of boxes tiled by ``tiles`` (the SMEM tiling of its transforms): Mosaic GPU
  tiles a GMEM operand along a dimension only if it is a multiple of the tile or smaller than it. A dimension
  that is neither is zero-padded up to a multiple (odd prefill-sized M, K off a multiple of 64, 12 tree nodes);
  decode's one to eight token rows pass as they are, a box that reads past them gets TMA's zeros, and a box
  stored past them is clipped. No pad, no extra kernel: at M = 1 a pad was one more XLA kernel per matmul
  (~1.7 us, 144 in a Qwen3-8B step)."""
  pads = [(0, 0 if d < t or d % t == 0 else _round_up(d, t) - d) for d, t in zip(x.shape, tiles)]
  return jnp.pad(x, pads) if any(hi for _, hi in pads) else x
