"""What the split-K Mosaic GPU matmuls (``w12`` and ``skinny_matmul``) share: weights on the wgmma M side
(64 output channels per block), tokens on N, the K range cut into ``split_k`` pieces (``auto_split_k``) whose
partial sums XLA adds afterwards. ``store_partial_sum`` / ``partial_sums_kernel`` / ``reduce_partial_sums`` are
W12's channel-major ``[split_k, N, Mp]`` epilogue; ``skinny_matmul`` stores tokens-major (its module says why)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu


def round_up(a: int, b: int) -> int:
  return -(-a // b) * b


def smem_transforms(minor_dim: int, dtype) -> tuple:
  """Tiling + swizzle that wgmma descriptors and conflict-free SMEM access need."""
  bits = jnp.dtype(dtype).itemsize * 8
  swizzle = plgpu.find_swizzle(minor_dim * bits)
  if swizzle < 32:  # a 16-byte row has nothing to swizzle
    return ()
  return (plgpu.TilingTransform((8, swizzle * 8 // bits)), plgpu.SwizzleTransform(swizzle))


def auto_split_k(n_blocks: int, k_steps: int, num_sms: int, blocks_per_sm: int = 1) -> int:
  """The fewest K splits (a divisor of ``k_steps``) that give every SM ``blocks_per_sm`` blocks: narrow
  layers such as Qwen3-8B's down projection (N = 4096: 64 channel blocks) would otherwise leave half the
  H200 idle."""
  for split in range(1, k_steps + 1):
    if k_steps % split == 0 and n_blocks * split >= num_sms * blocks_per_sm:
      return split
  return k_steps


def num_sms() -> int:
  return int(getattr(jax.devices()[0], "core_count", 0) or 132)  # 132: H100 / H200 SXM


def store_partial_sum(accumulate, out_smem, out_block, tile, out_dtype):
  """The epilogue: ``accumulate(acc_ref)`` on a fresh f32 wgmma accumulator of shape ``tile``, its result
  cast to ``out_dtype`` and copied through ``out_smem`` to this block's ``out_block`` in GMEM."""
  acc = pl.run_scoped(accumulate, plgpu.ACC(tile, jnp.float32))
  out_smem[...] = acc.astype(out_dtype)
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(out_smem, out_block)
  plgpu.wait_smem_to_gmem(0)


def partial_sums_kernel(kernel, *, n, mp, tile_n, tile_m, split_k, out_dtype, **kernel_kwargs):
  """The launch: one block per (``tile_n`` channels, ``tile_m`` tokens, K split), grid axes named ``n``,
  ``m``, ``s``, writing ``[split_k, N, Mp]`` partial sums."""
  return plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((split_k, n, mp), out_dtype),
                      grid=(n // tile_n, mp // tile_m, split_k), grid_names=("n", "m", "s"), **kernel_kwargs)


def reduce_partial_sums(y_t: jax.Array, m: int, dtype) -> jax.Array:
  """``[split_k, N, Mp]`` partial sums -> ``[m, N]`` in ``dtype``: one XLA fusion (sum, slice, transpose,
  cast), which XLA may fuse further into the consumer."""
  return y_t.sum(0)[:, :m].T.astype(dtype)
