"""scripts/convert_w12.py: pack a checkpoint into W12 once, cache it with orbax, and let `weight_format=w12`
engines restore it instead of packing at start-up."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from pallas_kernels import w12
from specpilot.decoding import make_engine
from specpilot.models import hf
from specpilot.models.weights import _is_w12, pack_w12
from tests.test_checkpoint_errors import qwen3_tensors, write_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import convert_w12


@pytest.fixture
def bf16_ckpt(tmp_path) -> Path:
    tensors = {k: v.astype(ml_dtypes.bfloat16) for k, v in qwen3_tensors().items()}
    tensors["model.layers.0.mlp.down_proj.weight"][3, 5] = ml_dtypes.bfloat16(1e30)  # an escape, at least one
    return write_checkpoint(tmp_path / "bf16", tensors)


def convert(capsys, *argv) -> tuple[int, str, str]:
    rc = convert_w12.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_same_tree(a, b):
    leaves_a, def_a = jax.tree_util.tree_flatten(a)
    leaves_b, def_b = jax.tree_util.tree_flatten(b)
    assert def_a == def_b  # structure and static metadata (logical shape, group_k) alike
    for x, y in zip(leaves_a, leaves_b):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8))


def test_convert_reload_is_bit_identical_and_second_convert_is_a_hit(bf16_ckpt, tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    rc, out, err = convert(capsys, bf16_ckpt, "--cache-dir", cache)
    assert rc == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    where = hf.w12_cache_entry(bf16_ckpt, cache)
    assert report["cache"] == str(where) and where.is_dir() and not report["cache_hit"]
    assert f"cache: {where}" in out and "bits/weight" in out
    assert report["escapes"] >= 1 and report["matrices"] == 4 * 2 + 1  # 4 per layer + lm_head
    in_memory = pack_w12(hf.load_target(bf16_ckpt, jnp.bfloat16)[1])
    assert report["bits_per_weight"] == pytest.approx(
        sum(w12.bits_per_weight(p) * p.shape[0] * p.shape[1] for p in jax.tree.leaves(in_memory, is_leaf=_is_w12)
            if _is_w12(p)) / report["weights"])

    def no_packing(*a, **kw):
        pytest.fail("packed again although the W12 cache holds this checkpoint")

    monkeypatch.setattr(w12, "pack", no_packing)
    monkeypatch.setattr(hf, "read_checkpoint_tensors", no_packing)  # a hit reads no safetensors either
    _, restored, hit = hf.load_w12(bf16_ckpt, cache, create=False)
    assert hit
    assert_same_tree(restored, in_memory)

    mtime = where.stat().st_mtime_ns
    monkeypatch.undo()  # the dtype check reads safetensors headers
    monkeypatch.setattr(w12, "pack", no_packing)
    rc, out, err = convert(capsys, bf16_ckpt, "--cache-dir", cache)
    assert rc == 0, err
    assert out.startswith(f"cache hit: {where}") and json.loads(out.strip().splitlines()[-1])["cache_hit"]
    assert where.stat().st_mtime_ns == mtime and sorted(p.name for p in cache.iterdir()) == [where.name]


def test_w12_engine_restores_the_cache_instead_of_packing(bf16_ckpt, tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    cfg, bf16_tree = hf.load_target(bf16_ckpt, jnp.bfloat16, cache)
    prompts = [[1, 2, 3]]
    expected = make_engine({"name": "ar"}, cfg, bf16_tree, context=32).generate(prompts, 4).tokens
    assert convert(capsys, bf16_ckpt, "--cache-dir", cache)[0] == 0

    def no_packing(*a, **kw):
        pytest.fail("make_engine packed although the W12 cache holds this checkpoint")

    monkeypatch.setattr(w12, "pack", no_packing)
    engine = make_engine({"name": "ar", "weight_format": "w12"}, cfg, bf16_tree, context=32)
    assert _is_w12(engine.params.layers[0].w_qkv) and _is_w12(engine.params.lm_head)
    assert engine.generate(prompts, 4).tokens == expected  # lossless: the same tokens as bf16


def test_a_tree_not_from_the_cached_checkpoint_is_packed(bf16_ckpt, tmp_path, capsys):
    cache = tmp_path / "cache"
    assert convert(capsys, bf16_ckpt, "--cache-dir", cache)[0] == 0
    _, tree = hf.load_target(bf16_ckpt, jnp.bfloat16, cache)
    changed = jax.tree.map(lambda a: a * 2, tree)  # a copy: unknown to the cache, so it must be packed
    packed = hf.packed_w12(changed)
    np.testing.assert_array_equal(np.asarray(w12.unpack(packed.lm_head)), np.asarray(changed.lm_head))


def test_unreadable_entry_is_repacked_and_replaced(bf16_ckpt, tmp_path, capsys):
    cache = tmp_path / "cache"
    where = hf.w12_cache_entry(bf16_ckpt, cache)
    where.mkdir(parents=True)
    (where / "garbage").write_text("not orbax")
    rc, out, _ = convert(capsys, bf16_ckpt, "--cache-dir", cache)
    assert rc == 0 and not json.loads(out.strip().splitlines()[-1])["cache_hit"]
    assert hf.load_w12(bf16_ckpt, cache, create=False)[2]


def one_line_error(capsys, *argv) -> str:
    rc, out, err = convert(capsys, *argv)
    assert rc == 2 and "cache:" not in out
    assert err.count("\n") == 1 and err.startswith("checkpoint error: "), err
    return err


def test_float32_needs_cast_flag_and_cast_matches_bf16_rounding(tmp_path, capsys):
    f32 = write_checkpoint(tmp_path / "f32", qwen3_tensors())
    cache = tmp_path / "cache"
    err = one_line_error(capsys, f32, "--cache-dir", cache)
    assert "float32" in err and "--cast-bf16" in err and "bfloat16" in err
    assert not cache.exists()
    rc, out, err = convert(capsys, f32, "--cache-dir", cache, "--cast-bf16")
    assert rc == 0, err
    assert "lossy" in out and json.loads(out.strip().splitlines()[-1])["cast_from"] == "float32"
    restored = hf.load_w12(f32, cache, create=False)[1]
    assert_same_tree(restored, pack_w12(hf.load_target(f32, jnp.bfloat16)[1]))


def test_missing_and_broken_checkpoints_are_one_line(bf16_ckpt, tmp_path, capsys):
    cache = tmp_path / "cache"
    assert "not found" in one_line_error(capsys, tmp_path / "nowhere", "--cache-dir", cache)
    data = (bf16_ckpt / "model.safetensors").read_bytes()
    (bf16_ckpt / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert "truncated" in one_line_error(capsys, bf16_ckpt, "--cache-dir", cache)
    (bf16_ckpt / "model.safetensors").write_bytes(data)
    (bf16_ckpt / "config.json").unlink()
    assert "config.json" in one_line_error(capsys, bf16_ckpt, "--cache-dir", cache)
    assert not cache.exists()


def test_int8_checkpoint_is_refused_by_dtype(tmp_path, capsys):
    tensors = qwen3_tensors()
    tensors["model.layers.0.mlp.up_proj.weight"] = np.zeros(tensors["model.layers.0.mlp.up_proj.weight"].shape,
                                                            np.int8)
    folder = write_checkpoint(tmp_path / "int8", {k: v.astype(ml_dtypes.bfloat16) if v.dtype != np.int8 else v
                                                  for k, v in tensors.items()})
    err = one_line_error(capsys, folder, "--cache-dir", tmp_path / "cache", "--cast-bf16")
    assert "int8" in err and "up_proj" in err


def test_drafter_converts_and_restores(tmp_path, capsys, monkeypatch):
    from specpilot.models import export
    from specpilot.models.config import DrafterConfig, ModelConfig
    from specpilot.models.weights import init_random_drafter

    target = ModelConfig(family="qwen3", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                         num_heads=2, num_kv_heads=1, head_dim=16, max_position_embeddings=64)
    dcfg = DrafterConfig(layers=target.replace(num_layers=1), block_size=4, mask_token_id=63,
                         target_layer_ids=(0, 1), num_target_layers=2)
    folder = export.export_drafter(tmp_path / "drafter", dcfg, init_random_drafter(dcfg, 1, jnp.bfloat16),
                                   dtype="bfloat16")
    cache = tmp_path / "cache"
    rc, out, err = convert(capsys, "--drafter", folder, "--cache-dir", cache)
    assert rc == 0, err
    assert json.loads(out.strip().splitlines()[-1])["kind"] == "drafter"
    _, tree = hf.load_drafter(folder, jnp.bfloat16, cache)
    expected = pack_w12(tree)
    monkeypatch.setattr(w12, "pack", lambda *a, **kw: pytest.fail("packed although the W12 cache holds it"))
    assert_same_tree(hf.packed_w12(tree), expected)


def test_a_cache_folder_it_cannot_write_is_one_line(bf16_ckpt, tmp_path, capsys):
    (tmp_path / "a_file").write_text("x")
    assert "cannot write the weight cache" in one_line_error(capsys, bf16_ckpt, "--cache-dir", tmp_path / "a_file" / "c")
