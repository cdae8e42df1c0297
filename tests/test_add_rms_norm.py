"""The residual add + RMSNorm kernel against its jnp reference (the model's own norm): in Pallas GPU-interpret mode
on CPU, cross-lowered for sm_90, and on an H100/H200 (marked gpu)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.add_rms_norm import add_rms_norm, add_rms_norm_reference
from pallas_kernels.add_rms_norm import mosaic_gpu as norm_mosaic_gpu
from pallas_kernels.add_rms_norm import ops as norm_ops
from specpilot.models.target import rms_norm as model_rms_norm

EPS = 1e-6


def inputs(lead, h, seed, with_delta=True, dtype=jnp.bfloat16):
  k = jax.random.split(jax.random.key(seed), 3)
  # rows of very different scales, so a wrong per-row statistic shows
  x = (jax.random.normal(k[0], (*lead, h)) * jnp.exp(jax.random.uniform(k[1], (*lead, 1), minval=-3, maxval=3)))
  delta = jax.random.normal(k[2], (*lead, h)) if with_delta else None
  w = 1.0 + 0.1 * jax.random.normal(jax.random.key(seed + 1), (h,))
  return x.astype(dtype), None if delta is None else delta.astype(dtype), w.astype(dtype)


def assert_close_to_reference(got, want):
  s, out = got
  want_s, want_out = want
  np.testing.assert_array_equal(np.asarray(s, np.float32), np.asarray(want_s, np.float32))  # the add: exact
  # the normed rows: equal up to one rounding step where the f32 sum of squares is added in another order
  a, b = np.asarray(out, np.float32), np.asarray(want_out, np.float32)
  assert np.all(np.abs(a - b) <= 2.0 ** -7 * np.abs(b) + 1e-30), np.max(np.abs(a - b) / (np.abs(b) + 1e-30))
  assert np.mean(a == b) > 0.99


def test_reference_is_the_models_add_then_norm():
  x, delta, w = inputs((2, 3), 256, seed=0, dtype=jnp.float32)
  s, out = add_rms_norm_reference(x, delta, w, EPS)
  np.testing.assert_array_equal(np.asarray(s), np.asarray(x + delta))
  np.testing.assert_array_equal(np.asarray(out), np.asarray(model_rms_norm(x + delta, w, EPS)))
  s, out = add_rms_norm_reference(x, None, w, EPS)
  assert s is x and np.array_equal(np.asarray(out), np.asarray(model_rms_norm(x, w, EPS)))


class AddRmsNormSuite:
  def run(self, x, delta, w):
    raise NotImplementedError

  @pytest.mark.parametrize("lead,h,with_delta", [((1,), 4096, True), ((3,), 1024, True), ((2, 5), 2048, True),
                                                 ((4,), 1024, False)])
  def test_matches_reference(self, lead, h, with_delta):
    x, delta, w = inputs(lead, h, seed=h + len(lead), with_delta=with_delta)
    got = self.run(x, delta, w)
    assert got[0].shape == got[1].shape == x.shape and got[1].dtype == x.dtype
    assert_close_to_reference(got, add_rms_norm_reference(x, delta, w, EPS))


class TestMosaicGpuInterpret(AddRmsNormSuite):
  def run(self, x, delta, w):
    return norm_mosaic_gpu.add_rms_norm(x, delta, w, EPS, interpret=plgpu.InterpretGPUParams())

  def test_unsupported_and_bad_inputs(self):
    x, delta, w = inputs((2,), 1024, seed=0)
    with pytest.raises(NotImplementedError, match="16-bit"):
      self.run(x.astype(jnp.float32), delta.astype(jnp.float32), w)
    with pytest.raises(NotImplementedError, match="multiple of 1024"):
      self.run(x[:, :640], delta[:, :640], w[:640])
    with pytest.raises(ValueError, match="weight has shape"):
      self.run(x, delta, w[:512])
    with pytest.raises(ValueError, match="does not match"):
      self.run(x, delta[:1], w)


@pytest.mark.gpu
@pytest.mark.skipif(not norm_ops._on_hopper(), reason="needs an H100/H200")
class TestMosaicGpu(AddRmsNormSuite):
  def run(self, x, delta, w):
    return jax.jit(lambda x, d, w: add_rms_norm(x, d, w, EPS, implementation="mosaic_gpu"))(x, delta, w)


@pytest.mark.parametrize("m,with_delta", [(1, True), (256, True), (1, False)])
def test_hopper_lowering_at_qwen3_shapes(m, with_delta):
  x, delta, w = inputs((m,), 4096, seed=1, with_delta=with_delta)
  run = jax.jit(lambda x, d, w: norm_mosaic_gpu.add_rms_norm(x, d, w, EPS))
  assert "mosaic_gpu" in run.trace(x, delta, w).lower(lowering_platforms=("cuda",)).as_text()


def test_dispatch_is_the_reference_off_hopper_and_refuses_unknown_names(monkeypatch):
  x, delta, w = inputs((2,), 1024, seed=3, dtype=jnp.float32)
  monkeypatch.setattr(norm_ops, "DEFAULT", "mosaic_gpu")
  monkeypatch.setattr(norm_ops, "_on_hopper", lambda: False)
  got = add_rms_norm(x, delta, w, EPS)
  want = add_rms_norm_reference(x, delta, w, EPS)
  for a, b in zip(got, want):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(ValueError, match="unknown add_rms_norm implementation 'triton'"):
    add_rms_norm(x, delta, w, EPS, implementation="triton")


def test_kernel_inside_the_model_in_interpret_mode(monkeypatch):
    """A bf16 model forward with every residual add and norm on the kernel (interpret mode): the hidden states it
    returns and its logits match the XLA path's, and the kernel ran at each of the layers' adds."""
    from specpilot.models import target
    from specpilot.models.kv_cache import KVCache
    from specpilot.models.weights import init_random_target
    from tests import models as tm

    calls = []

    def kernel(x, delta, w, eps):
        calls.append(delta is None)
        return norm_mosaic_gpu.add_rms_norm(x, delta, w, eps, interpret=plgpu.InterpretGPUParams())

    cfg = tm.target_config(vocab=32, hidden=1024, layers=2, heads=8, kv_heads=2, head_dim=128)
    w = init_random_target(cfg, 1, jnp.bfloat16)
    rng = np.random.default_rng(0)
    kv = rng.normal(size=(2, cfg.num_layers, 1, 16, cfg.num_kv_heads, cfg.head_dim))
    cache = KVCache(k=jnp.asarray(kv[0], jnp.bfloat16), v=jnp.asarray(kv[1], jnp.bfloat16),
                    lengths=jnp.asarray([5], jnp.int32))
    tokens = jnp.asarray([[3, 7]], jnp.int32)

    def run():
        out = target.forward(w, cfg, tokens, cache.lengths[:, None] + jnp.arange(2)[None], cache, None, (0, 1))
        return out.logits, out.hidden

    want_logits, want_hidden = run()
    monkeypatch.setattr(norm_ops, "DEFAULT", "mosaic_gpu")
    monkeypatch.setattr(norm_ops, "_on_hopper", lambda: True)
    monkeypatch.setattr(norm_ops, "_mosaic_gpu", kernel)
    got_logits, got_hidden = run()
    assert calls == [True, False, False, False, False]  # the first layer's norm has no add; then 2 adds a layer
    np.testing.assert_allclose(np.asarray(got_hidden, np.float32), np.asarray(want_hidden, np.float32), rtol=0.02,
                               atol=0.02)  # the streams after layers 0 and 1 (the last one final-normed)
    np.testing.assert_allclose(np.asarray(got_logits), np.asarray(want_logits), atol=0.05, rtol=0.02)
