"""Draft trees: `best_first` against a plain-Python heap build (DDTree's `build_ddtree_tree`: pop the best
node, push its next sibling and its first child; the budget counts draft nodes only, not the root),
`ancestor_mask` against a Python reference, and `walk` on hand-made trees."""

from __future__ import annotations

import heapq
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specpilot.decoding import tree as trees

# ---- references ------------------------------------------------------------------------------------


def heap_build(logp: np.ndarray, budget: int, depth_limit: int | None = None):
    """DDTree's best-first build. Returns nodes in pop order as (path tuple of tokens, parent index, score);
    index 0 is the root, nodes are 1..n."""
    rows, vocab = logp.shape
    limit = rows if depth_limit is None else min(rows, depth_limit)
    if budget <= 0 or limit <= 0:
        return []
    k = min(budget, vocab)
    order = np.argsort(-logp, axis=-1, kind="stable")[:, :k]
    lp = np.take_along_axis(logp, order, axis=-1).astype(np.float64)
    heap = [(-lp[0, 0], (0,), 0, 1, 0, lp[0, 0])]
    nodes, paths = [], {0: ()}
    while heap and len(nodes) < budget:
        _, ranks, parent, depth, rank, logw = heapq.heappop(heap)
        idx = len(nodes) + 1
        paths[idx] = paths[parent] + (int(order[depth - 1, rank]),)
        nodes.append((paths[idx], parent, logw))
        if rank + 1 < k:
            w = logw - lp[depth - 1, rank] + lp[depth - 1, rank + 1]
            heapq.heappush(heap, (-w, ranks[:-1] + (rank + 1,), parent, depth, rank + 1, w))
        if depth < limit:
            w = logw + lp[depth, 0]
            heapq.heappush(heap, (-w, ranks + (0,), idx, depth + 1, 0, w))
    return nodes


def tree_paths(tree: trees.Tree):
    """Valid nodes of a Tree as (path tuple, parent verify index, score), in node order."""
    tok, par, valid, score = (np.asarray(x) for x in (tree.tokens, tree.parent, tree.valid, tree.score))
    paths, out = {0: ()}, []
    for j in range(len(tok)):
        if not valid[j]:
            continue
        assert par[j] in paths, f"node {j + 1}: parent {par[j]} is not an earlier valid node"
        paths[j + 1] = paths[par[j]] + (int(tok[j]),)
        out.append((paths[j + 1], int(par[j]), float(score[j])))
    return out


def ancestor_reference(parent, valid) -> np.ndarray:
    n = len(parent)
    m = np.eye(n + 1, dtype=bool)
    for i in range(1, n + 1):
        if not valid[i - 1]:
            continue
        j = i
        while j != 0:
            j = int(parent[j - 1])
            m[i, j] = True
    for j in range(1, n + 1):  # no one sees an invalid node but itself
        if not valid[j - 1]:
            m[:, j] = False
            m[j, j] = True
    return m


# ---- best_first vs the heap ------------------------------------------------------------------------

best_first = jax.jit(trees.best_first, static_argnums=1)
ancestor_mask = jax.jit(trees.ancestor_mask, static_argnums=1)
walk = jax.jit(trees.walk, static_argnums=4)


@pytest.mark.parametrize(
    "depth,vocab,budgets",
    [(7, 16, (1, 3, 7, 8, 24, 64)), (3, 5, (2, 6, 20, 200)), (5, 251, (4, 16, 64)), (1, 9, (1, 5, 12))],
)
def test_best_first_matches_heap(depth, vocab, budgets):
    rng = np.random.default_rng(depth * 1000 + vocab)
    for trial in range(3):
        logits = rng.standard_normal((depth, vocab)).astype(np.float32) * rng.uniform(0.5, 4.0)
        logp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits), axis=-1))
        for budget in budgets:
            want = heap_build(logp, budget)
            got = tree_paths(best_first(jnp.asarray(logp), budget))
            assert len(want) == min(budget, sum(min(budget, vocab) ** d for d in range(1, depth + 1)))
            assert {p for p, _, _ in got} == {p for p, _, _ in want}, (depth, vocab, budget, trial)
            # same order too (pop order = score order; random scores have no ties), hence same parents
            assert [p for p, _, _ in got] == [p for p, _, _ in want]
            assert [q for _, q, _ in got] == [q for _, q, _ in want]
            np.testing.assert_allclose([s for *_, s in got], [s for *_, s in want], rtol=1e-5, atol=1e-5)


def test_best_first_depth_limit():
    rng = np.random.default_rng(7)
    logp = np.asarray(jax.nn.log_softmax(jnp.asarray(rng.standard_normal((6, 10)) * 3.0), axis=-1))
    for limit in (1, 2, 4, 6):
        for budget in (5, 30):
            got = tree_paths(best_first(jnp.asarray(logp), budget, jnp.int32(limit)))
            want = heap_build(logp, budget, limit)
            assert [p for p, _, _ in got] == [p for p, _, _ in want], (limit, budget)
            assert max(len(p) for p, _, _ in got) <= limit


def test_best_first_exact_ties():
    """Uniform log-probs: every node of a depth ties; both keep the earlier-ranked (parent-major) ones."""
    logp = np.full((3, 3), np.log(1 / 3), np.float32)
    for budget in (2, 4, 5, 8, 12, 13):
        got = tree_paths(best_first(jnp.asarray(logp), budget))
        want = heap_build(logp, budget)
        assert {p for p, _, _ in got} == {p for p, _, _ in want}, budget


@pytest.mark.parametrize("rank_max", [0, 2048])
@pytest.mark.parametrize("vocab,k,chunk", [(1000, 16, 64), (999, 64, 8), (151, 7, 32), (4096, 256, 8), (50, 8, 4),
                                           (300, 3, 128), (3001, 16, (8, 4)), (999, 5, (4, 3, 2)), (64, 8, (4, 4))])
def test_vocab_top_k_is_lax_top_k_exactly(vocab, k, chunk, rank_max, monkeypatch):
    """Values (bit for bit), indices and tie order on adversarial inputs: a dozen distinct values (ties across and
    inside slices and at the k-th place), zeros of both signs, -inf rows and halves, a ragged last slice, and
    all-equal rows, where every slice's max ties; with one screening level or several (a tuple of widths), the small
    top-k's sorted or counted."""
    monkeypatch.setattr(trees, "RANK_TOP_K_MAX", rank_max)
    rng = np.random.default_rng(vocab + k + sum(np.atleast_1d(chunk)))
    x = np.round(rng.standard_normal((3, 4, vocab)) * 2) / 2
    x[0, 0, :] = -np.inf
    x[1, 2, rng.choice(vocab, vocab // 2, replace=False)] = -np.inf
    x[2, 1, :] = 0.5
    x[0, 1, : vocab // 2] = np.where(rng.random(vocab // 2) < 0.5, -0.0, 0.0)  # -0.0 ranks below +0.0
    x = jnp.asarray(x, jnp.float32)
    want_v, want_i = jax.lax.top_k(x, k)
    got_v, got_i = jax.jit(lambda x: trees.vocab_top_k(x, k, chunk))(x)
    np.testing.assert_array_equal(np.asarray(got_v).view(np.int32), np.asarray(want_v).view(np.int32))
    np.testing.assert_array_equal(np.asarray(got_i), np.asarray(want_i))


def test_best_first_with_the_screened_vocab_top_k_builds_the_same_tree(monkeypatch):
    """Screening at 128-wide slices of a 1,000-token vocabulary (8 slices for a top-64: the k >= slices fallback to
    lax.top_k) and at 8-wide ones (125 slices: the screen runs) builds the same tree."""
    rng = np.random.default_rng(3)
    logp = jax.nn.log_softmax(jnp.asarray(rng.standard_normal((5, 1000)) * 3.0, jnp.float32), axis=-1)
    build = lambda: jax.jit(lambda lp: trees.best_first(lp, 64))(logp)  # noqa: E731  a fresh trace each time
    top_ks = lambda: str(jax.make_jaxpr(lambda lp: trees.best_first(lp, 64))(logp)).count("top_k")  # noqa: E731
    monkeypatch.setattr(trees, "RANK_TOP_K_MAX", 0)  # every top-k a sort, so the screen's own shows in the count
    monkeypatch.setattr(trees, "VOCAB_TOPK_CHUNKS", {64: 128})
    want, direct = build(), top_ks()
    monkeypatch.setattr(trees, "VOCAB_TOPK_CHUNKS", {64: 8})
    got = build()
    assert top_ks() == direct + 1  # the screen really ran: one more top_k (of the slice maxima)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("n,k", [(1, 1), (7, 7), (280, 64), (300, 3), (960, 64)])
def test_rank_top_k_is_lax_top_k_exactly(n, k):
    """The sort-free top-k: values, indices and tie order on rows with many ties (-0.0 beside +0.0 among them),
    -inf runs and all-equal rows."""
    rng = np.random.default_rng(n + k)
    x = np.round(rng.standard_normal((4, n)) * 2) / 2
    x[0, : n // 2] = np.where(rng.random(n // 2) < 0.5, -0.0, 0.0)
    x[1, rng.choice(n, n // 2, replace=False)] = -np.inf
    x[2, :] = -np.inf
    x[3, :] = -1.5
    x = jnp.asarray(x, jnp.float32)
    want_v, want_i = jax.lax.top_k(x, k)
    got_v, got_i = jax.jit(lambda x: trees.rank_top_k(x, k))(x)
    np.testing.assert_array_equal(np.asarray(got_v), np.asarray(want_v))
    np.testing.assert_array_equal(np.asarray(got_i), np.asarray(want_i))
    with pytest.raises(ValueError, match="exceeds the row length"):
        trees.rank_top_k(x, n + 1)
    with pytest.raises(ValueError, match="float rows must be float32"):
        trees.rank_top_k(x.astype(jnp.bfloat16), k)
    bf16 = x.astype(jnp.bfloat16)  # small_top_k sorts what rank_top_k cannot count
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trees, "RANK_TOP_K_MAX", 4096)
        for got, want in zip(trees.small_top_k(bf16, k), jax.lax.top_k(bf16, k)):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("chunks", [None, (4, 4)])
@pytest.mark.parametrize("budget", [5, 64, 128])
def test_best_first_counting_ranks_builds_the_sorted_tree(monkeypatch, budget, chunks):
    """``RANK_TOP_K_MAX`` swaps every small top-k of the build for ``rank_top_k``: the same tree, bit for bit, on
    random log-probs, on ties (log-probs rounded to a few values) and on +0.0 against -0.0; over 300 tokens the
    table's widths take the whole row in one top-k, ``(4, 4)`` screens it in two levels."""
    if chunks is not None:
        monkeypatch.setattr(trees, "VOCAB_TOPK_CHUNKS", {budget: chunks})
    if budget == 128:  # 645 pairs a depth: a rank_top_k a depth, not the chain
        monkeypatch.setattr(trees, "CHAIN_MAX_PAIRS", 644)
    rng = np.random.default_rng(budget)
    raw = rng.standard_normal((2, 6, 300)) * 3.0
    log_softmax = lambda x: jax.nn.log_softmax(jnp.asarray(x, jnp.float32), axis=-1)  # noqa: E731
    signed_zeros = np.array(log_softmax(np.round(raw)))
    signed_zeros[:, :, :4] = [0.0, -0.0, 0.0, -0.0]  # scores that tie at zero, the two signs ranked apart
    # one program a setting (the setting is read at trace time: each traces its own function object), three inputs
    builds = {}
    for rank_max in (0, 4096):
        monkeypatch.setattr(trees, "RANK_TOP_K_MAX", rank_max)
        builds[rank_max] = jax.jit(jax.vmap(lambda lp: trees.best_first(lp, budget, 4))).lower(raw.astype(np.float32))
        builds[rank_max] = builds[rank_max].compile()
    # no sort left, the vocabulary's top-k included; the lowered text, as jnp.sort traces inside a nested jit
    text = jax.jit(lambda lp: trees.best_first(lp, budget)).lower(raw[0].astype(np.float32)).as_text()
    assert not re.search(r"\b(stablehlo|chlo)\.(sort|top_k)\b", text)
    for logp in (log_softmax(raw), log_softmax(np.round(raw)), jnp.asarray(signed_zeros)):
        want, got = builds[0](logp), builds[4096](logp)
        for a, b in zip(got, want):  # bit for bit: scores' -0.0 stays -0.0
            a, b = np.asarray(a), np.asarray(b)
            np.testing.assert_array_equal(*(x.view(np.int32) if x.dtype == np.float32 else x for x in (a, b)))


def test_rank_limit_counts_only_at_the_timed_batches(monkeypatch):
    """Engines count ranks at batch 1 only (the one batch timed); an explicit ``rank_max`` overrides the module's."""
    assert trees.rank_limit(1) == trees.RANK_TOP_K_MAX > 0 and trees.rank_limit(2) == 0
    monkeypatch.setattr(trees, "RANK_TOP_K_MAX_BATCH", 8)
    assert trees.rank_limit(8) == trees.RANK_TOP_K_MAX and trees.rank_limit(9) == 0
    logp = jax.nn.log_softmax(jnp.asarray(np.random.default_rng(0).standard_normal((4, 300)), jnp.float32), axis=-1)
    lowered = {r: jax.jit(lambda lp, r=r: trees.best_first(lp, 64, None, r)).lower(logp).as_text() for r in (0, 4096)}
    sorts = {r: len(re.findall(r"\b(stablehlo|chlo)\.(sort|top_k)\b", text)) for r, text in lowered.items()}
    assert sorts[0] > 0 and sorts[4096] == 0


def test_vocab_topk_chunk_follows_the_measured_table():
    assert trees.vocab_topk_chunk(1) == trees.vocab_topk_chunk(16) == trees.vocab_topk_chunk(64) == (16, 16)
    assert trees.vocab_topk_chunk(65) == trees.vocab_topk_chunk(128) == (16, 16)
    assert trees.vocab_topk_chunk(129) == trees.vocab_topk_chunk(256) == (32, 8)
    assert trees.vocab_topk_chunk(1024) == trees.VOCAB_TOPK_CHUNK_LARGE == 64


# ---- ancestor_mask ---------------------------------------------------------------------------------


def test_ancestor_mask_matches_reference_on_built_trees():
    rng = np.random.default_rng(3)
    for depth, vocab, budget in [(4, 6, 9), (3, 2, 20), (5, 4, 5)]:  # (3, 2, 20): only 14 nodes exist
        logp = jax.nn.log_softmax(jnp.asarray(rng.standard_normal((depth, vocab)) * 2.0), axis=-1)
        t = best_first(logp, budget)
        got = np.asarray(ancestor_mask(t, depth))
        np.testing.assert_array_equal(got, ancestor_reference(np.asarray(t.parent), np.asarray(t.valid)))
        assert np.asarray(t.valid).sum() == min(budget, sum(vocab**d for d in range(1, depth + 1)))


def test_ancestor_mask_hand_made():
    #   root ─ 1 ─ 3 ─ 5          node: 1  2  3  4  5  6(invalid)
    #        └ 2 ─ 4               parent: 0  0  1  2  3  1
    t = trees.Tree(
        tokens=jnp.array([5, 6, 7, 8, 9, 4], jnp.int32),
        depth=jnp.array([1, 1, 2, 2, 3, 2], jnp.int32),
        parent=jnp.array([0, 0, 1, 2, 3, 1], jnp.int32),
        valid=jnp.array([True, True, True, True, True, False]),
        score=jnp.zeros(6, jnp.float32),
    )
    got = np.asarray(ancestor_mask(t, 3))
    want = np.zeros((7, 7), bool)
    for i, anc in {0: [0], 1: [0, 1], 2: [0, 2], 3: [0, 1, 3], 4: [0, 2, 4], 5: [0, 1, 3, 5], 6: [6]}.items():
        want[i, anc] = True
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(want, ancestor_reference(np.asarray(t.parent), np.asarray(t.valid)))


# ---- walk ------------------------------------------------------------------------------------------

HAND = trees.Tree(  # same shape as above; node 6 (token 6, child of node 1) is invalid
    tokens=jnp.array([5, 6, 7, 8, 9, 6], jnp.int32),
    depth=jnp.array([1, 1, 2, 2, 3, 2], jnp.int32),
    parent=jnp.array([0, 0, 1, 2, 3, 1], jnp.int32),
    valid=jnp.array([True, True, True, True, True, False]),
    score=jnp.zeros(6, jnp.float32),
)


@pytest.mark.parametrize(
    "choice,path,tokens",
    [
        # target choice per verify index 0..6 -> accepted verify indices, committed tokens (drafts + bonus)
        ([6, 0, 8, 0, 9, 0, 0], [0, 2, 4], [6, 8, 9]),  # root->2 (6), 2->4 (8); node 4 has no child: bonus 9
        ([5, 7, 0, 9, 0, 3, 0], [0, 1, 3, 5], [5, 7, 9, 3]),  # the full depth-3 path, bonus from node 5
        ([11, 7, 8, 9, 9, 9, 9], [0], [11]),  # the root's choice matches no child: bonus only
        ([5, 6, 0, 0, 0, 0, 0], [0, 1], [5, 6]),  # 6 under node 1 is only an invalid node: stop, bonus 6
    ],
)
def test_walk_hand_made(choice, path, tokens):
    anc = ancestor_mask(HAND, 3)
    w = walk(HAND, jnp.int32(2), jnp.asarray(choice, jnp.int32), anc, 3)
    n = int(w.n_accepted)
    assert n == len(path) - 1
    assert np.asarray(w.path)[: n + 1].tolist() == path
    assert np.asarray(w.new_tokens)[: n + 1].tolist() == tokens
    assert int(w.bonus) == tokens[-1]


def test_walk_chain():
    c = trees.chain(jnp.array([3, 4, 5], jnp.int32))
    anc = ancestor_mask(c, 3)
    w = walk(c, jnp.int32(1), jnp.array([3, 4, 0, 7], jnp.int32), anc, 3)
    assert int(w.n_accepted) == 2
    assert np.asarray(w.path)[:3].tolist() == [0, 1, 2]
    assert np.asarray(w.new_tokens)[:3].tolist() == [3, 4, 0]
