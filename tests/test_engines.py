"""Greedy speculative engines are lossless: stock, ddtree, specpilot and tlv commit exactly the AR
target's tokens, batched (ragged prompts) or not, with or without EOS, for tree budgets below the
block's depth and above the vocabulary.

Models: `models.repeat_pair` (tiny float32 target over 16 tokens that mostly repeats its last token and
switches depending on context; a drafter built from the target's embedding that drafts "repeat"), so
rounds often commit several tokens and often reject. Engines compile once per module (see
`models.generate`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models as tm
from specpilot.decoding import make_engine

VOCAB, BLOCK, MAX_NEW, CONTEXT = 16, 8, 64, 100
MASK = VOCAB - 1
N_PROMPTS, BATCH = 20, 4
SINGLE = (0, 7)  # prompts also run alone: both have 3 tokens, padded to 9 in their batches

SPEC_ENGINES = {
    "stock": dict(name="stock"),
    "ddtree_budget24_gt_vocab": dict(name="ddtree", tree_budget=24),
    "specpilot": dict(name="specpilot", tree_budget=24, budget_candidates=[4, 24],
                      verify_cost_ms={1: 1.0, 24: 1.6}, draft_cost_ms=0.5),
    "tlv_int8_budget5_lt_depth": dict(name="tlv", tree_budget=5, level1_format="int8"),
}
# EOS handling is the shared `commit`; two spec engines suffice (one also covers a tree budget below
# the block's depth).
EOS_ENGINES = {
    "stock": dict(name="stock"),
    "ddtree_budget3_lt_depth": dict(name="ddtree", tree_budget=3),
}


@pytest.fixture(scope="module")
def pair():
    return tm.repeat_pair(tm.target_config(vocab=VOCAB), block_size=BLOCK, embed_scale=0.6, seed=0)


@pytest.fixture(scope="module")
def prompts():
    ps = tm.prompts(N_PROMPTS, VOCAB, lengths=(3, 9, 6, 3), seed=1, exclude=(MASK,))
    assert all(len(ps[i]) == 3 for i in SINGLE)  # every batch of 4 pads to 9: one compile per engine
    return ps


# Batches of 4 drop finished requests (4 -> 2 rows) in these (engine, with EOS) runs; the others keep
# whole batches, saving a loop compile each (the row shuffling is engine-independent code).
SHRINKING = {("ar", False), ("stock", False), ("ddtree_budget24_gt_vocab", False), ("ddtree_budget3_lt_depth", True)}
_engines: dict = {}


def engine(name: str, engine_cfg: dict, cfg, pair):
    key = (name, cfg.eos_token_ids)
    if key not in _engines:
        _, tw, dcfg, dw = pair
        eng = make_engine(engine_cfg, cfg, tw, dcfg, dw, context=CONTEXT)
        assert eng.shrink_from <= BATCH
        _engines[key] = eng if (name, bool(cfg.eos_token_ids)) in SHRINKING else tm.whole_batch(eng)
    return _engines[key]


def run_batched(eng, prompts):
    tokens, acc, stats = [], [], []
    for i in range(0, len(prompts), BATCH):
        r = tm.generate(eng, prompts[i : i + BATCH], MAX_NEW, seed=0)
        tokens += r.tokens
        acc += r.acceptance_lengths
        stats.append(r.stats)
    return tokens, acc, stats


@pytest.fixture(scope="module")
def ar_tokens(pair, prompts):
    cfg = pair[0]
    tokens, _, _ = run_batched(engine("ar", dict(name="ar"), cfg, pair), prompts)
    assert all(len(t) == MAX_NEW for t in tokens)
    # the workload is not degenerate: prompts differ in output, and outputs are not one repeated token
    assert len({tuple(t) for t in tokens}) >= N_PROMPTS - 3
    assert sum(len(set(t)) > 2 for t in tokens) >= N_PROMPTS // 2
    return tokens


@pytest.fixture(scope="module")
def spec_batched(pair, prompts):
    cfg = pair[0]
    return {n: run_batched(engine(n, c, cfg, pair), prompts) for n, c in SPEC_ENGINES.items()}


def test_ar_batch1_equals_batched(pair, prompts, ar_tokens):
    eng = engine("ar", dict(name="ar"), pair[0], pair)
    for i in SINGLE:
        assert tm.generate(eng, [prompts[i]], MAX_NEW).tokens[0] == ar_tokens[i]


@pytest.mark.parametrize("name", list(SPEC_ENGINES))
def test_greedy_batched_equals_ar(name, spec_batched, ar_tokens):
    tokens, acc, _ = spec_batched[name]
    for i, (got, want) in enumerate(zip(tokens, ar_tokens)):
        assert got == want, f"{name}: prompt {i} diverges from AR at token {_first_diff(got, want)}"
    for i, a in enumerate(acc):
        assert sum(a) >= MAX_NEW - 1 and all(1 <= x <= BLOCK for x in a), (name, i, a)
    hist = np.bincount(np.concatenate(acc), minlength=BLOCK + 1)[1:]
    # rounds that accept >= 2 drafts exercise acceptance + KV compaction; rejections must happen too
    assert hist[2:].sum() >= 20 and hist[:-1].sum() >= 20, f"{name}: committed-per-round histogram {hist.tolist()}"


@pytest.mark.parametrize("name", list(SPEC_ENGINES))
def test_greedy_batch1_equals_batched(name, pair, prompts, spec_batched, ar_tokens):
    """Each request alone gives the same tokens (and, except specpilot whose budget is chosen for the
    whole batch, the same per-round counts) as inside a ragged batch of 4."""
    eng = engine(name, SPEC_ENGINES[name], pair[0], pair)
    tokens, acc, _ = spec_batched[name]
    for i in SINGLE:
        r = tm.generate(eng, [prompts[i]], MAX_NEW)
        assert r.tokens[0] == ar_tokens[i] == tokens[i]
        if SPEC_ENGINES[name]["name"] != "specpilot":
            assert r.acceptance_lengths[0] == acc[i]


def test_tree_engines_build_real_trees(spec_batched):
    """The tree engines verify trees of the configured size (not chains), and specpilot picks sizes."""
    nodes = {n: np.mean([s["mean_tree_nodes"] for s in spec_batched[n][2]]) for n in SPEC_ENGINES}
    assert nodes["stock"] == BLOCK - 1
    assert nodes["ddtree_budget24_gt_vocab"] == 24
    assert 4 <= nodes["specpilot"] <= 24
    assert 1 <= nodes["tlv_int8_budget5_lt_depth"] <= BLOCK - 1  # level 2 verifies the chosen chain


# ---- EOS ------------------------------------------------------------------------------------------


def _first_diff(a, b):
    return next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _cut_at(tokens, eos):
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


@pytest.fixture(scope="module")
def eos_setup(pair, ar_tokens):
    """An EOS id that ends most outputs midway while some requests never emit it."""
    def score(t):
        firsts = [toks.index(t) for toks in ar_tokens if t in toks]
        return sum(0 < f < MAX_NEW - 1 for f in firsts), len(firsts) < len(ar_tokens)

    eos = max((t for t in range(VOCAB - 1) if score(t)[1]), key=lambda t: score(t)[0])
    assert score(eos)[0] >= 5, "no token stops enough outputs midway; change the seeds"
    cfg = pair[0].replace(eos_token_ids=(eos,))
    return eos, cfg, [_cut_at(t, eos) for t in ar_tokens]


@pytest.fixture(scope="module")
def eos_runs(pair, prompts, eos_setup):
    _, cfg, _ = eos_setup
    runs = {"ar": run_batched(engine("ar", dict(name="ar"), cfg, pair), prompts)}
    for name, c in EOS_ENGINES.items():
        runs[name] = run_batched(engine(name, c, cfg, pair), prompts)
    return runs


@pytest.mark.parametrize("name", ["ar", *EOS_ENGINES])
def test_greedy_eos_matches_ar(name, eos_runs, eos_setup):
    eos, _, want = eos_setup
    assert any(len(t) < MAX_NEW for t in want) and any(len(t) == MAX_NEW for t in want)
    tokens, acc, _ = eos_runs[name]
    for i, (got, w) in enumerate(zip(tokens, want)):
        assert got == w, f"{name}: prompt {i} (eos {eos}) diverges at token {_first_diff(got, w)}: {got} vs {w}"
        assert sum(acc[i]) >= len(w) - 1


def test_no_round_after_eos(eos_runs, eos_setup):
    """Like the reference loops, a request stops after the round that commits its EOS: every round but
    the last leaves the output short of its final length."""
    _, _, want = eos_setup
    extra = {}
    for name, (tokens, acc, _) in eos_runs.items():
        extra[name] = [i for i, (w, a) in enumerate(zip(want, acc)) if len(a) > 1 and sum(a[:-1]) >= len(w) - 1]
    assert not any(extra.values()), f"requests that ran a round after finishing: {extra}"


def test_a_request_the_prefill_finishes_runs_no_round(pair, prompts, ar_tokens):
    """The prefill's token can finish a request (max_new_tokens = 1, or it is an EOS): no round runs or is counted
    for it, while a request beside it in the batch runs as before."""
    i = next(j for j in range(1, N_PROMPTS) if ar_tokens[0][0] not in ar_tokens[j])  # never emits prompt 0's first
    for name in ("ar", "stock"):
        eng = engine(name, dict(name=name), pair[0], pair)
        r = tm.generate(eng, [prompts[0]], 1)
        assert r.tokens == [ar_tokens[0][:1]] and r.acceptance_lengths == [[]] and r.stats["tau"] == 0.0
    eos = ar_tokens[0][0]
    eng = engine("stock", dict(name="stock"), pair[0].replace(eos_token_ids=(eos,)), pair)
    r = tm.generate(eng, [prompts[0], prompts[i]], MAX_NEW)
    assert r.tokens == [[eos], ar_tokens[i]]
    assert r.acceptance_lengths[0] == [] and sum(r.acceptance_lengths[1]) >= MAX_NEW - 1


def test_an_engine_is_freed_with_its_last_reference(pair):
    """The jitted loop belongs to the engine, so dropping an engine frees it and the weight copies it made (the agent
    keeps a few engines and drops the rest)."""
    import gc
    import weakref

    _, tw, dcfg, dw = pair
    eng = make_engine(dict(name="tlv", tree_budget=3, level1_format="int8"), pair[0], tw, dcfg, dw, context=CONTEXT)
    tm.generate(eng, [[1, 2, 3]], 4)
    ref = weakref.ref(eng)
    del eng
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("index", [-1, 0, 1, 2, 3])
def test_switch_in_place_runs_the_branch_lax_switch_runs(index):
    """`spec.switch_in_place` (SpecPilot's verify under xla): the picked branch's state and output, as
    `lax.switch` gives them, an index out of range clamped; the branches write the state at different places and
    return different values, so running none, another or two of them would show."""
    from specpilot.decoding.spec import switch_in_place

    rng = np.random.default_rng(index + 1)
    state = {"k": jnp.asarray(rng.standard_normal((4, 32, 8), np.float32)), "n": jnp.int32(3)}
    operand = jnp.asarray(rng.standard_normal((4, 8), np.float32))

    def branch(c, st, x):
        k = jax.lax.dynamic_update_slice(st["k"], (x * c)[:, None], (0, st["n"] + c, 0))
        return {"k": k, "n": st["n"] + c}, (jnp.sum(k[:, : c + 4] ** 2), k[:, st["n"]] * c)

    branches = [functools.partial(branch, c) for c in (1, 2, 5)]
    got = jax.jit(lambda i, st, x: switch_in_place(i, branches, st, x))(jnp.int32(index), state, operand)
    want = jax.lax.switch(index, branches, state, operand)
    jax.tree.map(np.testing.assert_array_equal, got, want)


@pytest.mark.parametrize("flags,on", [
    ("", False), ("--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL", True),
    ("--xla_gpu_enable_command_buffer=+CONDITIONAL", False), ("--xla_gpu_enable_command_buffer=FUSION,WHILE", True),
    ("--xla_gpu_enable_command_buffer=+WHILE --xla_gpu_enable_command_buffer=-WHILE", False),
    ("--xla_gpu_enable_command_buffer=+WHILE --xla_gpu_enable_command_buffer= --xla_dump_to=/tmp/x", False),
])
def test_specpilot_verifies_through_lax_switch_where_while_loops_run_in_command_buffers(flags, on, pair, monkeypatch):
    """`engine.while_loops_in_command_buffers` reads XLA_FLAGS as XLA does (the last flag counts, +/- items change
    the default set); where it says yes, SpecPilot's verify under xla traces a `lax.switch` (stablehlo.case), since
    `switch_in_place` gave wrong results there on an H100; elsewhere its while loops, no conditional."""
    from specpilot.decoding.engine import while_loops_in_command_buffers

    monkeypatch.setenv("XLA_FLAGS", flags)
    assert while_loops_in_command_buffers() is on
    if flags not in ("", "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"):
        return
    eng = engine("specpilot", SPEC_ENGINES["specpilot"], pair[0], pair)
    verify = dict(eng.stages())["verify"]
    tokens = jnp.zeros((2, 4), jnp.int32)
    state = jax.eval_shape(lambda: eng.prefill(eng.params, tokens, jnp.array([4, 4]), 8, jax.random.key(0)))
    carry = jax.eval_shape(lambda st: eng._stage_tree(eng.params, st, eng._stage_draft(eng.params, st, {})), state)
    text = jax.jit(verify).lower(eng.params, state, carry).as_text()
    assert ("stablehlo.case" in text) is on


def test_cupti_times_specpilots_switch_stage_from_a_compile_without_command_buffers(pair, prompts):
    """`engine.cupti_program`: the stages holding control flow (SpecPilot's verify, its `switch_in_place`; the
    commit, its key split) get a program compiled without XLA's command buffers, whose result is the stage's own;
    its other stages, and a function with neither or one that is not jitted, keep their program. The whole round
    holds the control flow too (`profile_vs_loop.round_measure` times it so)."""
    from specpilot.decoding import layouts
    from specpilot.decoding.common import pad_prompts
    from specpilot.decoding.engine import cupti_compiled, cupti_program, holds_control_flow

    def words(a):  # a typed PRNG key as its words
        return jax.random.key_data(a) if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key) else a

    eng = engine("specpilot", SPEC_ENGINES["specpilot"], pair[0], pair)
    tokens, lens = pad_prompts(prompts[:2])
    state = jax.jit(eng.prefill, static_argnums=(3,))(eng.params, tokens, lens, 24, jax.random.key(0))
    carry, switched = {}, []
    for name, fn in eng.stages():
        stage = jax.jit(fn)
        program = cupti_program(stage, (eng.params, state, carry))
        if program is not stage:
            switched.append(name)
            assert isinstance(program, jax.stages.Compiled)
            jax.tree.map(lambda a, b: np.testing.assert_array_equal(*map(words, (a, b))),
                         program(eng.params, state, carry), stage(eng.params, state, carry))
        carry = stage(eng.params, *layouts.fresh_copies((state, carry)))
    assert switched == ["verify", "commit"]  # the commit's: jax.random's threefry hash, a while loop in StableHLO
    assert holds_control_flow(jax.jit(eng.round).lower(eng.params, state))  # the round profile_vs_loop times whole
    plain = jax.jit(lambda x: x * 2)
    assert cupti_program(plain, (np.ones(3, np.float32),)) is plain
    assert cupti_compiled(plain.lower(np.ones(3, np.float32)), plain) is plain  # its pinned round's form
    assert cupti_program(fn, ()) is fn  # not jitted: nothing to lower


def test_profile_times_stages_and_reports_the_budgets_specpilot_chose(pair, prompts):
    """`Engine.profile`: every stage timed (the smaller of a synchronised and a pipelined estimate, less the
    host's dispatch cost) in every round, the round is their sum, and a cost-aware engine's verified node
    counts per round are among its candidates' sizes."""
    tcfg = pair[0]
    eng = engine("specpilot", SPEC_ENGINES["specpilot"], tcfg, pair)
    prof = eng.profile(prompts[:2], 24, rounds=3, repeats=2)
    assert list(prof["stage_ms"]) == ["draft", "tree", "verify", "commit"]
    # a tiny stage may come out at 0 once the host's share is taken off; the target pass never does
    assert all(v >= 0 for v in prof["stage_ms"].values()) and prof["stage_ms"]["verify"] > 0
    assert prof["round_ms"] == pytest.approx(sum(prof["stage_ms"].values()))
    issue = prof["stage_issue_ms"]  # the host's time to issue a pipelined call, per stage
    assert list(issue) == list(prof["stage_ms"]) and all(v > 0 for v in issue.values())
    assert prof["dispatch_ms"] > 0  # measured, and subtracted from every stage
    for name, per_round in prof["stage_ms_rounds"].items():
        assert len(per_round) == prof["rounds"] and all(v >= 0 for v in per_round)
        assert prof["stage_ms"][name] == pytest.approx(sum(per_round) / len(per_round), rel=1e-3, abs=1e-3)
    assert len(prof["verified_nodes"]) == prof["rounds"] > 0
    assert all(1 <= v <= 24 for v in prof["verified_nodes"])
    assert len(prof["chosen_budgets"]) == prof["rounds"]  # recorded by the engine, not inferred from the nodes
    assert all(c in (4, 24) and v <= c for c, v in zip(prof["chosen_budgets"], prof["verified_nodes"]))
    # the stages compiled for the loop's layouts run the same rounds
    pinned = eng.profile(prompts[:2], 24, rounds=3, repeats=1, loop_layouts=True)
    assert [pinned[k] for k in ("tokens_per_round", "verified_nodes", "chosen_budgets")] == [
        prof[k] for k in ("tokens_per_round", "verified_nodes", "chosen_budgets")]
    ar = engine("ar", dict(name="ar"), tcfg, pair).profile(prompts[:2], 8, rounds=2, repeats=1)
    assert ar["verified_nodes"] == [] and "chosen_budgets" not in ar and list(ar["stage_ms"]) == ["verify", "commit"]
    timed = engine("ar", dict(name="ar"), tcfg, pair).profile(prompts[:2], 8, rounds=2, repeats=1, gpu_time=True)
    if jax.devices()[0].platform == "gpu":  # CUPTI: every stage's kernel time
        assert list(timed["stage_gpu_ms"]) == ["verify", "commit"] and timed["stage_gpu_ms"]["verify"] > 0
        # every stage's kernels, each with its time a round, the largest first
        assert list(timed["stage_gpu_kernels"]) == ["verify", "commit"]
        for kernels in timed["stage_gpu_kernels"].values():
            ms = list(kernels.values())
            assert ms and all(v > 0 for v in ms) and ms == sorted(ms, reverse=True)
        assert list(timed["stage_gpu_launches"]) == ["verify", "commit"]
        assert timed["stage_gpu_launches"]["verify"] >= len(timed["stage_gpu_kernels"]["verify"])
    else:
        assert not {"stage_gpu_ms", "stage_gpu_kernels", "stage_gpu_launches"} & set(timed)
        assert "need an NVIDIA GPU" in timed["stage_gpu_error"]
