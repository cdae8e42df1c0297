"""The DFlash drafter against an independent NumPy implementation written from the architecture
description (z-lab/dflash `DFlashDraftModel`), reading the Hugging Face-layout tensors ([out, in]
weights, separate q/k/v and gate/up) of a random checkpoint saved in the z-lab layout — so the
checkpoint loader's fusing and transposes are covered too.

Reference semantics, per request, in float64:
  c = hidden_norm(fc(features of context positions 0..n-1))           # once, shared by all layers
  h = embed[block]                                                     # block rows at positions n..n+B-1
  per layer:  x = input_layernorm(h)
              q = rope(q_norm(q_proj(x)))                              # block positions
              k = [rope(k_norm(k_proj(c))) at 0..n-1 ; rope(k_norm(k_proj(x))) at n..]
              v = [v_proj(c) ; v_proj(x)]
              h += o_proj(softmax(q k^T / sqrt(D)) v)                  # non-causal, GQA, all ctx + block
              h += down(silu(gate(y)) * up(y)),  y = post_attention_layernorm(h)
  logits = norm(h) @ lm_head^T                                         # the target's head
"""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file

from specpilot.models import dflash
from specpilot.models.hf import load_drafter

H, HQ, HKV, D, I_SIZE, LAYERS, BLOCK, VOCAB = 32, 4, 2, 8, 48, 2, 4, 31
IDS, N_TARGET, THETA, EPS = [0, 2], 3, 500000.0, 1e-6


def drafter_tensors(rng) -> dict[str, np.ndarray]:
    lin = lambda o, i: (rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32)  # noqa: E731
    norm = lambda n: (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)  # noqa: E731
    t = {"fc.weight": lin(H, len(IDS) * H), "hidden_norm.weight": norm(H), "norm.weight": norm(H)}
    for i in range(LAYERS):
        p = f"layers.{i}."
        t |= {
            p + "input_layernorm.weight": norm(H),
            p + "post_attention_layernorm.weight": norm(H),
            p + "self_attn.q_proj.weight": lin(HQ * D, H),
            p + "self_attn.k_proj.weight": lin(HKV * D, H),
            p + "self_attn.v_proj.weight": lin(HKV * D, H),
            p + "self_attn.o_proj.weight": lin(H, HQ * D),
            p + "self_attn.q_norm.weight": norm(D),
            p + "self_attn.k_norm.weight": norm(D),
            p + "mlp.gate_proj.weight": lin(I_SIZE, H),
            p + "mlp.up_proj.weight": lin(I_SIZE, H),
            p + "mlp.down_proj.weight": lin(H, I_SIZE),
        }
    return t


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dflash_drafter")
    config = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": BLOCK,
        "num_target_layers": N_TARGET, "dflash_config": {"mask_token_id": VOCAB - 1, "target_layer_ids": IDS},
        "hidden_size": H, "intermediate_size": I_SIZE, "num_hidden_layers": LAYERS, "num_attention_heads": HQ,
        "num_key_value_heads": HKV, "head_dim": D, "vocab_size": VOCAB, "rms_norm_eps": EPS, "rope_theta": THETA,
        "max_position_embeddings": 512, "attention_bias": False, "tie_word_embeddings": False,
    }
    (folder / "config.json").write_text(json.dumps(config))
    tensors = drafter_tensors(np.random.default_rng(0))
    save_file(tensors, str(folder / "model.safetensors"))
    return folder, {k: v.astype(np.float64) for k, v in tensors.items()}


# ---- the NumPy reference ---------------------------------------------------------------------------


def rms(x, w):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * w


def rope(x, pos):
    """x [T, heads, D] at integer positions [T]: rotate-half RoPE."""
    inv = 1.0 / THETA ** (np.arange(0, D, 2) / D)
    ang = pos[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1))[:, None], np.sin(np.concatenate([ang, ang], -1))[:, None]
    rot = np.concatenate([-x[..., D // 2 :], x[..., : D // 2]], -1)
    return x * cos + rot * sin


def silu(x):
    return x / (1.0 + np.exp(-x))


def reference_logits(t, feats, embed, lm_head_hf, block, block_valid=None):
    """feats [n, len(IDS)·H] for context positions 0..n-1; block [B] token ids; -> logits [B, V]."""
    n, b = len(feats), len(block)
    bv = b if block_valid is None else block_valid
    c = rms(feats @ t["fc.weight"].T, t["hidden_norm.weight"])
    h = embed[block]
    pos_ctx, pos_blk = np.arange(n, dtype=np.float64), n + np.arange(b, dtype=np.float64)
    for i in range(LAYERS):
        w = lambda name: t[f"layers.{i}.{name}"]  # noqa: E731
        x = rms(h, w("input_layernorm.weight"))
        q = rope(rms((x @ w("self_attn.q_proj.weight").T).reshape(b, HQ, D), w("self_attn.q_norm.weight")), pos_blk)

        def kv(src, pos):
            k = (src @ w("self_attn.k_proj.weight").T).reshape(len(src), HKV, D)
            v = (src @ w("self_attn.v_proj.weight").T).reshape(len(src), HKV, D)
            return rope(rms(k, w("self_attn.k_norm.weight")), pos), v

        k_ctx, v_ctx = kv(c, pos_ctx)
        k_blk, v_blk = kv(x, pos_blk)
        k = np.concatenate([k_ctx, k_blk[:bv]])
        v = np.concatenate([v_ctx, v_blk[:bv]])
        out = np.zeros((b, HQ, D))
        for hq in range(HQ):
            g = hq // (HQ // HKV)
            s = q[:, hq] @ k[:, g].T / np.sqrt(D)
            p = np.exp(s - s.max(-1, keepdims=True))
            out[:, hq] = (p / p.sum(-1, keepdims=True)) @ v[:, g]
        h = h + out.reshape(b, HQ * D) @ w("self_attn.o_proj.weight").T
        y = rms(h, w("post_attention_layernorm.weight"))
        h = h + (silu(y @ w("mlp.gate_proj.weight").T) * (y @ w("mlp.up_proj.weight").T)) @ w("mlp.down_proj.weight").T
    return rms(h, t["norm.weight"]) @ lm_head_hf.T


# ---- the test -------------------------------------------------------------------------------------


@pytest.mark.parametrize("block_valid", [None, (BLOCK, 2)])
def test_ingest_and_draft_logits_match_numpy_reference(checkpoint, block_valid):
    folder, t = checkpoint
    dcfg, dw = load_drafter(folder, dtype=jnp.float32)
    assert dcfg.block_size == BLOCK and dcfg.target_layer_ids == tuple(IDS) and dcfg.layers.rope.theta == THETA

    rng = np.random.default_rng(1)
    embed = rng.standard_normal((VOCAB, H)).astype(np.float32)
    lm_head_hf = (rng.standard_normal((VOCAB, H)) / np.sqrt(H)).astype(np.float32)  # HF [V, H]
    f = len(IDS) * H
    # two ingests with ragged counts; rows past n_new are junk that must never be seen
    feats1 = rng.standard_normal((2, 6, f)).astype(np.float32)
    feats2 = rng.standard_normal((2, 3, f)).astype(np.float32)
    n1, n2 = np.array([6, 4]), np.array([2, 3])
    block = np.array([[5, 30, 30, 30], [17, 30, 30, 30]], np.int32)  # [root, mask × (B-1)]

    ctx = dflash.init_context(dcfg, 2, 24, jnp.float32)
    ctx = dflash.ingest(dw, dcfg, ctx, jnp.asarray(feats1), jnp.asarray(n1, jnp.int32))
    ctx = dflash.ingest(dw, dcfg, ctx, jnp.asarray(feats2), jnp.asarray(n2, jnp.int32))
    assert np.asarray(ctx.lengths).tolist() == (n1 + n2).tolist()
    bv = None if block_valid is None else jnp.asarray(block_valid, jnp.int32)
    got = np.asarray(dflash.draft_logits(dw, dcfg, jnp.asarray(embed), jnp.asarray(lm_head_hf.T), ctx,
                                         jnp.asarray(block), bv))

    for r in range(2):
        ctx_feats = np.concatenate([feats1[r, : n1[r]], feats2[r, : n2[r]]]).astype(np.float64)
        want = reference_logits(t, ctx_feats, embed.astype(np.float64), lm_head_hf.astype(np.float64), block[r],
                                None if block_valid is None else block_valid[r])
        assert got[r].shape == want.shape
        np.testing.assert_allclose(got[r], want, atol=1e-4, rtol=0, err_msg=f"request {r}")
        assert np.abs(want).max() > 0.5  # the comparison is not vacuous


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("attention", ["xla", "pallas_tree"])
def test_ingest_and_draft_equals_ingest_then_draft(checkpoint, attention, dtype):
    """The engine's one-pass form (each layer's QKV weight read once for the new context rows and the block rows)
    gives the same logits and the same context as the two calls, bit for bit, with junk rows past n_new."""
    folder, _ = checkpoint
    dcfg, dw = load_drafter(folder, dtype=dtype)
    rng = np.random.default_rng(2)
    embed = jnp.asarray(rng.standard_normal((VOCAB, H)), dtype)
    lm_head = jnp.asarray(rng.standard_normal((H, VOCAB)) / np.sqrt(H), dtype)
    f = len(IDS) * H
    ctx = dflash.ingest(dw, dcfg, dflash.init_context(dcfg, 2, 32, dtype),
                        jnp.asarray(rng.standard_normal((2, 5, f)), dtype), jnp.asarray([5, 3], jnp.int32))
    feats = jnp.asarray(rng.standard_normal((2, BLOCK, f)), dtype)
    n_new = jnp.asarray([4, 1], jnp.int32)
    block = jnp.asarray([[5, 30, 30, 30], [17, 30, 30, 30]], jnp.int32)
    bv = jnp.asarray([BLOCK, 2], jnp.int32)

    want_ctx = dflash.ingest(dw, dcfg, ctx, feats, n_new)
    want = dflash.draft_logits(dw, dcfg, embed, lm_head, want_ctx, block, bv, attention=attention)
    got, got_ctx = dflash.ingest_and_draft(dw, dcfg, embed, lm_head, ctx, feats, n_new, block, bv,
                                           attention=attention)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    assert np.asarray(got_ctx.lengths).tolist() == [9, 4]
    for name in ("k", "v"):
        np.testing.assert_array_equal(np.asarray(getattr(got_ctx, name), np.float32),
                                      np.asarray(getattr(want_ctx, name), np.float32), err_msg=name)
    assert float(jnp.abs(got).max()) > 0.5
