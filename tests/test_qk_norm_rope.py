"""The q/k norm + rope kernel against its jnp reference (the model's own q/k norm and rope): in Pallas GPU-interpret
mode on CPU, cross-lowered for sm_90, and on an H100/H200 (marked gpu)."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

import models as tm
from pallas_kernels.qk_norm_rope import mosaic_gpu as rope_mosaic_gpu
from pallas_kernels.qk_norm_rope import ops as rope_ops
from pallas_kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_reference
from pallas_kernels.skinny_matmul import TuningConfig as SkinnyConfig
from pallas_kernels.skinny_matmul import mosaic_gpu as skinny_mosaic_gpu
from pallas_kernels.split_k import SplitKPartials
from pallas_kernels.tree_attention import unpack_heads

EPS = 1e-6
INTERPRET = plgpu.InterpretGPUParams()


def inputs(b, t, hq, hkv, d, seed, norm=True):
  """The q|k|v rows, norm weights and rope tables (``tm.on_device``)."""
  rng = np.random.default_rng(seed)
  # heads of very different scales, so a wrong per-head statistic shows
  scale = np.exp(rng.uniform(-3, 3, (b, t, hq + 2 * hkv, 1)))
  qkv = rng.normal(size=(b, t, hq + 2 * hkv, d)) * scale
  qkv = tm.on_device(qkv.reshape(b, t, (hq + 2 * hkv) * d))  # named sizes: t may be 0
  q_norm, k_norm = (tm.on_device(1.0 + 0.2 * rng.normal(size=d)) for _ in range(2))
  ang = rng.uniform(0, 50.0, (b, t, d // 2))
  ang = np.concatenate([ang, ang], -1)  # HF's layout: each frequency twice
  cos, sin = (tm.on_device(f(ang), jnp.float32) for f in (np.cos, np.sin))
  return qkv, *((q_norm, k_norm) if norm else (None, None)), cos, sin


def numpy_heads(qkv, q_norm, k_norm, cos, sin, hkv):
  """The same thing in float64 numpy, written from the definitions (per-head RMSNorm, rotate-half RoPE)."""
  b, t, _ = qkv.shape
  d = cos.shape[-1]
  x = np.asarray(qkv, np.float64).reshape(b, t, -1, d)
  hq = x.shape[2] - 2 * hkv
  qk = x[:, :, : hq + hkv]
  if q_norm is not None:
    g = np.concatenate([np.tile(np.asarray(q_norm, np.float64), (hq, 1)), np.tile(np.asarray(k_norm, np.float64),
                                                                                   (hkv, 1))])
    qk = qk / np.sqrt(np.mean(qk * qk, -1, keepdims=True) + EPS) * g
  c, s = np.asarray(cos, np.float64)[:, :, None], np.asarray(sin, np.float64)[:, :, None]
  rot = np.concatenate([-qk[..., d // 2:], qk[..., : d // 2]], -1)
  return np.concatenate([qk * c + rot * s, x[:, :, hq + hkv:]], 2)


def assert_close(got, want):
  """Equal up to one bf16 rounding step where the f32 sum of squares is added in another order, and mostly equal."""
  a, b = np.asarray(got, np.float32), np.asarray(want, np.float32)
  assert a.shape == b.shape
  assert np.all(np.abs(a - b) <= 2.0 ** -7 * np.abs(b) + 2.0 ** -7 * np.abs(b).max(-1, keepdims=True) * 0.05 + 1e-30)
  assert np.mean(a == b) > 0.98


@pytest.mark.parametrize("norm", [True, False])
def test_reference_is_norm_then_rope(norm):
  args = inputs(2, 3, 4, 2, 128, seed=0, norm=norm)
  got = qk_norm_rope_reference(*args, num_kv_heads=2, eps=EPS)
  want = numpy_heads(*args, 2)
  np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=3e-2, atol=3e-2 * np.abs(want).max())
  np.testing.assert_array_equal(np.asarray(got[:, :, 6:]), np.asarray(args[0]).reshape(2, 3, 8, 128)[:, :, 6:])


class QkNormRopeSuite:
  def run(self, *args, **kwargs):
    raise NotImplementedError

  @pytest.mark.parametrize("b,t,hq,hkv,d,norm", [(1, 1, 4, 2, 128, True), (2, 3, 8, 1, 128, True),
                                                 (1, 2, 2, 1, 256, True), (1, 2, 4, 2, 128, False)])
  def test_matches_reference(self, b, t, hq, hkv, d, norm):
    args = inputs(b, t, hq, hkv, d, seed=b + t + d, norm=norm)
    want = qk_norm_rope_reference(*args, num_kv_heads=hkv, eps=EPS)
    got = self.run(*args, num_kv_heads=hkv, eps=EPS)
    assert got.shape == (b, t, hq + 2 * hkv, d) and got.dtype == jnp.bfloat16
    assert_close(got, want)
    np.testing.assert_array_equal(np.asarray(got[:, :, hq + hkv:]), np.asarray(want[:, :, hq + hkv:]))  # v: as is
    for part, want_part in zip(self.run(*args, num_kv_heads=hkv, eps=EPS, split=True), unpack_heads(want, hkv)):
      assert_close(part, want_part)


class TestMosaicGpuInterpret(QkNormRopeSuite):
  def run(self, *args, **kwargs):
    return rope_mosaic_gpu.qk_norm_rope(*args, **kwargs, interpret=INTERPRET)

  def test_float16_heads(self):
    """f16, the kernel's other activation dtype (the suite runs bf16 only), norms in f16 too."""
    qkv, qn, kn, cos, sin = inputs(2, 2, 2, 1, 128, seed=3)
    qkv, qn, kn = (a.astype(jnp.float16) for a in (qkv, qn, kn))
    got = self.run(qkv, qn, kn, cos, sin, num_kv_heads=1, eps=EPS)
    assert got.dtype == jnp.float16
    assert_close(got, qk_norm_rope_reference(qkv, qn, kn, cos, sin, num_kv_heads=1, eps=EPS))

  def test_unsupported_and_bad_inputs(self):
    qkv, qn, kn, cos, sin = inputs(1, 2, 4, 2, 128, seed=1)
    with pytest.raises(NotImplementedError, match="16-bit"):
      self.run(qkv.astype(jnp.float32), qn, kn, cos, sin, num_kv_heads=2, eps=EPS)
    small = inputs(1, 2, 4, 2, 64, seed=1)
    with pytest.raises(NotImplementedError, match="head_dim 64 is not a multiple of 128"):
      self.run(*small, num_kv_heads=2, eps=EPS)
    with pytest.raises(ValueError, match=r"cos \(1, 1, 128\)"):
      self.run(qkv, qn, kn, cos[:, :1], sin[:, :1], num_kv_heads=2, eps=EPS)
    with pytest.raises(ValueError, match="not q heads plus 2 x 4 kv heads"):
      self.run(qkv, qn, kn, cos, sin, num_kv_heads=4, eps=EPS)
    with pytest.raises(ValueError, match="both q_norm and k_norm"):
      self.run(qkv, qn, None, cos, sin, num_kv_heads=2, eps=EPS)
    with pytest.raises(ValueError, match=r"k_norm has shape \(64,\)"):
      self.run(qkv, qn, kn[:64], cos, sin, num_kv_heads=2, eps=EPS)


def projection(t, k, hq, hkv, d, split, seed, interpret=True):
  """A skinny matmul's q|k|v projection of ``t`` token rows, unsummed (``SplitKPartials``) and summed."""
  rng = np.random.default_rng(seed)
  a = tm.on_device(rng.normal(size=(1, t, k)))
  w = tm.on_device(rng.normal(size=(k, (hq + 2 * hkv) * d)) / np.sqrt(k))

  def matmul(reduce):
    return skinny_mosaic_gpu.skinny_matmul(a, w, config=SkinnyConfig(split_k=split), reduce=reduce,
                                           interpret=INTERPRET if interpret else None)

  return matmul


@pytest.mark.parametrize("t,split", [(1, 2), (3, 4)])
def test_kernel_adds_split_k_partials_as_their_sum_would(t, split):
  """The q|k|v projection's K splits go into the kernel unsummed: v's heads equal the summed projection's bit for
  bit, and q's and k's match the reference on the sum."""
  matmul = projection(t, 512, 4, 2, 128, split, seed=t)
  partials = matmul(reduce=False)
  assert isinstance(partials, SplitKPartials) and partials.num_splits == split
  _, qn, kn, cos, sin = inputs(1, t, 4, 2, 128, seed=t)
  got = rope_mosaic_gpu.qk_norm_rope(partials, qn, kn, cos, sin, num_kv_heads=2, eps=EPS, interpret=INTERPRET)
  want = qk_norm_rope_reference(matmul(reduce=True), qn, kn, cos, sin, num_kv_heads=2, eps=EPS)
  assert_close(got, want)
  np.testing.assert_array_equal(np.asarray(got[:, :, 6:]), np.asarray(want[:, :, 6:]))
  assert_close(qk_norm_rope_reference(partials, qn, kn, cos, sin, num_kv_heads=2, eps=EPS), want)


@pytest.mark.parametrize("t,split_k,split", [(1, 2, True), (16, 0, False)])
def test_hopper_lowering_at_qwen3_shapes(t, split_k, split):
  """Qwen3-8B's q|k|v (32 q heads, 8 kv heads of 128): an AR step's (one token, two K splits, three outputs) and a
  16-row verify's (summed, packed), lowered for sm_90."""
  matmul = projection(t, 4096, 32, 8, 128, split_k, seed=0, interpret=False)
  qkv = jax.eval_shape(lambda: matmul(reduce=False))
  _, qn, kn, cos, sin = inputs(1, t, 4, 2, 128, seed=0)

  def run(qkv, qn, kn, cos, sin):
    return rope_mosaic_gpu.qk_norm_rope(qkv, qn, kn, cos, sin, num_kv_heads=8, eps=EPS, split=split)

  if isinstance(qkv, SplitKPartials):
    qkv = SplitKPartials(jnp.zeros(qkv.halves.shape, qkv.halves.dtype), qkv.lead, qkv.dtype)
  else:
    qkv = jnp.zeros(qkv.shape, qkv.dtype)
  assert "mosaic_gpu" in jax.jit(run).trace(qkv, qn, kn, cos, sin).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.gpu
@pytest.mark.skipif(not rope_ops._on_hopper(), reason="needs an H100/H200")
class TestMosaicGpu(QkNormRopeSuite):
  def run(self, *args, **kwargs):
    return jax.jit(lambda *a: qk_norm_rope(*a, **kwargs, implementation="mosaic_gpu"))(*args)

  @pytest.mark.parametrize("t,split", [(1, 2), (16, 4)])
  def test_split_k_partials_at_qwen3_shapes(self, t, split):
    matmul = projection(t, 4096, 32, 8, 128, split, seed=t, interpret=False)
    _, qn, kn, cos, sin = inputs(1, t, 32, 8, 128, seed=t)
    run = jax.jit(lambda *a: qk_norm_rope(matmul(reduce=False), *a, num_kv_heads=8, eps=EPS,
                                          implementation="mosaic_gpu"))
    want = qk_norm_rope_reference(jax.jit(lambda: matmul(reduce=True))(), qn, kn, cos, sin, num_kv_heads=8, eps=EPS)
    assert_close(run(qn, kn, cos, sin), want)


def test_dispatch_is_the_reference_off_hopper_and_refuses_unknown_names(monkeypatch):
  args = inputs(1, 2, 4, 2, 64, seed=3)
  monkeypatch.setattr(rope_ops, "DEFAULT", "mosaic_gpu")
  monkeypatch.setattr(rope_ops, "_on_hopper", lambda: False)
  want = qk_norm_rope_reference(*args, num_kv_heads=2, eps=EPS)
  np.testing.assert_array_equal(np.asarray(qk_norm_rope(*args, num_kv_heads=2, eps=EPS)), np.asarray(want))
  for got, part in zip(qk_norm_rope(*args, num_kv_heads=2, eps=EPS, split=True), unpack_heads(want, 2)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(part))
  with pytest.raises(ValueError, match="unknown qk_norm_rope implementation 'triton'"):
    qk_norm_rope(*args, num_kv_heads=2, eps=EPS, implementation="triton")


@pytest.mark.parametrize("t,d,dtype", [(2, 64, jnp.bfloat16), (2, 128, jnp.float32), (0, 128, jnp.bfloat16)])
def test_dispatch_falls_back_loudly_on_hopper_for_what_the_kernel_does_not_tile(monkeypatch, caplog, t, d, dtype):
  """On a Hopper with the kernel chosen, a head size off 128, f32 heads or no tokens (an empty grid) run the
  reference, with a warning."""
  qkv, qn, kn, cos, sin = inputs(1, t, 4, 2, d, seed=4)
  args = (qkv.astype(dtype), qn, kn, cos, sin)
  monkeypatch.setattr(rope_ops, "DEFAULT", "mosaic_gpu")
  monkeypatch.setattr(rope_ops, "_on_hopper", lambda: True)
  with caplog.at_level(logging.WARNING, logger=rope_ops.__name__):
    got = qk_norm_rope(*args, num_kv_heads=2, eps=EPS, split=True)
  assert "falls back to XLA" in caplog.text
  for a, b in zip(got, unpack_heads(qk_norm_rope_reference(*args, num_kv_heads=2, eps=EPS), 2)):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))

@pytest.mark.parametrize("t,attention", [(1, "pallas_tree"), (2, "pallas_tree"), (2, "xla")])
def test_model_runs_the_kernel_on_the_qkv_projection(monkeypatch, t, attention):
  """With the skinny kernel and this kernel chosen (interpret mode), a target forward hands the q|k|v projection to
  the kernel (unsummed: at a few rows the skinny kernel splits K), as three arrays where the attention reads
  them apart and packed for the tree-attention kernel above one token; its logits and new K/V match the XLA path's."""
  from pallas_kernels.skinny_matmul import ops as skinny_ops
  from specpilot.models import target

  seen = []

  def rope_kernel(*args, **kwargs):
    seen.append((type(args[0]).__name__, kwargs["split"]))
    return rope_mosaic_gpu.qk_norm_rope(*args, **kwargs, interpret=INTERPRET)

  cfg = tm.target_config(vocab=32, hidden=512, layers=1, heads=4, kv_heads=2, head_dim=128, intermediate=512)
  w, cache = tm.bf16_step_inputs(cfg)
  tokens = jnp.asarray([[3, 7][:t]], jnp.int32)

  def run():
    out = target.forward(w, cfg, tokens, cache.lengths[:, None] + jnp.arange(t)[None], cache, attention=attention)
    return out.logits, out.cache.k

  want, got = tm.xla_then_kernels(monkeypatch, {rope_ops: rope_kernel, skinny_ops: tm.interpreted_skinny}, run)
  packed = attention == "pallas_tree" and t > 1
  assert seen == [("SplitKPartials", not packed)]  # a few rows: the skinny kernel splits K
  np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), atol=0.05, rtol=0.02)
  assert_close(got[1][0, 0, 5:5 + t], want[1][0, 0, 5:5 + t])  # this step's keys, as the cache holds them
