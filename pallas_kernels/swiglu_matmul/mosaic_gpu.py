"""The gate|up projection with SwiGLU in its epilogue, for few token rows on Hopper (Mosaic GPU).

Why: in a Qwen3-8B decode step the SwiGLU after the gate|up matmul is a kernel of its own (XLA's fusion, 1.4-1.5 us a
layer, 51-55 us a step on the H200, plus its launch gap in the serial chain;
docs/results/2026-12-02-merge-in-kernel-h200/, call 2). Here it is the matmul's epilogue: the step has one kernel a
layer fewer and the activation is written once, ``[M, I]`` instead of the projection's ``[M, 2 I]``.

Shape of the call. The skinny kernel's (``pallas_kernels.skinny_matmul``): weights on the wgmma M side, tokens on N,
``W`` read as stored (``[K, 2 I]``, gate columns first), no transpose, one ``[tile_k, 64]`` weight tile a pipeline
step. The blocks come in clusters of two: for intermediate channels ``64 j .. 64 j + 63`` the gate block (cluster
index 0) streams gate columns ``64 j``, the up block (index 1) up columns ``I + 64 j``, so the grid has the skinny
kernel's 384 blocks at Qwen3-8B's shape, not 192 blocks of two tiles each. K is never split: SwiGLU needs the whole
sum. Epilogue: each block rounds its accumulator to the projection's dtype (what the matmul returned before) into its
own shared memory; after a cluster barrier the gate block reads the up block's tile through distributed shared memory
(``plgpu.cluster_ref``), computes ``silu(gate) * up`` in f32 (``gate / (1 + exp(-gate)) * up``, as the swiglu kernel
does), rounds once, and stores it transposed (tokens-major) through SMEM with one TMA; a second cluster barrier keeps
the up block's tile alive until it has been read.

The output is ``[M, I]`` exactly: TMA reads zeros for the token rows past ``M`` in the activation tile and clips the
stored box, so no pad or slice kernel runs around the call.

Interpret mode has no distributed shared memory (``cluster_ref`` is rejected there), so interpreted the up block
hands its tile over through a GMEM scratch output instead (TMA out, cluster barrier, TMA in); everything else, the
cluster barriers included, is the GPU form. ``interpretable`` picks the form (the default when interpreting).

Measured: the first form (192 blocks of a gate and an up tile each) tied the two kernels it replaces on the H200
(47.6-49.5 against 47.6 us a call at M = 1; docs/results/2026-12-02-swiglu-epilogue-h200/): its 192 blocks balanced
worse on 132 SMs than the skinny kernel's 384. This form, on the H200: 46.4-47.0 us a call at M = 1 and 46.4 at 16
against 47.5 and 51.3 for the two kernels, and the AR step 4.241 against 4.303-4.306 ms
(docs/results/2026-12-06-swiglu-cluster-h200/; on an H100 5.857 against 5.906 ms,
docs/results/2026-12-06-swiglu-cluster-loop-h100/).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.lowering import lowered_once
from pallas_kernels.split_k import exit_wait, round_up, smem_transforms, streamed_dot, token_tile
from pallas_kernels.tma import pad_for_tma

TILE_N = 64  # intermediate channels per cluster: one wgmma M in each of its two blocks
X_TILE = (8, 64)  # the SMEM tiling of the activation tiles
GATE, UP = 0, 1  # a block's index in its cluster


@dataclasses.dataclass(frozen=True)
class TuningConfig:
  """tile_m: token rows per block (wgmma N, a multiple of 8 up to 256; M is padded to ``min(tile_m, M rounded up to
  8)``). tile_k: reduction depth per pipeline step (a multiple of 64; a step moves one ``[tile_k, 64]`` bf16 weight
  tile). max_concurrent_steps: pipeline slots, i.e. weight bytes in flight a block. The default was the best of four
  pipeline configs at M = 16 on an H100 and 0.1 us behind (256, 2) at M = 1
  (docs/results/2026-12-06-swiglu-cluster-probe-h100/)."""

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


def store_swiglu(acc, proj_smem, out_smem, staged, out_tile, half, *, up_tile=None, hand_over=None) -> None:
  """The cluster epilogue (module docstring), shared with the W12 gate|up kernel (``w12.mosaic_gpu``): this block's
  ``[64, tile_m]`` f32 accumulator (channels on M) rounded to bf16 into ``proj_smem``; after the cluster barrier
  ``staged[0]`` the gate block (``half == GATE``) reads the up block's tile (``up_tile()``, by default through
  distributed shared memory), stores ``silu(gate) * up`` rounded once, tokens-major through ``out_smem``
  ``[tile_m, 64]`` into ``out_tile`` (rows past the output's clipped by TMA); ``staged[1]`` keeps the up block's tile
  alive until it has been read. ``hand_over()`` runs between the rounding and the first barrier (the interpretable
  form's GMEM handover). Every thread calls it; the caller waits for the store (``exit_wait``)."""
  proj_smem[...] = acc.astype(jnp.bfloat16)  # the projection as the matmul would have returned it
  # Every thread's part written before the cluster arrive: that is one thread a block, with no barrier of its own
  # (a tile_k = 256 run on an H100 read a half-written up tile without this).
  plgpu.commit_smem()
  if hand_over is not None:
    hand_over()
  plgpu.barrier_arrive(staged.at[0])
  plgpu.barrier_wait(staged.at[0])

  @pl.when(half == GATE)
  def _epilogue():
    up_ref = up_tile() if up_tile is not None else plgpu.cluster_ref(proj_smem, {"c": UP})
    gate = plgpu.load(proj_smem, layout=plgpu.Layout.WGMMA).astype(jnp.float32)
    up = plgpu.load(up_ref, layout=plgpu.Layout.WGMMA).astype(jnp.float32)
    out_smem.T[...] = (gate / (1.0 + jnp.exp(-gate)) * up).astype(jnp.bfloat16)
    plgpu.commit_smem()  # also: every thread has read the up tile before the arrive below
    plgpu.copy_smem_to_gmem(out_smem, out_tile)

  plgpu.barrier_arrive(staged.at[1])  # the up block's tile stays until the gate block has read it
  plgpu.barrier_wait(staged.at[1])


def swiglu_scratch(tile_m: int) -> dict:
  """``store_swiglu``'s SMEM and cluster barriers, by the names it takes."""
  return {
      "staged": plgpu.ClusterBarrier(collective_axes=("c",), num_barriers=2),  # projection stored; read
      "proj_smem": plgpu.SMEM((TILE_N, tile_m), jnp.bfloat16),  # unswizzled: cluster_ref loads reject swizzles
      "out_smem": plgpu.SMEM((tile_m, TILE_N), jnp.bfloat16, transforms=smem_transforms(TILE_N, jnp.bfloat16)),
  }


@lowered_once("m", "tile_m", "tile_k", "max_concurrent_steps", "interpret", "interpretable")
def _call(x2, w, *, m, tile_m, tile_k, max_concurrent_steps, interpret, interpretable):
  k, n = w.shape
  inter = n // 2
  steps = k // tile_k
  depth = min(max_concurrent_steps, steps)
  n_blocks, m_blocks = inter // TILE_N, round_up(m, tile_m) // tile_m
  w_transforms = smem_transforms(TILE_N, jnp.bfloat16)
  x_transforms = smem_transforms(tile_k, jnp.bfloat16)

  def swiglu_matmul_body(w_gmem, x_gmem, out_gmem, *handover, w_smem, x_smem, loaded, staged, proj_smem, out_smem,
                         up_smem=None, handed=None):  # profile name
    j, mi, half = lax.axis_index("n"), lax.axis_index("m"), lax.axis_index("c")
    w_cols = pl.ds(half * inter + j * TILE_N, TILE_N)  # the gate block's gate columns, the up block's up columns
    m_slice = pl.ds(mi * tile_m, tile_m)

    def load_w(step, slot):
      plgpu.copy_gmem_to_smem(w_gmem.at[pl.ds(step * tile_k, tile_k), w_cols], w_smem.at[slot], loaded.at[slot])

    def load_x(step, slot):
      plgpu.copy_gmem_to_smem(x_gmem.at[m_slice, pl.ds(step * tile_k, tile_k)], x_smem.at[slot], loaded.at[slot])

    def multiply(acc_ref, slot):
      plgpu.wgmma(acc_ref, w_smem.at[slot].T, x_smem.at[slot].T)

    acc = streamed_dot((TILE_N, tile_m), steps, depth, loaded, load_w, load_x, multiply, interpret)
    if interpretable:  # no distributed shared memory: the up block's tile goes through GMEM
      def hand_over():
        @pl.when(half == UP)
        def _hand_over():
          plgpu.copy_smem_to_gmem(proj_smem, handover[0].at[j, mi])
          plgpu.wait_smem_to_gmem(0)

      def up_tile():
        plgpu.copy_gmem_to_smem(handover[0].at[j, mi], up_smem, handed.at[0])
        plgpu.barrier_wait(handed.at[0])
        return up_smem
    else:
      hand_over, up_tile = None, None
    store_swiglu(acc, proj_smem, out_smem, staged, out_gmem.at[m_slice, pl.ds(j * TILE_N, TILE_N)], half,
                 up_tile=up_tile, hand_over=hand_over)
    exit_wait()

  out_type = jax.ShapeDtypeStruct((m, inter), jnp.bfloat16)
  scratch = {
      "w_smem": plgpu.SMEM((depth, tile_k, TILE_N), jnp.bfloat16, transforms=w_transforms),
      "x_smem": plgpu.SMEM((depth, tile_m, tile_k), jnp.bfloat16, transforms=x_transforms),
      "loaded": plgpu.Barrier(num_arrivals=2, num_barriers=depth),  # a slot's weight and x tiles
      **swiglu_scratch(tile_m),
  }
  if interpretable:
    out_type = (out_type, jax.ShapeDtypeStruct((n_blocks, m_blocks, TILE_N, tile_m), jnp.bfloat16))
    scratch["up_smem"] = plgpu.SMEM((TILE_N, tile_m), jnp.bfloat16)
    scratch["handed"] = plgpu.Barrier(num_arrivals=1, num_barriers=1)
  call = plgpu.kernel(swiglu_matmul_body, out_type=out_type, grid=(n_blocks, m_blocks), grid_names=("n", "m"),
                      cluster=(2,), cluster_names=("c",), scratch_types=scratch, interpret=interpret)
  out = call(w, x2)
  return out[0] if interpretable else out


def swiglu_matmul(x: jax.Array, w_gate_up: jax.Array, *, config: TuningConfig | None = None,
                  interpret: plgpu.InterpretGPUParams | None = None,
                  interpretable: bool | None = None) -> jax.Array:
  """``reference.swiglu_matmul_reference(x, w_gate_up)`` in one kernel: ``[..., I]`` bf16 from bf16 ``x``
  ``[..., K]`` and ``w_gate_up`` ``[K, 2 I]``. Unsupported shapes raise NotImplementedError at trace time, so
  ``ops.swiglu_matmul`` can fall back loudly. ``interpretable`` (default: whether ``interpret`` is given) hands the
  up projection over through GMEM instead of distributed shared memory (module docstring)."""
  config = config or DEFAULT_CONFIG
  check_supported(x, w_gate_up, config)
  lead, k = x.shape[:-1], x.shape[-1]
  m = math.prod(lead)
  tile_m = token_tile(config.tile_m, m)
  x2 = pad_for_tma(x.reshape(m, k), X_TILE)
  out = _call(x2, w_gate_up, m=x2.shape[0], tile_m=tile_m, tile_k=config.tile_k,
              max_concurrent_steps=config.max_concurrent_steps, interpret=interpret,
              interpretable=interpret is not None if interpretable is None else interpretable)
  return (out if out.shape[0] == m else out[:m]).reshape(*lead, w_gate_up.shape[1] // 2)
