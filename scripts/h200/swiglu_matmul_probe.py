"""The MLP's gate|up projection + SwiGLU on the GPU at Qwen3-8B's shape, kernel time by CUPTI: the two-kernel path
(the skinny kernel, then XLA's SwiGLU fusion) against the fused kernel (``pallas_kernels.swiglu_matmul``) in several
pipeline configs, each checked against the jnp reference first. Prints one line per config as it goes. With
``--w12``: the same weight packed as W12, the register decode at one split then XLA's SwiGLU (what the models ran
before) against the register decode with the cluster epilogue (``w12.mosaic_gpu.w12_swiglu_matmul``) in several
pipeline configs, and the register decode alone.

    PYTHONPATH=$PWD python3 scripts/h200/swiglu_matmul_probe.py --m 1 16 [--w12] > $OUT/swiglu_probe.txt
"""

import argparse
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import skinny_matmul, swiglu, w12
from pallas_kernels.swiglu import swiglu_reference
from pallas_kernels.swiglu_matmul import mosaic_gpu, swiglu_matmul_reference
from specpilot.costmodel.cupti import kernel_timings

CONFIGS = [(128, 3), (128, 4), (64, 6), (256, 2)]
"""(tile_k, max_concurrent_steps): SMEM a block is steps x (tile_k x 128 + x tile) bytes. The cluster form's first run
(an H100, docs/results/2026-12-06-swiglu-cluster-probe-h100/, from a copy of the kernel in a probe of its own at
``d0d1c9d``) had these four within 0.6 us at M = 1 and 1.9 us at 16."""


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--m", type=int, nargs="+", default=[1, 16])
  ap.add_argument("--k", type=int, default=4096)
  ap.add_argument("--inter", type=int, default=12288)
  ap.add_argument("--iters", type=int, default=20)
  ap.add_argument("--w12", action="store_true", help="W12 weights: the register decode's forms")
  args = ap.parse_args()
  if jax.devices()[0].platform != "gpu":
    raise SystemExit(f"swiglu_matmul_probe needs a Hopper GPU; this backend is {jax.devices()[0].platform!r}")
  kw = jax.random.key(0)
  w = (jax.random.normal(kw, (args.k, 2 * args.inter)) / np.sqrt(args.k)).astype(jnp.bfloat16)
  if args.w12:  # the overflow escapes (past the channel lists, which the fused kernel leaves to XLA) zeroed
    packed = w12.pack(w)
    while packed.escape_index.shape[0]:
      w = w.reshape(-1).at[packed.escape_index].set(0).reshape(w.shape)
      packed = w12.pack(w)
    w = packed
  for m in args.m:
    x = jax.random.normal(jax.random.key(m), (m, args.k)).astype(jnp.bfloat16)
    want = np.asarray(swiglu_matmul_reference(x, w12.unpack(w) if args.w12 else w), np.float32)
    programs = w12_programs() if args.w12 else {"two kernels (skinny + XLA SwiGLU)": jax.jit(lambda a, b: swiglu_reference(
        skinny_matmul.matmul(a, b, implementation="mosaic_gpu", reduce=False)))}
    for tile_k, steps in [] if args.w12 else CONFIGS:
      config = mosaic_gpu.TuningConfig(tile_k=tile_k, max_concurrent_steps=steps)
      programs[f"fused tile_k={tile_k} steps={steps}"] = jax.jit(
          lambda a, b, c=config: mosaic_gpu.swiglu_matmul(a, b, config=c))
    fused_us = {}
    for name, fn in programs.items():
      got = np.asarray(fn(x, w), np.float32)
      # the projection alone has no SwiGLU to check
      err = float(np.max(np.abs(got - want))) if got.shape == want.shape else float("nan")
      per_call = []
      for _ in range(args.iters):
        per_call.append(sum(ms for _, ms in kernel_timings(lambda: fn(x, w))) * 1e3)
      us = statistics.median(per_call)
      print(f"M={m} {name}: {us:.1f} us of kernels (min {min(per_call):.1f}), max |err| {err:.3g}", flush=True)
      if name.startswith("fused"):
        fused_us[name] = us
    if not args.w12:
      tile_k, steps = CONFIGS[list(fused_us).index(min(fused_us, key=fused_us.get))]
      print(f"best M={m}: {tile_k} {steps}", flush=True)  # a line scripts can read


W12_CONFIGS = [(256, 2), (128, 4), (128, 2), (256, 3)]
"""(tile_k, max_concurrent_steps) of the W12 register decode with the cluster epilogue; (256, 2) is
``w12.mosaic_gpu.DEFAULT_CONFIG``'s at one and 16 token rows."""


def w12_programs() -> dict:
  import dataclasses

  from pallas_kernels.w12 import mosaic_gpu as w12_mosaic_gpu

  one = dataclasses.replace(w12_mosaic_gpu.DEFAULT_CONFIG, split_k=1)
  programs = {
      "W12 two kernels (register decode, XLA SwiGLU)": jax.jit(lambda a, b: swiglu.swiglu(
          w12_mosaic_gpu.w12_matmul(a, b, config=one, reduce=False), implementation="xla")),
      "W12 register decode alone": jax.jit(lambda a, b: w12_mosaic_gpu.w12_matmul(a, b, config=one)),
  }
  for tile_k, steps in W12_CONFIGS:
    config = dataclasses.replace(one, tile_k=tile_k, max_concurrent_steps=steps)
    programs[f"fused W12 tile_k={tile_k} steps={steps}"] = jax.jit(
        lambda a, b, c=config: w12_mosaic_gpu.w12_swiglu_matmul(a, b, config=c))
  return programs


if __name__ == "__main__":
  main()
