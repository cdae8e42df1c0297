"""Fused W12 x bf16 matmul for Hopper, written with Mosaic GPU (``plgpu.kernel``).

Shape of the kernel. It computes ``y.T = W.T @ x.T``: weight rows (output channels)
sit on the wgmma M side, tokens on the N side, like jax's
``hopper_mixed_type_matmul_mgpu`` does with int8 weights, because decode-time M
(tokens) is 1..256 while N (channels) is thousands: putting tokens on wgmma N
(a multiple of 8) wastes no work at small batch. One block owns 64 channels
and ``tile_m`` tokens and walks its K range (split-K: ``TuningConfig.split_k``, 0 =
``auto_split_k``, f32 partial sums added after the kernel) with a TMA pipeline that
streams the two W12 planes (1.5 bytes per weight) and the activations. Escapes decode
to +0.0 inside the loop; their true values are added afterwards, outside the hot loop: the
per-channel escape lists by the kernel itself for one token block (``TuningConfig.escapes_in_kernel``, the register
decode's default: each K split adds its share of the lists), else as gathers inside the split-K sum's XLA fusion up to
``GATHER_ROWS`` token rows and as a scatter above; a weight's overflow escapes, if any, as a scatter into the partial
sums.

Two decodes (``TuningConfig.decode``):
- ``"registers"`` (``DEFAULT_CONFIG``, ``_register_decode_call``): ``register_decode.py`` turns 32-bit words of the
  planes into wgmma's register A fragment, 4 weights per 9 integer instructions. The planes are stored in the order
  the threads read them, and the activation tiles are TMA boxes that read past ``x``'s rows and columns as zeros, so
  ``x`` goes in as it is. Needs a real Hopper: GPU interpret mode's wgmma reads SMEM only. It writes the skinny
  kernel's tokens-major split halves (``split_k.store_split``), so with every escape corrected in the kernel
  ``w12_matmul(..., reduce=False)`` hands its splits to the add + norm and q/k norm + rope kernels
  (``SplitKPartials``), and at one split it stores the bf16 result itself: no XLA op after it.
- ``"smem"`` (``_smem_decode_call``): 16-bit element ops on SMEM tiles, written back as bf16 SMEM tiles for wgmma.
  2.1-2.9x slower than the register decode; it runs in GPU interpret mode, so the CPU test suite runs it
  (``tests/test_w12_matmul.py``).

Learned on the H200: Mosaic GPU has no 8-bit arithmetic (widen before shifts), and
a 1-D uint8 SMEM row (the per-step bases) faults with a misaligned shared address,
hence ``_BASE_DTYPE`` for the SMEM decode (the register decode loads its bases from GMEM into registers).

Where it stands (docs/results/2026-12-05-w12-table-h200/; how it got there, session by session, and what was tried and
lost: docs/h200_runbook.md). Against the best bf16 matmul on the H200, weights beyond L2, the whole call: 0.85-0.88x at
M = 1 on Qwen3-8B's layer shapes and 0.79x on its LM head, 0.89-0.98x at 16, 0.85-1.20x at 64. With ``ONE_SPLIT_FILLS``
and ``split_k.exact_rows`` since, timed only on an H100: 0.78-0.84x, 0.78-0.94x and 0.82-1.03x there
(docs/results/2026-12-05-w12-split-rule-h100/). The decode loop with W12 weights: 0.888x the bf16 loop's step on the
H200, 0.850x on an H100, tokens identical (docs/results/2026-12-05-w12-loop-one-wave-h200/, the same H100 folder). What
bounds it at M = 1: copying W12's bytes through this grid with nothing computed (``scripts/h200/stream_probe.py``)
already takes 0.76-0.79x the bf16 kernel, because a call's fixed costs (launch, ramp, tail) do not shrink with its
bytes; the kernel sits 1-4 us above that copy, 1-2 us of it the decode itself (a 3-instruction stand-in,
``scripts/h200/w12_probe.py --ablate-decode``; fewer decode instructions a word moved it < 1 us each time: it is bound
by latency with few eligible warps, not by instruction count). At 64 rows it decodes every weight and multiplies it by
64 tokens from SMEM: 1.8-2.7 TB/s of stored bytes. The ``[N, Kp]`` planes give each row one run of ``tile_k`` bytes a
step, which is why narrow steps are slow (tile-major planes streamed as fast at 128 a step as at 256 in the copy probe).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, llvm, scf, vector
from jax.experimental import pallas as pl
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import pdl
from pallas_kernels.lowering import lowered_once
from pallas_kernels.split_k import (
  SMEM_LIMIT,
  SplitKPartials,
  auto_split_k,
  consumer_split_k,
  exact_rows,
  exit_wait,
  f32_from_halves,
  halves_from_f32,
  halves_scratch,
  num_sms,
  partial_sums_kernel,
  reduce_partial_sums,
  round_up,
  smem_transforms,
  store_partial_sum,
  store_split,
  token_tile,
)
from pallas_kernels.swiglu_matmul import mosaic_gpu as swiglu_matmul_kernel
from pallas_kernels.tma import pad_for_tma
from pallas_kernels.w12 import register_decode
from pallas_kernels.w12.config import TuningConfig
from pallas_kernels.w12.format import (
  PAIR_SPAN,
  W12Array,
  column_escape_correction_t,
  decode_bits,
  pair_partner,
  scatter_escapes_t,
  to_stored_order,
)

_HALF = PAIR_SPAN // 2
_BASE_DTYPE = jnp.uint16
"""Bases widened for the kernel: a 1-D uint8 SMEM row faults (misaligned) on H200."""


DEFAULT_CONFIG = TuningConfig(decode="registers", blocks_per_sm=2, max_concurrent_steps=2, tile_k=256,
                              escapes_in_kernel=True)
"""What ``w12_matmul`` runs on a GPU without a config: the register decode with the automatic split aiming at two
blocks an SM (384 blocks on 4096x12288, 12288x4096 and 4096x6144) unless one split already gives every SM a block
(``ONE_SPLIT_FILLS``: gate|up, 4096x12288, the LM head at up to 32 token rows), 256 K a
step (narrowed to 128 or 64 where K, the base-exponent groups or a wide activation tile need it: ``_widest_step``),
the channel lists' escapes corrected in the kernel (on the H200, weights beyond L2, the whole call with and without,
us: 23.3 / 25.2 at M = 1, 27.2 / 35.3 at 16, 47.0 / 85.9 at 64 on 12288x4096,
docs/results/2026-12-04-w12-wide-blocks-h200/). On the H200 at M = 1 (2026-12-03, weights rotated beyond L2,
docs/results/2026-12-03-w12-sass-h200/) 256 a step against 128: 22.5 against 24.3 us on 12288x4096, 9.0 / 9.6 on
4096x4096, 41.7 / 47.8 on 4096x24576, 13.0 / 12.8 on 4096x6144. The M = 64 numbers above predate the correction's
predicated loads and the capped split at wide activation tiles (``ACTIVATION_STEP_BYTES``: 28.8 us now). Interpret
mode runs ``TuningConfig()`` (SMEM decode).

Two blocks an SM, not four (2026-12-05, docs/results/2026-12-05-w12-m1-forms-h200/; weights beyond L2, whole call,
us, the four-block split first): 42.1 -> 38.7 on 4096x24576 (split 2 -> 1, which also stores bf16 and drops the XLA
sum after it), 23.4 -> 22.6 on 12288x4096 (12 -> 6), 23.6 -> 22.6 on 4096x12288 (4 -> 2), 13.8 -> 13.2 on 4096x6144
(8 -> 4) at M = 1; 44.2 -> 39.9, 25.6 -> 24.4, 25.4 -> 24.6, 15.2 -> 14.4 at M = 16. Not at 48-64 token rows
(``WIDE_TILE_BLOCKS_PER_SM``). Against the best bf16 matmul, one call at 79f03e0
(docs/results/2026-12-05-w12-table-h200/): 0.85-0.88x at M = 1 on 4096x12288, 12288x4096 and 4096x6144, 0.79x on the
LM head; 0.89-0.98x at 16; 0.85-1.20x at 64.

Two blocks an SM, not one, where one split would leave SMs idle (the H200, 2026-12-05, thirty-second session,
docs/results/2026-12-05-w12-split-check-h200/; each shape in one process, the whole call, us, one block an SM first):
22.8 / 22.4 on 12288x4096 (split 3 / 6), 13.7 / 13.2 on 4096x6144 (2 / 4) at M = 1; 24.8 / 24.1, 14.8 / 14.3 at 16.
An H100 had timed the opposite (0.1-1.7 us the other way, docs/results/2026-12-05-w12-fewer-splits-m1-m16-h100/); the
issue's GPU decides. The decode loop's splits and pipelines are again those its 0.888x was timed with
(docs/results/2026-12-05-w12-loop-one-wave-h200/)."""


ONE_SPLIT_FILLS = True
"""The automatic split of the register decode takes one split, whatever ``blocks_per_sm`` asks, where one split
already gives every SM a block, its result needs nothing after the kernel (every escape corrected in it) and the
activation tile is not wide (``_wide_activation_tile``). One split stores the bf16 result itself; two store f32
halves that an XLA kernel adds after (1.3-2.0 us). On the H200 (docs/results/2026-12-05-w12-split-check-h200/, the
whole call, us): 23.0 / 24.1 on 4096x12288 at M = 16 (192 channel blocks: one split against two). At M = 1 the
kernel at one split is 0.8 us slower (21.9 / 21.1) and the result was a row slice of its 8-row box (1.2 us of XLA
copy); the kernel now stores exactly the rows asked (``exact_rows``). The H100 took one split there at both M
(30.4 -> 29.8 at 1, 32.2 -> 30.2 at 16; docs/results/2026-12-05-w12-fewer-splits-m1-m16-h100/)."""


ACTIVATION_STEP_BYTES = 16 * 1024
"""The most activation bytes (``tile_m x tile_k`` bf16) a default step loads, and the bound past which the automatic
split is capped at ``CONSUMER_SPLIT_K`` as for a consumer (``_capped_config`` then picks the step). At 64 token rows a
256-wide step's activation tile (32 KB) outweighs its planes (24 KB). On the H200 (escapes in the kernel, weights
beyond L2, the whole call, us; docs/results/2026-12-04-w12-m64-h200/):
- 128 a step against 256 at the automatic split: 45.9 / 47.2 on 12288x4096, 67.6 / 76.2 on 4096x24576, 37.7 / 42.8
  on 4096x12288, 25.3 / 31.1 on 4096x6144, 349.6 / 375.5 on 4096x151936; at 16 rows (8 KB) 256 is as fast or faster
  (27.1 / 29.1 on 12288x4096, 45.6 / 49.4 on 4096x24576).
- Two splits against the automatic ones (12, 4, 8 and 2): 31.3 (256 a step: 128 blocks, one an SM; 42.5 at 128) /
  38.8 on 12288x4096, 32.9 / 36.7 on 4096x12288, 21.0 / 22.1 on 4096x6144, 63.3 / 63.0 on 4096x24576 (256 a step at
  two splits: 37.2, 24.1, 72.5 on the last three, with 384, 192 and 768 blocks)."""


WIDE_TILE_BLOCKS_PER_SM = 4
"""The fewest blocks an SM the automatic split aims at (before its cap at ``CONSUMER_SPLIT_K``) at a wide activation
tile, whatever smaller ``blocks_per_sm`` the config asks. There one wave of blocks loses: gate|up (4096x24576, 384
channel blocks) at two splits against one, on the H200 in one process (escapes in the kernel, 128 a step, 2 deep, the
whole call, us): 62.5 / 64.1 at 64 rows, 58.1 / 62.6 at 48 (docs/results/2026-12-05-w12-table-h200/). The other
layer shapes get two splits either way."""


def _wide_activation_tile(tile_m: int, tile_k: int = DEFAULT_CONFIG.tile_k) -> bool:
  """Whether a step of ``tile_k`` would load more than ``ACTIVATION_STEP_BYTES`` of ``tile_m`` bf16 token rows (by
  default the default's 256-wide step: tiles over 32 rows)."""
  return tile_m * tile_k * 2 > ACTIVATION_STEP_BYTES


def _widest_step(config: TuningConfig, kp: int, group_k: int, tile_m: int) -> TuningConfig:
  """``config`` with its K a step narrowed (halved down to 64) until it divides both the padded K and the
  base-exponent groups and its activation tile of ``tile_m`` rows is at most ``ACTIVATION_STEP_BYTES``."""
  tile_k = config.tile_k
  while tile_k > 64 and (kp % tile_k or group_k % tile_k or _wide_activation_tile(tile_m, tile_k)):
    tile_k //= 2
  return dataclasses.replace(config, tile_k=tile_k)


GATHER_ROWS = 8
"""Token rows up to which the channel lists' escape correction is gathered inside the split-K sum's fusion. On the
H200 (12288x4096, docs/results/2026-12-01-partials-w12v3-h200/) the gathers made M = 1's epilogue one 2.0 us kernel
(was a scatter and a sum: ~3.5 us), but at 16 and 64 rows the fused transpose took 9.8 and 10.9 us (the scatter and
the sum: 5.8 and 10.0)."""


CONSUMER_TILE_K = 256
"""The register decode's K a step when a consumer's cap (``split_k.CONSUMER_SPLIT_K``) leaves it fewer K splits than
the auto split. Then it runs about one block an SM (128 blocks for a 4096-wide output at two splits), and each SM's
one warpgroup decodes alone: Nsight Compute on the H200 showed one warp a scheduler, issuing every 2.6 cycles
(docs/results/2026-12-03-w12-depth-cluster-h200/). Twice the K a step gives that warp twice the independent decode
work between waits, in the same summation order. At M = 1 with two splits and the escapes in the kernel, in one
sweep: 256 at depth 2 took 27.9 us on 12288x4096 and 12.4 on 4096x4096; 128 at depth 4 took 30.9 and 13.1; 128 at
depth 4 with ``overlap_decode`` took 30.5 and 13.0 (``bench_kernels.py --only w12 --sweep``, ``w12_sweep()[9, 12,
14]``)."""

CONSUMER_DEPTH = 3
"""A capped split (wide or not) loads at least this many steps ahead, as far as shared memory allows. With 256 a step
at M = 1 on the H200 (2026-12-03, weights beyond L2, docs/results/2026-12-03-w12-sass-h200/), depths 2 / 3 / 4 took
24.5 / 22.4 / 21.8 us on 12288x4096, 10.4 / 9.8 / 10.3 on 4096x4096 and 13.6 / 13.4 / 17.1 on 4096x6144. (Before the
decode's 2026-12-03 rework, at 128 a step, 2 / 4 / 6 / 8 took 35.7 / 30.7 / 31.6 / 32.9 us on 12288x4096,
docs/results/2026-12-03-skinny-resident-w12-loop-h200/.)"""


def _capped_config(config: TuningConfig, tile_m: int, kp: int, group_k: int, split_k: int,
                   grid_blocks: int) -> TuningConfig:
  """What the register decode runs when its split was capped (for a consumer, or at a wide activation tile):
  ``CONSUMER_TILE_K`` a step where K, the base-exponent groups, the split and shared memory allow it, loading at least
  ``CONSUMER_DEPTH`` steps ahead as far as shared memory allows. Except with a wide activation tile
  (``_wide_activation_tile``) and more ``grid_blocks`` than SMs: then ``config`` as it is, since there several
  resident blocks an SM stream more than a deeper lone one (``ACTIVATION_STEP_BYTES``). Neither changes the order of
  the sums."""
  if _wide_activation_tile(tile_m) and grid_blocks > num_sms():
    return config
  step = config
  wide = dataclasses.replace(config, tile_k=CONSUMER_TILE_K)
  if (config.tile_k < CONSUMER_TILE_K and not kp % CONSUMER_TILE_K and not group_k % CONSUMER_TILE_K
      and not (kp // CONSUMER_TILE_K) % split_k
      and _register_smem_bytes(wide, tile_m, config.max_concurrent_steps) <= SMEM_LIMIT):
    step = wide
  depth = step.max_concurrent_steps
  while depth < CONSUMER_DEPTH and _register_smem_bytes(step, tile_m, depth + 1) <= SMEM_LIMIT:
    depth += 1
  return dataclasses.replace(step, max_concurrent_steps=depth)


def split_groups(span: int, group_k: int, total_groups: int) -> int:
  """Base-exponent groups a K split of ``span`` (a multiple of the step) can touch: whole groups when the split is
  whole groups, one when it lies inside one (a group is whole steps, so a split starting at a multiple of its span
  never straddles it then), else one more than it spans."""
  if span % group_k == 0:
    count = span // group_k
  elif group_k % span == 0:
    count = 1
  else:
    count = -(-span // group_k) + 1
  return min(count, total_groups)


def _register_smem_bytes(config: TuningConfig, tile_m: int, depth: int) -> int:
  """The register decode's shared memory a block: ``depth`` pipeline stages of both planes (1.5 bytes a weight) and
  the activation tiles, and the epilogue's f32 halves."""
  rows = config.tile_n
  stage = rows * config.tile_k * 3 // 2 + tile_m * config.tile_k * 2
  return depth * stage + 2 * tile_m * rows * 2


REGISTER_TILE_N = (64, 128, 192, 256)
"""The register decode's channels a block: 1-4 row blocks of 64 (wgmma M groups), one warpgroup decoding each in turn
into one wgmma's A operand, all against one activation tile. Why more than one: each block reads its own copy of the
``[tile_m, tile_k]`` activation tile, so at 64 token rows 64-channel blocks read as many activation bytes (from L2) as
weight bytes, and a 64-row stage (57 KB at 256 K) fits one block an SM."""


def _check_supported(x: jax.Array, packed: W12Array, config: TuningConfig, interpret) -> None:
  """Raises NotImplementedError (the caller falls back) for shapes not tiled yet."""
  k, n = packed.shape
  kp = packed.sign_mantissa.shape[1]
  if x.dtype != jnp.bfloat16:
    raise NotImplementedError(f"w12 mosaic_gpu needs bf16 activations, got {x.dtype}")
  if x.shape[-1] != k:
    raise ValueError(f"w12 matmul: x has {x.shape[-1]} features, the weight expects {k}")
  if n % config.tile_n:
    raise NotImplementedError(f"N={n} is not a multiple of tile_n={config.tile_n}")
  if kp % config.tile_k:
    raise NotImplementedError(f"padded K={kp} is not a multiple of tile_k={config.tile_k}")
  if packed.group_k % config.tile_k:
    raise NotImplementedError(f"group_k={packed.group_k} is not a multiple of tile_k={config.tile_k}")
  if config.decode == "registers":
    if interpret is not None:
      raise NotImplementedError("decode='registers' feeds wgmma from registers, which GPU interpret mode lacks")
    if config.tile_n not in REGISTER_TILE_N or config.tile_k not in (64, 128, 256):
      raise NotImplementedError(f"decode='registers' needs tile_n in {REGISTER_TILE_N} and tile_k 64, 128 or 256, "
                                f"got {config}")
    tile_m = token_tile(config.tile_m, math.prod(x.shape[:-1]))
    smem = _register_smem_bytes(config, tile_m, min(config.max_concurrent_steps, kp // config.tile_k))
    if smem > SMEM_LIMIT:
      raise NotImplementedError(f"decode='registers' with {config} needs {smem} bytes of shared memory a block at "
                                f"{tile_m} token rows, over {SMEM_LIMIT}: lower max_concurrent_steps or tile_k")
  if config.split_k and (kp // config.tile_k) % config.split_k:
    raise NotImplementedError(f"split_k={config.split_k} does not divide the {kp // config.tile_k} K steps")


@lowered_once("tile_n", "tile_m", "tile_k", "max_concurrent_steps", "split_k", "overlap_decode", "out_dtype",
              "interpret")
def _smem_decode_call(x2, byte_plane, partner_plane, nibble_plane, base_tiles, *, tile_n, tile_m, tile_k,
                      max_concurrent_steps, split_k, overlap_decode, out_dtype, interpret):
  """One block per (tile_n channels, tile_m tokens, K split); a TMA pipeline over its K steps.
  With ``split_k`` > 1 each split writes its own f32 partial sum, ``[split_k, N, Mp]``. ``partner_plane`` is
  ``format.pair_partner`` of the byte plane (each element's sign sits in its partner's byte): an element-wise decode
  of SMEM tiles cannot swap neighbours, so it reads a swapped copy (made by XLA each call: this decode is the
  interpretable one, not the fast one).

  ``overlap_decode``: two decoded-weight slots and async wgmma. Step i decodes into slot i % 2 while
  step i - 1's wgmma still runs (each step ends with ``wgmma_wait(pieces)``: its own groups may stay in
  flight, the previous step's are done), and the activation tiles, which wgmma reads from SMEM, are
  released one step late (``delay_release=1``). Without it each step waits for its own wgmma.

  Every operand moves in 32-wide K pieces (one nibble half each): a piece of the
  byte plane, of the nibble plane and of ``x`` is then a whole swizzled SMEM tile,
  so decoding and wgmma never slice inside a swizzle atom.
  """
  n, kp = byte_plane.shape
  mp = x2.shape[0]
  k_steps = kp // tile_k
  pieces = tile_k // _HALF  # 32-wide K pieces per step; nibble chunks are pieces // 2
  chunks = pieces // 2

  byte_transforms = smem_transforms(_HALF, jnp.uint8)
  x_transforms = smem_transforms(_HALF, jnp.bfloat16)
  out_transforms = smem_transforms(tile_m, out_dtype)

  steps = k_steps // split_k  # K steps per split
  depth = min(max_concurrent_steps, steps)
  overlap = overlap_decode and depth > 1  # delay_release needs a deeper pipeline than 1
  slots = 2 if overlap else 1

  def w12_matmul_body(byte_gmem, partner_gmem, nibble_gmem, base_gmem, x_gmem, out_gmem, w_smem,
                      out_smem):  # profile name
    pdl.begin_kernel(interpret)
    n_slice = pl.ds(lax.axis_index("n") * tile_n, tile_n)
    m_slice = pl.ds(lax.axis_index("m") * tile_m, tile_m)
    split = lax.axis_index("s")
    first = split * steps  # this block's first K step

    def piece_spec(rows, per_step, j, transforms, delay=0):
      return plgpu.BlockSpec((rows, _HALF), lambda k, j=j: (0, per_step * (first + k) + j), transforms=transforms,
                             delay_release=delay)

    in_specs = (
        [piece_spec(tile_n, pieces, j, byte_transforms) for j in range(pieces)] * 2  # bytes, partners' bytes
        + [piece_spec(tile_n, chunks, c, byte_transforms) for c in range(chunks)]
        + [plgpu.BlockSpec((1, tile_n), lambda k: (first + k, 0))]
        + [piece_spec(tile_m, pieces, j, x_transforms, delay=1 if overlap else 0) for j in range(pieces)]
    )

    def accumulate(acc_ref):
      def step(idx, *refs):
        byte_smem, partner_smem = refs[:pieces], refs[pieces:2 * pieces]
        nibble_smem = refs[2 * pieces:2 * pieces + chunks]
        base_smem = refs[2 * pieces + chunks]
        x_smem = refs[2 * pieces + chunks + 1:]
        w_slot = w_smem.at[idx[0] % slots]
        base = lax.broadcast_in_dim(base_smem[0].astype(jnp.uint16), (tile_n, _HALF), (0,))
        for c in range(chunks):
          # Mosaic GPU has no 8-bit arithmetic (bar bitwise ops): widen first
          nibbles = nibble_smem[c][...].astype(jnp.uint16)
          for half, codes in enumerate((nibbles & 0xF, nibbles >> 4)):
            j = 2 * c + half
            bits = decode_bits(byte_smem[j][...], partner_smem[j][...], codes, base)
            w_slot[j] = lax.bitcast_convert_type(bits, jnp.bfloat16)
        plgpu.commit_smem()
        for j in range(pieces):
          plgpu.wgmma(acc_ref, w_slot.at[j], x_smem[j].transpose((1, 0)))
        # each wgmma call is one group and groups retire in order: leaving this step's `pieces` groups
        # in flight means the previous step's are done, so the slot decoded next step is free
        plgpu.wgmma_wait(pieces if overlap else 0)

      pipeline = plgpu.emit_pipeline(step, grid=(steps,), in_specs=in_specs, max_concurrent_steps=depth)
      byte_rows, partner_rows = byte_gmem.at[n_slice], partner_gmem.at[n_slice]
      nibble_rows = nibble_gmem.at[n_slice]
      x_rows = x_gmem.at[m_slice]
      pipeline(*[byte_rows] * pieces, *[partner_rows] * pieces, *[nibble_rows] * chunks, base_gmem.at[:, n_slice],
               *[x_rows] * pieces)
      if overlap:
        plgpu.wgmma_wait(0)
      return acc_ref[...]

    store_partial_sum(accumulate, out_smem, out_gmem.at[split, n_slice, m_slice], (tile_n, tile_m), out_dtype)

  call = partial_sums_kernel(
      w12_matmul_body, n=n, mp=mp, tile_n=tile_n, tile_m=tile_m, split_k=split_k, out_dtype=out_dtype,
      scratch_types=dict(
          w_smem=plgpu.SMEM((slots, pieces, tile_n, _HALF), jnp.bfloat16, transforms=x_transforms),
          out_smem=plgpu.SMEM((tile_n, tile_m), out_dtype, transforms=out_transforms),
      ),
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
      interpret=interpret,
  )
  return call(byte_plane, partner_plane, nibble_plane, base_tiles, x2)


class _MlirOps:
  """``register_decode``'s ops as i32 MLIR (Python ints become constants); ptxas fuses the
  and/xor pairs into LOP3."""

  def __init__(self):
    self.i32 = ir.IntegerType.get_signless(32)

  def const(self, v):
    if not isinstance(v, int):
      return v
    return arith.constant(self.i32, v - 2**32 if v >= 2**31 else v)

  def _apply(op):
    return lambda self, a, b: op(self.const(a), self.const(b))

  add, mul, and_, xor = map(_apply, (arith.addi, arith.muli, arith.andi, arith.xori))
  shl, shr = map(_apply, (arith.shli, arith.shrui))
  del _apply

  def not_(self, a):
    return self.xor(a, 0xFFFFFFFF)

  def prmt(self, a, b, selector):
    return mgpu_utils.prmt(self.const(a), self.const(b), self.const(selector))

  def rotate_right_1(self, a):
    return mgpu_utils.inline_ptx("shf.r.wrap.b32 $0, $1, $1, 1;", self.const(a), result_types=self.i32)

  def f32_from_bf16_bits(self, bits):
    return arith.bitcast(ir.F32Type.get(), self.shl(bits, 16))

  def fadd(self, a, b):
    return arith.addf(a, b)

  def fmul(self, a, b):
    return arith.mulf(a, b)

  def select_nonzero(self, flag, value):
    nonzero = arith.cmpi(arith.CmpIPredicate.ne, self.const(flag), self.const(0))
    return arith.select(nonzero, value, arith.constant(ir.F32Type.get(), 0.0))


def _thread():
  """This thread's index in its warpgroup (inside an ``inline_mgpu`` function)."""
  return arith.remui(mgpu_utils.thread_idx(), arith.constant(ir.IntegerType.get_signless(32), 128))


def _thread_values_type(values: int):
  """``values`` uint32 a thread as a Pallas array's type: thread ``t`` holds elements ``t + 128 i``."""
  return plgpu.ShapeDtypeStruct((values * 128,), jnp.uint32, layout=plgpu.Layout.WG_STRIDED((values * 128,),
                                                                                           vec_size=1))


def _entries_type(count: int):
  """``escape_entries``' values (``_thread_values_type``): a thread's ``(k, bits)`` pairs in ``[half][j]`` order."""
  return _thread_values_type(4 * count)


def _x_bits_type(count: int, tile_m: int):
  """``register_decode.escape_x``'s bits (``_thread_values_type``): ``count`` a (half, column)."""
  return _thread_values_type(count * tile_m // 2)


def _words(array) -> list:
  """A ``_thread_values_type`` array's values, as i32."""
  return [vector.extract(r, dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([0]))
          for r in array.registers]


def _thread_values(values, layout):
  """i32 values -> an array of ``layout`` (a ``_thread_values_type``'s)."""
  word = ir.VectorType.get((1,), ir.IntegerType.get_signless(32))
  registers = np.empty((len(values),), dtype=object)
  for i, value in enumerate(values):
    registers[i] = vector.from_elements(word, [value])
  return mgpu.FragmentedArray(_registers=registers, _layout=layout.to_mgpu(), _is_signed=False)


_BASES_TYPE = _thread_values_type(2)
"""A step's base exponents as a Pallas array: thread ``t`` holds elements ``t`` and ``t + 128``, its two rows' (``half``
0 and 1, ``register_decode.thread_rows``) bases, each times 0x01010101."""


def _load_bases(groups: int):
  """An ``inline_mgpu`` function: the block's ``[64, groups]`` slice of ``base_exponent`` in GMEM -> ``groups`` arrays
  in ``_BASES_TYPE``, one a K group, in registers for the whole pipeline. Issued before the pipeline's first copies
  and first used in its first step, so their L2 latency hides under the first TMA's. Why: read from GMEM at every
  step, the base's latency was the register decode's largest stall at the auto split (12 % of Nsight Compute's warp
  samples on the H200, 12288x4096, M = 1, 2026-12-03); staged into SMEM before the pipeline it delayed the first
  copies by one L2 round trip (~1 us a call)."""

  @plgpu.inline_mgpu(
      arg_types=(plgpu.RefType(),),
      return_type=(_BASES_TYPE,) * groups,
  )
  def load(ctx, base_ref):
    del ctx
    ops = _MlirOps()
    i8 = ir.IntegerType.get_signless(8)
    base_pointer = mgpu_utils.memref_ptr(base_ref)
    stride = ir.MemRefType(base_ref.type).get_strides_and_offset()[0][0]
    first_row = register_decode.thread_rows(ops, _thread())
    arrays = []
    for g in range(groups):
      bases = []
      for half in range(2):
        offset = ops.add(ops.mul(ops.add(first_row, 8 * half), stride), g)
        base = arith.extui(ops.i32, llvm.load(i8, mgpu_utils.getelementptr(base_pointer, [offset], i8)))
        bases.append(ops.mul(base, 0x01010101))
      arrays.append(_thread_values(bases, _BASES_TYPE.layout))
    return tuple(arrays)

  return load


def _decode_chunk_to_registers(chunk: int, step_k: int, row_blocks: int, byte_transforms, nibble_transforms):
  """An ``inline_mgpu`` function: (byte, nibble SMEM refs of one step's ``[64 row_blocks, step_k]`` tiles, each row
  block's step bases in ``_BASES_TYPE``) -> the bf16 ``[64 row_blocks, 64]`` A fragment (WGMMA layout, one M group a
  row block) of stored K chunk ``chunk``, via ``register_decode.decode_chunk``."""
  rows = row_blocks * register_decode.ROWS

  @plgpu.inline_mgpu(
      arg_types=(plgpu.RefType(byte_transforms), plgpu.RefType(nibble_transforms), *[_BASES_TYPE.layout] * row_blocks),
      return_type=plgpu.ShapeDtypeStruct((rows, register_decode.CHUNK), jnp.bfloat16, layout=plgpu.Layout.WGMMA),
  )
  def decode(ctx, byte_ref, nibble_ref, *bases):
    del ctx
    ops = _MlirOps()
    i8 = ir.IntegerType.get_signless(8)
    pair = ir.VectorType.get((2,), ops.i32)
    pointers = {"bytes": mgpu_utils.memref_ptr(byte_ref), "nibbles": mgpu_utils.memref_ptr(nibble_ref)}

    def load_words(plane, offset):
      words = llvm.load(pair, mgpu_utils.getelementptr(pointers[plane], [offset], i8))
      return tuple(vector.extract(words, dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([w]))
                   for w in range(2))

    thread = _thread()
    layout = fa.WGMMA_LAYOUT
    registers = np.empty(layout.registers_shape((rows, register_decode.CHUNK)), dtype=object)
    bf16_pair = ir.VectorType.get((2,), ir.BF16Type.get())
    for block, block_bases in enumerate(bases):
      words = register_decode.decode_chunk(ops, thread, load_words, _words(block_bases), chunk, step_k, block)
      for (col_tile, half), word in words.items():
        registers[block, col_tile, 0, 0, half, 0, 0, 0, 0] = mgpu_utils.bitcast(word, bf16_pair)
    return mgpu.FragmentedArray(_registers=registers, _layout=layout, _is_signed=None)

  return decode


_SCALAR_LAYOUT = plgpu.Layout.WG_SPLAT((128,))
"""A traced int32 scalar (the K split) handed to an ``inline_mgpu`` function as ``jnp.full((128,), value)``: every
thread holds it (``_scalar``)."""


def _scalar(array):
  """The one value of a ``_SCALAR_LAYOUT`` array, as an i32."""
  return array.registers.flat[0]


@plgpu.inline_mgpu()
def _warpgroup_barrier(ctx):
  """Every thread of the warpgroup gets here before any goes on. The register decode's kernel runs without Pallas'
  automatic barriers (``unsafe_no_auto_barriers``: one before every TMA copy, six a step), so each step ends with
  this one: the pipeline refills a step's slots after its body, and every thread must have read them first."""
  del ctx
  mgpu_utils.warpgroup_barrier()


def _entries(array, count: int) -> list:
  """``_load_escape_entries``' array of one row block -> ``register_decode.escape_entries``' ``[half][j]`` pairs."""
  words = _words(array)
  return [[(words[2 * (half * count + j)], words[2 * (half * count + j) + 1]) for j in range(count)]
          for half in range(2)]


def _entry_loader(ops, rows_ref, bits_ref):
  """``load_entry(row, c)`` for ``register_decode.escape_entries``: the block's ``[64 R, C]`` lists read from GMEM, an
  unused entry (``bits`` 0) for ``c >= C``."""
  i8, i16 = ir.IntegerType.get_signless(8), ir.IntegerType.get_signless(16)
  rows_pointer, bits_pointer = mgpu_utils.memref_ptr(rows_ref), mgpu_utils.memref_ptr(bits_ref)
  list_stride, _ = ir.MemRefType(rows_ref.type).get_strides_and_offset()[0]
  capacity = ir.MemRefType(rows_ref.type).shape[1]

  def load_entry(row, c):
    valid = arith.cmpi(arith.CmpIPredicate.ult, ops.const(c), ops.const(capacity))
    entry = ops.add(ops.mul(row, list_stride), arith.select(valid, ops.const(c), ops.const(0)))
    k = llvm.load(ops.i32, mgpu_utils.getelementptr(rows_pointer, [ops.mul(entry, 4)], i8))
    bits = arith.extui(ops.i32, llvm.load(i16, mgpu_utils.getelementptr(bits_pointer, [ops.mul(entry, 2)], i8)))
    return k, arith.select(valid, bits, ops.const(0))

  return load_entry


def _load_escape_entries(count: int, splits: int, row_blocks: int):
  """An ``inline_mgpu`` function: (the block's ``[64 row_blocks, C]`` escape lists in GMEM, its K split as an int32
  array) -> this thread's share of the entries (``count`` a row: ``register_decode.split_share``), one array in
  ``_entries_type`` a row block, for ``_gather_escape_x`` and ``_add_escape_sums``. Issued before the pipeline, the loads'
  latency hides under it: on the H200 at M = 1 loading them after the pipeline cost 0.5-1.5 us a call on the layer
  shapes (docs/results/2026-12-04-w12-wide-blocks-h200/)."""
  entries_type = _entries_type(count)

  @plgpu.inline_mgpu(
      arg_types=(plgpu.RefType(), plgpu.RefType(), _SCALAR_LAYOUT),
      return_type=(entries_type,) * row_blocks,
  )
  def load(ctx, rows_ref, bits_ref, split):
    del ctx
    ops = _MlirOps()
    arrays = []
    for block in range(row_blocks):
      entries = register_decode.escape_entries(ops, _thread(), _entry_loader(ops, rows_ref, bits_ref), count, block,
                                               _scalar(split), splits)
      arrays.append(_thread_values([value for half in entries for entry in half for value in entry],
                                   entries_type.layout))
    return tuple(arrays)

  return load


def _x_loader(ops, x_ref, m: int):
  """``load_x(col, k, used)`` for ``register_decode.escape_x``: ``x`` ``[m, K]`` read from GMEM only for a used entry
  of one of its rows (a predicated load), else 0."""
  i8, i16 = ir.IntegerType.get_signless(8), ir.IntegerType.get_signless(16)
  x_pointer = mgpu_utils.memref_ptr(x_ref)
  x_stride = ir.MemRefType(x_ref.type).get_strides_and_offset()[0][0]

  def load_x(col, k, used):
    valid = arith.andi(arith.cmpi(arith.CmpIPredicate.ult, col, ops.const(m)),
                       arith.cmpi(arith.CmpIPredicate.ne, used, ops.const(0)))
    branch = scf.IfOp(valid, [ops.i32], has_else=True)
    with ir.InsertionPoint(branch.then_block):
      address = mgpu_utils.getelementptr(x_pointer, [ops.mul(ops.add(ops.mul(col, x_stride), k), 2)], i8)
      scf.yield_([arith.extui(ops.i32, llvm.load(i16, address))])
    with ir.InsertionPoint(branch.else_block):
      scf.yield_([ops.const(0)])
    return branch.results[0]

  return load_x


def _gather_escape_x(tile_m: int, count: int, m: int, row_blocks: int):
  """An ``inline_mgpu`` function: (this thread's share of the block's escape lists, ``_load_escape_entries``' arrays;
  ``x`` ``[m, K]`` in GMEM) -> the ``x`` bits each entry multiplies (``register_decode.escape_x``), one
  ``_x_bits_type`` array a row block, for ``_add_escape_sums``. For one token block (``m <= tile_m``): a thread's
  columns past ``m`` load nothing."""
  bits_type = _x_bits_type(count, tile_m)

  @plgpu.inline_mgpu(
      arg_types=(*[_entries_type(count).layout] * row_blocks, plgpu.RefType()),
      return_type=(bits_type,) * row_blocks,
  )
  def gather(ctx, *refs):
    del ctx
    ops = _MlirOps()
    *lists, x_ref = refs
    thread, load_x = _thread(), _x_loader(ops, x_ref, m)
    values = [bits for array in lists
              for bits in register_decode.escape_x(ops, thread, _entries(array, count), load_x, tile_m)]
    per_block = len(values) // row_blocks
    return tuple(_thread_values(values[b * per_block:(b + 1) * per_block], bits_type.layout)
                 for b in range(row_blocks))

  return gather


def _add_escape_sums(tile_m: int, count: int, row_blocks: int):
  """An ``inline_mgpu`` function: (the f32 ``[64 row_blocks, tile_m]`` accumulator, this thread's share of the block's
  escape lists, their ``x`` bits from ``_gather_escape_x``) -> the accumulator plus ``register_decode.escape_sums``
  of each row block: registers only, no loads."""

  @plgpu.inline_mgpu(
      arg_types=(plgpu.Layout.WGMMA, *[_entries_type(count).layout] * row_blocks,
                 *[_x_bits_type(count, tile_m).layout] * row_blocks),
      return_type=plgpu.ShapeDtypeStruct((row_blocks * register_decode.ROWS, tile_m), jnp.float32,
                                         layout=plgpu.Layout.WGMMA),
  )
  def add(ctx, acc, *arrays):
    del ctx
    ops = _MlirOps()
    lists, x_bits = arrays[:row_blocks], arrays[row_blocks:]
    registers = np.empty(acc.registers.shape, dtype=object)
    f32_pair = ir.VectorType.get((2,), ir.F32Type.get())
    for block in range(row_blocks):
      values = register_decode.escape_sums(ops, _entries(lists[block], count), _words(x_bits[block]), tile_m)
      for (col_tile, half), pair in values.items():
        registers[block, col_tile, 0, 0, half, 0, 0, 0, 0] = vector.from_elements(f32_pair, list(pair))
    return acc + mgpu.FragmentedArray(_registers=registers, _layout=acc.layout, _is_signed=None)

  return add


@lowered_once("mp", "group_k", "tile_n", "tile_m", "tile_k", "max_concurrent_steps", "split_k", "halves", "out_rows",
              "overlap_decode", "m", "swiglu")
def _register_decode_call(x2, byte_plane, nibble_plane, base_exponent, *, mp, group_k, tile_n, tile_m, tile_k,
                          max_concurrent_steps, split_k, halves, out_rows, overlap_decode=False, escape_lists=None,
                          m=None, swiglu=False):
  """One warpgroup per (``tile_n`` channels, tile_m tokens, K split); each step's W12 tiles are decoded by
  ``register_decode`` straight into wgmma's A registers, 64 K at a time, one wgmma M group per 64 channels (all
  against the one activation tile of the step: ``REGISTER_TILE_N``), in logical K order (the planes' stored
  order is the order the threads read), against ``x2`` ``[m, K]`` as the caller has it (``pad_for_tma``: decode's
  one to eight rows untouched): TMA fills the activation tiles' rows past ``m`` (up to ``mp``) and columns past
  ``K`` (up to ``Kp``) with zeros, so no padded or permuted copy of ``x`` is made. Before its pipeline each thread
  loads its two rows' base exponents for the split's K groups from ``base_exponent`` ``[N, groups]`` in GMEM into
  registers (``_load_bases``), so no per-call XLA op rearranges them and no step waits on L2 for them. The output
  is the skinny kernel's, tokens-major ``[split_k, halves, Mp, N]`` (``split_k.store_split``; ``out_rows`` in place of
  ``Mp``: ``split_k.exact_rows``): with every escape corrected in the kernel, a consumer kernel can add the splits
  itself (``SplitKPartials``). With ``escape_lists`` (``(column_escape_rows, column_escape_bits)``, one token block:
  ``mp == tile_m``, ``m`` real rows) every block loads its split's share of its channels' lists before the pipeline
  (entries ``s``, ``s + split_k``, ...: ``_load_escape_entries``) and adds their correction to its accumulators after it
  (``_add_escape_sums``), the ``x`` values it multiplies loaded after the pipeline (``_gather_escape_x``). Shared by the
  splits, not left to the first: at 64 token rows on the H200 the first split's blocks alone took 52 us on 12288x4096
  where the shared form takes 42 (the kernel without any: 37; docs/results/2026-12-04-w12-wide-blocks-h200/).

  A step is three TMA copies (both planes and the ``[tile_m, tile_k]`` activation tile, whose 64-wide chunks wgmma
  reads in place) and one warpgroup barrier (``_warpgroup_barrier``; Pallas' automatic barriers are off). On the H200
  (2026-12-03, SASS and Nsight Compute's samples) the automatic ones put a barrier before each of the six copies a
  step (the activations then came in 64-wide chunks), ~16 % of the step's instructions with their address setup.

  ``overlap_decode``: async wgmma. Each step ends with ``wgmma_wait(chunks)`` (its own wgmmas may stay in flight, the
  previous step's are done), so step i's decode runs while step i - 1's wgmmas do, and the activation tiles, which
  wgmma reads from SMEM, are released one step late (``delay_release=1``); the planes are read into registers by the
  decode itself, so their slots go back at once. Needs a pipeline deeper than one step.

  ``swiglu`` (a gate|up weight ``[K, 2 I]``, one split, bf16, ``tile_n`` 64): the blocks come in clusters of two, the
  gate block streaming channels ``64 j ..`` and the up block ``I + 64 j ..``, and the output is ``silu(gate) * up``
  ``[out_rows, I]`` through ``swiglu_matmul``'s cluster epilogue (``store_swiglu``), as the bf16 kernel
  ``pallas_kernels.swiglu_matmul`` does."""
  if swiglu and (split_k, halves, tile_n) != (1, 1, swiglu_matmul_kernel.TILE_N):
    raise ValueError(f"the swiglu epilogue takes one split, bf16 and 64 channels a block, got split_k={split_k}, "
                     f"halves={halves}, tile_n={tile_n}")
  row_blocks = tile_n // register_decode.ROWS
  n, kp = byte_plane.shape
  chunks = tile_k // register_decode.CHUNK
  steps = kp // tile_k // split_k
  depth = min(max_concurrent_steps, steps)
  overlap = overlap_decode and depth > 1  # delay_release needs a deeper pipeline than 1
  byte_transforms = smem_transforms(tile_k, jnp.uint8)
  nibble_transforms = smem_transforms(tile_k // 2, jnp.uint8)
  x_transforms = smem_transforms(register_decode.CHUNK, jnp.bfloat16)
  decoders = [_decode_chunk_to_registers(c, tile_k, row_blocks, byte_transforms, nibble_transforms)
              for c in range(chunks)]
  total_groups = base_exponent.shape[1]
  groups = split_groups(steps * tile_k, group_k, total_groups)
  load_bases = _load_bases(groups)
  add_sums = gather_x = load_entries = None
  if escape_lists is not None:
    if mp != tile_m:
      raise ValueError(f"the in-kernel escape correction takes one token block, got Mp={mp}, tile_m={tile_m}")
    count = register_decode.split_share(escape_lists[0].shape[1], split_k)
    load_entries = _load_escape_entries(count, split_k, row_blocks)
    gather_x = _gather_escape_x(tile_m, count, m, row_blocks)
    add_sums = _add_escape_sums(tile_m, count, row_blocks)

  inter_blocks = n // 2 // tile_n

  def w12_matmul_body(byte_gmem, nibble_gmem, base_gmem, x_gmem, *refs, out_smem, staged=None,
                      proj_smem=None):  # profile name
    pdl.begin_kernel(None)  # registers: never interpreted (``_check_supported``)
    rows_gmem, bits_gmem, out_gmem = refs if add_sums else (None, None, *refs)
    # the block's channel block: with the swiglu epilogue the up block's is the gate block's, I / tile_n further
    block_n = lax.axis_index("c") * inter_blocks + lax.axis_index("n") if swiglu else lax.axis_index("n")
    n_slice = pl.ds(block_n * tile_n, tile_n)
    m_slice = pl.ds(lax.axis_index("m") * tile_m, tile_m)
    split = 0 if swiglu else lax.axis_index("s")
    first = split * steps
    # the split's groups, the slice kept inside the array (a split can start inside a group)
    first_group = jnp.minimum(first * tile_k // group_k, total_groups - groups)
    bases = [load_bases(base_gmem.at[pl.ds(block_n * tile_n + block * register_decode.ROWS,
                                           register_decode.ROWS), pl.ds(first_group, groups)])
             for block in range(row_blocks)]  # [row block][group]
    if add_sums is not None:  # the split's share of the lists, into registers before the pipeline
      entries = load_entries(rows_gmem.at[n_slice], bits_gmem.at[n_slice], jnp.full((128,), split, jnp.int32))

    in_specs = (
        plgpu.BlockSpec((tile_n, tile_k), lambda k: (0, first + k), transforms=byte_transforms),
        plgpu.BlockSpec((tile_n, tile_k // 2), lambda k: (0, first + k), transforms=nibble_transforms),
        plgpu.BlockSpec((tile_m, tile_k), lambda k: (0, first + k), transforms=x_transforms,
                        delay_release=1 if overlap else 0),
    )

    def accumulate(acc_ref):
      def step(idx, byte_smem, nibble_smem, x_smem):
        group = (first + idx[0]) * tile_k // group_k - first_group
        step_bases = []
        for block_bases in bases:
          chosen = block_bases[0]
          for g in range(1, groups):
            chosen = jnp.where(jnp.broadcast_to(group == g, chosen.shape), block_bases[g], chosen)
          step_bases.append(chosen)
        for c in range(chunks):
          weights = decoders[c](byte_smem, nibble_smem, *step_bases)
          plgpu.wgmma(acc_ref, weights, x_smem.at[:, pl.ds(c * register_decode.CHUNK, register_decode.CHUNK)].T)
        # each wgmma call is one group and groups retire in order: leaving this step's `chunks` in flight means the
        # previous step's are done, so its activation tiles (released a step late) are free
        plgpu.wgmma_wait(chunks if overlap else 0)
        _warpgroup_barrier()

      pipeline = plgpu.emit_pipeline(step, grid=(steps,), in_specs=in_specs, max_concurrent_steps=depth)
      pipeline(byte_gmem.at[n_slice], nibble_gmem.at[n_slice], x_gmem.at[m_slice])
      if overlap:
        plgpu.wgmma_wait(0)
      if add_sums is not None:
        x_bits = gather_x(*entries, x_gmem)  # before the accumulator is read, as the sums need it
        acc_ref[...] = add_sums(acc_ref[...], *entries, *x_bits)
      return acc_ref[...]

    acc = pl.run_scoped(accumulate, plgpu.ACC((tile_n, tile_m), jnp.float32))
    if swiglu:
      out_tile = out_gmem.at[m_slice, pl.ds(lax.axis_index("n") * tile_n, tile_n)]
      swiglu_matmul_kernel.store_swiglu(acc, proj_smem, out_smem, staged, out_tile, lax.axis_index("c"))
      exit_wait()
    else:
      store_split(acc, out_smem, out_gmem, split, m_slice, n_slice)

  if swiglu:
    grid = dict(out_type=jax.ShapeDtypeStruct((out_rows, n // 2), jnp.bfloat16), grid=(inter_blocks, mp // tile_m),
                grid_names=("n", "m"), cluster=(2,), cluster_names=("c",),
                scratch_types=swiglu_matmul_kernel.swiglu_scratch(tile_m))
  else:
    grid = dict(out_type=jax.ShapeDtypeStruct((split_k, halves, out_rows, n), jnp.bfloat16),
                grid=(n // tile_n, mp // tile_m, split_k), grid_names=("n", "m", "s"),
                scratch_types={"out_smem": halves_scratch(halves, tile_m, tile_n)})
  call = plgpu.kernel(w12_matmul_body, compiler_params=plgpu.CompilerParams(unsafe_no_auto_barriers=True), **grid)
  return call(byte_plane, nibble_plane, base_exponent, x2, *(escape_lists or ()))


def _nothing_left_to_patch(packed: W12Array, in_kernel: bool) -> bool:
  """Whether the kernel's output is final: no escapes, or all of them in the channel lists the kernel corrects
  (``in_kernel``) and none past them (no overflow)."""
  return not packed.has_side_table or (in_kernel and not packed.escape_index.shape[0])


def w12_matmul(
    x: jax.Array,
    packed: W12Array,
    *,
    config: TuningConfig | None = None,
    interpret: plgpu.InterpretGPUParams | None = None,
    reduce: bool = True,
) -> jax.Array | SplitKPartials:
  """``x @ W`` for bf16 ``x`` ``[..., K]``: the fused kernel plus the escape patch. With ``reduce=False``, when
  nothing is left to patch after the kernel (no escapes, or all corrected in it: ``escapes_in_kernel`` and no
  overflow), the kernel's output as ``SplitKPartials`` (the unsummed K splits, or the padded result of an unsplit K)
  for a consumer kernel that reads it itself (``add_rms_norm``, ``qk_norm_rope``, ``swiglu``), as ``skinny_matmul``
  returns it: then at most ``split_k.CONSUMER_SPLIT_K`` splits unless the config names one.

  ``interpret=plgpu.InterpretGPUParams()`` runs it on CPU for tests. Unsupported
  shapes raise NotImplementedError so ``w12.matmul`` can fall back loudly.
  """
  k, n = packed.shape
  kp = packed.sign_mantissa.shape[1]
  lead = x.shape[:-1]
  m = math.prod(lead)
  if config is None and interpret is None:
    config = _widest_step(DEFAULT_CONFIG, kp, packed.group_k, token_tile(DEFAULT_CONFIG.tile_m, m))
  config = config or TuningConfig()
  _check_supported(x, packed, config, interpret)
  tile_m = token_tile(config.tile_m, m)
  mp = round_up(max(m, 1), tile_m)
  x2 = x.reshape(m, k)

  in_kernel = bool(config.decode == "registers" and config.escapes_in_kernel and packed.column_capacity
                   and mp == tile_m)
  complete = _nothing_left_to_patch(packed, in_kernel)
  k_steps = kp // config.tile_k
  wide = config.decode == "registers" and _wide_activation_tile(tile_m)
  blocks_per_sm = max(config.blocks_per_sm, WIDE_TILE_BLOCKS_PER_SM) if wide else config.blocks_per_sm
  n_blocks = (n // config.tile_n) * (mp // tile_m)
  one_split = (ONE_SPLIT_FILLS and config.decode == "registers" and complete and not wide
               and n_blocks >= num_sms())
  split_k = config.split_k or (1 if one_split else auto_split_k(n_blocks, k_steps, num_sms(), blocks_per_sm))
  auto_split = split_k
  # a consumer kernel reads every split (as skinny_matmul's); at a wide activation tile fewer splits stream faster
  if not config.split_k and (complete and not reduce or wide):
    split_k = consumer_split_k(split_k, k_steps)
  # f32 partial sums, or the bf16 result where nothing is added after the kernel
  halves = 2 if split_k > 1 or not complete else 1
  if config.decode == "registers":
    grid_blocks = (n // config.tile_n) * (mp // tile_m) * split_k
    step_config = (_capped_config(config, tile_m, kp, packed.group_k, split_k, grid_blocks)
                   if split_k < auto_split else config)
    out = _register_decode_call(
        pad_for_tma(x2, (8, register_decode.CHUNK)), packed.sign_mantissa, packed.exponent_codes,
        packed.base_exponent, mp=mp, group_k=packed.group_k, tile_n=config.tile_n, tile_m=tile_m,
        tile_k=step_config.tile_k,
        max_concurrent_steps=step_config.max_concurrent_steps, split_k=split_k, halves=halves,
        out_rows=exact_rows(m, mp, halves, reduce), overlap_decode=config.overlap_decode,
        escape_lists=(packed.column_escape_rows, packed.column_escape_bits) if in_kernel else None, m=m)
  else:
    # one base row per K step, [Kp / tile_k, N]: one small TMA box per step
    steps_per_group = packed.group_k // config.tile_k
    base_tiles = jnp.repeat(packed.base_exponent, steps_per_group, axis=1)[:, :kp // config.tile_k].T
    # this kernel decodes the planes in their stored K order: x follows it (a padded, permuted copy)
    x_stored = to_stored_order(jnp.pad(x2, ((0, mp - m), (0, kp - k))))
    y_t = _smem_decode_call(
        x_stored, packed.sign_mantissa, pair_partner(packed.sign_mantissa), packed.exponent_codes,
        base_tiles.astype(_BASE_DTYPE),
        tile_n=config.tile_n, tile_m=tile_m, tile_k=config.tile_k,
        max_concurrent_steps=config.max_concurrent_steps, split_k=split_k, overlap_decode=config.overlap_decode,
        out_dtype=jnp.float32 if halves == 2 else x.dtype, interpret=interpret)
    # channel-major [split_k, N, Mp] -> the register decode's tokens-major [split_k, halves, Mp, N], in XLA (this
    # decode is the interpretable one, not the fast one)
    y = jnp.swapaxes(y_t, 1, 2)
    out = halves_from_f32(y) if halves == 2 else y[:, None]
  if complete:
    partials = SplitKPartials(out, lead, jnp.dtype(x.dtype).name)  # halves == 1: the padded bf16 result itself
    return partials if not reduce else partials.sum()
  # out: [split_k, 2, Mp, N] f32 halves. The overflow escapes (usually none) are scattered into the first partial sum,
  # in place. Up to GATHER_ROWS rows the listed ones are gathers that join the split-K sum, the transpose and the cast
  # in one XLA fusion; above, they are scattered too.
  y_t = jnp.swapaxes(f32_from_halves(out), 1, 2)  # [split_k, N, Mp]
  gather = bool(packed.column_capacity and m <= GATHER_ROWS and not in_kernel)
  y_t = scatter_escapes_t(y_t, x2, packed, lists=not (gather or in_kernel))
  correction = column_escape_correction_t(x2, packed, mp) if gather else None
  return reduce_partial_sums(y_t, m, x.dtype, correction).reshape(*lead, n)


def w12_swiglu_matmul(x: jax.Array, packed: W12Array, *, config: TuningConfig | None = None) -> jax.Array:
  """``silu(x @ W_gate) * (x @ W_up)`` ``[..., I]`` bf16 for a W12 gate|up weight ``[K, 2 I]`` (gate columns first)
  in one kernel: the register decode at one split with ``swiglu_matmul``'s cluster epilogue (``_register_decode_call``
  with ``swiglu``), rounded as ``pallas_kernels.swiglu_matmul.reference`` says (the projection to bf16, then SwiGLU
  in f32 rounded once). NotImplementedError (the caller takes ``swiglu(w12_matmul(...))``) where it does not apply:
  more than one token block or a wide one (over 32 rows), escapes the kernel does not correct (an overflow, or
  ``escapes_in_kernel`` off), an intermediate size not a multiple of 64, or what ``w12_matmul``'s register decode
  does not tile."""
  k, n = packed.shape
  if n % 2 or (n // 2) % swiglu_matmul_kernel.TILE_N:
    raise NotImplementedError(f"the W12 swiglu kernel needs an intermediate size a multiple of "
                              f"{swiglu_matmul_kernel.TILE_N}, got the gate|up width {n}")
  lead = x.shape[:-1]
  m = math.prod(lead)
  config = config or _widest_step(DEFAULT_CONFIG, packed.sign_mantissa.shape[1], packed.group_k,
                                  token_tile(DEFAULT_CONFIG.tile_m, m))
  if config.decode != "registers" or config.tile_n != swiglu_matmul_kernel.TILE_N:
    raise NotImplementedError(f"the W12 swiglu kernel is the register decode with 64 channels a block, got {config}")
  _check_supported(x, packed, config, None)
  tile_m = token_tile(config.tile_m, m)
  mp = round_up(max(m, 1), tile_m)
  if mp != tile_m or _wide_activation_tile(tile_m):
    raise NotImplementedError(f"the W12 swiglu kernel takes one token block of at most 32 rows, got {m} rows")
  in_kernel = bool(config.escapes_in_kernel and packed.column_capacity)
  if not _nothing_left_to_patch(packed, in_kernel):
    raise NotImplementedError("the W12 swiglu kernel corrects the channel lists' escapes only (escapes_in_kernel, no "
                              "overflow)")
  out = _register_decode_call(
      pad_for_tma(x.reshape(m, k), (8, register_decode.CHUNK)), packed.sign_mantissa, packed.exponent_codes,
      packed.base_exponent, mp=mp, group_k=packed.group_k, tile_n=config.tile_n, tile_m=tile_m,
      tile_k=config.tile_k, max_concurrent_steps=config.max_concurrent_steps, split_k=1, halves=1,
      out_rows=exact_rows(m, mp, 1, True), overlap_decode=config.overlap_decode,
      escape_lists=(packed.column_escape_rows, packed.column_escape_bits) if in_kernel else None, m=m, swiglu=True)
  return out[:m].reshape(*lead, n // 2)
