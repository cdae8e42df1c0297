"""Residual add + RMSNorm in one Mosaic GPU kernel (Hopper; runs in GPU interpret mode too).

Why: XLA runs a residual add and the RMSNorm after it as three kernels (the add, the sum of squares, the scale:
``loop_add_fusion``, ``input_reduce_fusion``, ``loop_multiply_fusion`` in the H200's kernel split), ~1.5 us each,
twice a layer: ~0.3 ms of a Qwen3-8B decode step in 214 launches
(docs/results/2026-11-30-ar-tree-attention-h200/). This is one kernel per add: one warpgroup per token row reads
the row and its update from GMEM, writes the new residual row, sums its squares (f32, across the warpgroup) and
writes the normed row. The update may come as a skinny matmul's unsummed K splits (``split_k.SplitKPartials``):
the kernel adds them in order as it reads the row, which spares the XLA sum kernel between the two Mosaic GPU
kernels (two a layer in a decode step).

Numerics: the same operations as ``reference.add_rms_norm_reference`` (the add rounded to the activation dtype,
statistics in f32, each factor rounded before the weight multiply); only the order of the f32 sum of squares
differs, so a normed element can differ from XLA's by one rounding step, rarely. The model uses one
implementation at every token count, so AR steps and verify passes round alike.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import pdl
from pallas_kernels.lowering import lowered_once
from pallas_kernels.split_k import SplitKPartials, load_row

_SUPPORTED_DTYPES = (jnp.bfloat16, jnp.float16)
ROW_MULTIPLE = 1024
"""Hidden sizes this kernel tiles: a multiple of 1024 (128 threads x 8-element vectors)."""


def check_supported(x: jax.Array, delta: jax.Array | SplitKPartials | None, w: jax.Array,
                    prefix: jax.Array | None = None) -> None:
  """ValueError for inconsistent inputs; NotImplementedError (the caller falls back) for what the kernel does
  not tile."""
  h = x.shape[-1]
  if w.shape != (h,):
    raise ValueError(f"add_rms_norm: the weight has shape {w.shape}, the rows have {h} features")
  if delta is not None and tuple(delta.shape) != x.shape:
    raise ValueError(f"add_rms_norm: delta {tuple(delta.shape)} does not match x {x.shape}")
  if prefix is not None and (x.ndim < 2 or prefix.shape[:-2] != x.shape[:-2] or prefix.shape[-1] != h
                             or prefix.dtype != x.dtype):
    raise ValueError(f"add_rms_norm: prefix {prefix.shape} {prefix.dtype} does not fit x {x.shape} {x.dtype} "
                     "(expected [..., P, H] with x's leading axes, hidden size and dtype)")
  if jnp.dtype(x.dtype) not in map(jnp.dtype, _SUPPORTED_DTYPES):
    raise NotImplementedError(f"the add_rms_norm kernel takes 16-bit activations, got {x.dtype}")
  if h % ROW_MULTIPLE:
    raise NotImplementedError(f"hidden size {h} is not a multiple of {ROW_MULTIPLE}")
  if not math.prod(x.shape[:-1]):
    raise NotImplementedError("no rows: a kernel of an empty grid")


@lowered_once("eps", "interpret")
def add_rms_norm(x: jax.Array, delta: jax.Array | SplitKPartials | None, w: jax.Array, eps: float, *,
                 prefix: jax.Array | None = None, interpret: plgpu.InterpretGPUParams | None = None
                 ) -> tuple[jax.Array, jax.Array]:
  """``(x + delta, rms_norm(x + delta) * w)`` for ``x``, ``delta`` ``[..., H]`` (``delta=None``: no add; a
  ``SplitKPartials``: summed here); one block of 128 threads per row. ``prefix`` ``[..., P, H]``: rows copied ahead of
  each request's normed rows (``reference.add_rms_norm_reference``), by blocks of their own in the same grid."""
  check_supported(x, delta, w, prefix)
  lead, h = x.shape[:-1], x.shape[-1]
  m = math.prod(lead)
  t = x.shape[-2] if prefix is not None else 1
  p = prefix.shape[-2] if prefix is not None else 0  # rows ahead of each request's t normed rows
  dtype = x.dtype
  has_delta = delta is not None
  if isinstance(delta, SplitKPartials):
    if jnp.dtype(delta.dtype) != jnp.dtype(dtype):
      raise ValueError(f"add_rms_norm: the split-K update is {delta.dtype}, the rows are {jnp.dtype(dtype).name}")
    delta_arg = lax.bitcast_convert_type(delta.halves, jnp.uint16)  # a bitcast: no kernel
  elif has_delta:
    delta_arg = delta.astype(dtype).reshape(m, h)

  def norm_row(x_ref, d_ref, w_ref, o_ref, s_ref, row, out_row):
    # every load first: the weight's latency then overlaps the row's instead of following the reduction
    s, w = x_ref[row, :], w_ref[...]
    if d_ref is not None:
      s = (s.astype(jnp.float32) + load_row(d_ref, row, dtype).astype(jnp.float32)).astype(dtype)
      s_ref[row, :] = s
    s32 = s.astype(jnp.float32)
    inv = lax.rsqrt(jnp.sum(s32 * s32) / h + eps)
    y = (s32 * inv).astype(dtype)
    o_ref[out_row, :] = (w.astype(jnp.float32) * y.astype(jnp.float32)).astype(dtype)

  def add_rms_norm_body(*refs):  # the body's name is the kernel's name in profiles
    pdl.begin_kernel(interpret, release_first=True)  # a small kernel: its successor may start now
    refs = list(refs)  # inputs x, [delta], [prefix], w; outputs normed, [s]
    x_ref = refs.pop(0)
    d_ref = refs.pop(0) if has_delta else None
    pre_ref = refs.pop(0) if p else None
    w_ref, o_ref, *s_refs = refs
    s_ref = s_refs[0] if has_delta else None
    row = lax.axis_index("row")
    if not p:
      norm_row(x_ref, d_ref, w_ref, o_ref, s_ref, row, row)
      return
    req, j = row // (p + t), row % (p + t)  # output row j of request req: a prefix row, or normed row j - p

    @pl.when(j < p)
    def _():
      o_ref[row, :] = pre_ref[req * p + j, :]

    @pl.when(j >= p)
    def _():
      norm_row(x_ref, d_ref, w_ref, o_ref, s_ref, req * t + j - p, row)

  m_out = m + m // t * p
  out_type = (jax.ShapeDtypeStruct((m_out, h), dtype), *((jax.ShapeDtypeStruct((m, h), dtype),) if has_delta else ()))
  call = plgpu.kernel(add_rms_norm_body, out_type=out_type, grid=(m_out,), grid_names=("row",),
                      interpret=interpret,
                      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup))
  args = (x.reshape(m, h), *((delta_arg,) if has_delta else ()), *((prefix.reshape(-1, h),) if p else ()),
          w.astype(dtype))
  outs = call(*args)
  s = outs[1].reshape(x.shape) if has_delta else x
  return s, outs[0].reshape(*x.shape[:-2], x.shape[-2] + p, h) if p else outs[0].reshape(x.shape)
