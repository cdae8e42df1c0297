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


def _load_into(ckpt, cache, barrier, results):
    barrier.wait()  # both processes convert and save at the same moment
    try:
        _, tree = hf.load_target(ckpt, jnp.float32, cache_dir=cache)
        results.put(float(sum(np.asarray(a).sum() for a in jax.tree.leaves(tree))))
    except Exception as e:  # reported to the test, which fails with it
        results.put(f"{type(e).__name__}: {e}")


def test_processes_filling_the_cache_at_once_do_not_collide(tmp_path):
    """The search's workers (one per GPU) load the same checkpoint at once: each saves into its own temporary
    folder, one rename wins (the H200 search once died on orbax's shared temporary folder)."""
    import multiprocessing as mp

    ckpt, cache = tmp_path / "ckpt", tmp_path / "cache"
    tiny_checkpoint(ckpt)
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_load_into, args=(ckpt, cache, barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    try:
        got = [results.get(timeout=90) for _ in procs]  # queue.Empty (a failure) if a process hangs
    finally:
        for p in procs:
            p.join(timeout=10)
            p.kill()
    assert all(isinstance(g, float) for g in got), got
    assert got[0] == got[1]
    assert [p.name for p in cache.iterdir()] == [hf._cache_entry(ckpt, jnp.float32, cache).name], \
        f"leftover temporary folders: {sorted(p.name for p in cache.iterdir())}"
    _, again = hf.load_target(ckpt, jnp.float32, cache_dir=cache)
    assert float(sum(np.asarray(a).sum() for a in jax.tree.leaves(again))) == got[0]


def test_a_replaced_file_with_its_old_mtime_is_a_miss(tmp_path):
    """`cp -p`, `rsync -a` and `tar -x` keep a new file's mtime from the source: the cache must not serve the old
    weights for it."""
    import os

    from safetensors.numpy import load_file

    ckpt, cache = tmp_path / "ckpt", tmp_path / "cache"
    tiny_checkpoint(ckpt)
    _, old = hf.load_target(ckpt, jnp.float32, cache_dir=cache)
    f = ckpt / "model.safetensors"
    st = f.stat()
    doubled = {k: v * 2 for k, v in load_file(str(f)).items()}
    save_file(doubled, str(f))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
    _, new = hf.load_target(ckpt, jnp.float32, cache_dir=cache)
    np.testing.assert_array_equal(np.asarray(new.embed), 2 * np.asarray(old.embed))


def test_a_cache_that_cannot_be_written_is_skipped_with_a_warning(tmp_path, caplog):
    """A cache folder under a file: the load goes on (no hang, no traceback) and says why nothing was cached."""
    import threading

    ckpt = tmp_path / "ckpt"
    tiny_checkpoint(ckpt)
    (tmp_path / "a_file").write_text("x")
    before = {t.name for t in threading.enumerate() if not t.daemon}
    _, tree = hf.load_target(ckpt, jnp.float32, cache_dir=tmp_path / "a_file" / "cache")
    assert tree.layers and "cannot write the weight cache" in caplog.text
    assert {t.name for t in threading.enumerate() if not t.daemon} <= before  # nothing left to keep it alive
