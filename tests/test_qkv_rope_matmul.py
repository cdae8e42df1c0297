"""The q|k|v projection with the q/k norm + rope in its epilogue against its jnp reference (``qk_norm_rope(x @ w)``):
in Pallas GPU-interpret mode on CPU, cross-lowered for sm_90, through the public dispatch, the weight-leaf dispatch and
a target forward, and on an H100/H200 (marked gpu)."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

import models as tm
from pallas_kernels import skinny_matmul
from pallas_kernels.qk_norm_rope import qk_norm_rope
from pallas_kernels.qkv_rope_matmul import mosaic_gpu as qr_mosaic_gpu
from pallas_kernels.qkv_rope_matmul import ops as qr_ops
from pallas_kernels.qkv_rope_matmul import qkv_rope_matmul, qkv_rope_matmul_reference
from pallas_kernels.tree_attention import unpack_heads
from specpilot.models import weights

EPS = 1e-6
INTERPRET = plgpu.InterpretGPUParams()
Config = qr_mosaic_gpu.TuningConfig
D = 128


def inputs(m, k, hq, hkv, seed, norm=True):
  """bf16 ``x`` ``[1, m, k]`` and ``w`` whose heads' columns differ in scale by up to e^6 (a head's statistic or a
  swapped head shows), the norm weights, and rope tables of angles up to 50 (HF's layout: each frequency twice)."""
  rng = np.random.default_rng(seed)
  x = tm.on_device(rng.normal(size=(1, m, k)))
  scale = np.exp(rng.uniform(-3, 3, (hq + 2 * hkv, 1)))
  w = tm.on_device((rng.normal(size=(k, hq + 2 * hkv, D)) * scale / np.sqrt(k)).reshape(k, -1))
  q_norm, k_norm = (tm.on_device(1.0 + 0.2 * rng.normal(size=D)) for _ in range(2))
  ang = rng.uniform(0, 50.0, (1, m, D // 2))
  ang = np.concatenate([ang, ang], -1)
  cos, sin = (tm.on_device(f(ang), jnp.float32) for f in (np.cos, np.sin))
  return x, w, *((q_norm, k_norm) if norm else (None, None)), cos, sin


def assert_close(got, want):
  """Equal but where the projection's f32 sums, added in another order, round to a neighbouring bf16 value (the norm
  and the rope carry that step along: a few bf16 steps of the head's scale), and mostly equal."""
  a, b = np.asarray(got, np.float32), np.asarray(want, np.float32)
  assert a.shape == b.shape
  head_scale = np.abs(b).max(-1, keepdims=True)
  bad = np.abs(a - b) > 2.0**-6 * head_scale + 1e-30
  assert not bad.any(), f"{bad.sum()} of {bad.size} values off, first at {np.argwhere(bad)[0]}"
  assert np.mean(a == b) > 0.95


def reference(x, w, q_norm, k_norm, cos, sin, hkv, split):
  heads = qkv_rope_matmul_reference(x, w, q_norm, k_norm, cos, sin, num_kv_heads=hkv, eps=EPS)
  return unpack_heads(heads, hkv) if split else heads


@pytest.mark.parametrize(
    "m,k,hq,hkv,norm,split,config",
    [
        (1, 512, 4, 2, True, True, Config(splits=2)),  # a decode step: two splits of two K steps each
        (3, 768, 2, 1, True, False, Config(tile_k=128, max_concurrent_steps=1, splits=2)),  # 3 steps through 1 slot
        (2, 512, 2, 1, False, True, Config(tile_k=256, splits=2)),  # Llama: no q/k norm
    ],
)
def test_interpreted_kernel_matches_reference(m, k, hq, hkv, norm, split, config):
  x, w, qn, kn, cos, sin = inputs(m, k, hq, hkv, seed=m + k, norm=norm)
  got = qr_mosaic_gpu.qkv_rope_matmul(x, w, qn, kn, cos, sin, num_kv_heads=hkv, eps=EPS, split=split, config=config,
                                      interpret=INTERPRET)
  want = reference(x, w, qn, kn, cos, sin, hkv, split)
  for a, b in zip(got, want) if split else [(got, want)]:
    assert_close(a, b)


def test_unsupported_and_bad_inputs():
  x, w, qn, kn, cos, sin = inputs(1, 512, 4, 2, seed=0)
  run = lambda *a, **kw: qr_mosaic_gpu.qkv_rope_matmul(*a, num_kv_heads=kw.pop("hkv", 2), eps=EPS, interpret=INTERPRET,
                                                       **kw)
  with pytest.raises(ValueError, match="x has 256 features, w_qkv expects 512"):
    run(x[..., :256], w, qn, kn, cos, sin)
  with pytest.raises(ValueError, match="not q heads plus 2 x 4 kv heads"):
    run(x, w, qn, kn, cos, sin, hkv=4)
  with pytest.raises(ValueError, match="give both q_norm and k_norm"):
    run(x, w, qn, None, cos, sin)
  with pytest.raises(ValueError, match="cos"):
    run(x, w, qn, kn, cos[:, :, :64], sin)
  with pytest.raises(NotImplementedError, match="bf16"):
    run(x.astype(jnp.float32), w, qn, kn, cos, sin)
  with pytest.raises(NotImplementedError, match="head_dim 64"):
    run(x, w, qn[:64], kn[:64], cos[..., :64], sin[..., :64], hkv=4)
  many = jnp.tile(x, (1, 9, 1))
  with pytest.raises(NotImplementedError, match="9 token rows"):
    run(many, w, qn, kn, jnp.tile(cos, (1, 9, 1)), jnp.tile(sin, (1, 9, 1)))
  with pytest.raises(NotImplementedError, match="K=384 is not a multiple"):
    run(x[..., :384], w[:384], qn, kn, cos, sin)


def test_config_rejects_bad_values():
  for bad in (dict(tile_k=96), dict(max_concurrent_steps=0), dict(splits=9)):
    with pytest.raises(ValueError, match=next(iter(bad))):
      Config(**bad)


@pytest.mark.parametrize("m,config", [(1, None), (8, Config(tile_k=256, max_concurrent_steps=2))])
def test_lowers_for_cuda_as_one_kernel(m, config):
  """At Qwen3-8B's q|k|v shape (4096 x 48 heads of 128) the program has one Mosaic GPU call writing q, k and v, and
  no XLA norm or rope after it (no rsqrt, no slice or concatenate of heads). The second config's 192 KB of pipeline
  tiles and the accumulator's 32 KB copy fit the 227 KB only because the two scopes share memory."""
  sds = jax.ShapeDtypeStruct
  run = jax.jit(lambda x, w, qn, kn, c, s: qr_mosaic_gpu.qkv_rope_matmul(x, w, qn, kn, c, s, num_kv_heads=8, eps=EPS,
                                                                         split=True, config=config))
  hlo = run.trace(sds((1, m, 4096), jnp.bfloat16), sds((4096, 6144), jnp.bfloat16), sds((D,), jnp.bfloat16),
                  sds((D,), jnp.bfloat16), sds((1, m, D), jnp.float32), sds((1, m, D), jnp.float32)).lower(
      lowering_platforms=("cuda",)).as_text()
  (call,) = [line for line in hlo.splitlines() if "stablehlo.custom_call" in line]
  assert f"tensor<{m}x4096xbf16>, tensor<{m}x1024xbf16>, tensor<{m}x1024xbf16>" in call
  ops = {line.split("=", 1)[1].split()[0] for line in hlo.splitlines() if " = stablehlo." in line}
  assert not ops & {"stablehlo.rsqrt", "stablehlo.slice", "stablehlo.concatenate", "stablehlo.reduce"}, ops


def test_named_implementations_and_unknown_name():
  x, w, qn, kn, cos, sin = inputs(2, 256, 2, 1, seed=4)
  got = qkv_rope_matmul(x, w, qn, kn, cos, sin, num_kv_heads=1, eps=EPS, implementation="xla")
  np.testing.assert_array_equal(np.asarray(got, np.float32),
                                np.asarray(reference(x, w, qn, kn, cos, sin, 1, False), np.float32))
  with pytest.raises(ValueError, match="unknown qkv_rope_matmul implementation 'triton'"):
    qkv_rope_matmul(x, w, qn, kn, cos, sin, num_kv_heads=1, eps=EPS, implementation="triton")


def two_steps(x, w, qn, kn, cos, sin, hkv, split):
  return qk_norm_rope(skinny_matmul.matmul(x, w, reduce=False), qn, kn, cos, sin, num_kv_heads=hkv, eps=EPS,
                      split=split)


def test_default_is_the_two_step_path_the_models_ran_before(monkeypatch):
  """Off (``DEFAULT = "xla"``) or above ``MAX_ROWS`` rows, the dispatch is ``qk_norm_rope(skinny_matmul.matmul(...))``
  with each step's own choice, bit for bit."""
  args = inputs(2, 512, 4, 2, seed=5)
  np.testing.assert_array_equal(np.asarray(qkv_rope_matmul(*args, num_kv_heads=2, eps=EPS), np.float32),
                                np.asarray(two_steps(*args, 2, False), np.float32))
  monkeypatch.setattr(qr_ops, "DEFAULT", "mosaic_gpu")
  monkeypatch.setattr(qr_ops, "_on_hopper", lambda: True)
  many = inputs(qr_mosaic_gpu.MAX_ROWS + 1, 512, 4, 2, seed=6)
  for a, b in zip(qkv_rope_matmul(*many, num_kv_heads=2, eps=EPS, split=True), two_steps(*many, 2, True)):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_unsupported_shape_falls_back_loudly(monkeypatch, caplog):
  monkeypatch.setattr(qr_ops, "DEFAULT", "mosaic_gpu")
  monkeypatch.setattr(qr_ops, "_on_hopper", lambda: True)
  x, w, qn, kn, cos, sin = inputs(1, 448, 4, 2, seed=7)  # K = 448: not a multiple of tile_k x splits
  with caplog.at_level(logging.WARNING, logger=qr_ops.__name__):
    out = qkv_rope_matmul(x, w, qn, kn, cos, sin, num_kv_heads=2, eps=EPS)
  assert "falls back to two kernels" in caplog.text
  np.testing.assert_array_equal(np.asarray(out, np.float32),
                                np.asarray(two_steps(x, w, qn, kn, cos, sin, 2, False), np.float32))


def test_weight_leaf_dispatch(monkeypatch):
  """A bf16 leaf goes through ``qkv_rope_matmul``; an int8 leaf keeps its own matmul, then the norm + rope."""
  import pallas_kernels.qkv_rope_matmul as qr_package

  leaves = []

  def spy(x, w, *args, **kwargs):
    leaves.append(w.dtype)
    return qkv_rope_matmul(x, w, *args, **kwargs)

  monkeypatch.setattr(qr_package, "qkv_rope_matmul", spy)
  x, w, qn, kn, cos, sin = inputs(2, 512, 4, 2, seed=8)
  kw = dict(num_kv_heads=2, eps=EPS, split=False)
  np.testing.assert_array_equal(np.asarray(weights.linear_qk_norm_rope(x, w, qn, kn, cos, sin, **kw), np.float32),
                                np.asarray(qkv_rope_matmul(x, w, qn, kn, cos, sin, **kw), np.float32))
  assert leaves == [jnp.bfloat16]
  q = weights.quantize(w, "int8")
  np.testing.assert_array_equal(np.asarray(weights.linear_qk_norm_rope(x, q, qn, kn, cos, sin, **kw), np.float32),
                                np.asarray(qk_norm_rope(weights.linear(x, q), qn, kn, cos, sin, **kw), np.float32))
  assert leaves == [jnp.bfloat16]  # the int8 leaf did not reach the bf16 kernel's entry


def test_model_runs_the_kernel_on_the_qkv_projection(monkeypatch):
  """With the kernel chosen (interpret mode, two splits), a one-token target forward on the tree-attention path hands
  the q|k|v projection to it as three arrays; its logits and new K/V match the XLA path's."""
  from specpilot.models import target

  seen = []

  def kernel(*args, **kwargs):
    seen.append(kwargs["split"])
    return qr_mosaic_gpu.qkv_rope_matmul(*args, **kwargs, config=Config(splits=2), interpret=INTERPRET)

  cfg = tm.target_config(vocab=32, hidden=512, layers=1, heads=4, kv_heads=2, head_dim=128, intermediate=512)
  w, cache = tm.bf16_step_inputs(cfg)
  tokens = jnp.asarray([[3]], jnp.int32)

  def run():
    out = target.forward(w, cfg, tokens, cache.lengths[:, None], cache, attention="pallas_tree")
    return out.logits, out.cache.k

  want, got = tm.xla_then_kernels(monkeypatch, {qr_ops: kernel}, run)
  assert seen == [True]
  np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), atol=0.05, rtol=0.02)
  assert_close(got[1][0, 0, 5:6], want[1][0, 0, 5:6])  # this step's keys, as the cache holds them


@pytest.mark.gpu
@pytest.mark.skipif(not qr_ops._on_hopper(), reason="needs an H100/H200")
@pytest.mark.parametrize("m", [1, 8])
@pytest.mark.parametrize("config", [Config(), Config(tile_k=256, max_concurrent_steps=2), Config(splits=8),
                                    Config(tile_k=64, max_concurrent_steps=4, splits=2)])
def test_on_the_gpu_at_qwen3_8b_shape(m, config):
  """Qwen3-8B's q|k|v (K 4096, 32 q and 8 kv heads): equal to the reference, and thirty calls all the same bits (the
  rows cross the cluster after a barrier one thread a block arrives on)."""
  x, w, qn, kn, cos, sin = inputs(m, 4096, 32, 8, seed=m)
  run = jax.jit(lambda *a: qr_mosaic_gpu.qkv_rope_matmul(*a, num_kv_heads=8, eps=EPS, split=True, config=config))
  first = run(x, w, qn, kn, cos, sin)
  for a, b in zip(first, reference(x, w, qn, kn, cos, sin, 8, True)):
    assert_close(a, b)
  for _ in range(30):
    for a, b in zip(run(x, w, qn, kn, cos, sin), first):
      np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
