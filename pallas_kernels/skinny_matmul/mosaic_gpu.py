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
split slabs, slices the padding off and casts, with no transpose. The channel-major first version needed
one, a kernel of its own (at 16 tokens, 9.7 us per Qwen3-8B layer).

The RMSNorm in the prologue (``norm=(g, eps)``: ``rms_norm(x) * g @ W`` in one kernel). In its first pipeline step
(the first weight tiles already in flight) each block reads its token rows whole from GMEM (8 KB a row), keeps
``1 / rms`` per row in SMEM, and normalises every activation tile
between its TMA load and the wgmma, rounding as ``add_rms_norm.reference.rms_norm`` does (only the order of the f32
sum of squares differs). Why: in a decode step the norm is a kernel of its own (XLA's three, or ``add_rms_norm``'s
one: ~4 us either way, going by the H200's step times), 73 times a step; here its work hides under the weight
stream. Mosaic GPU moves activation tiles between registers and swizzled SMEM only as 64-row tiles, and broadcasts a
per-row or per-column factor over them only in warpgroup semantics. So the prologue kernels tile 64 token rows
whatever M is (TMA fills the rows past M with zeros: SMEM only, no extra HBM) in warpgroup semantics.

The SwiGLU in the prologue (``swiglu=True``: ``(silu(gate) * up) @ W_down`` from the gate|up projection's output):
each step loads the gate tile and the up tile of the same columns and multiplies them into the operand tile, as
the norm does; it removes the MLP's elementwise kernel, 36 a step.

Runs in Pallas GPU-interpret mode (both wgmma operands come from SMEM), so the CPU tests run the kernel.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import pdl
from pallas_kernels.skinny_matmul.config import TuningConfig
from pallas_kernels.split_k import auto_split_k, num_sms, round_up, smem_transforms
from pallas_kernels.tma import pad_for_tma

TILE_N = 64  # output channels per block: one wgmma M
X_TILE = (8, 64)  # the SMEM tiling of the activation tiles (``smem_transforms`` of a >= 128-byte bf16 row)
NORM_TILE_M = 64  # token rows per block with the norm prologue: Mosaic GPU's register <-> swizzled-SMEM tile

DEFAULT_CONFIG = TuningConfig()
"""What ``skinny_matmul`` runs without a config: in the H200 sweep (``bench_kernels.skinny_sweep``) the best
single config at M = 1, where ``ops`` uses the kernel (4.06 ms a step; blocks_per_sm=1 is better at M = 16,
tile_k=256 at 64)."""
PROLOGUE_CONFIG = TuningConfig(tile_m=NORM_TILE_M, tile_k=64)
"""Without a config, with a prologue: the 64-row activation tiles cost as much SMEM as the weight tiles, so
``tile_k`` halves to keep ``blocks_per_sm`` blocks resident at a useful depth (``_prologue_depth``). Unmeasured."""
SMEM_PER_SM = 228 * 1024  # H100 / H200; each resident block also reserves 1 KB


def _prologue_depth(depth: int, tile_m: int, tile_k: int, halves: int, norm: bool, swiglu: bool,
                    blocks_per_sm: int) -> int:
  """The deepest pipeline (at most ``depth``) whose SMEM lets ``blocks_per_sm`` blocks with a prologue share an
  SM: a stage holds a weight tile, one activation tile (two with ``swiglu``) and ``g``'s slice (with ``norm``)."""
  stage = tile_k * TILE_N * 2 + tile_m * tile_k * 2 * (2 if swiglu else 1) + (tile_k * 2 if norm else 0)
  fixed = halves * tile_m * TILE_N * 2 + tile_m * tile_k * 2 + (tile_m * 4 if norm else 0) + 1024
  return max(1, min(depth, (SMEM_PER_SM // blocks_per_sm - fixed) // stage))


SPLIT_K_BY_SHAPE: dict[tuple[int, int], int] = {}
"""``split_k`` by weight shape ``(K, N)`` for a config that leaves it at 0 (auto), where a measured split beats
``auto_split_k``'s. Why: the auto split fills every SM with ``blocks_per_sm`` blocks, which is what a matmul timed
alone wants, but each split adds an XLA sum kernel after it. In a chain of 64 dependent 4096 x 4096 matmuls on the
H200, no split (64 blocks) took 20.5 us a link against 22.8 with the auto split of 8
(docs/results/2026-12-01-pdl-h200/callC_pdl_probe.txt). ``scripts/h200/split_probe.py`` measures every decode
shape in such chains and writes this table (``bench_roofline.py --skinny-splits`` loads it). Empty: the auto split."""


def check_supported(x: jax.Array, w: jax.Array, config: TuningConfig, swiglu: bool = False) -> None:
  """Raises ValueError for inconsistent inputs, NotImplementedError (the caller falls back) for what the
  kernel does not tile."""
  k, n = w.shape
  if x.shape[-1] != (2 * k if swiglu else k):
    what = f"{2 * k} ([gate | up] for a weight of {k} rows)" if swiglu else str(k)
    raise ValueError(f"skinny matmul: x has {x.shape[-1]} features, the weight expects {what}")
  if x.dtype != jnp.bfloat16 or w.dtype != jnp.bfloat16:
    raise NotImplementedError(f"the skinny kernel takes bf16 x and W, got {x.dtype} and {w.dtype}")
  if n % TILE_N:
    raise NotImplementedError(f"N={n} is not a multiple of {TILE_N}")
  if k % config.tile_k:
    raise NotImplementedError(f"K={k} is not a multiple of tile_k={config.tile_k}")
  if config.split_k and (k // config.tile_k) % config.split_k:
    raise NotImplementedError(f"split_k={config.split_k} does not divide the {k // config.tile_k} K steps")


def _call(x2, w, norm=None, swiglu=False, *, tile_m, tile_k, max_concurrent_steps, split_k, halves, interpret, mp,
          blocks_per_sm=1):
  """``[split_k, halves, Mp, N]`` bf16: each block's accumulator stored transposed (tokens-major). With
  ``halves`` = 1 the bf16 result; with 2 the f32 partial sum's high and low 16 bits (``f32_from_halves``):
  Mosaic GPU stores a transposed wgmma accumulator into swizzled SMEM for 16-bit types only.

  ``x2`` has at most ``mp`` rows (``pad_for_tma``): the activation tiles are TMA boxes of ``tile_m`` rows, and TMA
  fills the rows past ``x2``'s with zeros. The output rows past them are zeros.

  ``norm=(g, eps)``: in its first step every block computes ``1 / rms`` of each of ``x2``'s rows (its whole row,
  read from GMEM), and each step normalises its activation tile into ``xn_smem`` before the wgmma. ``swiglu``: ``x2`` is
  ``[gate | up]`` (``2 K`` wide) and each step multiplies ``silu(gate)`` by ``up`` tile by tile into ``xn_smem``.
  Either way ``tile_m`` must be ``NORM_TILE_M``."""
  k, n = w.shape
  steps = k // tile_k // split_k
  depth = min(max_concurrent_steps, steps)
  if norm is not None or swiglu:
    depth = _prologue_depth(depth, tile_m, tile_k, halves, norm is not None, swiglu, blocks_per_sm)
  w_transforms = smem_transforms(TILE_N, jnp.bfloat16)
  x_transforms = smem_transforms(tile_k, jnp.bfloat16)

  rows = x2.shape[0]

  def kernel(w_gmem, x_gmem, *refs):
    if norm is not None:
      g_gmem, out_gmem, out_smem, inv_smem, xn_smem = refs
    elif swiglu:
      out_gmem, out_smem, xn_smem = refs
    else:
      out_gmem, out_smem = refs
    pdl.begin_kernel(interpret)
    n_slice = pl.ds(lax.axis_index("n") * TILE_N, TILE_N)
    m_block = lax.axis_index("m")
    m_slice = pl.ds(m_block * tile_m, tile_m)
    split = lax.axis_index("s")
    first = split * steps

    in_specs = [plgpu.BlockSpec((tile_k, TILE_N), lambda s: (first + s, 0), transforms=w_transforms),
                plgpu.BlockSpec((tile_m, tile_k), lambda s: (0, first + s), transforms=x_transforms)]
    if norm is not None:
      in_specs.append(plgpu.BlockSpec((tile_k,), lambda s: (first + s,)))

    def row_inverse_rms(r, row):
      s32 = x_gmem[row, :].astype(jnp.float32)
      inv_smem[r] = lax.rsqrt(jnp.sum(s32 * s32) / k + norm[1])

    def inverse_rms_of_rows():
      """1 / rms of this block's token rows into ``inv_smem``; 0 past the last row (whose tiles are zeros). Run in
      the first step, so the pipeline's first weight loads are already in flight while the rows are read."""
      for r in range(tile_m):
        if mp == tile_m:  # one row block (every decode step): which rows exist is static
          if r < rows:
            row_inverse_rms(r, r)
          else:
            inv_smem[r] = jnp.float32(0)
          continue
        row = m_block * tile_m + r
        pl.when(row < rows)(functools.partial(row_inverse_rms, r, row))
        pl.when(row >= rows)(functools.partial(inv_smem.__setitem__, r, jnp.float32(0)))
      plgpu.commit_smem()  # every thread's stores visible to the whole warpgroup before the tiles read them

    extra = ()
    if norm is not None:
      extra = (g_gmem,)
    elif swiglu:  # the up tile: the same columns K further on
      in_specs.append(plgpu.BlockSpec((tile_m, tile_k), lambda s: (0, k // tile_k + first + s),
                                      transforms=x_transforms))
      extra = (x_gmem.at[m_slice],)

    def accumulate(acc_ref):
      def step(indices, w_smem, x_smem, *more):
        f32, dtype = jnp.float32, x_smem.dtype
        if norm is not None:  # rms_norm's roundings: (x / rms) to bf16, then times g to bf16
          pl.when(indices[0] == 0)(inverse_rms_of_rows)
          y = (x_smem[...].astype(f32) * inv_smem[...][:, None]).astype(dtype)
          xn_smem[...] = (more[0][...].astype(f32)[None, :] * y.astype(f32)).astype(dtype)
        elif swiglu:  # jax.nn.silu(gate) * up op by op as its HLO has them, each rounded to bf16
          r = lambda v: v.astype(dtype).astype(f32)
          gate = x_smem[...].astype(f32)
          sig = r(1.0 / r(1.0 + r(jnp.exp(-gate))))
          xn_smem[...] = (r(gate * sig) * more[0][...].astype(f32)).astype(dtype)
        if norm is not None or swiglu:
          plgpu.commit_smem()
          x_smem = xn_smem
        plgpu.wgmma(acc_ref, w_smem.T, x_smem.T)
        plgpu.wgmma_wait(0)

      pipeline = plgpu.emit_pipeline(step, grid=(steps,), in_specs=in_specs, max_concurrent_steps=depth)
      pipeline(w_gmem.at[:, n_slice], x_gmem.at[m_slice], *extra)
      return acc_ref[...]

    acc = pl.run_scoped(accumulate, plgpu.ACC((TILE_N, tile_m), jnp.float32))
    if halves == 1:
      out_smem.at[0].T[...] = acc.astype(jnp.bfloat16)
    else:
      bits = lax.bitcast_convert_type(acc, jnp.uint32)
      for half, part in enumerate((bits >> 16, bits & 0xFFFF)):
        out_smem.at[half].T[...] = lax.bitcast_convert_type(part.astype(jnp.uint16), jnp.bfloat16)
    plgpu.commit_smem()
    for half in range(halves):  # one 2-D copy each: TMA strides at most 5 tiled dimensions
      plgpu.copy_smem_to_gmem(out_smem.at[half], out_gmem.at[split, half, m_slice, n_slice])
    plgpu.wait_smem_to_gmem(0)

  scratch = [plgpu.SMEM((halves, tile_m, TILE_N), jnp.bfloat16, transforms=smem_transforms(TILE_N, jnp.bfloat16))]
  params = {}
  if norm is not None or swiglu:
    if tile_m != NORM_TILE_M:
      raise ValueError(f"skinny matmul with a prologue tiles {NORM_TILE_M} token rows, got tile_m={tile_m}")
    scratch += [plgpu.SMEM((tile_m,), jnp.float32)] if norm is not None else []
    scratch += [plgpu.SMEM((tile_m, tile_k), jnp.bfloat16, transforms=x_transforms)]
    params["compiler_params"] = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
  call = plgpu.kernel(
      kernel, out_type=jax.ShapeDtypeStruct((split_k, halves, mp, n), jnp.bfloat16),
      grid=(n // TILE_N, mp // tile_m, split_k), grid_names=("n", "m", "s"), scratch_types=scratch,
      interpret=interpret, **params,
  )
  return call(w, x2, *(() if norm is None else (norm[0].astype(x2.dtype),)))


def f32_from_halves(halves: jax.Array) -> jax.Array:
  """``[..., 2, Mp, N]`` bf16 bit patterns (high, low 16 bits) -> the f32 values they split, exactly."""
  hi, lo = (lax.bitcast_convert_type(h, jnp.uint16).astype(jnp.uint32) for h in (halves[..., 0, :, :],
                                                                                  halves[..., 1, :, :]))
  return lax.bitcast_convert_type((hi << 16) | lo, jnp.float32)


def skinny_matmul(x: jax.Array, w: jax.Array, *, norm: tuple[jax.Array, float] | None = None, swiglu: bool = False,
                  config: TuningConfig | None = None,
                  interpret: plgpu.InterpretGPUParams | None = None) -> jax.Array:
  """``x @ w`` for bf16 ``x`` ``[..., K]`` and ``w`` ``[K, N]``, f32 accumulation, bf16 result; with
  ``norm=(g, eps)``, ``rms_norm(x, g, eps) @ w``; with ``swiglu``, ``x`` is ``[..., 2 K]`` (gate, then up) and the
  result ``(silu(gate) * up) @ w`` (the module docstring says how).

  ``interpret=plgpu.InterpretGPUParams()`` runs it on CPU for tests. Unsupported shapes raise
  NotImplementedError (at trace time) so ``skinny_matmul.matmul`` can fall back loudly.
  """
  config = config or (PROLOGUE_CONFIG if norm is not None or swiglu else DEFAULT_CONFIG)
  if norm is not None and swiglu:
    raise ValueError("skinny matmul: one prologue at a time (norm or swiglu)")
  check_supported(x, w, config, swiglu)
  k, n = w.shape
  lead = x.shape[:-1]
  m = math.prod(lead)
  if norm is not None and norm[0].shape != (k,):
    raise ValueError(f"skinny matmul: the norm weight has shape {norm[0].shape}, x has {k} features")
  tile_m = NORM_TILE_M if norm is not None or swiglu else min(config.tile_m, round_up(max(m, 1), 8))
  mp = round_up(max(m, 1), tile_m)
  k_steps = k // config.tile_k
  split_k = config.split_k or SPLIT_K_BY_SHAPE.get((k, n)) or auto_split_k(
      (n // TILE_N) * (mp // tile_m), k_steps, num_sms(), config.blocks_per_sm)
  if k_steps % split_k:
    raise ValueError(f"skinny matmul: split_k={split_k} for W[{k}, {n}] does not divide its {k_steps} K steps "
                     f"(tile_k={config.tile_k}; SPLIT_K_BY_SHAPE or the config)")
  x2 = pad_for_tma(x.reshape(m, x.shape[-1]), X_TILE)
  partial = _call(x2, w, norm, swiglu, tile_m=tile_m, tile_k=config.tile_k,
                  max_concurrent_steps=config.max_concurrent_steps, split_k=split_k, halves=2 if split_k > 1 else 1,
                  interpret=interpret, mp=mp, blocks_per_sm=config.blocks_per_sm)
  y = partial[0, 0] if split_k == 1 else f32_from_halves(partial).sum(0).astype(x.dtype)
  return y[:m].reshape(*lead, n)
