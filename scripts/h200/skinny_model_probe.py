"""Where the time goes when the model's bf16 linears run ``skinny_matmul``'s kernel: trace, XLA compile and
first call, then the median step, for a Qwen3-8B-shaped target with ``--layers`` layers at T = 1 and 16 tokens,
``skinny_matmul.ops.DEFAULT`` = xla and mosaic_gpu side by side; greedy tokens compared. A hang shows up as a
stack dump (faulthandler) after ``--hang-s`` seconds.

    PYTHONPATH=$PWD python3 scripts/h200/skinny_model_probe.py --layers 4 > $OUT/probe.txt
"""

import argparse
import dataclasses
import faulthandler
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from pallas_kernels.skinny_matmul import ops as skinny_ops
from specpilot.costmodel.measure import model_config
from specpilot.models.kv_cache import KVCache
from specpilot.models.target import forward
from specpilot.models.weights import init_random_target


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--layers", type=int, default=4)
  ap.add_argument("--tokens", type=int, nargs="+", default=[1, 16])
  ap.add_argument("--hang-s", type=float, default=120)
  args = ap.parse_args()
  faulthandler.dump_traceback_later(args.hang_s, exit=True)
  cfg = dataclasses.replace(model_config("qwen3_8b"), num_layers=args.layers)
  w = init_random_target(cfg, 0, jnp.bfloat16)
  shape = (cfg.num_layers, 1, 1152, cfg.num_kv_heads, cfg.head_dim)
  cache = KVCache(k=jax.random.normal(jax.random.key(1), shape, jnp.bfloat16),
                  v=jax.random.normal(jax.random.key(2), shape, jnp.bfloat16), lengths=jnp.full((1,), 1024, jnp.int32))
  print("| matmul | T | Mosaic GPU calls | trace s | compile s | first call s | median ms | argmax |\n"
        "|---|---|---|---|---|---|---|---|", flush=True)
  for t in args.tokens:
    toks = jnp.arange(1, t + 1, dtype=jnp.int32)[None]
    pos = (1024 + jnp.arange(t, dtype=jnp.int32))[None]
    for impl in ("xla", "mosaic_gpu"):
      skinny_ops.DEFAULT = impl
      fn = jax.jit(lambda w, toks, pos, cache: jnp.argmax(forward(w, cfg, toks, pos, cache).logits, -1))
      t0 = time.perf_counter()
      traced = fn.trace(w, toks, pos, cache)
      t1 = time.perf_counter()
      lowered = traced.lower()
      calls = lowered.as_text().count("mosaic_gpu")
      exe = lowered.compile()
      t2 = time.perf_counter()
      out = jax.block_until_ready(exe(w, toks, pos, cache))
      t3 = time.perf_counter()
      ms = []
      for _ in range(20):
        s = time.perf_counter()
        jax.block_until_ready(exe(w, toks, pos, cache))
        ms.append(1e3 * (time.perf_counter() - s))
      print(f"| {impl} | {t} | {calls} | {t1 - t0:.1f} | {t2 - t1:.1f} | {t3 - t2:.1f} | {statistics.median(ms):.3f} | "
            f"{out[0, :4].tolist()} |", flush=True)
  faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
  sys.exit(main())
