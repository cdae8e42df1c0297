"""The vocabulary top-k of DDTree's tree build on the GPU: ``jax.lax.top_k`` against the screened
``specpilot.decoding.tree.vocab_top_k`` at each slice width, same inputs, outputs checked equal; CUPTI time per
call (issue #8's tree-build share). ``tree.VOCAB_TOPK_CHUNKS`` is read from this table.

    PYTHONPATH=$PWD python3 scripts/h200/topk_probe.py > $OUT/topk.txt
"""

import argparse
import statistics

import jax
import jax.numpy as jnp
from jax.experimental.mosaic.gpu import profiler

from specpilot.decoding.tree import vocab_top_k


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--vocab", type=int, default=151936)
  ap.add_argument("--depths", type=int, default=15, help="draft depths (DFlash b16: 15)")
  ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
  ap.add_argument("--k", type=int, nargs="+", default=[16, 64, 256], help="tree budgets")
  ap.add_argument("--screen-chunks", type=int, nargs="+", default=[32, 64, 128, 256],
                  help="slice widths of the screened top-k (slice maxima, then k slices' candidates)")
  args = ap.parse_args()
  print("| batch | k | method | device us | equal |\n|---|---|---|---|---|", flush=True)
  for b in args.batch:
    x = jax.nn.log_softmax(jax.random.normal(jax.random.key(b), (b, args.depths, args.vocab)) * 3, axis=-1)
    for k in args.k:
      want = jax.jit(lambda x, k=k: jax.lax.top_k(x, k))(x)
      methods = [("lax.top_k", lambda x, k=k: jax.lax.top_k(x, k))]
      methods += [(f"screened, chunk {c}", lambda x, k=k, c=c: vocab_top_k(x, k, c)) for c in args.screen_chunks]
      for name, method in methods:
        fn = jax.jit(method)
        got = fn(x)
        equal = all(bool(jnp.array_equal(g, w)) for g, w in zip(got, want))
        _, ms = profiler.measure(fn, iterations=10)(x)
        print(f"| {b} | {k} | {name} | {1e3 * statistics.median(ms):.1f} | {equal} |", flush=True)


if __name__ == "__main__":
  main()
