"""DDTree's tree stage on the GPU, kernel by kernel: the drafter rows' log-softmax and ``best_first`` (vmapped over the
batch, as ``SpecEngine._build`` runs it) with its small top-k's sorted (``RANK_TOP_K_MAX = 0``) or counted
(``rank_top_k`` up to each limit), the vocabulary's top-k screened in one level or several (``--chunks``), same
inputs, every tree checked equal to the sorted build (untimed); then the accept on that tree (ancestor mask and
walk, in the verify stage) with the mask's former loop against its unrolled chain. CUPTI time per call, its
launches, and its largest kernels (issue #8's tree + accept + compaction share).

    PYTHONPATH=$PWD python3 scripts/h200/tree_probe.py > $OUT/tree.txt
    PYTHONPATH=$PWD python3 scripts/h200/tree_probe.py --quick   # CPU smoke run: tiny shapes, no timing
"""

import argparse
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from specpilot.argtypes import non_negative_int
from specpilot.decoding import tree as trees


def build_fn(budget: int):
  """The tree stage of one round: [B, D, V] drafter logits (float32) -> the vmapped best-first tree."""
  def build(rows):
    logp = jax.nn.log_softmax(rows, axis=-1)
    return jax.vmap(lambda lp: trees.best_first(lp, budget))(logp)  # RANK_TOP_K_MAX at any batch: the probe's own
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


def materialised(rank_top_k):
  """``rank_top_k`` with its input behind an optimization barrier: XLA computes the row once before the n² count
  instead of (perhaps) fusing the row's producers, gathers included, into every comparison."""
  def rank_top_k_materialised(x, k):
    return rank_top_k(jax.lax.optimization_barrier(x), k)
  return rank_top_k_materialised


def chunk_form(text: str) -> tuple[int, ...] | None:
  """``--chunks`` entries: "table" (``tree.VOCAB_TOPK_CHUNKS`` as it is) or widths joined by commas ("16,16")."""
  if text == "table":
    return None
  try:
    widths = tuple(int(w) for w in text.split(","))
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected 'table' or widths like 16,16, got {text!r}") from None
  if not widths or min(widths) < 1:
    raise argparse.ArgumentTypeError(f"widths must be >= 1, got {text!r}")
  return widths


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--vocab", type=int, default=151936)
  ap.add_argument("--depths", type=int, default=15, help="draft depths (DFlash b16: 15)")
  ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
  ap.add_argument("--budgets", type=int, nargs="+", default=[64, 256])
  ap.add_argument("--rank-max", type=non_negative_int, nargs="+", default=[0, 1024, 4096],
                  help="RANK_TOP_K_MAX values to compare (0: every small top-k sorts)")
  ap.add_argument("--chunks", type=chunk_form, nargs="+", default=[(64,), (16, 16), (32, 8), (8, 8, 8)],
                  help="vocabulary screening forms: 'table' (VOCAB_TOPK_CHUNKS) or slice widths a level, e.g. 16,16 "
                       "(default: one level of 64, the table before 2026-12-06, then the multi-level forms)")
  ap.add_argument("--chain-max-pairs", type=non_negative_int, nargs="+", default=[None],
                  help="CHAIN_MAX_PAIRS values to compare in every counted form (pairs a depth up to which the depths "
                       "run as a chain of order keys; 0: a rank_top_k a depth; default: the module's)")
  ap.add_argument("--barrier", action="store_true",
                  help="also time every counted form with rank_top_k's input materialised (optimization barrier; the "
                       "depth chain's counts, tree.CHAIN_MAX_PAIRS, do not call rank_top_k)")
  ap.add_argument("--iters", type=int, default=10)
  ap.add_argument("--top", type=int, default=6, help="kernels listed per row")
  ap.add_argument("--quick", action="store_true", help="tiny shapes on any backend, trees compared, no timing")
  args = ap.parse_args(argv)
  if args.quick:
    args.vocab, args.depths, args.batch, args.budgets, args.chunks = 300, 4, [2], [5, 64], [None, (4, 4)]
  cupti = None
  if not args.quick:
    from specpilot.costmodel import cupti

  def row(b, budget, form, fn, inputs, want):
    """Run ``fn``, check it against ``want`` (None: it is the baseline), time it, print its row; its output.
    Every tree form is checked against the sorted build (``RANK_TOP_K_MAX = 0``, the table's screening), built
    untimed first, so a run of one form still checks it."""
    got = jax.block_until_ready(fn(*inputs))
    equal = want is None or all(np.array_equal(np.asarray(g), np.asarray(w))
                                for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
    cells = ["–", "–", "–"]
    if cupti is not None:
      parts = cupti.median_kernel_us(lambda: fn(*inputs), args.iters)
      largest = sorted(parts.items(), key=lambda kv: -kv[1])[: args.top]
      cells = [f"{sum(parts.values()):.1f}", str(len(cupti.kernel_timings(lambda: fn(*inputs)))),
               ", ".join(f"{name[:40]} {us:.1f}" for name, us in largest)]
    print(f"| {b} | {budget} | {form} | {cells[0]} | {cells[1]} | {equal} | {cells[2]} |", flush=True)
    if not equal:
      raise SystemExit(f"tree_probe: {form} differs from {'the sorted build' if 'tree' in form else 'the first form'} "
                       f"(batch {b}, budget {budget})")
    return got

  print("| batch | budget | form | GPU us | launches | equal | largest kernels (us) |\n|---|---|---|---|---|---|---|",
        flush=True)
  saved = trees.RANK_TOP_K_MAX, trees.VOCAB_TOPK_CHUNKS, trees.rank_top_k, trees.CHAIN_MAX_PAIRS
  try:
    for b in args.batch:
      # bf16-valued logits, as the drafter's head gives them (cast to float32 by `dflash._block_pass`)
      rows = (jax.random.normal(jax.random.key(b), (b, args.depths, args.vocab)) * 3).astype(jnp.bfloat16)
      rows = rows.astype(jnp.float32)
      for budget in args.budgets:
        trees.RANK_TOP_K_MAX, trees.VOCAB_TOPK_CHUNKS, trees.rank_top_k, trees.CHAIN_MAX_PAIRS = 0, *saved[1:]
        want = jax.block_until_ready(jax.jit(build_fn(budget))(rows))  # untimed: the sorted build every form equals
        for widths in args.chunks:
          trees.VOCAB_TOPK_CHUNKS = saved[1] if widths is None else {budget: widths}
          for limit in args.rank_max:
            chains = args.chain_max_pairs if limit else [None]
            for barrier, chain in itertools.product((False, True) if args.barrier and limit else (False,), chains):
              trees.RANK_TOP_K_MAX = limit
              trees.rank_top_k = materialised(saved[2]) if barrier else saved[2]
              trees.CHAIN_MAX_PAIRS = saved[3] if chain is None else chain
              screen = f"screen widths {trees.vocab_topk_chunk(budget)}"  # (none runs where k >= the slices)
              form = f"tree, {screen}, top-k's " + (f"counted up to {limit}" if limit else "sorted")
              form += ", inputs materialised" if barrier else ""
              form += "" if chain is None else f", chain up to {chain} pairs"
              row(b, budget, form, jax.jit(build_fn(budget)), (rows,), want)  # traced with these settings
        # the accept on that tree: each verify index's target token is the next index's token half the time, else
        # token 0 (some nodes match, so the walk goes a few steps down)
        root = jnp.zeros((b,), jnp.int32)
        full = jnp.concatenate([root[:, None], want.tokens], axis=1)
        choice = jnp.where(jax.random.bernoulli(jax.random.key(budget), 0.5, full.shape), jnp.roll(full, -1, 1), 0)
        base = None
        for form, mask_fn in (("accept, looped mask", looped_ancestor_mask),
                              ("accept, unrolled mask", trees.ancestor_mask)):
          got = row(b, budget, form, jax.jit(accept_fn(mask_fn, args.depths)), (want, root, choice), base)
          base = got if base is None else base
  finally:
    trees.RANK_TOP_K_MAX, trees.VOCAB_TOPK_CHUNKS, trees.rank_top_k, trees.CHAIN_MAX_PAIRS = saved


if __name__ == "__main__":
  main()
