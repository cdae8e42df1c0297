"""Qwen3's q/k RMSNorm + rotary embedding of a fused q|k|v projection in one Mosaic GPU kernel (Hopper; runs in
GPU interpret mode too).

Why: after the q|k|v projection XLA ran three kernels a layer in a decode step (the split-K sum with the q/k norm's
reduction, the rope's concatenation, v's sum and cast: ``input_reduce_fusion``, ``input_concatenate_fusion``,
``loop_convert_fusion``, ~4.8 us a layer, ~0.17 ms of a Qwen3-8B AR step on the H200,
docs/results/2026-12-01-partials-w12v3-h200/). This is one launch: one block of 128 threads per (token row, head)
reads the head's ``D`` values (or the skinny matmul's unsummed K splits, ``split_k.SplitKPartials``, added in split
order as ``SplitKPartials.sum`` does), norms q and k heads (sum of squares across the warpgroup), rotates them
(the partner half read back from a shared-memory copy of the normed head stored twice, so element ``i`` reads
``i + D/2`` without a wrap) and writes the head; v heads are written as summed.

Numerics: the reference's operations in its order (the sum rounded to the activation dtype; the norm's statistic in
f32, each factor rounded as ``rms_norm`` does; the rope in f32 from the rounded normed head, rounded once). The rope's
sign is folded into the sin table (``sin * [-1, +1]``, exact). Only the order of the f32 sum of squares differs from
XLA's, so an element can differ by one rounding step, rarely.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import pdl
from pallas_kernels.lowering import lowered_once
from pallas_kernels.split_k import SplitKPartials, load_row

_SUPPORTED_DTYPES = (jnp.bfloat16, jnp.float16)
HEAD_MULTIPLE = 128
"""Head sizes this kernel tiles: a multiple of the warpgroup's 128 threads."""


def check_supported(qkv, q_norm, k_norm, cos, sin, num_kv_heads: int) -> None:
  """ValueError for inconsistent inputs; NotImplementedError (the caller falls back) for what the kernel does not
  tile."""
  if len(qkv.shape) != 3:
    raise ValueError(f"qk_norm_rope: qkv must be [B, T, (Hq + 2 Hkv) D], got shape {tuple(qkv.shape)}")
  b, t, n = qkv.shape
  d = cos.shape[-1]
  if cos.shape != (b, t, d) or sin.shape != cos.shape:
    raise ValueError(f"qk_norm_rope: cos {cos.shape} and sin {sin.shape} must be [B, T, D] = {(b, t, d)}")
  if n % d or n // d <= 2 * num_kv_heads:
    raise ValueError(f"qk_norm_rope: {n} features are not q heads plus 2 x {num_kv_heads} kv heads of size {d}")
  if (q_norm is None) != (k_norm is None):
    raise ValueError("qk_norm_rope: give both q_norm and k_norm, or neither")
  for name, g in (("q_norm", q_norm), ("k_norm", k_norm)):
    if g is not None and g.shape != (d,):
      raise ValueError(f"qk_norm_rope: {name} has shape {g.shape}, the heads have {d} features")
  if jnp.dtype(qkv.dtype) not in map(jnp.dtype, _SUPPORTED_DTYPES):
    raise NotImplementedError(f"the qk_norm_rope kernel takes 16-bit activations, got {qkv.dtype}")
  if d % HEAD_MULTIPLE:
    raise NotImplementedError(f"head_dim {d} is not a multiple of {HEAD_MULTIPLE}")
  if not b * t:
    raise NotImplementedError("no rows: a kernel of an empty grid")



@lowered_once("num_kv_heads", "eps", "split", "interpret")
def qk_norm_rope(qkv: jax.Array | SplitKPartials, q_norm: jax.Array | None, k_norm: jax.Array | None,
                 cos: jax.Array, sin: jax.Array, *, num_kv_heads: int, eps: float, split: bool = False,
                 interpret: plgpu.InterpretGPUParams | None = None):
  """``reference.qk_norm_rope_reference`` in one kernel: the heads ``[B, T, Hq + 2 Hkv, D]``, or with
  ``split=True`` the triple ``(q, k, v)`` as three arrays (so a consumer kernel reading them separately needs no
  slice copied out)."""
  check_supported(qkv, q_norm, k_norm, cos, sin, num_kv_heads)
  b, t, n = qkv.shape
  d = cos.shape[-1]
  m, h_all = b * t, n // d
  hq = h_all - 2 * num_kv_heads
  dtype = jnp.dtype(qkv.dtype)
  norm = q_norm is not None
  if isinstance(qkv, SplitKPartials):
    x_arg = lax.bitcast_convert_type(qkv.halves, jnp.uint16)  # a bitcast: no kernel
  else:
    x_arg = qkv.reshape(m, n)
  sign = np.concatenate([-np.ones(d // 2, np.float32), np.ones(d // 2, np.float32)])  # the rotation's sign
  tables = (cos.reshape(m, d).astype(jnp.float32), (sin.astype(jnp.float32) * sign).reshape(m, d))
  weights = (q_norm.astype(dtype), k_norm.astype(dtype)) if norm else ()

  def qk_norm_rope_body(*refs):  # the body's name is the kernel's name in profiles
    pdl.begin_kernel(interpret, release_first=True)  # a small kernel: its successor may start now
    x_ref, cos_ref, sin_ref, *refs = refs
    (qn_ref, kn_ref), refs = (refs[:2], refs[2:]) if norm else ((None, None), refs)
    *out_refs, twice = refs
    row, head = lax.axis_index("row"), lax.axis_index("head")
    # every load first (the tables and weights too, which a v head does not use): their latencies then overlap
    # the head's instead of following the norm's reduction
    x = load_row(x_ref, row, dtype, pl.ds(head * d, d))
    cos, sin = cos_ref[row, :], sin_ref[row, :]
    q_gain, k_gain = (qn_ref[...], kn_ref[...]) if norm else (None, None)

    def store(ref, first_head, value):
      ref[row, pl.ds((head - first_head) * d, d)] = value

    def rotated(gain, ref, first_head):
      y = x.astype(jnp.float32)
      if gain is not None:  # rms_norm's roundings: the normed head, then the weight's product
        y = (y * lax.rsqrt(jnp.sum(y * y) / d + eps)).astype(dtype)
        y = (gain.astype(jnp.float32) * y.astype(jnp.float32)).astype(dtype).astype(jnp.float32)
      twice[pl.ds(0, d)] = y
      twice[pl.ds(d, d)] = y
      partner = twice[pl.ds(d // 2, d)]  # element i: y[(i + D/2) mod D]
      store(ref, first_head, (y * cos + partner * sin).astype(dtype))

    q_out, k_out, v_out = out_refs if split else out_refs * 3
    firsts = (0, hq, hq + num_kv_heads) if split else (0, 0, 0)
    pl.when(head < hq)(lambda: rotated(q_gain, q_out, firsts[0]))
    pl.when((head >= hq) & (head < hq + num_kv_heads))(lambda: rotated(k_gain, k_out, firsts[1]))
    pl.when(head >= hq + num_kv_heads)(lambda: store(v_out, firsts[2], x))

  widths = (hq * d, num_kv_heads * d, num_kv_heads * d) if split else (n,)
  call = plgpu.kernel(qk_norm_rope_body, out_type=tuple(jax.ShapeDtypeStruct((m, w), dtype) for w in widths),
                      grid=(m, h_all), grid_names=("row", "head"),
                      scratch_types=[plgpu.SMEM((2 * d,), jnp.float32)], interpret=interpret,
                      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup))
  outs = call(x_arg, *tables, *weights)
  heads = [o.reshape(b, t, -1, d) for o in outs]
  return tuple(heads) if split else heads[0]
