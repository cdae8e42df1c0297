"""Compile and run the W12 kernel once at one shape with Mosaic GPU's dumps on: SASS and ptxas's
register/spill report for reading the decode's instruction count (issue #4).

    MOSAIC_GPU_DUMP_SASS=1 MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_TO=$OUT/sass \\
      PYTHONPATH=$PWD python3 scripts/h200/w12_sass.py --k 12288 --n 4096 --m 1 --decode registers
"""

import argparse
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import w12
from pallas_kernels.w12 import mosaic_gpu


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--k", type=int, default=12288)
  ap.add_argument("--n", type=int, default=4096)
  ap.add_argument("--m", type=int, default=1)
  ap.add_argument("--decode", default="registers")
  ap.add_argument("--tile-k", type=int, default=128)
  args = ap.parse_args()
  rng = np.random.default_rng(0)
  w = (rng.normal(0, 0.02, (args.k, args.n)) * np.exp(rng.uniform(-1.4, 1.4, args.n))).astype(jnp.bfloat16)
  packed = jax.device_put(w12.pack(w))
  x = jnp.asarray(rng.normal(size=(args.m, args.k)), jnp.bfloat16)
  config = w12.TuningConfig(decode=args.decode, tile_k=args.tile_k)
  y = jax.jit(lambda x, p: mosaic_gpu.w12_matmul(x, p, config=config))(x, packed)
  ref = w12.matmul(x, packed, implementation="reference")
  err = float(jnp.abs(y.astype(jnp.float32) - ref.astype(jnp.float32)).max() / jnp.abs(ref.astype(jnp.float32)).max())
  print(dataclasses.asdict(config), "rel err", err, "escapes", packed.num_escapes)


if __name__ == "__main__":
  main()
