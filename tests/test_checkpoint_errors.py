"""Broken checkpoints fail at load time with a one-line `CheckpointError` naming the file or tensor."""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from specpilot.models.config import CheckpointError
from specpilot.models.hf import load_target

H, HEADS, KV_HEADS, D, I, V, LAYERS = 32, 4, 2, 8, 64, 50, 2
CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": V,
    "hidden_size": H,
    "intermediate_size": I,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": D,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "max_position_embeddings": 128,
    "hidden_act": "silu",
}


def qwen3_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,), "lm_head.weight": (V, H)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (H,),
            p + "post_attention_layernorm.weight": (H,),
            p + "self_attn.q_proj.weight": (HEADS * D, H),
            p + "self_attn.k_proj.weight": (KV_HEADS * D, H),
            p + "self_attn.v_proj.weight": (KV_HEADS * D, H),
            p + "self_attn.o_proj.weight": (H, HEADS * D),
            p + "self_attn.q_norm.weight": (D,),
            p + "self_attn.k_norm.weight": (D,),
            p + "mlp.gate_proj.weight": (I, H),
            p + "mlp.up_proj.weight": (I, H),
            p + "mlp.down_proj.weight": (H, I),
        }
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def write_checkpoint(folder: Path, tensors: dict[str, np.ndarray], config: dict = CONFIG, shards: int = 1) -> Path:
    """An HF-layout folder: config.json plus one model.safetensors or `shards` files and an index."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if shards == 1:
        save_file(tensors, folder / "model.safetensors")
        return folder
    names = sorted(tensors)
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        save_file(part, folder / fname)
        weight_map |= dict.fromkeys(part, fname)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def load_error(folder: Path) -> str:
    with pytest.raises(CheckpointError) as info:
        load_target(folder, dtype=jnp.float32)
    msg = str(info.value)
    assert "\n" not in msg, f"message should be one line: {msg!r}"
    return msg


@pytest.fixture
def good(tmp_path) -> Path:
    return write_checkpoint(tmp_path / "good", qwen3_tensors())


@pytest.fixture
def sharded(tmp_path) -> Path:
    return write_checkpoint(tmp_path / "sharded", qwen3_tensors(), shards=3)


def test_valid_checkpoints_load(good, sharded):
    """The broken copies below differ from these in one respect only."""
    cfg, w = load_target(good, dtype=jnp.float32)
    assert (cfg.family, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim) == ("qwen3", LAYERS, KV_HEADS, D)
    _, ws = load_target(sharded, dtype=jnp.float32)
    np.testing.assert_array_equal(np.asarray(w.layers[1].w_qkv), np.asarray(ws.layers[1].w_qkv))
    np.testing.assert_array_equal(np.asarray(w.lm_head), np.asarray(ws.lm_head))


def test_missing_tensor(good):
    name = "model.layers.1.mlp.down_proj.weight"
    tensors = load_file(good / "model.safetensors")
    del tensors[name]
    save_file(tensors, good / "model.safetensors")
    msg = load_error(good)
    assert name in msg and "missing" in msg


def test_missing_lm_head_when_untied(good):
    tensors = load_file(good / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, good / "model.safetensors")
    assert "lm_head.weight" in load_error(good)


def test_wrong_shape(good):
    name = "model.layers.0.self_attn.k_proj.weight"
    tensors = load_file(good / "model.safetensors")
    tensors[name] = np.zeros((HEADS * D, H), np.float32)  # q's shape: a GQA checkpoint read as MHA
    save_file(tensors, good / "model.safetensors")
    msg = load_error(good)
    assert name in msg and str((HEADS * D, H)) in msg and str((KV_HEADS * D, H)) in msg


def test_unsupported_architecture(good):
    config = dict(CONFIG, architectures=["MixtralForCausalLM"])
    (good / "config.json").write_text(json.dumps(config))
    msg = load_error(good)
    assert "MixtralForCausalLM" in msg and "config.json" in msg


def test_unreadable_config(good):
    (good / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"], ')
    assert "config.json" in load_error(good)


def test_missing_config(good):
    (good / "config.json").unlink()
    assert "config.json" in load_error(good)


@pytest.mark.parametrize("keep", ["all_but_100", "header_only_half", "four_bytes"])
def test_truncated_safetensors(good, keep):
    path = good / "model.safetensors"
    data = path.read_bytes()
    header_len = int.from_bytes(data[:8], "little")
    cut = {"all_but_100": len(data) - 100, "header_only_half": 8 + header_len // 2, "four_bytes": 4}[keep]
    path.write_bytes(data[:cut])
    msg = load_error(good)
    assert "model.safetensors" in msg and "truncated" in msg


def test_missing_model_safetensors(good):
    (good / "model.safetensors").unlink()
    assert "model.safetensors" in load_error(good)


def test_missing_shard(sharded):
    shard = sharded / "model-00002-of-00003.safetensors"
    shard.unlink()
    assert shard.name in load_error(sharded)


def test_truncated_shard(sharded):
    shard = sharded / "model-00003-of-00003.safetensors"
    shard.write_bytes(shard.read_bytes()[:-64])
    assert shard.name in load_error(sharded)


def test_index_lists_tensor_in_no_shard(sharded):
    index = sharded / "model.safetensors.index.json"
    shard = "model-00001-of-00003.safetensors"
    tensors = load_file(sharded / shard)
    name = sorted(tensors)[0]
    del tensors[name]
    save_file(tensors, sharded / shard)
    msg = load_error(sharded)
    assert name in msg and index.name in msg


def test_unreadable_shard_index(sharded):
    (sharded / "model.safetensors.index.json").write_text("not json")
    assert "model.safetensors.index.json" in load_error(sharded)


def test_missing_folder(tmp_path):
    assert "nowhere" in load_error(tmp_path / "nowhere")


@pytest.mark.parametrize(
    "change, expect",
    [
        ({"hidden_size": None}, "hidden_size"),
        ({"attention_bias": True}, "attention_bias"),
        ({"hidden_act": "gelu"}, "gelu"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
        # transformers 5 runs a `rope_scaling` in place of `rope_parameters`: never the default rope beside it
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}, "rope_scaling": {"rope_type": "yarn",
          "factor": 4.0, "original_max_position_embeddings": 32}}, "unsupported rope_type 'yarn'"),
        # features that change the outputs are refused, never ignored
        ({"mlp_bias": True}, "mlp_bias"),
        ({"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1}, "sliding-window"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, "sliding-window"),
        ({"quantization_config": {"quant_method": "bitsandbytes"}}, "quantized checkpoints (bitsandbytes)"),
        # values of the wrong kind are one line, not a traceback
        ({"hidden_size": "abc"}, "bad config value"),
        ({"num_attention_heads": 0, "head_dim": None}, "bad config value"),
        ({"eos_token_id": "abc"}, "bad config value"),
    ],
    ids=["missing_key", "attention_bias", "hidden_act", "rope_type", "rope_scaling_and_parameters", "mlp_bias",
         "sliding_window", "layer_types", "quantized", "hidden_str", "heads_zero", "eos_str"],
)
def test_unsupported_config(good, change, expect):
    config = {k: v for k, v in {**CONFIG, **change}.items() if v is not None}
    (good / "config.json").write_text(json.dumps(config))
    assert expect in load_error(good)


@pytest.mark.parametrize("change", [{"use_sliding_window": True, "sliding_window": 4, "max_window_layers": LAYERS},
                                    {"use_sliding_window": True, "sliding_window": None}, {"hidden_act": "swish"}],
                         ids=["window_from_layer_past_the_last", "no_window", "swish"])
def test_configs_transformers_runs_as_full_attention_silu_load(good, change):
    """transformers' Qwen3 config slides only layers from max_window_layers on (none here), and "swish" is its silu:
    these checkpoints load (they were refused)."""
    (good / "config.json").write_text(json.dumps({**CONFIG, **change}))
    cfg, _ = load_target(good, dtype=jnp.float32)
    assert cfg.num_layers == LAYERS


def test_config_that_is_not_an_object(good):
    (good / "config.json").write_text("[]")
    assert "expected a JSON object" in load_error(good)


def test_integer_weights_are_refused(good):
    tensors = qwen3_tensors()
    name = "model.layers.0.self_attn.q_proj.weight"
    tensors[name] = tensors[name].astype(np.int8)
    save_file(tensors, good / "model.safetensors")
    assert "is int8; quantized weights are not supported" in load_error(good)


def _rewrite_header(path: Path, edit) -> None:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = edit(json.loads(raw[8 : 8 + n]))
    text = json.dumps(header, separators=(",", ":")).encode().ljust(n)  # same length: the data stays where it was
    assert len(text) == n
    path.write_bytes(raw[:8] + text + raw[8 + n :])


@pytest.mark.parametrize("edit, expect", [
    (lambda h: [], "not a JSON object"),
    (lambda h: {k: ({"dtype": v["dtype"], "shape": v["shape"]} if k == "lm_head.weight" else v)
                for k, v in h.items()}, "corrupt safetensors header"),
    (lambda h: {k: ({**v, "data_offsets": [-(v["data_offsets"][0] // 10), v["data_offsets"][1]]}  # same length
                    if k == "model.norm.weight" else v) for k, v in h.items()}, "data out of range"),
], ids=["list", "no_offsets", "negative_offsets"])
def test_corrupt_safetensors_headers(good, edit, expect):
    _rewrite_header(good / "model.safetensors", edit)
    assert expect in load_error(good)


def test_index_whose_weight_map_is_not_a_mapping(sharded):
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": None}))
    assert "weight_map is not a name -> file mapping" in load_error(sharded)


def test_a_single_file_wins_over_an_index_as_in_transformers(good, sharded):
    """Both present: `model.safetensors` is read (the index and its shards are from elsewhere)."""
    for f in sharded.glob("model-*"):
        (good / f.name).write_bytes(f.read_bytes())
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    (good / "model.safetensors.index.json").write_text(json.dumps(index))
    save_file(qwen3_tensors(seed=1), good / "model.safetensors")
    _, w = load_target(good, dtype=jnp.float32)
    want = qwen3_tensors(seed=1)["model.embed_tokens.weight"]
    np.testing.assert_array_equal(np.asarray(w.embed), want)


def test_an_unsupported_feature_is_named_once(good):
    """Our own error passes through the value checks unwrapped."""
    (good / "config.json").write_text(json.dumps({**CONFIG, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}))
    msg = load_error(good)
    assert "unsupported rope_type 'yarn'" in msg and "bad config value" not in msg


def test_generation_config_stop_tokens_join_the_configs(good):
    """Qwen3 lists <|im_end|> in config.json and <|endoftext|> too in generation_config.json: HF stops at both."""
    from specpilot.models.config import target_config_from_hf

    (good / "config.json").write_text(json.dumps({**CONFIG, "eos_token_id": 7}))
    (good / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9]}))
    assert target_config_from_hf(good).eos_token_ids == (7, 9)


def test_absent_keys_take_transformers_defaults(tmp_path):
    """Keys a config.json leaves out take the config class's defaults, as transformers 5 reads them: Qwen3's head_dim
    128 and 32 KV heads (not hidden_size / heads and heads, Llama's), llama3 rope's original context
    max_position_embeddings. A Qwen3 config without head_dim is a valid checkpoint, not a shape error."""
    from specpilot.models.config import rope_inv_freq, target_config_from_hf

    config = {k: v for k, v in CONFIG.items() if k not in ("head_dim", "num_key_value_heads")}
    config["num_attention_heads"] = 32
    tensors = qwen3_tensors()
    rng = np.random.default_rng(3)
    for i in range(LAYERS):
        p = f"model.layers.{i}.self_attn."
        tensors |= {p + "q_proj.weight": rng.standard_normal((32 * 128, H), np.float32),
                    p + "k_proj.weight": rng.standard_normal((32 * 128, H), np.float32),
                    p + "v_proj.weight": rng.standard_normal((32 * 128, H), np.float32),
                    p + "o_proj.weight": rng.standard_normal((H, 32 * 128), np.float32),
                    p + "q_norm.weight": rng.standard_normal(128, np.float32),
                    p + "k_norm.weight": rng.standard_normal(128, np.float32)}
    cfg, _ = load_target(write_checkpoint(tmp_path / "qwen3", tensors, config), dtype=jnp.float32)
    assert (cfg.head_dim, cfg.num_kv_heads) == (128, 32)

    llama = {**CONFIG, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "head_dim": None,
             "num_key_value_heads": None, "max_position_embeddings": 256,
             "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0}}
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps(llama))
    cfg = target_config_from_hf(tmp_path / "llama")
    assert (cfg.head_dim, cfg.num_kv_heads, cfg.rope.original_max_position) == (H // HEADS, HEADS, 256)
    # transformers' llama3 rule at original context 256 (head_dim 8): frequency 0 kept, 1 smoothed, 2-3 divided
    inv = 5e5 ** -(np.arange(0, 8, 2) / 8)
    smooth = (256 * inv[1] / (2 * np.pi) - 1.0) / 3.0
    want = [inv[0], (1 - smooth) * inv[1] / 8 + smooth * inv[1], inv[2] / 8, inv[3] / 8]
    np.testing.assert_allclose(rope_inv_freq(cfg.rope, cfg.head_dim), want, rtol=1e-6)
