"""DDTree's tree stage on the GPU, kernel by kernel: the drafter rows' log-softmax and ``best_first`` (vmapped over
the batch, as ``SpecEngine._build`` runs it) with its small top-k's sorted (``RANK_TOP_K_MAX = 0``) or counted
(``rank_top_k`` up to each limit), same inputs, trees checked equal to the sorted build; then the accept on that
tree (ancestor mask and walk, in the verify stage) with the mask's former loop against its unrolled chain. CUPTI
time per call, its launches, and its largest kernels (issue #8's tree + accept + compaction share).

    PYTHONPATH=$PWD python3 scripts/h200/tree_probe.py > $OUT/tree.txt
    PYTHONPATH=$PWD python3 scripts/h200/tree_probe.py --quick   # CPU smoke run: tiny shapes, no timing
"""

import argparse
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from specpilot.decoding import tree as trees


def build_fn(budget: int):
  """The tree stage of one round: [B, D, V] drafter logits (float32) -> the vmapped best-first tree."""
  def build(rows):
    logp = jax.nn.log_softmax(rows, axis=-1)
    return jax.vmap(lambda lp: trees.best_first(lp, budget))(logp)
  return build


def looped_ancestor_mask(tree, max_depth: int):
  """``tree.ancestor_mask`` as it was until 2026-12-06 (one ``fori_loop`` step a depth): the accept rows' baseline."""
  n = tree.tokens.shape[0]
  parent_full = jnp.concatenate([jnp.zeros((1,), jnp.int32), tree.parent])
  valid_full = jnp.concatenate([jnp.ones((1,), bool), tree.valid])
  eye = jnp.eye(n + 1, dtype=bool)
  anc = jax.lax.fori_loop(0, max_depth, lambda _, a: eye | a[parent_full], eye)
  return (anc & valid_full[None, :] & valid_full[:, None]) | eye


def accept_fn(mask_fn, depths: int):
  """The accept of one round (in the verify stage): the ancestor mask and the walk, vmapped over the batch."""
  def accept(tree, root, choice):
    anc = jax.vmap(lambda t: mask_fn(t, depths))(tree)
    return anc, jax.vmap(lambda t, r, c, a: trees.walk(t, r, c, a, depths))(tree, root, choice, anc)
  return accept


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--vocab", type=int, default=151936)
  ap.add_argument("--depths", type=int, default=15, help="draft depths (DFlash b16: 15)")
  ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
  ap.add_argument("--budgets", type=int, nargs="+", default=[64, 256])
  ap.add_argument("--rank-max", type=int, nargs="+", default=[0, 1024, 4096],
                  help="RANK_TOP_K_MAX values to compare (0: every small top-k sorts)")
  ap.add_argument("--iters", type=int, default=20)
  ap.add_argument("--top", type=int, default=6, help="kernels listed per row")
  ap.add_argument("--quick", action="store_true", help="tiny shapes on any backend, trees compared, no timing")
  args = ap.parse_args()
  if args.quick:
    args.vocab, args.depths, args.batch, args.budgets = 300, 4, [2], [5, 64]
  timed = not args.quick
  if timed:
    from specpilot.costmodel import cupti
  print("| batch | budget | form | GPU us | launches | equal | largest kernels (us) |\n|---|---|---|---|---|---|---|",
        flush=True)
  default = trees.RANK_TOP_K_MAX
  for b in args.batch:
    # bf16-valued logits, as the drafter's head gives them (cast to float32 by `dflash._block_pass`)
    rows = (jax.random.normal(jax.random.key(b), (b, args.depths, args.vocab)) * 3).astype(jnp.bfloat16)
    rows = rows.astype(jnp.float32)
    for budget in args.budgets:
      want = None
      for limit in args.rank_max:
        trees.RANK_TOP_K_MAX = limit
        fn = jax.jit(build_fn(budget))  # traced with this limit
        got = jax.block_until_ready(fn(rows))
        if want is None:
          want = got
        equal = all(np.array_equal(np.asarray(g), np.asarray(w)) for g, w in zip(got, want))
        cells = ["–", "–", "–"]
        if timed:
          parts = cupti.median_kernel_us(lambda: fn(rows), args.iters)
          launches = len(cupti.kernel_timings(lambda: fn(rows)))
          largest = sorted(parts.items(), key=lambda kv: -kv[1])[: args.top]
          cells = [f"{sum(parts.values()):.1f}", str(launches),
                   ", ".join(f"{name[:40]} {us:.1f}" for name, us in largest)]
        form = f"tree, top-k's counted up to {limit}" if limit else "tree, top-k's sorted"
        print(f"| {b} | {budget} | {form} | {cells[0]} | {cells[1]} | {equal} | {cells[2]} |", flush=True)
        if not equal:
          raise SystemExit(f"tree_probe: RANK_TOP_K_MAX={limit} built a different tree (batch {b}, budget {budget})")
      # the accept on that tree: the target picks each node's own token half the time, else token 0
      tree = want
      root = jnp.zeros((b,), jnp.int32)
      full = jnp.concatenate([root[:, None], tree.tokens], axis=1)
      choice = jnp.where(jax.random.bernoulli(jax.random.key(budget), 0.5, full.shape), jnp.roll(full, -1, 1), 0)
      base = None
      for name, mask_fn in (("accept, looped mask", looped_ancestor_mask), ("accept, unrolled mask",
                                                                            trees.ancestor_mask)):
        fn = jax.jit(accept_fn(mask_fn, args.depths))
        got = jax.block_until_ready(fn(tree, root, choice))
        base = got if base is None else base
        equal = all(np.array_equal(np.asarray(g), np.asarray(w)) for g, w in zip(jax.tree.leaves(got),
                                                                                  jax.tree.leaves(base)))
        cells = ["–", "–", "–"]
        if timed:
          parts = cupti.median_kernel_us(lambda: fn(tree, root, choice), args.iters)
          launches = len(cupti.kernel_timings(lambda: fn(tree, root, choice)))
          largest = sorted(parts.items(), key=lambda kv: -kv[1])[: args.top]
          cells = [f"{sum(parts.values()):.1f}", str(launches),
                   ", ".join(f"{k[:40]} {us:.1f}" for k, us in largest)]
        print(f"| {b} | {budget} | {name} | {cells[0]} | {cells[1]} | {equal} | {cells[2]} |", flush=True)
        if not equal:
          raise SystemExit(f"tree_probe: the unrolled ancestor mask differs from the looped one (batch {b})")
  trees.RANK_TOP_K_MAX = default


if __name__ == "__main__":
  main()
