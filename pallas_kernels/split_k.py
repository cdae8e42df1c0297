"""What the split-K Mosaic GPU matmuls (``w12`` and ``skinny_matmul``) share: weights on the wgmma M side
(64 output channels per block), tokens on N, the K range cut into ``split_k`` pieces (``auto_split_k``) whose
partial sums XLA adds afterwards. ``store_partial_sum`` / ``partial_sums_kernel`` / ``reduce_partial_sums`` are the
W12 SMEM decode's channel-major ``[split_k, N, Mp]`` epilogue; ``skinny_matmul`` and the W12 register decode store
tokens-major halves (``store_split``; the skinny module says why) as ``SplitKPartials``, which a consumer kernel
(``load_row``) may add itself. ``streamed_dot`` is the few-token matmuls' weight-streaming pipeline."""

from __future__ import annotations

import dataclasses
import functools
import math
import operator

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import pdl


def round_up(a: int, b: int) -> int:
  return -(-a // b) * b


SM_SMEM = 228 * 1024
"""Shared memory an SM of the H100 / H200 holds: its resident blocks' together, each with 1 KB reserved."""

SMEM_LIMIT = 226 * 1024
"""Shared memory a block of the split-K matmul kernels may take: the H100 / H200's 227 KB less 1 KB for Mosaic GPU's
barriers (it added 64 bytes to the W12 register decode's own count in the configs checked on the CPU)."""


def token_tile(tile_m: int, m: int) -> int:
  """Token rows a block takes (wgmma N, a multiple of 8): ``tile_m``, or fewer for fewer rows; ``tile_m == 0`` takes
  all ``m`` rows in one block (at most 256, wgmma's widest N), so every weight byte is read once per call."""
  rows = round_up(max(m, 1), 8)
  return min(rows, 256) if tile_m == 0 else min(tile_m, rows)


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


CONSUMER_SPLIT_K = 2
"""The most K splits a matmul hands to a consumer kernel (``reduce=False``: the add + norm, q/k norm + rope and SwiGLU
kernels) when its config names no split (the skinny and W12 kernels). Why: the add + norm kernel reads every split's
row in its one block. With the auto split (8 for the o projection, 6 for down) its 72 calls took 105 us a step more,
as much as the XLA sums they replaced; with two, 16 us more, and the o and down matmuls themselves got 42 us faster:
the AR step went 4.574 -> 4.452 ms on the H200 (docs/results/2026-12-01-partials-w12v3-h200/). Two splits of a
4096-wide output are 128 blocks of 64 channels, each with ``max_concurrent_steps`` 16 KB weight tiles in flight: ~8
MB, above the HBM's bandwidth-delay product. The W12 decode loop handed its auto splits over until the eighteenth
session: its 73 add + norm calls took 508 us a step and its tokens differed from the bf16 loop's; with two splits
they took 176 us and the tokens match, though its o and down kernels, at ~1 block an SM, took longer
(docs/results/2026-12-03-skinny-resident-w12-loop-h200/; ``w12.mosaic_gpu.CONSUMER_DEPTH``)."""


def consumer_split_k(split_k: int, k_steps: int) -> int:
  """The largest divisor of ``k_steps`` no larger than ``split_k`` or ``CONSUMER_SPLIT_K``."""
  return max(s for s in range(1, min(split_k, CONSUMER_SPLIT_K) + 1) if k_steps % s == 0)


def num_sms() -> int:
  return int(getattr(jax.devices()[0], "core_count", 0) or 132)  # 132: H100 / H200 SXM


def streamed_dot(tile, steps: int, depth: int, loaded, load_w, load_x, multiply, interpret) -> jax.Array:
  """Inside a Mosaic GPU kernel: the f32 ``tile``-shaped wgmma accumulator of ``steps`` pipeline steps through
  ``depth`` slots, what the few-token matmuls (``skinny_matmul``, ``swiglu_matmul``, ``qkv_rope_matmul``) share.
  ``load_w(step, slot)`` / ``load_x(step, slot)`` issue a step's weight and activation TMA loads into a slot (both
  arriving on ``loaded.at[slot]``); ``multiply(acc_ref, slot)`` issues the slot's wgmma. The first ``depth`` weight
  tiles go out before the grid-dependency wait (``pdl.begin_kernel``): no kernel writes a weight, so under PDL they
  stream while the kernel before this one still runs; the activations, its output, are read only after the wait."""
  _fill_pipeline(depth, load_w, load_x, interpret)
  return _accumulate_item(tile, 0, steps, steps, depth, loaded, load_w, load_x, multiply)


def streamed_items(tile, items, steps: int, depth: int, loaded, load_w, load_x, multiply, store, interpret) -> None:
  """``streamed_dot`` over ``items`` (traced) work items of ``steps`` steps each, one pipeline through them all: the
  step ``t`` of the flattened walk is step ``t % steps`` of item ``t // steps``, and its loads go out ``depth`` steps
  ahead whichever item they belong to, so the next item's first tiles stream while this one's last steps multiply
  and its accumulator is stored (``store(acc, item)``). What a persistent grid needs: a block that ends an item does
  not drain its pipeline, as a block of a wave does before the next block on its SM has loaded anything."""
  _fill_pipeline(depth, load_w, load_x, interpret)
  total = items * steps

  def item_body(i, carry):
    store(_accumulate_item(tile, i * steps, steps, total, depth, loaded, load_w, load_x, multiply), i)
    return carry

  lax.fori_loop(0, items, item_body, None)


def _fill_pipeline(depth, load_w, load_x, interpret) -> None:
  for slot in range(depth):
    load_w(slot, slot)
  pdl.begin_kernel(interpret)
  for slot in range(depth):
    load_x(slot, slot)


def _accumulate_item(tile, first, steps, total, depth, loaded, load_w, load_x, multiply) -> jax.Array:
  """Steps ``first .. first + steps`` of a walk of ``total`` steps on a fresh accumulator, refilling each slot with
  the step ``depth`` ahead."""

  def accumulate(acc_ref):
    def step(i, carry):
      t = first + i
      slot = lax.rem(t, depth)
      plgpu.barrier_wait(loaded.at[slot])
      multiply(acc_ref, slot)
      plgpu.wgmma_wait(0)

      @pl.when(t + depth < total)
      def _refill():  # the slot's tiles were read by the wgmma just waited for
        load_w(t + depth, slot)
        load_x(t + depth, slot)

      return carry

    lax.fori_loop(0, steps, step, None)
    return acc_ref[...]

  return pl.run_scoped(accumulate, plgpu.ACC(tile, jnp.float32))


def exit_wait() -> None:
  """A kernel's last wait on its TMA stores: until TMA has read the SMEM tiles, not until the writes land. A grid's
  writes are visible to the kernels after it once it completes (what jax's own Hopper matmuls rely on too), so waiting
  for them here only put the writes' latency on the last block's critical path, in every launch."""
  plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def store_partial_sum(accumulate, out_smem, out_block, tile, out_dtype):
  """The epilogue: ``accumulate(acc_ref)`` on a fresh f32 wgmma accumulator of shape ``tile``, its result
  cast to ``out_dtype`` and copied through ``out_smem`` to this block's ``out_block`` in GMEM."""
  acc = pl.run_scoped(accumulate, plgpu.ACC(tile, jnp.float32))
  out_smem[...] = acc.astype(out_dtype)
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(out_smem, out_block)
  exit_wait()


def partial_sums_kernel(kernel, *, n, mp, tile_n, tile_m, split_k, out_dtype, **kernel_kwargs):
  """The launch: one block per (``tile_n`` channels, ``tile_m`` tokens, K split), grid axes named ``n``,
  ``m``, ``s``, writing ``[split_k, N, Mp]`` partial sums."""
  return plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((split_k, n, mp), out_dtype),
                      grid=(n // tile_n, mp // tile_m, split_k), grid_names=("n", "m", "s"), **kernel_kwargs)


def reduce_partial_sums(y_t: jax.Array, m: int, dtype, extra: jax.Array | None = None) -> jax.Array:
  """``[split_k, N, Mp]`` partial sums (plus ``extra`` ``[N, Mp]``, elementwise work such as W12's escape gathers)
  -> ``[m, N]`` in ``dtype``: one XLA fusion (the splits added in order, slice, transpose, cast; written as adds, not
  a reduction, so ``extra``'s producers fuse into it), which XLA may fuse further into the consumer."""
  total = functools.reduce(operator.add, [y_t[s] for s in range(y_t.shape[0])])
  if extra is not None:
    total = total + extra
  return total[:, :m].T.astype(dtype)


def halves_scratch(halves: int, tile_m: int, tile_n: int = 64):
  """The SMEM tile ``store_split`` goes through: ``[halves, tile_m, tile_n]`` bf16, swizzled for TMA."""
  return plgpu.SMEM((halves, tile_m, tile_n), jnp.bfloat16, transforms=smem_transforms(tile_n, jnp.bfloat16))


def store_split(acc, out_smem, out_gmem, split, m_slice, n_slice) -> None:
  """The split-K epilogue of ``skinny_matmul`` and ``w12``: a ``[tile_n, tile_m]`` f32 wgmma accumulator (weights on
  M, tokens on N) stored transposed, tokens-major, through ``out_smem`` (``halves_scratch``) into
  ``out_gmem[split, :, m_slice, n_slice]`` of the ``[S, halves, Mp, N]`` output. ``halves`` = 1: the bf16 result; 2: the f32
  sum's high and low 16 bits (``f32_from_halves``), since Mosaic GPU stores a transposed accumulator into swizzled
  SMEM for 16-bit types only. Every thread calls it."""
  halves = out_smem.shape[0]
  if halves == 1:
    out_smem.at[0].T[...] = acc.astype(jnp.bfloat16)
  else:
    bits = lax.bitcast_convert_type(acc, jnp.uint32)
    for half, part in enumerate((bits >> 16, bits & 0xFFFF)):
      out_smem.at[half].T[...] = lax.bitcast_convert_type(part.astype(jnp.uint16), jnp.bfloat16)
  plgpu.commit_smem()
  for half in range(halves):  # one 2-D copy each: TMA strides at most 5 tiled dimensions
    plgpu.copy_smem_to_gmem(out_smem.at[half], out_gmem.at[split, half, m_slice, n_slice])
  exit_wait()


def exact_rows(m: int, mp: int, halves: int, reduce: bool) -> int:
  """Rows of a split-K kernel's ``[split_k, halves, rows, N]`` output: ``m``, the token rows asked, where the result
  is the bf16 output itself (``halves`` = 1: one split), is returned as it is (``reduce``) and is one box of fewer
  than 8 rows (TMA clips the box's store at ``m``, as ``tma.pad_for_tma`` says); else ``mp``. Why: a result of ``mp``
  rows is returned as a row slice, which XLA makes a copy kernel when nothing consumes it in the same fusion: 1.2 us
  a call on 4096x12288 at M = 1 (docs/results/2026-12-05-w12-fewer-splits-m1-m16-h100/). Consumer kernels
  (``reduce=False``) keep the ``mp`` rows their loads expect."""
  return m if reduce and halves == 1 and m < 8 and mp == 8 else mp


def halves_from_f32(y: jax.Array) -> jax.Array:
  """f32 ``[..., Mp, N]`` -> ``[..., 2, Mp, N]`` bf16 bit patterns of their high and low 16 bits: the inverse of
  ``f32_from_halves``, exactly."""
  bits = lax.bitcast_convert_type(y, jnp.uint32)
  parts = [lax.bitcast_convert_type(p.astype(jnp.uint16), jnp.bfloat16) for p in (bits >> 16, bits & 0xFFFF)]
  return jnp.stack(parts, axis=-3)


def join_halves(hi: jax.Array, lo: jax.Array) -> jax.Array:
  """uint16 high and low halves of f32 bit patterns -> the f32 values, exactly (plain jnp: also inside a Mosaic GPU
  kernel, on rows it loaded)."""
  return lax.bitcast_convert_type((hi.astype(jnp.uint32) << 16) | lo.astype(jnp.uint32), jnp.float32)


def load_row(ref, row, dtype, cols=slice(None)):
  """Inside a Mosaic GPU kernel: row ``row`` (columns ``cols``) of a matmul result as ``dtype``, from a plain
  ``[M, N]`` ref or from ``[S, 2, Mp, N]`` uint16 split-K halves (``SplitKPartials``' bits), whose splits are added in
  split order in f32 and rounded to ``dtype`` as ``SplitKPartials.sum`` does; ``[1, 1, Mp, N]``: the 16-bit result's
  own bits (an unsplit K)."""
  if len(ref.shape) == 2:
    return ref[row, cols].astype(dtype)
  if ref.shape[1] == 1:
    return lax.bitcast_convert_type(ref[0, 0, row, cols], dtype)
  total = None
  for s in range(ref.shape[0]):
    part = join_halves(ref[s, 0, row, cols], ref[s, 1, row, cols])
    total = part if total is None else total + part
  return total.astype(dtype)


def f32_from_halves(halves: jax.Array) -> jax.Array:
  """``[..., 2, Mp, N]`` bf16 bit patterns (high, low 16 bits) -> the f32 values they split, exactly."""
  hi, lo = (lax.bitcast_convert_type(halves[..., h, :, :], jnp.uint16) for h in range(2))
  return join_halves(hi, lo)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SplitKPartials:
  """A matmul result whose K splits are not added yet: what ``skinny_matmul.matmul(..., reduce=False)`` returns when
  its kernel split K, so that the consumer adds the splits itself. Why: between two Mosaic GPU kernels the sum is an
  XLA kernel of its own (~1.45 us; two a layer in a Qwen3-8B decode step, after the o and down projections,
  docs/results/2026-12-01-fusion-prefetch-h200/), while ``add_rms_norm``'s kernel reads the row anyway.

  ``halves``: bf16 ``[S, 2, Mp, N]``, the f32 partial sums' high and low 16 bits (``f32_from_halves``), or
  ``[1, 1, Mp, N]``, the result itself (K not split: a kernel consumer then reads the matmul's padded output as it
  is, where a slice of it would be an XLA copy kernel); rows past ``prod(lead)`` are padding. ``lead``: the result's
  leading shape; ``dtype``: its dtype's name.
  """

  halves: jax.Array
  lead: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
  dtype: str = dataclasses.field(metadata=dict(static=True))

  @property
  def shape(self) -> tuple[int, ...]:
    return (*self.lead, self.halves.shape[-1])

  @property
  def num_splits(self) -> int:
    return self.halves.shape[0]

  def sum(self) -> jax.Array:
    """The result: the splits added in order (``((p0 + p1) + p2) + ...``, as a consumer kernel adds them, so the two
    paths round alike) in f32, cast to ``dtype``, the padding rows sliced off."""
    if self.halves.shape[1] == 1:
      return self.halves[0, 0, :math.prod(self.lead)].astype(self.dtype).reshape(self.shape)
    parts = f32_from_halves(self.halves)
    total = functools.reduce(operator.add, [parts[s] for s in range(self.num_splits)])
    return total.astype(self.dtype)[:math.prod(self.lead)].reshape(self.shape)
