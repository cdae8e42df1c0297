"""Draft trees on device: chain and best-first (DDTree) construction, ancestor masks, the verify walk.

A tree for one request is fixed-size arrays over N draft nodes; verify index 0 is the root (the last
committed token) and node j sits at verify index j + 1:
  tokens [N], depth [N] (1-based), parent [N] (a verify index, 0 = root), valid [N].
Functions here handle one request; engines `jax.vmap` them over the batch.

Best-first without a heap: every depth's top-k list is shared by all parents (one drafter pass), so
the best-first tree of budget N is exactly the N highest-scoring prefixes in the lattice of rank
sequences (a child never outscores its parent, nor a sibling its elder). We find them depth by depth
— the top N children of depth d's survivors — then take the global top N. Ties go to the shallower,
then earlier-ranked node, as the reference heap's tuple order does.

Survivors and ranks both come sorted, so child (i, j) — survivor i, rank j — is outscored or tied, with
a smaller index, by every (i', j') with i' <= i and j' <= j: it can be among the top N only if
(i + 1)(j + 1) <= N. Each depth therefore ranks those ~N ln N pairs (1.6k for N = 256), not all N·K (65k).
"""

from __future__ import annotations

from typing import NamedTuple

import functools

import jax
import jax.numpy as jnp
import numpy as np


class Tree(NamedTuple):
    tokens: jax.Array  # [N] int32
    depth: jax.Array  # [N] int32, 1-based
    parent: jax.Array  # [N] int32 verify index of the parent (0 = root)
    valid: jax.Array  # [N] bool
    score: jax.Array  # [N] float32 log-probability of the path under the drafter


def chain(drafts: jax.Array, logp: jax.Array | None = None) -> Tree:
    """The stock DFlash draft: a single path of the block's drafts."""
    n = drafts.shape[0]
    score = jnp.zeros((n,), jnp.float32) if logp is None else jnp.cumsum(logp)
    return Tree(
        tokens=drafts.astype(jnp.int32),
        depth=jnp.arange(1, n + 1, dtype=jnp.int32),
        parent=jnp.arange(n, dtype=jnp.int32),
        valid=jnp.ones((n,), bool),
        score=score,
    )


@functools.cache
def _undominated_pairs(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(survivor, rank) pairs with (i + 1)(j + 1) <= n, in survivor-major order (the order ties break in)."""
    i, j = np.nonzero(np.arange(1, n + 1)[:, None] * np.arange(1, k + 1)[None, :] <= n)
    return i.astype(np.int32), j.astype(np.int32)


RANK_TOP_K_MAX = 4096
"""``best_first``'s small top-k's (each depth's survivors, the final pick over all depths, the screened vocabulary
top-k's candidates and maxima) count ranks (``rank_top_k``) instead of sorting (``jax.lax.top_k``) where the row is
at most this long; 0: always sort. Both give the same result bit for bit. A bitonic sort of a few hundred elements
runs ~45 dependent compare-exchange rounds (6.6 µs a depth on the H200); a rank count is two reductions with none,
but n² comparisons: counting one screen level's 2,374 maxima and 4,096 candidates a row took 120 µs where their two
sorts took 56. So ``VOCAB_TOPK_CHUNKS`` screens in levels that leave ≤ ~2,000 elements to count. Measured with
``scripts/h200/tree_probe.py`` (docs/results/2026-12-06-tree-probe-h200/; the probe was deleted after ``a1b13e9``,
rerun it from there), the whole tree stage at batch 1, µs,
sorted -> counted up to 4,096:
64 nodes 209.8 -> 133.8 (with ``(16, 16)`` screening; 1,024 gives 133.5), 256 nodes 355.8 -> 208.0 (``(32, 8)``).
On an H100 (docs/results/2026-12-06-tree-probe-small-h100/, (16, 16) screening): 8 nodes 121.1 -> 104.2,
16 nodes 141.9 -> 114.0, 128 nodes 249.0 -> 196.6. Trees of bigger batches sort (``RANK_TOP_K_MAX_BATCH``): their
sorts run side by side at no extra latency, where counting's work grows with B; at batch 8 on that H100, counting
took 471.7 µs where sorting took 274.3 (64 nodes), 774.8 where it took 500.4 (256 nodes)."""
RANK_TOP_K_MAX_BATCH = 1
CHAIN_MAX_PAIRS = 1536
"""``best_first``'s depth chain picks each depth's pairs by place (``_depths_chained``) up to this many (parent,
child-rank) pairs a depth (``_undominated_pairs``: 280 at 64 nodes, 645 at 128, 1,466 at 256, 3,280 at 512), else
a ``rank_top_k`` a depth. The whole tree stage on an H100, µs, a top-k a depth -> the chain
(docs/results/2026-12-06-tree-chain-h100/): 8 nodes 104.2 -> 78.8, 16 nodes 114.0 -> 99.1, 32 nodes 134.2 ->
113.2, 64 nodes 147.4-148.2 -> 135.0, 128 nodes 192.8 -> 175.2, 256 nodes 228.5 -> 215.7. 512 nodes is not timed:
the pick's P² compares grow faster than a top-k's n·P (the chain's first form, floats, lost at 128 nodes). With
``vocab_top_k``'s ties broken by row index as well, 64 nodes took 120.0 (same file)."""


def rank_limit(batch: int) -> int:
    """The ``best_first(..., rank_max=)`` for a batch of ``batch`` trees: ``RANK_TOP_K_MAX`` up to
    ``RANK_TOP_K_MAX_BATCH`` requests, else 0 (sort)."""
    return RANK_TOP_K_MAX if batch <= RANK_TOP_K_MAX_BATCH else 0


def rank_top_k(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """``jax.lax.top_k(x, k)`` over the last axis, exactly (values, indices, ties to the lower index), without a
    sort: slot r takes the element whose ``places`` entry is r. Costs n² comparisons for a row of n: for short
    rows only."""
    n = x.shape[-1]
    if k > n:
        raise ValueError(f"rank_top_k: k = {k} exceeds the row length {n}")
    pos = _at_places(places(x), jnp.arange(n, dtype=jnp.int32), k)
    return jnp.take_along_axis(x, pos, axis=-1), pos


def order_key(x: jax.Array) -> jax.Array:
    """float32 -> int32 keys in ``lax.top_k``'s total order of the floats (-0.0 below +0.0): sign-magnitude to
    two's complement. Its own inverse up to the bitcast (``from_order_key``)."""
    if x.dtype != jnp.float32:
        raise ValueError(f"order_key: float rows must be float32 to count ranks, got {x.dtype}")
    bits = jax.lax.bitcast_convert_type(x, jnp.int32)
    return jnp.where(bits < 0, bits ^ jnp.int32(0x7FFFFFFF), bits)


def from_order_key(key: jax.Array) -> jax.Array:
    """The float32 whose ``order_key`` is ``key``."""
    return jax.lax.bitcast_convert_type(jnp.where(key < 0, key ^ jnp.int32(0x7FFFFFFF), key), jnp.float32)


def places(x: jax.Array, index: jax.Array | None = None) -> jax.Array:
    """[..., n] int32: each element's place in ``lax.top_k``'s order over the last axis (larger first, equal ones
    by index: their position, or ``index`` [..., n], distinct, where given): the number of elements before it in
    that order, a permutation of 0..n-1. Floats (float32 only) compare as their ``order_key``."""
    key = order_key(x) if jnp.issubdtype(x.dtype, jnp.floating) else x
    index = jnp.arange(x.shape[-1], dtype=jnp.int32) if index is None else index
    xi, xj = key[..., :, None], key[..., None, :]
    ahead = (xj > xi) | ((xj == xi) & (index[..., None, :] < index[..., :, None]))  # [..., i, j]: j ranks before i
    return jnp.sum(ahead, axis=-1, dtype=jnp.int32)


def _at_places(place: jax.Array, values: jax.Array, slots: int | np.ndarray) -> jax.Array:
    """[..., len(slots)] integers: entry s holds ``values[..., j]`` for the one j whose ``places`` entry is
    ``slots[s]`` (an int k: places 0..k-1), picked by a sum over zeros (no sort, no scatter)."""
    slots = np.arange(slots, dtype=np.int32) if isinstance(slots, int) else slots
    hit = place[..., None, :] == slots[:, None]  # [..., len(slots), n]
    return jnp.sum(jnp.where(hit, values[..., None, :], 0), axis=-1, dtype=values.dtype)


def small_top_k(x: jax.Array, k: int, rank_max: int | None = None) -> tuple[jax.Array, jax.Array]:
    """``best_first``'s top-k of a short row: ``rank_top_k`` up to ``rank_max`` elements (default
    ``RANK_TOP_K_MAX``; float32 or integer rows), else a sort."""
    rank_max = RANK_TOP_K_MAX if rank_max is None else rank_max
    countable = x.dtype == jnp.float32 or jnp.issubdtype(x.dtype, jnp.integer)
    return rank_top_k(x, k) if countable and x.shape[-1] <= rank_max else jax.lax.top_k(x, k)


VOCAB_TOPK_CHUNKS: dict[int, int | tuple[int, ...]] = {128: (16, 16), 256: (32, 8)}
"""``vocab_top_k``'s slice width (or widths, one a screening level) in ``best_first`` by top-k size: the entry of
the smallest key >= k, and ``VOCAB_TOPK_CHUNK_LARGE`` above the largest key.

The entries are the fastest forms of ``tree_probe.py``'s sweeps (deleted after ``a1b13e9``) with the small top-k's
counted (``RANK_TOP_K_MAX``), the whole tree stage at batch 1, µs:
- 64 and 256 nodes on the H200 (docs/results/2026-12-06-tree-probe-h200/; one level of 64, (16, 16), (32, 8),
  (8, 8, 8)): (16, 16) 133.8 at 64 nodes, (32, 8) 208.0 at 256.
- 8, 16 and 128 nodes on an H100 (docs/results/2026-12-06-tree-probe-small-h100/): (16, 16) took 104.2 where the
  former single-level 128 took 111.8 (8 nodes), 114.0 where 32 took 157.6 (16 nodes), and 196.6 against (8, 8)'s
  197.0 (128 nodes; (32, 8) would count 4,096 candidates a row, the costly kind, above). Not re-timed on an H200:
  the stage is small latency-bound kernels, whose order the two cards have kept in every sweep so far.
Screening at all: ``lax.top_k`` over the 151,936 log-probs of 15 depths took 558 µs at k = 64 on the H200
(``topk_probe.py``, at ``63e1118``; docs/results/2026-12-01-pdl-h200/callB_topk.txt), one screened level 66.
Sorting every small top-k instead (batches above ``RANK_TOP_K_MAX_BATCH``), the single level would still win at 8
nodes (114.9 against 121.1 µs on that H100) and lose at 16 (183.5 against 141.9)."""
VOCAB_TOPK_CHUNK_LARGE = 64


def vocab_topk_chunk(k: int) -> int | tuple[int, ...]:
    """The slice width(s) ``best_first`` screens a top-``k`` over the vocabulary with (``VOCAB_TOPK_CHUNKS``)."""
    return next((chunk for limit, chunk in sorted(VOCAB_TOPK_CHUNKS.items()) if k <= limit), VOCAB_TOPK_CHUNK_LARGE)


def vocab_top_k(x: jax.Array, k: int, chunk: int | tuple[int, ...],
                rank_max: int | None = None) -> tuple[jax.Array, jax.Array]:
    """``jax.lax.top_k(x, k)`` over the last axis, exactly (values, indices and tie order), by screening: the max
    of every ``chunk``-wide slice (one pass over ``x`` at memory speed), the ``k`` slices with the largest maxima
    (ties to the lower slice), then one top-k over those ``k * chunk`` candidates, ties broken by their indices in
    the row (the slices put in index order for a sort; a count compares the indices themselves).

    Why it is exact: take any x outside the chosen slices. Each chosen slice's max ranks before x (its max is
    larger, or equal and in an earlier slice, so at a lower index). That is k elements ranked before x, so x is
    not in the top k. The sorts run over ``V / chunk`` maxima and ``k * chunk`` candidates instead of the whole
    vocabulary row: XLA sorts a whole row for a top-k with k > 16, in many passes over memory. No NaN in ``x``
    (log-probs have none); -inf is fine.

    A tuple of widths screens the maxima the same way, one level a width (``(16, 16)``: 16-wide slices, whose
    maxima are screened in 16-wide slices of maxima): each level is this exact top-k, so the whole is too, and
    every top-k left is over ~``k * width`` elements, short enough to count ranks (``small_top_k``, ``rank_max``).
    """
    rank_max = RANK_TOP_K_MAX if rank_max is None else rank_max
    chunks = (chunk,) if isinstance(chunk, int) else tuple(chunk)
    if not chunks:
        return small_top_k(x, k, rank_max)
    width, inner = chunks[0], chunks[1:]
    vocab = x.shape[-1]
    slices = -(-vocab // width)
    if k >= slices:
        return small_top_k(x, k, rank_max)
    padded = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, slices * width - vocab)], constant_values=-jnp.inf)
    padded = padded.reshape(*x.shape[:-1], slices, width)
    _, chosen = vocab_top_k(padded.max(axis=-1), k, inner, rank_max)
    counted = k * width <= rank_max and x.dtype == jnp.float32  # ties broken by the row's own indices
    if not counted:  # ascending: slice order = index order, so the sorted top-k breaks ties as lax.top_k does
        chosen = -rank_top_k(-chosen, k)[0] if k <= rank_max else jnp.sort(chosen, axis=-1)
    candidates = jnp.take_along_axis(padded, chosen[..., None], axis=-2).reshape(*x.shape[:-1], k * width)
    if counted:
        index = (chosen[..., None] * width + jnp.arange(width, dtype=chosen.dtype)).reshape(candidates.shape)
        place = places(candidates, index)
        return from_order_key(_at_places(place, order_key(candidates), k)), _at_places(place, index, k)
    best, pos = small_top_k(candidates, k, rank_max)
    index = jnp.take_along_axis(chosen, pos // width, axis=-1) * width + pos % width
    return best, index


def best_first(logp: jax.Array, budget: int, depth_limit: jax.Array | int | None = None,
               rank_max: int | None = None) -> Tree:
    """DDTree's best-first tree of `budget` draft nodes from per-depth log-probs `logp` [D, V].

    depth_limit (optional, may be traced): depths beyond it are not expanded. rank_max: the longest top-k row
    counted rather than sorted (``small_top_k``; default ``RANK_TOP_K_MAX``, engines pass ``rank_limit(batch)``).
    """
    d_max, vocab = logp.shape
    n = budget
    k = min(budget, vocab)
    top_lp, top_id = vocab_top_k(logp.astype(jnp.float32), k, vocab_topk_chunk(k), rank_max)  # [D, K], descending
    neg = jnp.float32(-jnp.inf)
    allowed = jnp.ones((d_max,), bool) if depth_limit is None else jnp.arange(d_max) < depth_limit

    def pad(x, fill):
        return jnp.concatenate([x, jnp.full((n - x.shape[0],), fill, x.dtype)]) if x.shape[0] < n else x[:n]

    # depth 1: the best min(n, k) first tokens
    score = pad(jnp.where(allowed[0], top_lp[0], neg), neg)
    rank = pad(jnp.arange(k, dtype=jnp.int32), 0)
    par = jnp.full((n,), -1, jnp.int32)
    survivor, child_rank = _undominated_pairs(n, k)
    rank_max = RANK_TOP_K_MAX if rank_max is None else rank_max
    pairs = survivor.shape[0]
    if d_max == 1:
        best, pos = jnp.zeros((0, n), jnp.float32), jnp.zeros((0, n), jnp.int32)
    elif pairs <= min(rank_max, CHAIN_MAX_PAIRS):
        best, pos = _depths_chained(score, top_lp, allowed, survivor, child_rank, n)
    else:  # depths 2..D: [D - 1, n] each
        top_k = rank_top_k if pairs <= rank_max else jax.lax.top_k
        best, pos = _depths_by_top_k(score, top_lp, allowed, survivor, child_rank, n, top_k)
    all_scores = jnp.concatenate([score[None], best])  # [D, n]
    ranks = jnp.concatenate([rank[None], jnp.asarray(child_rank)[pos]])
    parents = jnp.concatenate([par[None], jnp.asarray(survivor)[pos]])
    chosen_score, sel = small_top_k(all_scores.reshape(-1), n, rank_max)  # depth-major order breaks ties shallow-first
    sel_depth = sel // n
    sel_idx = sel % n
    verify_index = jnp.zeros((d_max, n), jnp.int32).at[sel_depth, sel_idx].set(jnp.arange(1, n + 1, dtype=jnp.int32))
    par_in_prev = parents[sel_depth, sel_idx]
    parent = jnp.where(sel_depth == 0, 0, verify_index[jnp.maximum(sel_depth - 1, 0), jnp.maximum(par_in_prev, 0)])
    tokens = top_id[sel_depth, ranks[sel_depth, sel_idx]]
    valid = chosen_score > neg
    return Tree(
        tokens=tokens.astype(jnp.int32),
        depth=(sel_depth + 1).astype(jnp.int32),
        parent=jnp.where(valid, parent, 0).astype(jnp.int32),
        valid=valid,
        score=jnp.where(valid, chosen_score, neg),
    )


def _depths_by_top_k(score, top_lp, allowed, survivor, child_rank, n, top_k):
    """``best_first``'s depths 2..D with a ``top_k`` (``lax.top_k`` or ``rank_top_k``) a depth: each depth's n
    best (parent, child-rank) pairs, given the previous depth's n best scores in order. ([D - 1, n] scores,
    [D - 1, n] indices into the pairs.)"""
    bests, poss = [], []
    for d in range(1, top_lp.shape[0]):
        cand = score[survivor] + top_lp[d][child_rank]  # parent-major, then rank
        best, pos = top_k(cand, n)
        score = jnp.where(allowed[d], best, -jnp.inf)
        bests.append(score)
        poss.append(pos)
    return jnp.stack(bests), jnp.stack(poss)


def _depths_chained(score, top_lp, allowed, survivor, child_rank, n):
    """``_depths_by_top_k`` with ``rank_top_k``, bit for bit, in three launches a depth where that takes four
    (the deleted ``tree_probe.py``'s HLO dump, docs/results/2026-12-06-tree-chain-h100/): the pairs' places
    (``places``), the next depth's pairs picked by place straight from this depth's (P² compares for P pairs,
    where a top-k's values and indices take n·P and a gather and a sum after them), and a small kernel turning
    the pick back into floats, adding the next log-probs and taking their keys. The chain carries ``order_key``s,
    so each place count reads plain integers (XLA then fuses its compares into the reduction instead of writing
    them out). Each depth's n best and their indices are picked once, for all depths together, after the chain."""
    keys, place = [order_key(score[survivor] + top_lp[1][child_rank])], []
    for d in range(1, top_lp.shape[0]):
        place.append(places(keys[-1]))
        if d + 1 < top_lp.shape[0]:  # pair p's parent is depth d's survivor[p]-th best
            parent = from_order_key(_at_places(place[-1], keys[-1], survivor))
            keys.append(order_key(jnp.where(allowed[d], parent, -jnp.inf) + top_lp[d + 1][child_rank]))
    keys, place = jnp.stack(keys), jnp.stack(place)
    best = jnp.where(allowed[1:, None], from_order_key(_at_places(place, keys, n)), -jnp.inf)
    return best, _at_places(place, jnp.broadcast_to(jnp.arange(keys.shape[1], dtype=jnp.int32), keys.shape), n)


def ancestor_mask(tree: Tree, max_depth: int) -> jax.Array:
    """[N+1, N+1] bool: row i sees verify index j iff j is i's ancestor or i itself. Invalid nodes see
    only themselves and no one sees them. `max_depth` parent steps suffice (depth ≤ block − 1), unrolled: a
    chain of row gathers XLA may fuse, where a ``fori_loop`` launches at least a kernel a step (the two forms are
    timed against each other by ``tree_probe.py``, deleted after ``a1b13e9``)."""
    n = tree.tokens.shape[0]
    parent_full = jnp.concatenate([jnp.zeros((1,), jnp.int32), tree.parent])
    valid_full = jnp.concatenate([jnp.ones((1,), bool), tree.valid])
    eye = jnp.eye(n + 1, dtype=bool)
    anc = eye
    for _ in range(max_depth):
        anc = eye | anc[parent_full]
    return (anc & valid_full[None, :] & valid_full[:, None]) | eye


class Walk(NamedTuple):
    n_accepted: jax.Array  # number of accepted draft nodes (the round commits n_accepted + 1 tokens)
    path: jax.Array  # [D + 1] verify indices of root, accepted nodes by depth (rest: 0)
    new_tokens: jax.Array  # [D + 1] committed tokens: accepted drafts then the bonus token
    bonus: jax.Array


def walk(tree: Tree, root_token: jax.Array, target_choice: jax.Array, anc: jax.Array, max_depth: int) -> Walk:
    """Follow the target: from the root, step to the child whose token the target chose at the current
    node, until none matches. `target_choice` [N+1] is the target's token at each verify index (argmax
    when greedy, one independent sample per node otherwise — DDTree's exact sampling rule)."""
    tokens_full = jnp.concatenate([root_token[None].astype(jnp.int32), tree.tokens])
    match = tree.valid & (tree.tokens == target_choice[tree.parent])
    match_full = jnp.concatenate([jnp.ones((1,), bool), match])
    accepted = jnp.all(~anc | match_full[None, :], axis=1)  # every ancestor-or-self matched
    accepted_nodes = accepted[1:]
    n_acc = jnp.sum(accepted_nodes).astype(jnp.int32)
    depth_full = jnp.concatenate([jnp.zeros((1,), jnp.int32), tree.depth])
    path = jnp.zeros((max_depth + 1,), jnp.int32).at[jnp.where(accepted, depth_full, max_depth + 1)].set(
        jnp.arange(tokens_full.shape[0], dtype=jnp.int32), mode="drop"
    )
    bonus = target_choice[path[n_acc]]
    i = jnp.arange(max_depth + 1)
    drafted = tokens_full[path[jnp.minimum(i + 1, max_depth)]]
    new_tokens = jnp.where(i < n_acc, drafted, bonus).astype(jnp.int32)
    return Walk(n_accepted=n_acc, path=path, new_tokens=new_tokens, bonus=bonus)
