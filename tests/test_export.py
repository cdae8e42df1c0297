"""specpilot.models.export writes HF folders that hf.load_* read back bit-exactly (and transformers reads too)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specpilot.models import export, hf
from specpilot.models.config import DrafterConfig, ModelConfig, RopeConfig
from specpilot.models.kv_cache import init_cache
from specpilot.models.target import forward
from specpilot.models.weights import cast_floats, init_random_drafter, init_random_target

REPO = Path(__file__).resolve().parents[1]
QWEN = ModelConfig("qwen3", vocab_size=97, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=8, eos_token_ids=(0,), max_position_embeddings=256)
LLAMA = ModelConfig("llama", vocab_size=97, hidden_size=32, intermediate_size=40, num_layers=2, num_heads=4,
                    num_kv_heads=1, head_dim=8, tie_word_embeddings=True, eos_token_ids=(3, 5),
                    rope=RopeConfig(theta=500000.0, kind="llama3", factor=8.0, low_freq_factor=1.0,
                                    high_freq_factor=4.0, original_max_position=64))


def same_trees(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(la, lb))


@pytest.mark.parametrize("cfg", [QWEN, LLAMA], ids=["qwen3", "llama_tied_llama3rope"])
def test_target_round_trip_is_exact(tmp_path, cfg):
    w = init_random_target(cfg, seed=3, dtype=jnp.float32)
    export.export_target(tmp_path, cfg, w)
    cfg2, w2 = hf.load_target(tmp_path, jnp.float32)
    assert cfg2 == cfg
    assert same_trees(w, w2)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == [{"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}[cfg.family]]
    if cfg.rope.kind == "llama3":  # transformers < 5 reads only `rope_scaling`
        assert config["rope_scaling"]["rope_type"] == "llama3" and config["rope_scaling"]["factor"] == cfg.rope.factor


def test_target_round_trip_bf16(tmp_path):
    w = init_random_target(QWEN, seed=4, dtype=jnp.float32)
    export.export_target(tmp_path, QWEN, w, dtype="bfloat16")
    _, w2 = hf.load_target(tmp_path, jnp.bfloat16)
    assert same_trees(cast_floats(w, jnp.bfloat16), w2)


def test_drafter_round_trip_is_exact_in_zlab_layout(tmp_path):
    dcfg = DrafterConfig(layers=QWEN.replace(num_layers=1, intermediate_size=40, eos_token_ids=()), block_size=8,
                         mask_token_id=1, target_layer_ids=(0, 1), num_target_layers=2)
    dw = init_random_drafter(dcfg, seed=5, dtype=jnp.float32)
    export.export_drafter(tmp_path, dcfg, dw)
    dcfg2, dw2 = hf.load_drafter(tmp_path, jnp.float32)
    assert dcfg2 == dcfg
    assert same_trees(dw, dw2)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == 8
    assert config["dflash_config"] == {"mask_token_id": 1, "target_layer_ids": [0, 1]}
    names = set(hf.read_checkpoint_tensors(tmp_path))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_proj.weight"} <= names


def test_export_refuses_packed_weights(tmp_path):
    from specpilot.models.weights import quantize

    w = init_random_target(QWEN, seed=0, dtype=jnp.float32)
    w.lm_head = quantize(w.lm_head, "int8")
    with pytest.raises(TypeError, match="plain weight arrays"):
        export.export_target(tmp_path, QWEN, w)


_TRANSFORMERS_LOGITS = """
import sys, json, numpy as np, torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
ids = torch.tensor(json.loads(sys.argv[2]))
with torch.no_grad():
    np.save(sys.argv[3], m(ids).logits.numpy())
"""


@pytest.mark.slow
def test_transformers_reads_the_exported_target(tmp_path):
    """The export is a real HF checkpoint: transformers (torch reference venv) gives our logits."""
    ref = Path(os.environ.get("SPECPILOT_REF_PYTHON", REPO / ".venv-ref" / "bin" / "python"))
    if not ref.exists():
        pytest.skip("no torch reference venv (.venv-ref); `make test` creates it")
    w = init_random_target(QWEN, seed=7, dtype=jnp.float32)
    export.export_target(tmp_path / "ckpt", QWEN, w)
    tokens = np.array([[5, 9, 2, 44, 17, 3, 96, 0]], np.int32)
    proc = subprocess.run([str(ref), "-c", _TRANSFORMERS_LOGITS, str(tmp_path / "ckpt"), json.dumps(tokens.tolist()),
                           str(tmp_path / "logits.npy")], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = np.load(tmp_path / "logits.npy")
    cache = init_cache(QWEN.num_layers, 1, tokens.shape[1], QWEN.num_kv_heads, QWEN.head_dim, jnp.float32)
    ours = forward(w, QWEN, jnp.asarray(tokens), jnp.arange(tokens.shape[1])[None], cache).logits
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=2e-4, rtol=2e-4)


def test_a_drafters_sliding_window_layers_load_with_a_warning(tmp_path, caplog):
    """Only the drafts depend on them (the output stays the target's), so a drafter with them still loads."""
    dcfg = DrafterConfig(layers=QWEN.replace(num_layers=1, eos_token_ids=()), block_size=4, mask_token_id=1,
                         target_layer_ids=(0,), num_target_layers=2)
    export.export_drafter(tmp_path, dcfg, init_random_drafter(dcfg, seed=6, dtype=jnp.float32))
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "layer_types": ["sliding_attention"]}))
    assert hf.load_drafter(tmp_path, jnp.float32)[0] == dcfg
    assert "sliding-window layers run as full attention" in caplog.text
