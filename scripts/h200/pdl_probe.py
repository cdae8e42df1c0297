"""Does programmatic dependent launch (``pallas_kernels.pdl``) shorten a chain of Mosaic GPU kernels on this GPU?

Three chains of ``--layers`` links, each link reading the previous link's output, jitted, timed by wall clock
(median of synchronised calls: PDL overlaps kernels, which a sum of kernel times cannot show), with ``pdl.ENABLED``
off and on (traces cleared between), outputs checked bit-identical:
- ``skinny``: skinny matmul after skinny matmul (the split-K sum between them is an XLA kernel);
- ``skinny_split1``: the same without split-K (Mosaic GPU -> Mosaic GPU only, half the SMs at 4096 x 4096);
- ``norm+skinny``: the add_rms_norm kernel, then the matmul (the decode step's pattern, both Mosaic GPU);
- ``xla_norm+skinny``: XLA's add + norm, then the matmul (an XLA kernel between: what PDL can do there).

    PYTHONPATH=$PWD python3 scripts/h200/pdl_probe.py > $OUT/pdl.txt
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from chain_timing import wall_ms

from pallas_kernels import pdl
from pallas_kernels.add_rms_norm import mosaic_gpu as norm_mosaic_gpu
from pallas_kernels.add_rms_norm.reference import add_rms_norm_reference
from pallas_kernels.skinny_matmul import mosaic_gpu as skinny_mosaic_gpu

EPS = 1e-6


def chain(kind: str):
  def run(x, ws, norm_w):
    h, delta = x, None
    for w in ws:
      if kind.startswith("skinny"):
        config = skinny_mosaic_gpu.TuningConfig(split_k=1) if kind == "skinny_split1" else None
        h = skinny_mosaic_gpu.skinny_matmul(h, w, config=config)
        continue
      norm = norm_mosaic_gpu.add_rms_norm if kind == "norm+skinny" else add_rms_norm_reference
      h, normed = norm(h, delta, norm_w, EPS)
      delta = skinny_mosaic_gpu.skinny_matmul(normed, w)
    return h if delta is None else h + delta
  return run


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--layers", type=int, default=64)
  ap.add_argument("--hidden", type=int, default=4096)
  ap.add_argument("--iters", type=int, default=30)
  ap.add_argument("--kinds", nargs="+", default=["skinny", "skinny_split1", "norm+skinny", "xla_norm+skinny"])
  args = ap.parse_args()
  keys = jax.random.split(jax.random.key(0), args.layers + 2)
  x = jax.random.normal(keys[0], (1, args.hidden)).astype(jnp.bfloat16)
  ws = [(jax.random.normal(k, (args.hidden, args.hidden)) * args.hidden ** -0.5).astype(jnp.bfloat16)
        for k in keys[1:-1]]
  norm_w = (1 + 0.1 * jax.random.normal(keys[-1], (args.hidden,))).astype(jnp.bfloat16)
  weight_ms = args.layers * args.hidden ** 2 * 2 / 4.3e9
  print(f"{args.layers} links of {args.hidden}x{args.hidden} bf16 (weights {weight_ms:.3f} ms at 4.3 TB/s)")
  print("| chain | kernels | PDL off ms | PDL on ms | saved us / kernel | bit-identical |\n|---|---|---|---|---|---|")
  for kind in args.kinds:
    ms, out = {}, {}
    for on in (False, True):
      pdl.ENABLED = on
      jax.clear_caches()
      fn = jax.jit(chain(kind))
      out[on] = np.asarray(fn(x, ws, norm_w), np.float32)
      ms[on] = wall_ms(fn, (x, ws, norm_w), args.iters)
    kernels = args.layers * (1 if kind.startswith("skinny") else 2)
    same = bool(np.array_equal(out[False], out[True]))
    print(f"| {kind} | {kernels} | {ms[False]:.3f} | {ms[True]:.3f} | {1e3 * (ms[False] - ms[True]) / kernels:.2f} "
          f"| {same} |", flush=True)
  pdl.ENABLED = False


if __name__ == "__main__":
  main()
