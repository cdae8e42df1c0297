"""Converted weight trees are cached with orbax: the second load restores the cache, not the safetensors."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file

from specpilot.models import hf


def tiny_checkpoint(folder):
    h, i, v, d = 16, 32, 40, 8
    rng = np.random.default_rng(0)
    t = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    p = "model.layers.0."
    t |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
          p + "self_attn.q_proj.weight": (2 * d, h), p + "self_attn.k_proj.weight": (d, h),
          p + "self_attn.v_proj.weight": (d, h), p + "self_attn.o_proj.weight": (h, 2 * d),
          p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
          p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h), p + "mlp.down_proj.weight": (h, i)}
    folder.mkdir()
    save_file({k: rng.normal(size=s).astype(np.float32) for k, s in t.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "hidden_size": h, "intermediate_size": i, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": d, "vocab_size": v}))


def test_second_load_comes_from_the_orbax_cache(tmp_path, monkeypatch):
    ckpt, cache = tmp_path / "ckpt", tmp_path / "cache"
    tiny_checkpoint(ckpt)
    cfg, first = hf.load_target(ckpt, jnp.float32, cache_dir=cache)
    assert any(cache.iterdir()), "nothing was written to the cache"

    def no_conversion(*a, **kw):
        pytest.fail("second load converted the safetensors again instead of restoring the cache")

    monkeypatch.setattr(hf, "read_checkpoint_tensors", no_conversion)
    cfg2, second = hf.load_target(ckpt, jnp.float32, cache_dir=cache)
    assert cfg2 == cfg
    for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
