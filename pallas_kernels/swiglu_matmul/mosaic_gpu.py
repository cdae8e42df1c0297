"""The gate|up projection with SwiGLU in its epilogue, for few token rows on Hopper (Mosaic GPU).

Why: in a Qwen3-8B decode step the SwiGLU after the gate|up matmul is a kernel of its own (XLA's fusion, 1.4-1.5 us a
layer, 51-55 us a step on the H200, plus its launch gap in the serial chain;
docs/results/2026-12-02-merge-in-kernel-h200/, call 2). Here it is the matmul's epilogue: the step has one kernel a
layer fewer and the activation is written once, ``[M, I]`` instead of the projection's ``[M, 2 I]``.

Shape of the call. The skinny kernel's (``pallas_kernels.skinny_matmul``): weights on the wgmma M side, tokens on N,
``W`` read as stored (``[K, 2 I]``, gate columns first), no transpose. One block owns 64 intermediate channels: each
pipeline step TMA-loads the ``[tile_k, 64]`` gate tile at columns ``64 j`` and the up tile at ``I + 64 j`` and runs
two wgmmas into two ``[64, tile_m]`` f32 accumulators, so gate and up of one channel sit in the same thread's
registers and the epilogue is elementwise: each value rounded to the projection's dtype (what the matmul returned
before), ``silu(gate) * up`` in f32 (``gate / (1 + exp(-gate)) * up``, as the swiglu kernel computes it), rounded
once; stored transposed (tokens-major) through SMEM with one TMA. K is never split: SwiGLU needs the whole sum, and
Qwen3-8B's ``I / 64 = 192`` blocks at two a SM are all resident at once on the H200's 132 SMs (SMEM: three 34 KB
pipeline slots a block), with ~96 KB of weights in flight a block.

The output is ``[M, I]`` exactly: TMA reads zeros for the token rows past ``M`` in the activation tile and clips the
stored box, so no pad or slice kernel runs around the call. Runs in Pallas GPU-interpret mode (both wgmma operands
come from SMEM), so the CPU tests run the kernel.

Measured on the H200 (docs/results/2026-12-02-swiglu-epilogue-h200/): equal to the reference, and at parity. At
M = 1 it takes 47.6-49.5 us a call over the pipeline configs, the skinny kernel + XLA's SwiGLU 47.6 (both stream
4.2 TB/s): its 192 blocks of 128 weight columns lose ~1 us a call against the skinny kernel's 384 of 64, what the
SwiGLU kernel took. At M = 16 it is 48.4 against 51.3. What would keep 384 blocks (a load-time interleave of gate
and up columns, paired across warps in the epilogue) is in that README.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import pdl
from pallas_kernels.lowering import lowered_once
from pallas_kernels.split_k import exit_wait, halves_scratch, round_up, smem_transforms, token_tile
from pallas_kernels.tma import pad_for_tma

TILE_N = 64  # intermediate channels per block: one wgmma M for the gate, one for the up projection
X_TILE = (8, 64)  # the SMEM tiling of the activation tiles


@dataclasses.dataclass(frozen=True)
class TuningConfig:
  """tile_m: token rows per block (wgmma N, a multiple of 8 up to 256; M is padded to ``min(tile_m, M rounded up to
  8)``). tile_k: reduction depth per pipeline step (a multiple of 64; a step moves two ``[tile_k, 64]`` bf16 weight
  tiles). max_concurrent_steps: pipeline slots, i.e. weight bytes in flight a block; three at tile_k = 128 leave room
  for two blocks a SM. The default was the best at M = 16 on the H200 and 0.8 us behind (256, 1) at M = 1."""

  tile_m: int = 64
  tile_k: int = 128
  max_concurrent_steps: int = 3

  def __post_init__(self):
    if self.tile_m % 8 or not 8 <= self.tile_m <= 256:
      raise ValueError(f"tile_m must be a multiple of 8 in [8, 256], got {self.tile_m}")
    if self.tile_k <= 0 or self.tile_k % 64:
      raise ValueError(f"tile_k must be a positive multiple of 64, got {self.tile_k}")
    if self.max_concurrent_steps < 1:
      raise ValueError(f"max_concurrent_steps must be >= 1, got {self.max_concurrent_steps}")


DEFAULT_CONFIG = TuningConfig()


def check_supported(x: jax.Array, w: jax.Array, config: TuningConfig) -> None:
  """ValueError for inconsistent inputs; NotImplementedError (the caller falls back) for what the kernel does not
  tile."""
  k, n = w.shape
  if x.shape[-1] != k:
    raise ValueError(f"swiglu matmul: x has {x.shape[-1]} features, w_gate_up expects {k}")
  if n % 2:
    raise ValueError(f"swiglu matmul: the fused gate|up weight has an odd width {n}")
  if x.dtype != jnp.bfloat16 or w.dtype != jnp.bfloat16:
    raise NotImplementedError(f"the swiglu matmul kernel takes bf16 x and W, got {x.dtype} and {w.dtype}")
  if (n // 2) % TILE_N:
    raise NotImplementedError(f"intermediate size {n // 2} is not a multiple of {TILE_N}")
  if k % config.tile_k:
    raise NotImplementedError(f"K={k} is not a multiple of tile_k={config.tile_k}")


@lowered_once("m", "tile_m", "tile_k", "max_concurrent_steps", "interpret")
def _call(x2, w, *, m, tile_m, tile_k, max_concurrent_steps, interpret):
  k, n = w.shape
  inter = n // 2
  steps = k // tile_k
  depth = min(max_concurrent_steps, steps)
  w_transforms = smem_transforms(TILE_N, jnp.bfloat16)
  x_transforms = smem_transforms(tile_k, jnp.bfloat16)

  def swiglu_matmul_body(w_gmem, x_gmem, out_gmem, gate_smem, up_smem, x_smem, loaded, out_smem):  # profile name
    j = lax.axis_index("n")
    gate_cols, up_cols = pl.ds(j * TILE_N, TILE_N), pl.ds(inter + j * TILE_N, TILE_N)
    m_slice = pl.ds(lax.axis_index("m") * tile_m, tile_m)

    def load_w(step, slot):
      k_slice = pl.ds(step * tile_k, tile_k)
      plgpu.copy_gmem_to_smem(w_gmem.at[k_slice, gate_cols], gate_smem.at[slot], loaded.at[slot])
      plgpu.copy_gmem_to_smem(w_gmem.at[k_slice, up_cols], up_smem.at[slot], loaded.at[slot])

    def load_x(step, slot):
      plgpu.copy_gmem_to_smem(x_gmem.at[m_slice, pl.ds(step * tile_k, tile_k)], x_smem.at[slot], loaded.at[slot])

    # as in the skinny kernel: the weight tiles before the PDL wait, the activation (the previous kernel's output)
    # after it
    for slot in range(depth):
      load_w(slot, slot)
    pdl.begin_kernel(interpret)
    for slot in range(depth):
      load_x(slot, slot)

    def accumulate(gate_acc, up_acc):
      def step(i, carry):
        slot = lax.rem(i, depth)
        plgpu.barrier_wait(loaded.at[slot])
        plgpu.wgmma(gate_acc, gate_smem.at[slot].T, x_smem.at[slot].T)
        plgpu.wgmma(up_acc, up_smem.at[slot].T, x_smem.at[slot].T)
        plgpu.wgmma_wait(0)

        @pl.when(i + depth < steps)
        def _refill():  # the slot's tiles were read by the wgmmas just waited for
          load_w(i + depth, slot)
          load_x(i + depth, slot)

        return carry

      lax.fori_loop(0, steps, step, None)
      return gate_acc[...], up_acc[...]

    acc_type = plgpu.ACC((TILE_N, tile_m), jnp.float32)
    gate, up = pl.run_scoped(accumulate, acc_type, acc_type)
    gate = gate.astype(jnp.bfloat16).astype(jnp.float32)  # the projection as the matmul would have returned it
    up = up.astype(jnp.bfloat16).astype(jnp.float32)
    out_smem.at[0].T[...] = (gate / (1.0 + jnp.exp(-gate)) * up).astype(jnp.bfloat16)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(out_smem.at[0], out_gmem.at[m_slice, gate_cols])  # rows past M are clipped
    exit_wait()

  call = plgpu.kernel(
      swiglu_matmul_body, out_type=jax.ShapeDtypeStruct((m, inter), jnp.bfloat16),
      grid=(inter // TILE_N, round_up(m, tile_m) // tile_m), grid_names=("n", "m"),
      scratch_types={
          "gate_smem": plgpu.SMEM((depth, tile_k, TILE_N), jnp.bfloat16, transforms=w_transforms),
          "up_smem": plgpu.SMEM((depth, tile_k, TILE_N), jnp.bfloat16, transforms=w_transforms),
          "x_smem": plgpu.SMEM((depth, tile_m, tile_k), jnp.bfloat16, transforms=x_transforms),
          "loaded": plgpu.Barrier(num_arrivals=3, num_barriers=depth),  # a slot's gate, up and x tiles
          "out_smem": halves_scratch(1, tile_m, TILE_N),
      },
      interpret=interpret,
  )
  return call(w, x2)


def swiglu_matmul(x: jax.Array, w_gate_up: jax.Array, *, config: TuningConfig | None = None,
                  interpret: plgpu.InterpretGPUParams | None = None) -> jax.Array:
  """``reference.swiglu_matmul_reference(x, w_gate_up)`` in one kernel: ``[..., I]`` bf16 from bf16 ``x``
  ``[..., K]`` and ``w_gate_up`` ``[K, 2 I]``. Unsupported shapes raise NotImplementedError at trace time, so
  ``ops.swiglu_matmul`` can fall back loudly."""
  config = config or DEFAULT_CONFIG
  check_supported(x, w_gate_up, config)
  lead, k = x.shape[:-1], x.shape[-1]
  m = math.prod(lead)
  tile_m = token_tile(config.tile_m, m)
  x2 = pad_for_tma(x.reshape(m, k), X_TILE)
  out = _call(x2, w_gate_up, m=x2.shape[0], tile_m=tile_m, tile_k=config.tile_k,
              max_concurrent_steps=config.max_concurrent_steps, interpret=interpret)
  return (out if out.shape[0] == m else out[:m]).reshape(*lead, w_gate_up.shape[1] // 2)
