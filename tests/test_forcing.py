"""Token forcing passes honest engines and flags planted cheats (so the gate can fail)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from specpilot.decoding import make_engine
from specpilot.decoding.spec import SpecEngine, quantize_target
from specpilot.decoding.tree import Walk
from specpilot.forcing import force, target_margin_fn
from specpilot.models.config import DrafterConfig, ModelConfig
from specpilot.models.target import forward
from specpilot.models.weights import init_random_drafter, init_random_target

VOCAB = 16
MAX_NEW = 24
CONTEXT = 96


@pytest.fixture(scope="module")
def pair():
    cfg = ModelConfig(family="qwen3", vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=CONTEXT)
    w = init_random_target(cfg, seed=3, dtype=jnp.float32)
    w = dataclasses.replace(w, lm_head=w.lm_head * 4.0)  # decisive logits: honest margins are far above ties
    dcfg = DrafterConfig(layers=cfg.replace(num_layers=1), block_size=5, mask_token_id=VOCAB - 1,
                         target_layer_ids=(0, 1), num_target_layers=2)
    dw = init_random_drafter(dcfg, seed=4, dtype=jnp.float32)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, VOCAB - 1, size=int(rng.integers(3, 9))).tolist() for _ in range(6)]
    ref = make_engine({"name": "ar"}, cfg, w, context=CONTEXT).generate(prompts, MAX_NEW).tokens
    return cfg, w, dcfg, dw, prompts, ref


def run_force(engine, pair, **kw):
    cfg, w, _, _, prompts, ref = pair
    return force(engine, ref, prompts, target_margin_fn(w, cfg), reference_name="ar", **kw)


@pytest.mark.parametrize("spec", [
    {"name": "stock"},
    {"name": "ddtree", "tree_budget": 12},
    {"name": "tlv", "tree_budget": 12, "level1_format": "fp8"},
])
def test_honest_engines_pass(pair, spec):
    cfg, w, dcfg, dw, prompts, ref = pair
    report = run_force(make_engine(spec, cfg, w, dcfg, dw, context=CONTEXT), pair)
    assert report.passed, report.to_json()
    assert report.positions_checked == sum(len(r) for r in ref)


class SkipVerification(SpecEngine):
    """Commits every draft without looking at the target."""

    def _accept(self, key, state, tree, anc, q, logits):
        w = super()._accept(key, state, tree, anc, q, logits)
        d = self.depth
        new = jnp.concatenate([tree.tokens, w.new_tokens[:, -1:]], axis=1)
        return Walk(n_accepted=jnp.full_like(w.n_accepted, d), path=jnp.broadcast_to(jnp.arange(d + 1), w.path.shape),
                    new_tokens=new, bonus=w.bonus)


class DraftOnMismatch(SpecEngine):
    """At the first mismatch, commits the drafter's token instead of the target's."""

    def _accept(self, key, state, tree, anc, q, logits):
        w = super()._accept(key, state, tree, anc, q, logits)
        drafted = jnp.concatenate([tree.tokens, tree.tokens[:, -1:]], axis=1)
        at = jnp.arange(self.depth + 1)[None, :] == w.n_accepted[:, None]
        mismatch = (w.n_accepted < self.depth)[:, None]
        return w._replace(new_tokens=jnp.where(at & mismatch, drafted, w.new_tokens))


class SiblingVisible(SpecEngine):
    """Tree verify whose mask lets every node see all nodes up to its own depth (siblings too)."""

    def _verify(self, weights, last, tree, cache, defer_kv_write=False):
        out, anc = super()._verify(weights, last, tree, cache, defer_kv_write)
        depth = jnp.concatenate([jnp.zeros_like(tree.depth[:, :1]), tree.depth], axis=1)
        leaky = depth[:, None, :] <= depth[:, :, None]
        toks = jnp.concatenate([last[:, None], tree.tokens], axis=1)
        out = forward(weights, self.cfg, toks, cache.lengths[:, None] + depth, cache, leaky, self.dcfg.target_layer_ids,
                      attention=self.attention, defer_kv_write=defer_kv_write)
        return out, anc


_CHEATS = {}


def cheat(kind, pair):
    """One engine per cheat for the whole module (each compiles once)."""
    if kind not in _CHEATS:
        _CHEATS[kind] = _make_cheat(kind, pair)
    return _CHEATS[kind]


def _make_cheat(kind, pair):
    cfg, w, dcfg, dw, _, _ = pair
    if kind == "skip_verification":
        return SkipVerification("cheat", cfg, w, dcfg, dw, context=CONTEXT)
    if kind == "draft_on_mismatch":
        return DraftOnMismatch("cheat", cfg, w, dcfg, dw, context=CONTEXT)
    if kind == "lossy_weights_declared_exact":
        return SpecEngine("cheat", cfg, quantize_target(w, "fp8"), dcfg, dw, context=CONTEXT, tree="best_first",
                          tree_budget=12)
    if kind == "sibling_visible_mask":
        return SiblingVisible("cheat", cfg, w, dcfg, dw, context=CONTEXT, tree="best_first", tree_budget=12)
    raise ValueError(kind)


@pytest.mark.parametrize(
    "kind", ["skip_verification", "draft_on_mismatch", "lossy_weights_declared_exact", "sibling_visible_mask"]
)
def test_planted_cheats_are_flagged(pair, kind):
    report = run_force(cheat(kind, pair), pair, max_restarts=1)
    assert not report.passed
    assert report.violations, f"{kind}: no violation found: {report.to_json()}"
    v = report.violations[0]
    assert v["margin"] >= report.tie_tolerance and v["expected"] != v["got"]


def test_margins_of_padded_batches_equal_each_sequence_alone(pair):
    """`top2_margins` pads rows and length up to powers of two: each sequence's margin is the one its own forward
    gives, unpadded and alone (three rows → four, lengths 3-11 → 16)."""
    from specpilot.decoding.common import new_cache
    from specpilot.forcing import top2_margins

    cfg, w, *_ = pair
    seqs = [[1, 2, 3], list(range(11)), [5, 4, 3, 2, 1, 0, 7]]
    alone = []
    for seq in seqs:
        tokens = jnp.asarray([seq])
        logits = forward(w, cfg, tokens, jnp.arange(len(seq))[None], new_cache(cfg, 1, len(seq), w.embed.dtype)).logits
        top = np.sort(np.asarray(logits[0, -1]))[::-1]
        alone.append(top[0] - top[1])
    np.testing.assert_allclose(top2_margins(w, cfg, seqs), alone, rtol=1e-5, atol=1e-5)


def test_ties_are_not_violations(pair):
    """A mismatch at a position where the target's top-2 margin is below tolerance is a tie."""
    cfg, w, dcfg, dw, prompts, ref = pair
    report = force(cheat("draft_on_mismatch", pair), ref, prompts, target_margin_fn(w, cfg), tie_tolerance=1e9,
                   max_restarts=1)
    assert report.ties and not report.violations


def test_fake_engine_forcing():
    """The scripted engine continues any reference prefix exactly; its corrupting twin is flagged."""
    from specpilot.decoding.fake import FakeEngine

    prompts = [[1, 2, 3], [4, 5]]
    ref = FakeEngine().generate(prompts, 20).tokens
    always_decisive = lambda seqs: np.ones(len(seqs))  # noqa: E731
    assert force(FakeEngine(acceptance=(2, 3)), ref, prompts, always_decisive).passed
    report = force(FakeEngine(corrupt_every=5), ref, prompts, always_decisive, max_restarts=8)
    assert not report.passed and len(report.violations) >= 4
    assert all(v["expected"] != v["got"] for v in report.violations)


def test_decoding_past_the_references_eos_is_a_violation(pair):
    """A candidate that matches the reference up to its EOS and then goes on decoding fails; one that stops passes."""
    cfg, w, _, _, prompts, ref = pair
    eos = next(t for t in ref[0][2:] if all(t not in r for r in ref[1:3]))  # ends prompt 0 early, not 1 or 2
    eos_cfg = cfg.replace(eos_token_ids=(eos,))
    stopping = make_engine({"name": "ar"}, eos_cfg, w, context=CONTEXT)
    eos_ref = stopping.generate(prompts[:3], MAX_NEW).tokens
    assert len(eos_ref[0]) < MAX_NEW and eos_ref[0][-1] == eos
    margins = target_margin_fn(w, cfg)
    assert force(stopping, eos_ref, prompts[:3], margins, max_new_tokens=MAX_NEW).passed
    ignores_eos = make_engine({"name": "ar"}, cfg, w, context=CONTEXT)
    report = force(ignores_eos, eos_ref, prompts[:3], margins, max_new_tokens=MAX_NEW)
    assert not report.passed
    assert [(v["prompt"], v["position"], v["expected"]) for v in report.violations] == [(0, len(eos_ref[0]), None)]
    alone = force(ignores_eos, eos_ref[:1], prompts[:1], margins, max_new_tokens=MAX_NEW)  # the batch's longest
    assert [(v["prompt"], v["position"]) for v in alone.violations] == [(0, len(eos_ref[0]))]
