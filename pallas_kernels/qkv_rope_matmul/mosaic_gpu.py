"""The q|k|v projection with the q/k norm and the rope in its epilogue, for a decode step's few token rows on Hopper
(Mosaic GPU).

Why: in a Qwen3-8B AR step the q/k norm + rope after the q|k|v projection is a kernel of its own
(``pallas_kernels.qk_norm_rope``: 1.6 us a layer, 59 us a step on the H200, plus its place in the serial chain;
docs/results/2026-12-06-swiglu-cluster-h200/). Here it is the matmul's epilogue: one kernel a layer fewer.

Shape of the call. One head (``D`` = 128 output channels) a block, tokens on the wgmma M side (a 64-row activation
tile whose first 8 rows TMA fills, with zeros past the ``M`` real rows; the rows past 8 are left as they are and
only give accumulator rows nobody reads), the head's ``[tile_k, D]`` weight tile the B operand as stored (no
transpose), so the accumulator's rows are tokens and a token's head is one row of it. The blocks of a head come in a
cluster of ``splits`` that cut K in contiguous ranges (192 blocks at Qwen3-8B's 48 heads and four splits, what the
skinny kernel runs with its 96 channel blocks and two splits). Epilogue: every block stores its f32 accumulator in
shared memory (the pipeline's, free by then) and copies each real token row into a 1-D buffer of its own; after a
cluster barrier the split ``r mod splits`` reads row ``r``'s buffers of every split through distributed shared
memory (512 bytes a peer: ``scripts/h200/cluster_merge_probe.py`` measured a block reading its peers at ~30 KB a
us), adds them in split order,
rounds the sum to the activation dtype (what the matmul returned before) and finishes the head as
``qk_norm_rope.mosaic_gpu`` does: q and k heads normed and rotated, v heads stored as summed. A second barrier keeps
the buffers until every peer has read them.

Interpret mode has no distributed shared memory, so interpreted the buffers go through a GMEM output instead
(``interpretable``; the cluster barriers are the GPU form's).

Numerics: the projection's f32 partial sums added in split order and rounded once, then the rope kernel's
operations in its order; only the f32 summation order of the projection (four K ranges instead of the skinny
kernel's two) and of the norm's statistic differ from the unfused path, so an element may differ by one rounding step,
rarely.

Cost, predicted before any GPU run: the rope kernel's 59 us a step gone, the epilogue +0.5-0.8 us a call (a cluster
barrier, four 512-byte peer reads, the head's norm and rope): the AR step -30 to -40 us. The tensor cores do 64 rows
of work for one (16.8 MFLOP a block, ~2 us of a block's ~13 us stream on an H100 SM, overlapped with its loads).
Measured on an H100 (docs/results/2026-12-06-fusion-ab-h100/): -17 to -40 us a step with ``DEFAULT_CONFIG``, once
the pipeline's tiles and the accumulator's copy shared their memory (two blocks an SM); +46 us before (one).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.lowering import lowered_once
from pallas_kernels.split_k import SMEM_LIMIT, exit_wait, smem_transforms, streamed_dot
from pallas_kernels.tma import pad_for_tma

HEAD_DIM = 128
"""The head size the kernel tiles: one wgmma N, and a multiple of the warpgroup's 128 threads for the 1-D rows."""
TOKENS = 64  # the activation tile's rows: wgmma M
MAX_ROWS = 8
"""Token rows the epilogue handles (unrolled, one buffer a row): a decode step's batch of up to 8."""
X_TILE = (8, 64)  # the SMEM tiling of the activation tiles
_SUPPORTED_DTYPES = (jnp.bfloat16,)


@dataclasses.dataclass(frozen=True)
class TuningConfig:
  """tile_k: reduction depth per pipeline step (a multiple of 64; a step moves a ``[tile_k, D]`` weight tile).
  max_concurrent_steps: pipeline slots. splits: the K ranges of a head, one block each, one cluster (2 to 8)."""

  tile_k: int = 128
  max_concurrent_steps: int = 2
  splits: int = 4

  def __post_init__(self):
    if self.tile_k <= 0 or self.tile_k % 64:
      raise ValueError(f"tile_k must be a positive multiple of 64, got {self.tile_k}")
    if self.max_concurrent_steps < 1:
      raise ValueError(f"max_concurrent_steps must be >= 1, got {self.max_concurrent_steps}")
    if not 1 <= self.splits <= 8:
      raise ValueError(f"splits must be in [1, 8] (a portable cluster), got {self.splits}")


DEFAULT_CONFIG = TuningConfig()
"""Two blocks an SM (~100 KB of shared memory each), each with two 32 KB weight tiles in flight: the skinny kernel's
128 KB an SM. The first GPU run had three slots (~180 KB, one block an SM: 192 blocks in two waves) and made the AR
step 46 us slower than the two kernels it replaces (H100, docs/results/2026-12-06-fusion-ab-h100/)."""


def _smem_bytes(config: TuningConfig, d: int, steps: int, rows: int) -> int:
  """A block's shared memory: the larger of its pipeline's weight and activation tiles and the f32 accumulator's copy
  (scopes that reuse the same memory), the row buffers, and 1 KB for barriers and alignment."""
  depth = min(config.max_concurrent_steps, steps)
  return max(depth * (config.tile_k * d + TOKENS * config.tile_k) * 2, TOKENS * d * 4) + rows * 3 * d * 4 + 1024


def check_supported(x, w, q_norm, k_norm, cos, sin, num_kv_heads: int, config: TuningConfig) -> None:
  """ValueError for inconsistent inputs; NotImplementedError (the caller falls back) for what the kernel does not
  tile."""
  k, n = w.shape
  if x.shape[-1] != k:
    raise ValueError(f"qkv_rope_matmul: x has {x.shape[-1]} features, w_qkv expects {k}")
  lead, d = x.shape[:-1], cos.shape[-1]
  if cos.shape != (*lead, d) or sin.shape != cos.shape:
    raise ValueError(f"qkv_rope_matmul: cos {cos.shape} and sin {sin.shape} must be x's leading axes + [D]")
  if n % d or n // d <= 2 * num_kv_heads:
    raise ValueError(f"qkv_rope_matmul: {n} features are not q heads plus 2 x {num_kv_heads} kv heads of size {d}")
  if (q_norm is None) != (k_norm is None):
    raise ValueError("qkv_rope_matmul: give both q_norm and k_norm, or neither")
  if x.dtype not in _SUPPORTED_DTYPES or w.dtype not in _SUPPORTED_DTYPES:
    raise NotImplementedError(f"the qkv_rope_matmul kernel takes bf16 x and W, got {x.dtype} and {w.dtype}")
  if d != HEAD_DIM:
    raise NotImplementedError(f"head_dim {d}: the kernel tiles {HEAD_DIM}")
  if not 1 <= math.prod(lead) <= MAX_ROWS:
    raise NotImplementedError(f"{math.prod(lead)} token rows: the kernel takes 1 to {MAX_ROWS}")
  if k % (config.tile_k * config.splits):
    raise NotImplementedError(f"K={k} is not a multiple of tile_k x splits = {config.tile_k * config.splits}")
  smem = _smem_bytes(config, d, k // config.tile_k // config.splits, math.prod(lead))
  if smem > SMEM_LIMIT:
    raise NotImplementedError(f"{config} needs {smem} bytes of shared memory, over {SMEM_LIMIT}")


@lowered_once("m", "hq", "hkv", "eps", "norm", "split", "tile_k", "max_concurrent_steps", "splits", "interpret",
              "interpretable")
def _call(x2, w, tables, weights, *, m, hq, hkv, eps, norm, split, tile_k, max_concurrent_steps, splits, interpret,
          interpretable):
  k, n = w.shape
  d = HEAD_DIM
  steps = k // tile_k // splits
  depth = min(max_concurrent_steps, steps)
  dtype = x2.dtype

  def project(w_gmem, x_gmem, head, first, w_smem, x_smem, loaded):
    """The block's ``[64, D]`` f32 accumulator over its K range: the pipeline, in shared memory scoped to it."""

    def load_w(step, slot):
      cols = pl.ds(head * d, d)
      plgpu.copy_gmem_to_smem(w_gmem.at[pl.ds((first + step) * tile_k, tile_k), cols], w_smem.at[slot],
                              loaded.at[slot])

    def load_x(step, slot):  # the first 8 rows of the tile: the rows past them only make accumulator rows unread
      plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, X_TILE[0]), pl.ds((first + step) * tile_k, tile_k)],
                              x_smem.at[slot, pl.ds(0, X_TILE[0])], loaded.at[slot])

    def multiply(acc_ref, slot):  # tokens on M: the activation tile is A, the weight tile B as stored
      plgpu.wgmma(acc_ref, x_smem.at[slot], w_smem.at[slot])

    return streamed_dot((TOKENS, d), steps, depth, loaded, load_w, load_x, multiply, interpret)

  def qkv_rope_matmul_body(w_gmem, x_gmem, cos_ref, sin_ref, *refs):  # its name in profiles
    (qn_ref, kn_ref), refs = (refs[:2], refs[2:]) if norm else ((None, None), refs)
    outputs = (3 if split else 1) + (1 if interpretable else 0)
    out_refs, handover = refs[:outputs], None
    if interpretable:
      *out_refs, handover = out_refs
    row_bufs, twice, staged = refs[outputs:]
    head, part = lax.axis_index("head"), lax.axis_index("split")
    acc = pl.run_scoped(functools.partial(project, w_gmem, x_gmem, head, part * steps), *pipeline_scratch)

    def keep_rows(acc_smem):  # in the pipeline's shared memory, free by then
      acc_smem[...] = acc
      plgpu.commit_smem()
      for r in range(m):  # 1-D buffers at offset 0: cluster_ref of a slice elsewhere does not lower (jax 0.11.2)
        row_bufs[r][...] = acc_smem[r, :]

    pl.run_scoped(keep_rows, plgpu.SMEM((TOKENS, d), jnp.float32))  # unswizzled: rows read as 1-D vectors
    plgpu.commit_smem()  # every thread's rows written before the arrive (one thread a block)
    if interpretable:  # no distributed shared memory: the rows go through GMEM
      for r in range(m):
        plgpu.copy_smem_to_gmem(row_bufs[r], handover.at[part, head, r])
      plgpu.wait_smem_to_gmem(0)
    plgpu.barrier_arrive(staged.at[0])
    plgpu.barrier_wait(staged.at[0])

    q_out, k_out, v_out = out_refs if split else out_refs * 3
    firsts = (0, hq, hq + hkv) if split else (0, 0, 0)
    for r in range(m):
      def peer_row(peer, r=r):
        if interpretable:
          return handover[peer, head, r, :]
        return plgpu.cluster_ref(row_bufs[r], {"split": peer})[...]

      @pl.when(part == r % splits)
      def _finish_row(r=r, peer_row=peer_row):
        parts = [peer_row(peer) for peer in range(splits)]  # every load first
        cos, sin = cos_ref[r, :], sin_ref[r, :]
        q_gain, k_gain = (qn_ref[...], kn_ref[...]) if norm else (None, None)
        total = parts[0]
        for p in parts[1:]:
          total = total + p
        x = total.astype(dtype)

        def store(ref, first_head, value):
          ref[r, pl.ds((head - first_head) * d, d)] = value

        def rotated(gain, ref, first_head):  # as qk_norm_rope.mosaic_gpu: its roundings, in its order
          y = x.astype(jnp.float32)
          if gain is not None:
            y = (y * lax.rsqrt(jnp.sum(y * y) / d + eps)).astype(dtype)
            y = (gain.astype(jnp.float32) * y.astype(jnp.float32)).astype(dtype).astype(jnp.float32)
          twice[r][pl.ds(0, d)] = y
          twice[r][pl.ds(d, d)] = y
          partner = twice[r][pl.ds(d // 2, d)]  # element i: y[(i + D/2) mod D]
          store(ref, first_head, (y * cos + partner * sin).astype(dtype))

        pl.when(head < hq)(lambda: rotated(q_gain, q_out, firsts[0]))
        pl.when((head >= hq) & (head < hq + hkv))(lambda: rotated(k_gain, k_out, firsts[1]))
        pl.when(head >= hq + hkv)(lambda: store(v_out, firsts[2], x))

    plgpu.barrier_arrive(staged.at[1])  # the row buffers stay until every peer has read them
    plgpu.barrier_wait(staged.at[1])
    exit_wait()

  widths = (hq * d, hkv * d, hkv * d) if split else (n,)
  out_type = [jax.ShapeDtypeStruct((m, width), dtype) for width in widths]
  if interpretable:
    out_type.append(jax.ShapeDtypeStruct((splits, n // d, m, d), jnp.float32))
  pipeline_scratch = (
      plgpu.SMEM((depth, tile_k, d), dtype, transforms=smem_transforms(d, dtype)),
      plgpu.SMEM((depth, TOKENS, tile_k), dtype, transforms=smem_transforms(tile_k, dtype)),
      plgpu.Barrier(num_arrivals=2, num_barriers=depth),  # a slot's weight and x tiles
  )
  scratch = (
      tuple(plgpu.SMEM((d,), jnp.float32) for _ in range(m)),
      tuple(plgpu.SMEM((2 * d,), jnp.float32) for _ in range(m)),
      plgpu.ClusterBarrier(collective_axes=("split",), num_barriers=2),  # rows stored; rows read
  )
  call = plgpu.kernel(qkv_rope_matmul_body, out_type=tuple(out_type), grid=(n // d,), grid_names=("head",),
                      cluster=(splits,), cluster_names=("split",), scratch_types=scratch, interpret=interpret,
                      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup))
  outs = call(w, x2, *tables, *weights)
  return outs[:-1] if interpretable else outs


def qkv_rope_matmul(x: jax.Array, w_qkv: jax.Array, q_norm: jax.Array | None, k_norm: jax.Array | None,
                    cos: jax.Array, sin: jax.Array, *, num_kv_heads: int, eps: float, split: bool = False,
                    config: TuningConfig | None = None, interpret: plgpu.InterpretGPUParams | None = None,
                    interpretable: bool | None = None):
  """``reference.qkv_rope_matmul_reference`` in one kernel: the heads ``[..., Hq + 2 Hkv, D]`` of bf16 ``x``
  ``[..., K]`` and ``w_qkv`` ``[K, (Hq + 2 Hkv) D]``, or with ``split=True`` ``(q, k, v)`` as three arrays.
  Unsupported shapes raise NotImplementedError at trace time, so ``ops.qkv_rope_matmul`` can fall back loudly.
  ``interpretable`` (default: whether ``interpret`` is given) hands the rows over through GMEM instead of distributed
  shared memory (module docstring)."""
  config = config or DEFAULT_CONFIG
  check_supported(x, w_qkv, q_norm, k_norm, cos, sin, num_kv_heads, config)
  lead, k = x.shape[:-1], x.shape[-1]
  m, d = math.prod(lead), HEAD_DIM
  n = w_qkv.shape[1]
  hkv = num_kv_heads
  hq = n // d - 2 * hkv
  sign = np.concatenate([-np.ones(d // 2, np.float32), np.ones(d // 2, np.float32)])  # the rotation's sign
  tables = (cos.reshape(m, d).astype(jnp.float32), (sin.astype(jnp.float32) * sign).reshape(m, d))
  norm = q_norm is not None
  weights = (q_norm.astype(x.dtype), k_norm.astype(x.dtype)) if norm else ()
  x2 = pad_for_tma(x.reshape(m, k), X_TILE)
  outs = _call(x2, w_qkv, tables, weights, m=m, hq=hq, hkv=hkv, eps=float(eps), norm=norm, split=split,
               tile_k=config.tile_k, max_concurrent_steps=config.max_concurrent_steps, splits=config.splits,
               interpret=interpret, interpretable=interpret is not None if interpretable is None else interpretable)
  heads = [o.reshape(*lead, -1, d) for o in outs]
  return tuple(heads) if split else heads[0]
