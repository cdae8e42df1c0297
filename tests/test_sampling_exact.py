"""Sampled speculative decoding is exact: the joint law of the first three generated tokens equals the
target's own (temperature / top-k / top-p applied by `target_probs`), by a chi-square test over 10^4
independent requests (one batch of copies of one prompt; max_new_tokens=3, so the first round's
accepted drafts and bonus make up tokens 2-3). A deliberately biased verifier must fail the same test.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models as tm
from specpilot.decoding import make_engine
from specpilot.decoding import tree as trees
from specpilot.decoding.common import new_cache
from specpilot.decoding.sampling import Sampling, target_probs
from specpilot.decoding.spec import SpecEngine
from specpilot.models.target import forward

VOCAB, BLOCK, BUDGET, CONTEXT = 8, 4, 6, 16
N = 10_000
PROMPT = [1, 2, 3]
NEW = 3


def tiny_pair(vocab: int, block: int):
    cfg = tm.target_config(vocab=vocab, hidden=16, heads=2, kv_heads=1, head_dim=8, intermediate=32)
    return tm.repeat_pair(cfg, block_size=block, embed_scale=0.6, seed=3)


def continuation_logits(pair, prompt: list[int], new: int) -> jax.Array:
    """Target logits [V ** (new - 1), P + new - 1, V] of `prompt` + every continuation of new - 1 tokens (in
    `itertools.product` order): one forward pass."""
    cfg, tw = pair[0], pair[1]
    seqs = np.array([prompt + list(s) for s in itertools.product(range(cfg.vocab_size), repeat=new - 1)], np.int32)
    pos = jnp.broadcast_to(jnp.arange(seqs.shape[1]), seqs.shape)
    return forward(tw, cfg, jnp.asarray(seqs), pos, new_cache(cfg, len(seqs), seqs.shape[1], jnp.float32)).logits


def exact_joint_of(logits, sampling: Sampling, prompt_len: int, new: int) -> np.ndarray:
    """P(t1..t_new) [V] * new under the target's sampling distribution: the product of its distributions along each
    prefix, from `continuation_logits`."""
    v = logits.shape[-1]
    probs = np.asarray(target_probs(logits, sampling), np.float64).reshape((v,) * (new - 1) + (prompt_len + new - 1, v))
    joint = np.ones((v,) * new)
    for k in range(new):  # P(t_{k+1} | t_1..t_k): the sequences whose first k free tokens are t_1..t_k
        pk = probs[(slice(None),) * k + (0,) * (new - 1 - k) + (prompt_len - 1 + k,)]
        joint = joint * pk.reshape(pk.shape + (1,) * (new - 1 - k))
    return joint / joint.sum()


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(VOCAB, BLOCK)


@pytest.fixture(scope="module")
def all_logits(pair):
    return continuation_logits(pair, PROMPT, NEW)


def exact_joint(all_logits, sampling: Sampling) -> np.ndarray:
    """P(t1, t2, t3) [V, V, V] under the target's sampling distribution."""
    return exact_joint_of(all_logits, sampling, len(PROMPT), NEW)


def chi_square_p(samples: np.ndarray, joint: np.ndarray, min_expected: float = 5.0) -> tuple[float, float]:
    """(statistic, p-value) of samples [N, 3] against `joint`; cells expecting < min_expected are pooled.
    A sample in a zero-probability cell gives p = 0."""
    idx = np.ravel_multi_index(samples.T, joint.shape)
    observed = np.bincount(idx, minlength=joint.size).astype(np.float64)
    expected = joint.ravel() * len(samples)
    if np.any(observed[expected == 0] > 0):
        return np.inf, 0.0
    big = expected >= min_expected
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = float(np.sum((obs - exp) ** 2 / exp))
    dof = len(obs) - 1
    return stat, float(jax.scipy.special.gammaincc(dof / 2.0, stat / 2.0))


class GreedyWalkEngine(SpecEngine):
    """Biased on purpose: walks the tree with the target's argmax instead of a sample per node."""

    def _accept(self, key, state, tree, anc, q, logits):
        choice = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return jax.vmap(lambda t, r, c, a: trees.walk(t, r, c, a, self.depth))(tree, state.last, choice, anc)


def sample_engine(eng, seed=0):
    r = tm.generate(eng, [PROMPT] * N, NEW, seed=seed)
    samples = np.array([t[:NEW] for t in r.tokens], np.int64)
    assert samples.shape == (N, NEW)
    first_round = np.array([a[0] for a in r.acceptance_lengths]) if r.acceptance_lengths[0] else np.ones(N)
    return samples, first_round


CASES = {
    "stock_T1": ("stock", Sampling(1.0)),
    "stock_T0.6": ("stock", Sampling(0.6)),
    "ddtree_T1": ("ddtree", Sampling(1.0)),
    "ddtree_T0.6": ("ddtree", Sampling(0.6)),
    "stock_T1_topk2": ("stock", Sampling(1.0, top_k=2)),
    "ddtree_T0.8_topp0.7": ("ddtree", Sampling(0.8, top_p=0.7)),
}


def make(name, sampling, pair):
    cfg = dict(name=name) if name != "ddtree" else dict(name="ddtree", tree_budget=BUDGET)
    return tm.whole_batch(make_engine(cfg, *pair, sampling=sampling, context=CONTEXT))


def test_ar_sampling_matches_exact_joint(pair, all_logits):
    """Checks the harness itself: the AR engine samples from target_probs token by token."""
    s = Sampling(1.0)
    samples, _ = sample_engine(make("ar", s, pair))
    stat, p = chi_square_p(samples, exact_joint(all_logits, s))
    assert p > 1e-3, (stat, p)


@pytest.mark.parametrize("case", list(CASES))
def test_speculative_sampling_is_exact(case, pair, all_logits):
    name, s = CASES[case]
    samples, first_round = sample_engine(make(name, s, pair))
    joint = exact_joint(all_logits, s)
    # the first round must accept drafts often, or this would only test the bonus token
    assert np.mean(first_round >= 2) > 0.1, np.bincount(first_round)
    stat, p = chi_square_p(samples, joint)
    print(f"{case}: chi-square {stat:.1f}, p = {p:.3g}, first round >= 2 tokens: {np.mean(first_round >= 2):.2f}")
    assert p > 1e-3, f"{case}: chi-square {stat:.1f}, p = {p:.2e}"
    if s.top_k or s.top_p < 1.0:
        # support: every sampled prefix stays inside the target's top-k / top-p set at each position
        p1 = joint.sum((1, 2))
        p12 = joint.sum(2)
        assert np.all(p1[samples[:, 0]] > 0)
        assert np.all(p12[samples[:, 0], samples[:, 1]] > 0)
        assert np.all(joint[samples[:, 0], samples[:, 1], samples[:, 2]] > 0)
        # and the truncation is real: some tokens are excluded at the first position
        assert np.sum(p1 > 0) < VOCAB
        if s.top_k:
            assert len(np.unique(samples[:, 0])) <= s.top_k


def test_biased_verifier_fails(pair, all_logits):
    """The same test rejects a verifier that walks the tree with argmax choices at T = 1."""
    s = Sampling(1.0)
    eng = tm.whole_batch(
        GreedyWalkEngine("ddtree", *pair, sampling=s, context=CONTEXT, tree="best_first", tree_budget=BUDGET)
    )
    samples, _ = sample_engine(eng)
    stat, p = chi_square_p(samples, exact_joint(all_logits, s))
    assert p < 1e-6, f"biased verifier passed: chi-square {stat:.1f}, p = {p:.2e}"


# ---- several rounds: after acceptance, KV compaction and the drafter's ingest of the committed tokens -------------

MR_VOCAB, MR_BLOCK, MR_NEW, MR_N = 5, 3, 5, 20_000
MR_PROMPT = [1, 2, 0]
MR_ENGINES = {
    "stock_T1": (dict(name="stock"), Sampling(1.0)),
    "ddtree_T0.7_topk3": (dict(name="ddtree", tree_budget=4), Sampling(0.7, top_k=3)),
    "tlv_T1": (dict(name="tlv", tree_budget=4, level1_format="int8"), Sampling(1.0)),
    "specpilot_T1_topp0.8": (dict(name="specpilot", tree_budget=6, budget_candidates=[2, 6],
                                  verify_cost_ms={1: 1.0, 6: 1.05}), Sampling(1.0, top_p=0.8)),
}


@pytest.fixture(scope="module")
def mr_pair():
    return tiny_pair(MR_VOCAB, MR_BLOCK)


@pytest.fixture(scope="module")
def mr_logits(mr_pair):
    return continuation_logits(mr_pair, MR_PROMPT, MR_NEW)


@pytest.mark.parametrize("case", list(MR_ENGINES))
def test_sampling_is_exact_over_several_rounds(case, mr_pair, mr_logits):
    """The joint law of the first five tokens, which take two to five rounds, equals the target's: rounds after an
    accepted run (KV compaction, the drafter's context) sample exactly too."""
    engine_cfg, s = MR_ENGINES[case]
    eng = tm.whole_batch(make_engine(engine_cfg, *mr_pair, sampling=s, context=32))
    r = tm.generate(eng, [MR_PROMPT] * MR_N, MR_NEW)
    samples = np.array([t[:MR_NEW] for t in r.tokens], np.int64)
    # many requests accept a run of drafts and then go on to another round
    after_accept = np.mean([len(a) >= 2 and a[0] >= 2 for a in r.acceptance_lengths])
    assert after_accept > 0.1, after_accept
    stat, p = chi_square_p(samples, exact_joint_of(mr_logits, s, len(MR_PROMPT), MR_NEW))
    assert p > 1e-3, f"{case}: chi-square {stat:.1f}, p = {p:.2e}"


@pytest.mark.parametrize("case", ["stock_T1", "tlv_T1"])
def test_top_k_1_sampling_is_greedy(case, mr_pair):
    """Sampling at top-k = 1 leaves the target one token of probability 1 and gives every other draft probability
    0: a speculative engine must then commit exactly the greedy tokens."""
    engine_cfg = MR_ENGINES[case][0]  # its sampling replaced by top-k = 1
    prompts = [MR_PROMPT, [4, 3], [0, 0, 1, 2]]
    greedy = make_engine(dict(name="ar"), *mr_pair[:2], context=32).generate(prompts, 12).tokens
    top1 = make_engine(engine_cfg, *mr_pair, sampling=Sampling(1.0, top_k=1), context=32)
    sampled = top1.generate(prompts, 12, seed=7)
    assert sampled.tokens == greedy
