"""The skinny kernel's K split per decode shape, timed the way a decode step runs it: in a chain.

``auto_split_k`` fills every SM, which is what a matmul timed alone wants; but each split adds an XLA sum kernel
after the matmul, and in a step every matmul waits for the one before. So: for each Qwen3-8B weight shape and each
split, a jitted chain of ``--links`` links (the skinny matmul, then one XLA elementwise kernel that maps its output
back to the next link's input, as rope or silu do in the model), timed by wall clock (median of synchronised
calls). Prints µs per link and writes ``{"KxN": best split}`` as JSON for ``bench_roofline.py --skinny-splits``
(``skinny_matmul.mosaic_gpu.SPLIT_K_BY_SHAPE``).

Caveat, measured (docs/results/2026-12-01-drafter-tree-h200/): its picks on the H200 (qkv 8, o 4, gate/up 1, down 8)
made the decode loop 0.05 ms slower than the auto split; the chain's per-link times were not monotonic in the split
and carried host gaps. Decide with ``bench_roofline.py``'s ``split_decode_loop`` against ``fused_norm_decode_loop``.

    PYTHONPATH=$PWD python3 scripts/h200/split_probe.py --json $OUT/splits.json > $OUT/splits.txt
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
from chain_timing import wall_ms
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.skinny_matmul import mosaic_gpu as skinny
from pallas_kernels.split_k import auto_split_k, num_sms

SHAPES = ("4096x6144", "4096x4096", "4096x24576", "12288x4096")  # Qwen3-8B: qkv, o, gate|up, down


def chain(k: int, n: int, config: skinny.TuningConfig, interpret):
  """x [1, K] -> links of (skinny matmul [K, N], then [1, N] -> [1, K] in one XLA elementwise kernel)."""
  def run(x, ws):
    for w in ws:
      y = skinny.skinny_matmul(x, w, config=config, interpret=interpret).astype(jnp.float32)
      y = y[:, :k] if n >= k else jnp.tile(y, (1, k // n))
      x = (y * jax.lax.rsqrt(jnp.mean(y * y) + 1e-6)).astype(jnp.bfloat16)  # keeps values O(1) along the chain
    return x
  return run


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--shapes", nargs="+", default=list(SHAPES), help="KxN weight shapes")
  ap.add_argument("--splits", nargs="+", type=int, default=[1, 2, 3, 4, 6, 8],
                  help="candidate splits (those that do not divide a shape's K steps are skipped)")
  ap.add_argument("--links", type=int, default=16)
  ap.add_argument("--iters", type=int, default=20)
  ap.add_argument("--json", help="write the best split per shape here")
  ap.add_argument("--interpret", action="store_true", help="Pallas GPU interpret mode (a CPU smoke run)")
  args = ap.parse_args(argv)
  interpret = plgpu.InterpretGPUParams() if args.interpret else None
  base = skinny.DEFAULT_CONFIG
  best = {}
  print("| shape | split | us / link | auto |\n|---|---|---|---|", flush=True)
  for shape in args.shapes:
    k, n = map(int, shape.split("x"))
    k_steps = k // base.tile_k
    auto = auto_split_k(n // skinny.TILE_N, k_steps, num_sms(), base.blocks_per_sm)
    keys = jax.random.split(jax.random.key(k + n), args.links + 1)
    x = jax.random.normal(keys[0], (1, k)).astype(jnp.bfloat16)
    ws = [(jax.random.normal(key, (k, n)) * k ** -0.5).astype(jnp.bfloat16) for key in keys[1:]]
    times = {}
    for split in sorted({s for s in [*args.splits, auto] if k_steps % s == 0}):
      config = dataclasses.replace(base, split_k=split)
      fn = jax.jit(chain(k, n, config, interpret))
      times[split] = wall_ms(fn, (x, ws), args.iters) * 1e3 / args.links
      print(f"| {shape} | {split} | {times[split]:.2f} | {'yes' if split == auto else ''} |", flush=True)
    best[shape] = min(times, key=times.get)
    print(f"| {shape} | best {best[shape]} | {times[best[shape]]:.2f} | auto {auto}: {times[auto]:.2f} |", flush=True)
  if args.json:
    Path(args.json).write_text(json.dumps(best, indent=1) + "\n")
  return best


if __name__ == "__main__":
  main()
