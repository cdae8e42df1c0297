"""What the q/k norm + rope would cost inside the attention kernel's prologue (the runbook's "The q/k norm + rope in
the attention kernel", proposed in the fifty-fifth session): the number that decides whether removing the AR step's
36 q/k norm + rope launches (59 us a step) pays.

Each kernel is one AR step's attention head for Qwen3-8B's heads (one block per KV head, its G query heads as rows
``g * 16`` of a ``[64, D]`` Q tile, the rows between them the tree's absent nodes), up to its first wgmma (``Q K^T``
of one ``[64, D]`` K block):
- ``plain_q``: Q's rows TMA-loaded from the roped q heads, as the attention kernel loads them now;
- ``rope_prologue``: the q|k|v projection's two unsummed K splits (``SplitKPartials``' uint16 halves) TMA-loaded
  instead, then summed, rounded, RMS-normed, scaled by ``q_norm`` and rotated in registers, each half of D a
  tile-aligned slice of the SMEM tiles (so the rotation's partner half needs no shuffle), and stored into the Q tile;
- ``qk_norm_rope``: the kernel that norms and rotates every head today (``pallas_kernels.qk_norm_rope``), alone.
The prologue pays if ``rope_prologue - plain_q`` is well under ``qk_norm_rope``'s time (predicted: 0.3-0.5 against
1.6 us; measured on an H100: 2.17 against 1.57 us, so it does not pay and was not built:
docs/results/2026-12-07-rope-prologue-probe-h100/). Learned building it on the CPU: a 1-D vector loaded from GMEM
does not broadcast along a WGMMA tile's rows in Mosaic GPU ("Only optimized transfers to SMEM supported" at
lowering), so ``q_norm`` and the rope tables go through SMEM by TMA.

    PYTHONPATH=$PWD python3 scripts/h200/rope_prologue_probe.py > $OUT/rope_prologue.txt
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.qk_norm_rope.mosaic_gpu import qk_norm_rope
from pallas_kernels.qk_norm_rope.reference import qk_norm_rope_reference
from pallas_kernels.split_k import SplitKPartials, join_halves

D, G, HKV, BLOCK_M, BLOCK_KV, EPS = 128, 4, 8, 64, 64, 1e-6
NODES = BLOCK_M // G  # a row block's nodes; node 0 is the AR step's one token
_PARAMS = plgpu.CompilerParams(approx_math=True, lowering_semantics=plgpu.LoweringSemantics.Warpgroup)


def _transforms(dtype) -> tuple:
  bits = jnp.dtype(dtype).itemsize * 8
  swizzle = plgpu.find_swizzle(D * bits)
  return plgpu.TilingTransform((8, swizzle * 8 // bits)), plgpu.SwizzleTransform(swizzle)


def _scores(q_smem, k_smem, out_smem, out_ref, h):
  """``Q K^T`` of the block's tile and its store: the attention kernel's first step, minus the softmax."""
  def scores_of(acc_ref):
    plgpu.wgmma(acc_ref, q_smem, k_smem.transpose((1, 0)))
    return acc_ref[...]

  out_smem[...] = pl.run_scoped(scores_of, plgpu.ACC((BLOCK_M, BLOCK_KV), jnp.float32))
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(out_smem, out_ref.at[h])
  plgpu.wait_smem_to_gmem(0)


def _call(body, scratch, *args, interpret=None):
  scratch = (plgpu.SMEM((BLOCK_M, D), jnp.bfloat16, transforms=_transforms(jnp.bfloat16)),
             plgpu.SMEM((BLOCK_KV, D), jnp.bfloat16, transforms=_transforms(jnp.bfloat16)),
             plgpu.SMEM((BLOCK_M, BLOCK_KV), jnp.float32), *scratch)
  out = jax.ShapeDtypeStruct((HKV, BLOCK_M, BLOCK_KV), jnp.float32)
  return plgpu.kernel(body, out_type=out, grid=(HKV,), grid_names=("h",), scratch_types=scratch,
                      compiler_params=_PARAMS, interpret=interpret)(*args)


def plain_q(q: jax.Array, k: jax.Array, interpret=None) -> jax.Array:
  """q: the roped heads ``[1, 1, Hq, D]``; k: ``[HKV, BLOCK_KV, D]`` -> ``[HKV, BLOCK_M, BLOCK_KV]`` scores."""
  def plain_q_body(q_ref, k_ref, out_ref, q_smem, k_smem, out_smem, barrier):  # its name in profiles
    h = lax.axis_index("h")
    for gi in range(G):  # rows past the one node: TMA reads zeros past q
      plgpu.copy_gmem_to_smem(q_ref.at[0, pl.ds(0, NODES), h * G + gi], q_smem.at[pl.ds(gi * NODES, NODES)], barrier)
    plgpu.copy_gmem_to_smem(k_ref.at[h], k_smem, barrier)
    plgpu.barrier_wait(barrier)
    _scores(q_smem, k_smem, out_smem, out_ref, h)

  return _call(plain_q_body, (plgpu.Barrier(num_arrivals=G + 1),), q, k, interpret=interpret)


def rope_prologue(parts: SplitKPartials, q_norm, cos, sin, k: jax.Array, interpret=None) -> jax.Array:
  """The same scores from the q|k|v projection's unsummed K splits: ``parts`` ``[1, 1, (Hq + 2 Hkv) D]`` with
  ``halves`` ``[S, 2, Mp, N]``; ``q_norm`` ``[D]``; ``cos``, ``sin`` ``[1, 1, D]``."""
  splits = parts.num_splits
  bits = lax.bitcast_convert_type(parts.halves, jnp.uint16)  # a bitcast: no kernel
  sign = np.concatenate([-np.ones(D // 2, np.float32), np.ones(D // 2, np.float32)])
  tables = (q_norm.astype(jnp.bfloat16), cos.reshape(D).astype(jnp.float32),
            (sin.astype(jnp.float32) * sign).reshape(D))

  def rope_prologue_body(x_ref, gain_ref, cos_ref, sin_ref, k_ref, out_ref, q_smem, k_smem, out_smem, x_smem,
                         gain_smem, cos_smem, sin_smem, barrier):  # its name in profiles
    h = lax.axis_index("h")
    for s in range(splits):
      for half in range(2):
        for gi in range(G):
          plgpu.copy_gmem_to_smem(x_ref.at[s, half, pl.ds(0, NODES), pl.ds((h * G + gi) * D, D)],
                                  x_smem.at[s, half, pl.ds(gi * NODES, NODES)], barrier)
    for src, dst in ((gain_ref, gain_smem), (cos_ref, cos_smem), (sin_ref, sin_smem), (k_ref.at[h], k_smem)):
      plgpu.copy_gmem_to_smem(src, dst, barrier)
    plgpu.barrier_wait(barrier)
    w = D // 2

    def summed(cols):  # the splits added in order in f32 and rounded, as SplitKPartials.sum does
      total = None
      for s in range(splits):
        part = join_halves(x_smem[s, 0, :, cols], x_smem[s, 1, :, cols])
        total = part if total is None else total + part
      return total.astype(jnp.bfloat16).astype(jnp.float32)

    lo, hi = summed(pl.ds(0, w)), summed(pl.ds(w, w))
    inv = lax.rsqrt(((lo * lo).sum(axis=1) + (hi * hi).sum(axis=1)) / D + EPS)
    along_rows = lambda ref, first: lax.broadcast_in_dim(ref[pl.ds(first, w)].astype(jnp.float32), (BLOCK_M, w), [1])

    def normed(x, first):  # rms_norm's roundings: the normed head, then the weight's product
      y = (x * lax.broadcast_in_dim(inv, x.shape, [0])).astype(jnp.bfloat16).astype(jnp.float32)
      return (along_rows(gain_smem, first) * y).astype(jnp.bfloat16).astype(jnp.float32)

    y_lo, y_hi = normed(lo, 0), normed(hi, w)
    q_smem[:, pl.ds(0, w)] = (y_lo * along_rows(cos_smem, 0) + y_hi * along_rows(sin_smem, 0)).astype(jnp.bfloat16)
    q_smem[:, pl.ds(w, w)] = (y_hi * along_rows(cos_smem, w) + y_lo * along_rows(sin_smem, w)).astype(jnp.bfloat16)
    plgpu.commit_smem()
    _scores(q_smem, k_smem, out_smem, out_ref, h)

  scratch = (plgpu.SMEM((splits, 2, BLOCK_M, D), jnp.uint16, transforms=_transforms(jnp.uint16)),
             plgpu.SMEM((D,), jnp.bfloat16), plgpu.SMEM((D,), jnp.float32), plgpu.SMEM((D,), jnp.float32),
             plgpu.Barrier(num_arrivals=splits * 2 * G + 4))
  return _call(rope_prologue_body, scratch, bits, *tables, k, interpret=interpret)


def example(seed: int = 0, splits: int = 2, mp: int = 8):
  """Random inputs at Qwen3-8B's heads: ``(parts, q_norm, k_norm, cos, sin, k)``."""
  rng = np.random.default_rng(seed)
  n = (G * HKV + 2 * HKV) * D
  f32 = rng.normal(size=(splits, mp, n)).astype(np.float32)
  halves = np.stack([(f32.view(np.uint32) >> 16).astype(np.uint16), (f32.view(np.uint32) & 0xFFFF).astype(np.uint16)],
                    axis=1)
  parts = SplitKPartials(lax.bitcast_convert_type(jnp.asarray(halves), jnp.bfloat16), (1, 1), "bfloat16")
  ang = rng.uniform(0, 100, size=(1, 1, D // 2)).astype(np.float32)
  ang = np.concatenate([ang, ang], -1)
  norms = [jnp.asarray(rng.normal(1.0, 0.2, size=(D,)), jnp.bfloat16) for _ in range(2)]
  k = jnp.asarray(rng.normal(size=(HKV, BLOCK_KV, D)), jnp.bfloat16)
  return parts, *norms, jnp.asarray(np.cos(ang)), jnp.asarray(np.sin(ang)), k


def roped_q(parts, q_norm, k_norm, cos, sin) -> jax.Array:
  """The roped query heads ``[1, 1, Hq, D]`` by the jnp reference (what ``plain_q`` reads)."""
  return qk_norm_rope_reference(parts, q_norm, k_norm, cos, sin, num_kv_heads=HKV, eps=EPS)[:, :, :G * HKV]


def reference_scores(q: jax.Array, k: jax.Array) -> np.ndarray:
  """``[HKV, G, BLOCK_KV]``: each KV head's G query heads' scores, which the kernels hold at rows ``g * NODES``
  (their other rows: the node rows past the step's one token, zeros, or the matmul's padding rows in
  ``rope_prologue``)."""
  qh = np.asarray(q[0, 0].astype(jnp.float32)).reshape(HKV, G, D)
  return np.einsum("hgd,hkd->hgk", qh, np.asarray(k.astype(jnp.float32)))


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--iters", type=int, default=15)
  args = ap.parse_args(argv)
  if jax.devices()[0].platform != "gpu":
    raise SystemExit(f"rope_prologue_probe needs a Hopper GPU; this backend is {jax.devices()[0].platform!r}")
  from specpilot.costmodel.cupti import kernel_summary, median_kernel_us

  parts, q_norm, k_norm, cos, sin, k = example()
  q = roped_q(parts, q_norm, k_norm, cos, sin)
  want = reference_scores(q, k)
  programs = {"plain_q": (jax.jit(plain_q), (q, k)),
              "rope_prologue": (jax.jit(rope_prologue), (parts, q_norm, cos, sin, k)),
              "qk_norm_rope": (jax.jit(lambda p, a, b, c, s: qk_norm_rope(p, a, b, c, s, num_kv_heads=HKV, eps=EPS)),
                               (parts, q_norm, k_norm, cos, sin))}
  for name, (program, inputs) in programs.items():
    try:
      got = program(*inputs)
    except Exception as e:  # noqa: BLE001 - report and go on
      print(f"{name}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
      continue
    right = "-" if name == "qk_norm_rope" else bool(np.allclose(np.asarray(got)[:, ::NODES], want, rtol=2e-2, atol=0.2))
    parts_us = median_kernel_us(lambda p=program, a=inputs: p(*a), args.iters)
    print(f"{name}: {sum(parts_us.values()):.2f} us a call, right={right} ({kernel_summary(parts_us)})", flush=True)


if __name__ == "__main__":
  main()
