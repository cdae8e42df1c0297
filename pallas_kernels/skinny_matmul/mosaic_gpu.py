"""A bf16 matmul for few token rows (decode) on Hopper, written with Mosaic GPU.

Why: a decode step reads every weight once and is bound by HBM bandwidth, but XLA's bf16 dot at M = 1
reached 56-77 % of the read ceiling on Qwen3-8B's projections (docs/results/2026-11-30-w12-registers-h200/).
This is the W12 kernel (``pallas_kernels/w12``) without the decode: the same split-K grid
(``pallas_kernels/split_k.py``), weights on the wgmma M side, tokens on N.

Measured on the H200 (docs/results/2026-11-30-skinny-matmul-h200/): at M = 1 a step's matmuls take 4.06 ms
against XLA's 4.30 (large weights stream at 4.2-4.4 TB/s; every call, XLA's too, loses ~4.5 us to the
pipeline's ramp and tail); at M = 16 and 64 it ties XLA. Inside the decode loop it helped only with XLA's
command buffers (5.03 against 5.29 ms a step); with attention on the tree-attention kernel its loop is the best
AR step measured, 4.69-4.87 ms (docs/results/2026-11-30-ar-tree-attention-h200/). ``ops`` uses it for M <= 8 and
only when asked.

Shape of the call. ``y.T = W.T @ x.T`` for ``W`` ``[K, N]`` stored as the model stores it (no per-call
transpose): each pipeline step TMA-loads a ``[tile_k, 64]`` weight tile (128-byte rows, 128-byte swizzle)
and hands it to wgmma as a transposed (M-major) A operand, which wgmma supports for 16-bit types; the
``[tile_m, tile_k]`` activation tile is the B operand. One block owns 64 output channels and ``tile_m``
tokens and walks ``K / split_k`` of the reduction; its accumulator is stored transposed, so the partial sums
are ``[split_k, Mp, N]`` (f32 when split, as two 16-bit halves, else bf16): after the kernel XLA adds the
split slabs, slices the padding off and casts, with no transpose; or, with ``reduce=False``, the consumer does
(``split_k.SplitKPartials``: the residual add + norm kernel). The channel-major first version needed
one, a kernel of its own (at 16 tokens, 9.7 us per Qwen3-8B layer).

The grid is persistent by default (``TuningConfig.persistent``): one block a resident slot, each walking its share of
the (64 channels, token block, K split) work items through one pipeline, so a block that ends an item has the next
item's first tiles in flight. On the H200 it took 30 us off the kernel's 108 calls in a 64-token verify (2052 against
2082 us) and nothing at one row, where two or three blocks an SM already overlap each other's ramps
(docs/results/2026-12-06-ar-row-h200/).

The pipeline is written out (one barrier per slot for its weight and x tiles) rather than ``emit_pipeline``'s, which
loads both tiles of a step together: the first ``max_concurrent_steps`` weight tiles go out before the PDL wait
(``pallas_kernels.pdl``), the x tiles after it. On the H200 the written-out pipeline took what ``emit_pipeline`` took
(3715 against 3702-3766 us of matmuls a decode step, docs/results/2026-12-01-pdl-early-loads-h200/).

Runs in Pallas GPU-interpret mode (both wgmma operands come from SMEM), so the CPU tests run the kernel.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.lowering import lowered_once
from pallas_kernels.skinny_matmul.config import TuningConfig
from pallas_kernels.split_k import (
    SM_SMEM,
    SMEM_LIMIT,
    SplitKPartials,
    auto_split_k,
    consumer_split_k,
    exact_rows,
    halves_scratch,
    num_sms,
    round_up,
    smem_transforms,
    store_split,
    streamed_dot,
    streamed_items,
    token_tile,
)
from pallas_kernels.tma import pad_for_tma

TILE_N = 64  # output channels per block: one wgmma M
X_TILE = (8, 64)  # the SMEM tiling of the activation tiles (``smem_transforms`` of a >= 128-byte bf16 row)

DEFAULT_CONFIG = TuningConfig(persistent=True)
"""What ``skinny_matmul`` runs without a config: in the H200 sweep (``bench_kernels.skinny_sweep``) the best
single config at M = 1, where ``ops`` uses the kernel (4.06 ms a step; blocks_per_sm=1 is better at M = 16,
tile_k=256 at 64). The persistent grid: the same AR step (4.240 / 4.246 against 4.244 / 4.245 ms), the 64-token
verify 21-27 us faster (the kernel's 108 calls 2052 against 2082 us, one H200, docs/results/2026-12-06-ar-row-h200/)."""


SPLIT_K_BY_SHAPE: dict[tuple[int, int], int] = {}
"""``split_k`` by weight shape ``(K, N)`` for a config that leaves it at 0 (auto), where a measured split beats
``auto_split_k``'s. Why: the auto split fills every SM with ``blocks_per_sm`` blocks, which is what a matmul timed
alone wants, but each split adds an XLA sum kernel after it. In a chain of 64 dependent 4096 x 4096 matmuls on the
H200, no split (64 blocks) took 20.5 us a link against 22.8 with the auto split of 8
(docs/results/2026-12-01-pdl-h200/callC_pdl_probe.txt; ``pdl_probe.py``, at ``63e1118``).
``scripts/h200/split_probe.py`` measures every decode shape in such chains and writes this table
(``bench_roofline.py --skinny-splits`` loads it). Empty: the auto split, which the decode loop measured best (the
probe's picks were 0.05 ms a step slower, docs/results/2026-12-01-drafter-tree-h200/)."""


def check_supported(x: jax.Array, w: jax.Array, config: TuningConfig) -> None:
  """Raises ValueError for inconsistent inputs, NotImplementedError (the caller falls back) for what the
  kernel does not tile."""
  k, n = w.shape
  if x.shape[-1] != k:
    raise ValueError(f"skinny matmul: x has {x.shape[-1]} features, the weight expects {k}")
  if x.dtype != jnp.bfloat16 or w.dtype != jnp.bfloat16:
    raise NotImplementedError(f"the skinny kernel takes bf16 x and W, got {x.dtype} and {w.dtype}")
  if n % TILE_N:
    raise NotImplementedError(f"N={n} is not a multiple of {TILE_N}")
  if k % config.tile_k:
    raise NotImplementedError(f"K={k} is not a multiple of tile_k={config.tile_k}")
  if config.split_k and (k // config.tile_k) % config.split_k:
    raise NotImplementedError(f"split_k={config.split_k} does not divide the {k // config.tile_k} K steps")


def _smem_bytes(tile_m: int, tile_k: int, depth: int, halves: int) -> int:
  """A block's shared memory: ``depth`` stages of a weight and an activation tile, and the output tile's halves."""
  return depth * (tile_k * TILE_N + tile_m * tile_k) * 2 + halves * tile_m * TILE_N * 2


def _pipeline_depth(config: TuningConfig, tile_m: int, steps: int, halves: int) -> int:
  """``max_concurrent_steps`` (at most ``steps``); with ``tile_m == 0`` (all rows in one block) the deepest pipeline
  that fits shared memory. Raises NotImplementedError (the caller falls back) when the tiles do not fit."""
  depth = min(config.max_concurrent_steps, steps)
  while config.tile_m == 0 and depth > 1 and _smem_bytes(tile_m, config.tile_k, depth, halves) > SMEM_LIMIT:
    depth -= 1
  smem = _smem_bytes(tile_m, config.tile_k, depth, halves)
  if smem > SMEM_LIMIT:
    raise NotImplementedError(f"the skinny kernel with {config} needs {smem} bytes of shared memory a block at "
                              f"{tile_m} token rows, over {SMEM_LIMIT}: lower max_concurrent_steps, tile_k or tile_m")
  return depth


def persistent_blocks(work_items: int, smem_bytes: int, blocks_per_sm: int) -> int:
  """Blocks of the persistent grid (``TuningConfig.persistent``): as many as are resident at once (``blocks_per_sm``,
  or fewer where shared memory holds fewer), at most one a work item."""
  resident = max(1, min(blocks_per_sm, SM_SMEM // (smem_bytes + 1024)))
  return min(work_items, num_sms() * resident)


@lowered_once("tile_m", "tile_k", "max_concurrent_steps", "split_k", "halves", "interpret", "mp", "out_rows",
              "grid_blocks")
def _call(x2, w, *, tile_m, tile_k, max_concurrent_steps, split_k, halves, interpret, mp, out_rows, grid_blocks):
  """``[split_k, halves, Mp, N]`` bf16: each block's accumulator stored transposed (tokens-major). With
  ``halves`` = 1 the bf16 result; with 2 the f32 partial sum's high and low 16 bits (``f32_from_halves``):
  Mosaic GPU stores a transposed wgmma accumulator into swizzled SMEM for 16-bit types only.

  ``x2`` has at most ``mp`` rows (``pad_for_tma``): the activation tiles are TMA boxes of ``tile_m`` rows, and TMA
  fills the rows past ``x2``'s with zeros. The output rows past them are zeros; ``out_rows`` (``split_k.exact_rows``)
  may be fewer than ``mp``, the stores clipped.

  ``grid_blocks`` = 0: one block a work item (64 channels, ``tile_m`` tokens, one K split). Else a persistent grid of
  that many blocks, block ``p`` taking items ``p, p + grid_blocks, ..`` through one pipeline (``streamed_items``);
  the output is the same."""
  k, n = w.shape
  steps = k // tile_k // split_k
  depth = min(max_concurrent_steps, steps)
  w_transforms = smem_transforms(TILE_N, jnp.bfloat16)
  x_transforms = smem_transforms(tile_k, jnp.bfloat16)
  m_blocks = mp // tile_m
  work_items = n // TILE_N * m_blocks * split_k

  def skinny_matmul_body(w_gmem, x_gmem, out_gmem, w_smem, x_smem, loaded, out_smem):  # its name in profiles
    def coordinates(step):  # a step of this block's walk -> (channel block, token block, split, step in the split)
      if not grid_blocks:
        return lax.axis_index("n"), lax.axis_index("m"), lax.axis_index("s"), step
      item = lax.axis_index("p") + step // steps * grid_blocks
      return item // (m_blocks * split_k), item // split_k % m_blocks, item % split_k, step % steps

    def load_w(step, slot):
      nb, _, split, i = coordinates(step)
      k_slice = pl.ds((split * steps + i) * tile_k, tile_k)
      plgpu.copy_gmem_to_smem(w_gmem.at[k_slice, pl.ds(nb * TILE_N, TILE_N)], w_smem.at[slot], loaded.at[slot])

    def load_x(step, slot):
      _, mb, split, i = coordinates(step)
      k_slice = pl.ds((split * steps + i) * tile_k, tile_k)
      plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(mb * tile_m, tile_m), k_slice], x_smem.at[slot], loaded.at[slot])

    def multiply(acc_ref, slot):
      plgpu.wgmma(acc_ref, w_smem.at[slot].T, x_smem.at[slot].T)

    def store(acc, item):
      nb, mb, split, _ = coordinates(item * steps)
      store_split(acc, out_smem, out_gmem, split, pl.ds(mb * tile_m, tile_m), pl.ds(nb * TILE_N, TILE_N))

    if not grid_blocks:
      store(streamed_dot((TILE_N, tile_m), steps, depth, loaded, load_w, load_x, multiply, interpret), 0)
      return
    p = lax.axis_index("p")
    items = (work_items - p + grid_blocks - 1) // grid_blocks
    streamed_items((TILE_N, tile_m), items, steps, depth, loaded, load_w, load_x, multiply, store, interpret)

  grid, grid_names = ((grid_blocks,), ("p",)) if grid_blocks else ((n // TILE_N, m_blocks, split_k), ("n", "m", "s"))
  call = plgpu.kernel(
      skinny_matmul_body, out_type=jax.ShapeDtypeStruct((split_k, halves, out_rows, n), jnp.bfloat16),
      grid=grid, grid_names=grid_names,
      scratch_types={
          "w_smem": plgpu.SMEM((depth, tile_k, TILE_N), jnp.bfloat16, transforms=w_transforms),
          "x_smem": plgpu.SMEM((depth, tile_m, tile_k), jnp.bfloat16, transforms=x_transforms),
          "loaded": plgpu.Barrier(num_arrivals=2, num_barriers=depth),  # a slot's weight and x tiles
          "out_smem": halves_scratch(halves, tile_m, TILE_N),
      },
      interpret=interpret,
  )
  return call(w, x2)


def skinny_matmul(x: jax.Array, w: jax.Array, *, config: TuningConfig | None = None,
                  interpret: plgpu.InterpretGPUParams | None = None,
                  reduce: bool = True) -> jax.Array | SplitKPartials:
  """``x @ w`` for bf16 ``x`` ``[..., K]`` and ``w`` ``[K, N]``, f32 accumulation, bf16 result; with
  ``reduce=False`` the kernel's output as ``SplitKPartials`` (the unsummed K splits, or with K unsplit the padded
  result), for a consumer kernel that reads it itself.

  ``interpret=plgpu.InterpretGPUParams()`` runs it on CPU for tests. Unsupported shapes raise
  NotImplementedError (at trace time) so ``skinny_matmul.matmul`` can fall back loudly.
  """
  config = config or DEFAULT_CONFIG
  check_supported(x, w, config)
  k, n = w.shape
  lead = x.shape[:-1]
  m = math.prod(lead)
  tile_m = token_tile(config.tile_m, m)
  mp = round_up(max(m, 1), tile_m)
  k_steps = k // config.tile_k
  split_k = config.split_k or SPLIT_K_BY_SHAPE.get((k, n)) or auto_split_k(
      (n // TILE_N) * (mp // tile_m), k_steps, num_sms(), config.blocks_per_sm)
  if not reduce and not config.split_k and (k, n) not in SPLIT_K_BY_SHAPE:
    split_k = consumer_split_k(split_k, k_steps)
  if k_steps % split_k:
    raise ValueError(f"skinny matmul: split_k={split_k} for W[{k}, {n}] does not divide its {k_steps} K steps "
                     f"(tile_k={config.tile_k}; SPLIT_K_BY_SHAPE or the config)")
  halves = 2 if split_k > 1 else 1
  depth = _pipeline_depth(config, tile_m, k_steps // split_k, halves)
  x2 = pad_for_tma(x.reshape(m, k), X_TILE)
  grid_blocks = 0
  if config.persistent:
    grid_blocks = persistent_blocks(n // TILE_N * (mp // tile_m) * split_k,
                                    _smem_bytes(tile_m, config.tile_k, depth, halves), config.blocks_per_sm)
  partial = _call(x2, w, tile_m=tile_m, tile_k=config.tile_k, max_concurrent_steps=depth, split_k=split_k,
                  halves=halves, interpret=interpret, mp=mp, out_rows=exact_rows(m, mp, halves, reduce),
                  grid_blocks=grid_blocks)
  partials = SplitKPartials(partial, lead, jnp.dtype(x.dtype).name)  # split_k == 1: the padded result itself
  return partials.sum() if reduce else partials
