"""The MLP's gate|up projection + SwiGLU on the GPU at Qwen3-8B's shape, kernel time by CUPTI: the two-kernel path
(the skinny kernel, then XLA's SwiGLU fusion) against the fused kernel (``pallas_kernels.swiglu_matmul``) in several
pipeline configs, each checked against the jnp reference first. Prints one line per config as it goes.

    PYTHONPATH=$PWD python3 scripts/h200/swiglu_matmul_probe.py --m 1 16 > $OUT/swiglu_probe.txt
"""

import argparse
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import skinny_matmul
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
  args = ap.parse_args()
  if jax.devices()[0].platform != "gpu":
    raise SystemExit(f"swiglu_matmul_probe needs a Hopper GPU; this backend is {jax.devices()[0].platform!r}")
  kw = jax.random.key(0)
  w = (jax.random.normal(kw, (args.k, 2 * args.inter)) / np.sqrt(args.k)).astype(jnp.bfloat16)
  for m in args.m:
    x = jax.random.normal(jax.random.key(m), (m, args.k)).astype(jnp.bfloat16)
    want = np.asarray(swiglu_matmul_reference(x, w), np.float32)
    programs = {"two kernels (skinny + XLA SwiGLU)": jax.jit(lambda a, b: swiglu_reference(
        skinny_matmul.matmul(a, b, implementation="mosaic_gpu", reduce=False)))}
    for tile_k, steps in CONFIGS:
      config = mosaic_gpu.TuningConfig(tile_k=tile_k, max_concurrent_steps=steps)
      programs[f"fused tile_k={tile_k} steps={steps}"] = jax.jit(
          lambda a, b, c=config: mosaic_gpu.swiglu_matmul(a, b, config=c))
    fused_us = {}
    for name, fn in programs.items():
      got = np.asarray(fn(x, w), np.float32)
      err = float(np.max(np.abs(got - want)))
      per_call = []
      for _ in range(args.iters):
        per_call.append(sum(ms for _, ms in kernel_timings(lambda: fn(x, w))) * 1e3)
      us = statistics.median(per_call)
      print(f"M={m} {name}: {us:.1f} us of kernels (min {min(per_call):.1f}), max |err| {err:.3g}", flush=True)
      if name.startswith("fused"):
        fused_us[name] = us
    tile_k, steps = CONFIGS[list(fused_us).index(min(fused_us, key=fused_us.get))]
    print(f"best M={m}: {tile_k} {steps}", flush=True)  # a line scripts can read


if __name__ == "__main__":
  main()
