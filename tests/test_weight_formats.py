"""Weight formats plug in through the weight leaf: W12 is bit-exact, so tokens must not change."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.w12 import ops as w12_ops
from specpilot.decoding import make_engine
from specpilot.models.config import DrafterConfig, ModelConfig
from specpilot.models.kv_cache import init_cache
from specpilot.models.target import forward
from specpilot.models.weights import add_passthrough_layers, init_random_drafter, init_random_target


def tiny_pair(dtype):
    """A 2-layer random Qwen3 target and a 1-layer drafter reading both of its layers."""
    cfg = ModelConfig(family="qwen3", vocab_size=64, hidden_size=64, intermediate_size=96, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=128)
    dcfg = DrafterConfig(layers=cfg.replace(num_layers=1), block_size=4, mask_token_id=63,
                         target_layer_ids=(0, 1), num_target_layers=2)
    return cfg, init_random_target(cfg, seed=1, dtype=dtype), dcfg, init_random_drafter(dcfg, seed=2, dtype=dtype)


@pytest.mark.parametrize("engine", ["ar", "stock"])
def test_w12_weights_give_identical_tokens(engine, monkeypatch):
    cfg, w, dcfg, dw = tiny_pair(jnp.bfloat16)
    prompts = [[1, 2, 3, 4], [9, 8, 7]]
    outs = {}
    for fmt in ("bf16", "w12"):
        e = make_engine({"name": engine, "weight_format": fmt}, cfg, w, dcfg, dw, context=128)
        outs[fmt] = e.generate(prompts, 16).tokens
    target_w12 = e.params["target"] if engine != "ar" else e.params
    assert type(target_w12.layers[0].w_qkv).__name__ == "W12Array"
    assert outs["w12"] == outs["bf16"]
    # the tokens alone survive a lossy format (a flipped mantissa bit in every weight keeps them): the target's
    # logits on the engine's W12 leaves are the bf16 ones bit for bit (the reference matmul: unpack + dot)
    monkeypatch.setattr(w12_ops, "DEFAULT", "reference")
    tokens = jnp.asarray([[1, 2, 3, 4, 9, 8, 7]], jnp.int32)

    def logits(weights):
        cache = init_cache(cfg.num_layers, 1, 16, cfg.num_kv_heads, cfg.head_dim, jnp.bfloat16)
        return np.asarray(forward(weights, cfg, tokens, jnp.arange(7)[None], cache).logits, np.float32)

    np.testing.assert_array_equal(logits(target_w12), logits(w))


def test_passthrough_layers_deepen_the_target_without_changing_its_tokens():
    """`deployment.target_passthrough_layers`: more layers to read and compute, the same greedy tokens from AR
    and from a speculative engine whose drafter reads the original layers' hidden states, which accepts the same
    drafts round by round (any lossless engine gives AR's tokens; its acceptance shows the drafter's inputs kept)."""
    cfg, w, dcfg, dw = tiny_pair(jnp.float32)
    deep_cfg, deep_w = add_passthrough_layers(cfg, w, 3)
    assert deep_cfg.num_layers == 5 and len(deep_w.layers) == 5 and deep_w.layers[:2] == w.layers
    pointers = {id(leaf) for layer in deep_w.layers for leaf in (layer.w_qkv, layer.w_gate_up)}
    assert len(pointers) == 10  # every added layer has buffers of its own: its weights are really read
    assert not bool(jnp.any(deep_w.layers[4].w_down)) and bool(jnp.any(deep_w.layers[4].w_gate_up))
    prompts = [[1, 2, 3, 4], [9, 8, 7]]
    for engine in ("ar", "stock"):
        shallow = make_engine({"name": engine}, cfg, w, dcfg, dw, context=128).generate(prompts, 12)
        deep = make_engine({"name": engine}, deep_cfg, deep_w, dcfg, dw, context=128).generate(prompts, 12)
        assert deep.tokens == shallow.tokens, engine
        assert deep.acceptance_lengths == shallow.acceptance_lengths, engine
    with pytest.raises(ValueError, match="passthrough"):
        add_passthrough_layers(cfg, w, -1)


def test_tlv_of_a_w12_target_quantizes_the_bf16_weights_it_holds():
    """TLV's level 1 of a W12 target is the int8 quantization of the same bf16 weights (not a crash on the packed
    leaf), and its tokens are the bf16 AR target's."""
    from pallas_kernels import w12
    from specpilot.models.weights import quantize

    cfg, w, dcfg, dw = tiny_pair(jnp.bfloat16)
    packed, plain = quantize(w12.pack(w.lm_head), "int8"), quantize(w.lm_head, "int8")
    assert bool(jnp.all(packed.q_t == plain.q_t)) and bool(jnp.all(packed.scale == plain.scale))
    prompts = [[1, 2, 3, 4], [9, 8, 7]]
    ar = make_engine({"name": "ar"}, cfg, w, context=128).generate(prompts, 12).tokens
    tlv = make_engine({"name": "tlv", "tree_budget": 6, "level1_format": "int8", "weight_format": "w12"},
                      cfg, w, dcfg, dw, context=128)
    assert type(tlv.params["target"].layers[0].w_qkv).__name__ == "W12Array"
    assert tlv.generate(prompts, 12).tokens == ar
