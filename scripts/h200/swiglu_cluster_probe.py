"""Probe: the gate|up projection + SwiGLU with gate and up of one 64-channel block on a cluster of two CTAs (384
blocks, as the skinny kernel's gate|up) against the two-kernel path and the fused kernel of 192 two-tile blocks
(``pallas_kernels.swiglu_matmul``), at Qwen3-8B's shape, CUPTI kernel time, each checked against the jnp reference.
The up CTA leaves its bf16 projection in its shared memory, the gate CTA reads it through distributed shared memory
(``plgpu.cluster_ref``) and writes ``silu(gate) * up``.

    PYTHONPATH=$PWD python3 scripts/h200/swiglu_cluster_probe.py --m 1 16 > $OUT/swiglu_cluster.txt
"""

import argparse
import math
import statistics

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import pdl, skinny_matmul
from pallas_kernels.split_k import exit_wait, round_up, smem_transforms, token_tile
from pallas_kernels.swiglu import swiglu_reference
from pallas_kernels.swiglu_matmul import mosaic_gpu, swiglu_matmul_reference
from pallas_kernels.tma import pad_for_tma
from specpilot.costmodel.cupti import kernel_timings

TILE_N = 64

def _call(x2, w, *, m, tile_m, tile_k, depth, interpret):
  k, n = w.shape
  inter = n // 2
  steps = k // tile_k
  depth = min(depth, steps)
  w_tr = smem_transforms(TILE_N, jnp.bfloat16)
  x_tr = smem_transforms(tile_k, jnp.bfloat16)
  def body(w_gmem, x_gmem, out_gmem, w_smem, x_smem, loaded, stage, out_smem, staged):
    j = lax.axis_index("n")
    c = lax.axis_index("c")  # 0: the gate columns, 1: the up columns of the same channels
    cols = pl.ds(c * inter + j * TILE_N, TILE_N)
    m_slice = pl.ds(lax.axis_index("m") * tile_m, tile_m)
    def load_w(step, slot):
      plgpu.copy_gmem_to_smem(w_gmem.at[pl.ds(step * tile_k, tile_k), cols], w_smem.at[slot], loaded.at[slot])
    def load_x(step, slot):
      plgpu.copy_gmem_to_smem(x_gmem.at[m_slice, pl.ds(step * tile_k, tile_k)], x_smem.at[slot], loaded.at[slot])
    for s in range(depth): load_w(s, s)
    pdl.begin_kernel(interpret)
    for s in range(depth): load_x(s, s)
    def accumulate(acc):
      def step(i, carry):
        slot = lax.rem(i, depth)
        plgpu.barrier_wait(loaded.at[slot])
        plgpu.wgmma(acc, w_smem.at[slot].T, x_smem.at[slot].T)
        plgpu.wgmma_wait(0)
        @pl.when(i + depth < steps)
        def _():
          load_w(i + depth, slot); load_x(i + depth, slot)
        return carry
      lax.fori_loop(0, steps, step, None)
      return acc[...]
    acc = pl.run_scoped(accumulate, plgpu.ACC((TILE_N, tile_m), jnp.float32))
    stage[...] = acc.astype(jnp.bfloat16)
    plgpu.barrier_arrive(staged.at[0])
    plgpu.barrier_wait(staged.at[0])
    @pl.when(c == 0)
    def _epilogue():
      lay = plgpu.Layout.WGMMA
      gate = plgpu.load(stage, layout=lay).astype(jnp.float32)
      up = plgpu.load(plgpu.cluster_ref(stage, {"c": 1}), layout=lay).astype(jnp.float32)
      out_smem.T[...] = (gate / (1.0 + jnp.exp(-gate)) * up).astype(jnp.bfloat16)
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(out_smem, out_gmem.at[m_slice, pl.ds(j * TILE_N, TILE_N)])
    plgpu.barrier_arrive(staged.at[1])  # the up block's stage stays until the gate block has read it
    plgpu.barrier_wait(staged.at[1])
    exit_wait()
  call = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((m, inter), jnp.bfloat16),
      grid=(inter // TILE_N, round_up(m, tile_m) // tile_m), grid_names=("n", "m"),
      cluster=(2,), cluster_names=("c",),
      scratch_types={
        "w_smem": plgpu.SMEM((depth, tile_k, TILE_N), jnp.bfloat16, transforms=w_tr),
        "x_smem": plgpu.SMEM((depth, tile_m, tile_k), jnp.bfloat16, transforms=x_tr),
        "loaded": plgpu.Barrier(num_arrivals=2, num_barriers=depth),
        "stage": plgpu.SMEM((TILE_N, tile_m), jnp.bfloat16),
        "out_smem": plgpu.SMEM((tile_m, TILE_N), jnp.bfloat16, transforms=w_tr),
        "staged": plgpu.ClusterBarrier(collective_axes=("c",), num_barriers=2),
      }, interpret=interpret)
  return call(w, x2)

def clustered(x, w, tile_m=64, tile_k=128, depth=3, interpret=None):
  lead, k = x.shape[:-1], x.shape[-1]
  m = math.prod(lead)
  tm = token_tile(tile_m, m)
  x2 = pad_for_tma(x.reshape(m, k), (8, 64))
  out = _call(x2, w, m=x2.shape[0], tile_m=tm, tile_k=tile_k, depth=depth, interpret=interpret)
  return (out if out.shape[0] == m else out[:m]).reshape(*lead, w.shape[1] // 2)


CLUSTER_CONFIGS = [(128, 4), (128, 3), (64, 6), (256, 2)]


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--m", type=int, nargs="+", default=[1, 16])
  ap.add_argument("--iters", type=int, default=20)
  args = ap.parse_args()
  k, inter = 4096, 12288
  w = (jax.random.normal(jax.random.key(0), (k, 2 * inter)) / np.sqrt(k)).astype(jnp.bfloat16)
  for m in args.m:
    x = jax.random.normal(jax.random.key(m), (m, k)).astype(jnp.bfloat16)
    want = np.asarray(swiglu_matmul_reference(x, w), np.float32)
    programs = {"two kernels": jax.jit(lambda a, b: swiglu_reference(
        skinny_matmul.matmul(a, b, implementation="mosaic_gpu", reduce=False))),
                "fused 192 blocks": jax.jit(lambda a, b: mosaic_gpu.swiglu_matmul(a, b))}
    for tile_k, depth in CLUSTER_CONFIGS:
      programs[f"cluster tile_k={tile_k} depth={depth}"] = jax.jit(
          lambda a, b, t=tile_k, d=depth: clustered(a, b, tile_k=t, depth=d))
    for name, fn in programs.items():
      try:
        got = np.asarray(fn(x, w), np.float32)
      except Exception as e:  # a config that does not compile: say so, go on
        print(f"M={m} {name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
        continue
      err = float(np.max(np.abs(got - want)))
      same = float(np.mean(got == want))
      per_call = [sum(ms for _, ms in kernel_timings(lambda: fn(x, w))) * 1e3 for _ in range(args.iters)]
      print(f"M={m} {name}: {statistics.median(per_call):.2f} us of kernels (min {min(per_call):.2f}), "
            f"max |err| {err:.3g}, equal {same:.4f}", flush=True)


if __name__ == "__main__":
  main()
