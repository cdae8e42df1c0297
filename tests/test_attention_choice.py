"""The model's `attention` choice: `pallas_tree` (tree-attention kernel, or its jnp reference off Hopper)
computes the same step as the dense-mask XLA attention, inside the forward pass and inside an engine."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specpilot.decoding import make_engine
from specpilot.models import dflash, target
from specpilot.models.kv_cache import KVCache, write_every_layer
from specpilot.models.weights import init_random_target
from tests import models as tm


def random_tree_mask(b: int, n: int, rng) -> jnp.ndarray:
    """[B, n, n] ancestor-or-self masks of random trees (node 0 the root, parents before children)."""
    mask = np.zeros((b, n, n), bool)
    for r in range(b):
        parent = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
        for i in range(n):
            j = i
            while j >= 0:
                mask[r, i, j] = True
                j = parent[j]
    return jnp.asarray(mask)


def step(cfg, weights, dtype, attention, lengths, n, seed=0, with_cache=False, defer_kv_write=False):
    """One tree-verify forward over a filled cache; returns logits and the hidden of layer 0 (and the cache, and with
    `defer_kv_write` the new K/V)."""
    rng = np.random.default_rng(seed)
    b, cap = len(lengths), 128
    kv = rng.normal(size=(2, cfg.num_layers, b, cap, cfg.num_kv_heads, cfg.head_dim))
    cache = KVCache(k=jnp.asarray(kv[0], dtype), v=jnp.asarray(kv[1], dtype), lengths=jnp.asarray(lengths, jnp.int32))
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, size=(b, n)), jnp.int32)
    mask = random_tree_mask(b, n, rng)
    depth = jnp.sum(mask, -1) - 1
    out = target.forward(weights, cfg, tokens, cache.lengths[:, None] + depth, cache, mask, (0,), attention=attention,
                         defer_kv_write=defer_kv_write)
    if defer_kv_write:
        return out.logits, out.hidden, out.cache, out.new_kv
    return (out.logits, out.hidden, out.cache) if with_cache else (out.logits, out.hidden)


def test_pallas_tree_reference_path_equals_xla_attention():
    cfg = tm.target_config(vocab=32, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16)
    w = init_random_target(cfg, 0, jnp.float32)
    want = step(cfg, w, jnp.float32, "xla", [5, 40, 0], 9)
    got = step(cfg, w, jnp.float32, "pallas_tree", [5, 40, 0], 9)
    for a, b in zip(want, got):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-5, atol=2e-5)


def test_pallas_tree_writes_the_same_cache_after_the_last_layer():
    """pallas_tree writes every layer's new K/V in one scatter after the layers: the cache it returns equals the
    XLA path's per-layer writes (up to f32 rounding: the 9 nodes run padded to 16, `target.TREE_ROW_TILE`, and a
    16-row matmul may round unlike a 9-row one; later layers also differ by the two attentions' rounding), the new
    slots past capacity are dropped (lengths 125 + 9 > 128) and every other slot, the padded nodes' included, is
    untouched."""
    cfg = tm.target_config(vocab=32, hidden=64, layers=3, heads=4, kv_heads=2, head_dim=16)
    w = init_random_target(cfg, 0, jnp.float32)
    lengths, n = [5, 125, 0], 9
    *_, want = step(cfg, w, jnp.float32, "xla", lengths, n, with_cache=True)
    *_, got = step(cfg, w, jnp.float32, "pallas_tree", lengths, n, with_cache=True)
    *_, before = step(cfg, w, jnp.float32, "xla", lengths, 0, with_cache=True)  # n = 0 writes nothing
    new = np.zeros(got.k.shape[1:3], bool)  # [B, S]: the slots this step wrote
    for r, length in enumerate(lengths):
        new[r, length:length + n] = True
    for a, b, old in ((want.k, got.k, before.k), (want.v, got.v, before.v)):
        a, b, old = np.asarray(a), np.asarray(b), np.asarray(old)
        np.testing.assert_allclose(b[0], a[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-5)
        np.testing.assert_array_equal(b[:, ~new], old[:, ~new])
        assert not np.allclose(b[:, new], old[:, new])
    np.testing.assert_array_equal(np.asarray(got.lengths), np.asarray(want.lengths))


def test_pallas_tree_defers_its_cache_write_on_request():
    """`defer_kv_write` (what SpecPilot's switch branches ask for): the same logits, the cache untouched, and the new
    K/V that, written with every layer at once, give the cache the plain call writes. Only pallas_tree can: XLA's
    attention reads the new K/V from the cache."""
    cfg = tm.target_config(vocab=32, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16)
    w = init_random_target(cfg, 0, jnp.float32)
    lengths, n = [5, 120, 0], 9
    logits, hidden, written = step(cfg, w, jnp.float32, "pallas_tree", lengths, n, with_cache=True)
    d_logits, d_hidden, untouched, (ks, vs) = step(cfg, w, jnp.float32, "pallas_tree", lengths, n, defer_kv_write=True)
    *_, before = step(cfg, w, jnp.float32, "xla", lengths, 0, with_cache=True)
    np.testing.assert_array_equal(np.asarray(d_logits), np.asarray(logits))
    np.testing.assert_array_equal(np.asarray(d_hidden), np.asarray(hidden))
    assert ks.shape == (cfg.num_layers, len(lengths), n, cfg.num_kv_heads, cfg.head_dim) == vs.shape
    rewritten = write_every_layer(untouched, ks, vs)
    for got, old, again, want in ((untouched.k, before.k, rewritten.k, written.k),
                                  (untouched.v, before.v, rewritten.v, written.v)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(old))
        np.testing.assert_array_equal(np.asarray(again), np.asarray(want))
    with pytest.raises(ValueError, match="defer_kv_write: attention='xla' reads the new K/V from the cache"):
        step(cfg, w, jnp.float32, "xla", lengths, n, defer_kv_write=True)


def test_pallas_tree_kernel_in_interpret_mode_inside_the_model(monkeypatch):
    """The Mosaic GPU kernel itself (CPU interpret mode) in a bf16 model with Qwen3-like attention shapes."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from pallas_kernels.tree_attention import mosaic_gpu

    calls = []

    def kernel(*args, **kw):
        calls.append(args[0].shape)
        return mosaic_gpu.tree_attention_packed(*args, interpret=plgpu.InterpretGPUParams())

    monkeypatch.setattr(target, "tree_attention_packed", kernel)
    cfg = tm.target_config(vocab=32, hidden=128, layers=1, heads=4, kv_heads=1, head_dim=64)
    w = init_random_target(cfg, 1, jnp.bfloat16)
    want, _ = step(cfg, w, jnp.bfloat16, "xla", [70, 3], 12, seed=1)
    got, _ = step(cfg, w, jnp.bfloat16, "pallas_tree", [70, 3], 12, seed=1)
    assert calls == [(2, 16, 6, 64)]  # 4 q heads, 1 k head, 1 v head in one array; 12 nodes run as 16
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=0.1, rtol=0.05)  # bf16 rounding differs
    assert np.mean(np.argmax(np.asarray(got), -1) == np.argmax(np.asarray(want), -1)) > 0.9


def draft(dcfg, tw, dw, dtype, attention, lengths, block_valid=None, seed=0):
    """Drafter logits over a random context cache of `lengths` tokens per request (capacity 128)."""
    rng = np.random.default_rng(seed)
    lc = dcfg.layers
    kv = rng.normal(size=(2, lc.num_layers, len(lengths), 128, lc.num_kv_heads, lc.head_dim))
    ctx = KVCache(k=jnp.asarray(kv[0], dtype), v=jnp.asarray(kv[1], dtype), lengths=jnp.asarray(lengths, jnp.int32))
    block = jnp.asarray(rng.integers(0, dcfg.layers.vocab_size, size=(len(lengths), dcfg.block_size)), jnp.int32)
    valid = None if block_valid is None else jnp.asarray(block_valid, jnp.int32)
    return dflash.draft_logits(dw, dcfg, tw.embed, tw.lm_head, ctx, block, valid, attention=attention)


@pytest.mark.parametrize("block_valid", [None, [8, 3]])
def test_drafter_pallas_tree_reference_path_equals_xla_attention(block_valid):
    """The drafter's block attention through the tree-attention op (its jnp reference on the CPU): the context read
    up to its length, every valid block row seen by every row (`block_valid` cuts keys, not queries)."""
    tcfg = tm.target_config(vocab=32, hidden=64)
    dlayers = tm.drafter_layers_config(tcfg, num_layers=2, heads=4, kv_heads=2)
    _, tw, dcfg, dw = tm.random_pair(tcfg, drafter_layers=dlayers)
    want = draft(dcfg, tw, dw, jnp.float32, "xla", [5, 60], block_valid)
    got = draft(dcfg, tw, dw, jnp.float32, "pallas_tree", [5, 60], block_valid)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-5)
    if block_valid is not None:  # the cut matters: without it the logits differ
        full = draft(dcfg, tw, dw, jnp.float32, "pallas_tree", [5, 60])
        assert not np.allclose(np.asarray(full), np.asarray(got), atol=1e-3)
    with pytest.raises(ValueError, match="attention: unknown implementation 'flash'"):
        draft(dcfg, tw, dw, jnp.float32, "flash", [5, 60])


def test_drafter_pallas_tree_kernel_in_interpret_mode(monkeypatch):
    """The Mosaic GPU kernel itself (CPU interpret mode) as the drafter's attention: 16 block rows over a context,
    bf16, head_dim 64, one call per drafter layer."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from pallas_kernels.tree_attention import mosaic_gpu

    calls = []

    def kernel(*args, **kw):
        calls.append(args[0].shape)
        return mosaic_gpu.tree_attention_packed(*args, interpret=plgpu.InterpretGPUParams())

    monkeypatch.setattr(dflash, "tree_attention_packed", kernel)
    tcfg = tm.target_config(vocab=32, hidden=128)
    dlayers = tm.drafter_layers_config(tcfg, num_layers=2, heads=4, kv_heads=1, head_dim=64)
    tcfg, tw, dcfg, dw = tm.random_pair(tcfg, block_size=16, drafter_layers=dlayers, dtype=jnp.bfloat16)
    want = draft(dcfg, tw, dw, jnp.bfloat16, "xla", [70, 3], seed=1)
    got = draft(dcfg, tw, dw, jnp.bfloat16, "pallas_tree", [70, 3], seed=1)
    assert calls == [(2, 16, 6, 64)] * 2
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=0.1, rtol=0.05)  # bf16 rounding differs
    assert np.mean(np.argmax(np.asarray(got), -1) == np.argmax(np.asarray(want), -1)) > 0.9


def test_fused_attention_call_equals_the_model_attention():
    """`cudnn` goes through jax.nn.dot_product_attention with the model's mask; its XLA form checks the plumbing
    (mask layout, GQA, scale) on any backend."""
    rng = np.random.default_rng(3)
    q, k, v = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((2, 5, 8, 16), (2, 40, 2, 16), (2, 40, 2, 16)))
    mask = jnp.asarray(rng.random((2, 5, 40)) < 0.6).at[:, :, 0].set(True)
    np.testing.assert_allclose(np.asarray(target.fused_attention(q, k, v, mask, "xla")),
                               np.asarray(target.attention(q, k, v, mask)), rtol=1e-5, atol=1e-5)


def test_bad_attention_choices_are_clear_errors():
    cfg = tm.target_config()
    w = init_random_target(cfg, 0, jnp.float32)
    with pytest.raises(ValueError, match="attention: unknown implementation 'flash'"):
        step(cfg, w, jnp.float32, "flash", [3], 2)
    if jax.devices()[0].platform != "gpu":
        with pytest.raises(ValueError, match="attention=cudnn needs an NVIDIA GPU; this backend is 'cpu'"):
            step(cfg, w, jnp.float32, "cudnn", [3], 2)


@pytest.mark.gpu
@pytest.mark.skipif(jax.devices()[0].platform != "gpu", reason="cuDNN attention needs an NVIDIA GPU")
@pytest.mark.parametrize("attention", ["cudnn", "pallas_tree"])
def test_gpu_attention_choices_equal_xla(attention):
    cfg = tm.target_config(vocab=64, hidden=256, layers=2, heads=8, kv_heads=2, head_dim=128)
    w = init_random_target(cfg, 0, jnp.bfloat16)
    want, _ = step(cfg, w, jnp.bfloat16, "xla", [70, 3], 16)
    got, _ = step(cfg, w, jnp.bfloat16, attention, [70, 3], 16)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=0.1, rtol=0.05)


@pytest.mark.parametrize("name", ["ar", "ddtree", "specpilot"])
def test_engine_with_pallas_tree_attention_equals_ar(name):
    """Specpilot's switch branches hand their new K/V back (padded to the largest candidate) and one scatter after
    the switch writes them: the same tokens, with both budgets picked."""
    pair = tm.repeat_pair(tm.target_config(vocab=16), block_size=8, embed_scale=0.6, seed=0)
    tcfg, tw, dcfg, dw = pair
    prompts = tm.prompts(2, 16, lengths=(3, 6), seed=1, exclude=(15,))
    ar = make_engine({"name": "ar"}, tcfg, tw, dcfg, dw, context=64).generate(prompts, 24)
    cfg = {"name": name, "tree_budget": 12, "attention": "pallas_tree"}
    if name == "specpilot":
        cfg.update(budget_candidates=[4, 12], verify_cost_ms={1: 1.0, 12: 1.4}, draft_cost_ms=0.5)
    eng = make_engine(cfg, tcfg, tw, dcfg, dw, context=64)
    assert eng.attention == "pallas_tree"
    assert eng.generate(prompts, 24).tokens == ar.tokens
    if name == "specpilot":
        assert set(eng.profile(prompts, 24, rounds=6, repeats=1)["chosen_budgets"]) == {4, 12}


@pytest.mark.gpu
@pytest.mark.skipif(jax.devices()[0].platform != "gpu", reason="the tree-attention kernel needs an H100/H200")
def test_gpu_drafter_pallas_tree_equals_xla():
    """The drafter's attention on the Mosaic GPU kernel at DFlash-b16 shapes (16 rows, GQA 32/8, head_dim 128)."""
    tcfg = tm.target_config(vocab=64, hidden=512)
    dlayers = tm.drafter_layers_config(tcfg, num_layers=2, heads=32, kv_heads=8, head_dim=128)
    tcfg, tw, dcfg, dw = tm.random_pair(tcfg, block_size=16, drafter_layers=dlayers, dtype=jnp.bfloat16)
    want = draft(dcfg, tw, dw, jnp.bfloat16, "xla", [100, 7], seed=2)
    got = draft(dcfg, tw, dw, jnp.bfloat16, "pallas_tree", [100, 7], seed=2)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=0.1, rtol=0.05)


def test_pad_tree_rows_adds_nodes_that_only_see_themselves():
    """`pallas_tree` runs 9..15 nodes as 16 (`target.TREE_ROW_TILE`): the padded nodes see only themselves and no real
    node sees them, so the real nodes' attention is unchanged; a host mask stays on the host."""
    rng = np.random.default_rng(3)
    mask = np.asarray(random_tree_mask(2, 9, rng))
    tokens = jnp.asarray(rng.integers(1, 32, (2, 9)), jnp.int32)
    positions = jnp.asarray(np.arange(9)[None] + np.array([[4], [7]]), jnp.int32)
    for m in (mask, jnp.asarray(mask)):
        t, p, got = target.pad_tree_rows(tokens, positions, m)
        assert isinstance(got, type(m)) and got.shape == (2, 16, 16) and t.shape == p.shape == (2, 16)
        got = np.asarray(got)
        np.testing.assert_array_equal(got[:, :9, :9], mask)
        assert not got[:, :9, 9:].any() and not got[:, 9:, :9].any()
        np.testing.assert_array_equal(got[:, 9:, 9:], np.broadcast_to(np.eye(7, dtype=bool), (2, 7, 7)))
        np.testing.assert_array_equal(np.asarray(t[:, :9]), np.asarray(tokens))
        assert not np.asarray(t[:, 9:]).any()
        np.testing.assert_array_equal(np.asarray(p[:, 9:]), np.repeat(np.asarray(positions[:, -1:]), 7, axis=1))
