"""One W12 matmul on the GPU, taken apart: CUPTI time per kernel of the jitted call (the fused
kernel, and the XLA ops around it: x padding/permutation, split-K sum, escape patch), and, with
MOSAIC_GPU_DUMP_PTXAS=1, ptxas's register and spill report (issue #4; on the H200 on 2026-11-30
MOSAIC_GPU_DUMP_SASS=1 printed no SASS beside it).

    MOSAIC_GPU_DUMP_PTXAS=1 PYTHONPATH=$PWD \\
      python3 scripts/h200/w12_probe.py --k 12288 --n 4096 --m 1 --config decode=registers,blocks_per_sm=4 > $OUT/probe.txt
"""

import argparse
import statistics

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.mosaic.gpu import profiler

from pallas_kernels import w12
from pallas_kernels.config_fields import parse_fields
from pallas_kernels.w12 import mosaic_gpu


def parse_config(text: str) -> w12.TuningConfig:
  try:
    return w12.TuningConfig(**parse_fields(text, w12.TuningConfig))
  except ValueError as e:
    raise SystemExit(f"--config: {e}") from e


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--k", type=int, default=12288)
  ap.add_argument("--n", type=int, default=4096)
  ap.add_argument("--m", type=int, nargs="+", default=[1])
  ap.add_argument("--config", nargs="+", default=["decode=registers"], help="TuningConfig fields, k=v,k=v")
  ap.add_argument("--plain", action="store_true",
                  help="no CUPTI: just run each call a few times (for Nsight Compute, which needs CUPTI itself)")
  args = ap.parse_args()
  rng = np.random.default_rng(0)
  w = (rng.normal(0, 0.02, (args.k, args.n)) * np.exp(rng.uniform(-1.4, 1.4, args.n))).astype(jnp.bfloat16)
  packed = jax.device_put(w12.pack(w))
  print(f"K x N {args.k}x{args.n}, escapes {packed.num_escapes} (one weight copy: partly L2-resident)", flush=True)
  for m in args.m:
    x = jnp.asarray(rng.normal(size=(m, args.k)), jnp.bfloat16)
    ref = w12.matmul(x, packed, implementation="reference").astype(jnp.float32)
    for text in args.config:
      config = parse_config(text)
      fn = jax.jit(lambda x, p, config=config: mosaic_gpu.w12_matmul(x, p, config=config))
      y = fn(x, packed).astype(jnp.float32)
      err = float(jnp.abs(y - ref).max() / jnp.abs(ref).max())
      if args.plain:
        for _ in range(3):
          fn(x, packed).block_until_ready()
        print(f"M={m} {text}: rel err {err:.1e}", flush=True)
        continue
      _, runs = profiler.measure(fn, aggregate=False, iterations=9)(x, packed)
      per_kernel = {}
      for run in runs:
        for i, (name, ms) in enumerate(run):
          per_kernel.setdefault(f"{i}:{name}", []).append(ms * 1e3)
      total = sum(statistics.median(v) for v in per_kernel.values())
      print(f"M={m} {text}: rel err {err:.1e}, device {total:.1f} us = "
            + " + ".join(f"{name[:40]} {statistics.median(v):.1f}" for name, v in per_kernel.items()), flush=True)


if __name__ == "__main__":
  main()
