"""The residual add + RMSNorm kernel against its jnp reference (the model's own norm): in Pallas GPU-interpret mode
on CPU, cross-lowered for sm_90, and on an H100/H200 (marked gpu)."""

import logging

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

import models as tm
from pallas_kernels.add_rms_norm import add_rms_norm, add_rms_norm_reference
from pallas_kernels.add_rms_norm.reference import rms_norm
from pallas_kernels.add_rms_norm import mosaic_gpu as norm_mosaic_gpu
from pallas_kernels.add_rms_norm import ops as norm_ops
from pallas_kernels.skinny_matmul import TuningConfig as SkinnyConfig
from pallas_kernels.skinny_matmul import mosaic_gpu as skinny_mosaic_gpu
from pallas_kernels.split_k import SplitKPartials

EPS = 1e-6
BF16 = ml_dtypes.bfloat16


def inputs(lead, h, seed, with_delta=True, dtype=jnp.bfloat16):
  rng = np.random.default_rng(seed)
  # rows of very different scales, so a wrong per-row statistic shows
  x = rng.normal(size=(*lead, h)) * np.exp(rng.uniform(-3, 3, (*lead, 1)))
  delta = rng.normal(size=(*lead, h)) if with_delta else None
  w = 1.0 + 0.1 * rng.normal(size=h)
  return tm.on_device(x, dtype), None if delta is None else tm.on_device(delta, dtype), tm.on_device(w, dtype)


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
  np.testing.assert_array_equal(np.asarray(out), np.asarray(rms_norm(x + delta, w, EPS)))
  s, out = add_rms_norm_reference(x, None, w, EPS)
  assert s is x and np.array_equal(np.asarray(out), np.asarray(rms_norm(x, w, EPS)))



def test_reference_is_hf_qwen3_rms_norm_in_numpy():
  """The reference against HF's Qwen3RMSNorm written in numpy: the bf16 add, the mean of squares in f32 (here f64),
  ``eps`` inside the square root, the normed row rounded to bf16, then the weight's product rounded once. Some rows
  are so small that ``eps`` dominates their statistic, so ``eps`` outside the root (or left out) shows."""
  rng = np.random.default_rng(0)
  scale = np.exp(rng.uniform(-12, 3, (6, 1)))  # mean squares from ~4e-11 (eps-dominated) to ~4e2
  x = (rng.normal(size=(6, 256)) * scale).astype(BF16)
  delta = (rng.normal(size=(6, 256)) * scale).astype(BF16)
  w = (1.0 + 0.1 * rng.normal(size=256)).astype(BF16)
  s64 = (x.astype(np.float32) + delta.astype(np.float32)).astype(BF16).astype(np.float64)
  normed = (s64 / np.sqrt(np.mean(s64 * s64, -1, keepdims=True) + EPS)).astype(BF16)
  want = (w.astype(np.float32) * normed.astype(np.float32)).astype(BF16).astype(np.float32)
  s, out = add_rms_norm_reference(jnp.asarray(x), jnp.asarray(delta), jnp.asarray(w), EPS)
  np.testing.assert_array_equal(np.asarray(s, np.float32), s64.astype(np.float32))
  got = np.asarray(out, np.float32)
  assert out.dtype == jnp.bfloat16
  assert np.all(np.abs(got - want) <= 2.0 ** -8 * np.abs(want)), np.max(np.abs(got - want) / np.abs(want))
  assert np.mean(got == want) > 0.99

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


  @pytest.mark.parametrize("lead,p,with_delta", [((2, 3), 4, True), ((1, 16), 8, True), ((2, 5), 1, False)])
  def test_prefix_rows_come_before_each_requests_normed_rows(self, lead, p, with_delta):
    """``prefix`` rows skip the norm and land, copied, ahead of each request's normed rows."""
    x, delta, w = inputs(lead, 1024, seed=p, with_delta=with_delta)
    prefix = jax.random.normal(jax.random.key(p + 7), (lead[0], p, 1024)).astype(x.dtype)
    got = self.run(x, delta, w, prefix=prefix)
    assert got[0].shape == x.shape and got[1].shape == (lead[0], p + lead[1], 1024)
    np.testing.assert_array_equal(np.asarray(got[1][:, :p], np.float32), np.asarray(prefix, np.float32))
    assert_close_to_reference((got[0], got[1][:, p:]), add_rms_norm_reference(x, delta, w, EPS))
    assert_close_to_reference(got, add_rms_norm_reference(x, delta, w, EPS, prefix))


class TestMosaicGpuInterpret(AddRmsNormSuite):
  def run(self, x, delta, w, prefix=None):
    return norm_mosaic_gpu.add_rms_norm(x, delta, w, EPS, prefix=prefix, interpret=plgpu.InterpretGPUParams())

  def test_float16_rows(self):
    """f16, the kernel's other activation dtype, with a prefix (the suite runs bf16 only)."""
    x, delta, w = inputs((2, 3), 1024, seed=5, dtype=jnp.float16)
    prefix = jax.random.normal(jax.random.key(6), (2, 2, 1024)).astype(jnp.float16)
    got = self.run(x, delta, w, prefix=prefix)
    assert got[0].dtype == got[1].dtype == jnp.float16
    assert_close_to_reference(got, add_rms_norm_reference(x, delta, w, EPS, prefix))

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
    with pytest.raises(ValueError, match=r"prefix \(2, 1024\) float32 does not fit x \(2, 1024\) bfloat16"):
      self.run(x, delta, w, prefix=x.astype(jnp.float32))
    with pytest.raises(ValueError, match=r"prefix \(1, 2, 512\)"):
      self.run(x[None], delta[None], w, prefix=x[None, :, :512])
    with pytest.raises(ValueError, match=r"prefix \(3, 2, 1024\)"):  # another request count
      self.run(x[None], delta[None], w, prefix=jnp.stack([x] * 3))


@pytest.mark.gpu
@pytest.mark.skipif(not norm_ops._on_hopper(), reason="needs an H100/H200")
class TestMosaicGpu(AddRmsNormSuite):
  def run(self, x, delta, w, prefix=None):
    return jax.jit(lambda x, d, w, p: add_rms_norm(x, d, w, EPS, prefix=p, implementation="mosaic_gpu"))(
        x, delta, w, prefix)

  @pytest.mark.parametrize("m,split", [(1, 4), (8, 3)])
  def test_split_k_partials(self, m, split):
    x, matmul = split_k_update(m, 3072, 4096, split, seed=m, interpret=False)
    w = (1.0 + 0.1 * jax.random.normal(jax.random.key(9), (4096,))).astype(jnp.bfloat16)
    got = jax.jit(lambda x, w: add_rms_norm(x, matmul(reduce=False), w, EPS, implementation="mosaic_gpu"))(x, w)
    assert_close_to_reference(got, add_rms_norm_reference(x, jax.jit(lambda: matmul(reduce=True))(), w, EPS))


@pytest.mark.parametrize("m,with_delta", [(1, True), (256, True), (1, False)])
def test_hopper_lowering_at_qwen3_shapes(m, with_delta):
  x, delta, w = inputs((m,), 4096, seed=1, with_delta=with_delta)
  run = jax.jit(lambda x, d, w: norm_mosaic_gpu.add_rms_norm(x, d, w, EPS))
  assert "mosaic_gpu" in run.trace(x, delta, w).lower(lowering_platforms=("cuda",)).as_text()


def test_hopper_lowering_with_prefix_rows_at_drafter_shapes():
  """A DFlash round's input norm: 16 block rows normed behind 8 context rows, lowered for sm_90."""
  x, delta, w = inputs((1, 16), 4096, seed=2)
  run = jax.jit(lambda x, d, w, p: norm_mosaic_gpu.add_rms_norm(x, d, w, EPS, prefix=p))
  assert "mosaic_gpu" in run.trace(x, delta, w, x[:, :8]).lower(lowering_platforms=("cuda",)).as_text()


def split_k_update(m, k, h, split, seed, interpret=True):
  """A skinny matmul's unsummed ``[*m, h]`` output (``SplitKPartials``) and the residual rows it updates; ``m`` an
  int or a leading shape."""
  lead = (m,) if isinstance(m, int) else tuple(m)
  rng = np.random.default_rng(seed)
  a, w, x = map(tm.on_device, (rng.normal(size=(*lead, k)), rng.normal(size=(k, h)) / np.sqrt(k),
                               rng.normal(size=(*lead, h))))
  params = plgpu.InterpretGPUParams() if interpret else None

  def matmul(reduce):
    return skinny_mosaic_gpu.skinny_matmul(a, w, config=SkinnyConfig(split_k=split), interpret=params, reduce=reduce)

  return x, matmul


@pytest.mark.parametrize("m,split", [(1, 4), (3, 2), ((2, 3), 8), (2, 1)])  # 1: the padded result itself
def test_kernel_adds_split_k_partials_as_their_sum_would(m, split):
  """The o / down projections' K splits go into the kernel unsummed: its new residual rows equal the reference's
  (the splits added in order, rounded to bf16, added to the rows) bit for bit, and the normed rows match."""
  x, matmul = split_k_update(m, 1024, 1024, split, seed=split)
  partials = matmul(reduce=False)
  assert isinstance(partials, SplitKPartials) and partials.num_splits == split and partials.shape == x.shape
  np.testing.assert_array_equal(np.asarray(partials.sum(), np.float32), np.asarray(matmul(reduce=True), np.float32))
  w = (1.0 + 0.1 * jax.random.normal(jax.random.key(9), (1024,))).astype(jnp.bfloat16)
  got = norm_mosaic_gpu.add_rms_norm(x, partials, w, EPS, interpret=plgpu.InterpretGPUParams())
  want = add_rms_norm_reference(x, partials.sum(), w, EPS)
  assert_close_to_reference(got, want)
  assert_close_to_reference(add_rms_norm_reference(x, partials, w, EPS), want)


def test_split_k_partials_of_another_dtype_or_shape_are_refused():
  x, matmul = split_k_update(1, 1024, 1024, 2, seed=0)
  partials = matmul(reduce=False)
  w = jnp.ones((1024,), jnp.bfloat16)
  with pytest.raises(ValueError, match="split-K update is float16"):
    norm_mosaic_gpu.add_rms_norm(x, SplitKPartials(partials.halves, (1,), "float16"), w, EPS)
  with pytest.raises(ValueError, match=r"delta \(2, 1024\) does not match"):
    norm_mosaic_gpu.add_rms_norm(x, SplitKPartials(partials.halves, (2,), "bfloat16"), w, EPS)


def test_hopper_lowering_with_split_k_partials_at_qwen3_shapes():
  """An AR step's o projection (K = 4096, split 4) into the add + norm kernel, lowered for sm_90."""
  x, matmul = split_k_update(1, 4096, 4096, 4, seed=2, interpret=False)
  partials = jax.eval_shape(lambda: matmul(reduce=False))
  assert isinstance(partials, SplitKPartials) and partials.halves.shape == (4, 2, 8, 4096)
  halves = jnp.zeros(partials.halves.shape, partials.halves.dtype)
  run = jax.jit(lambda x, p, w: norm_mosaic_gpu.add_rms_norm(x, SplitKPartials(p, (1,), "bfloat16"), w, EPS))
  assert "mosaic_gpu" in run.trace(x, halves, jnp.ones((4096,), jnp.bfloat16)).lower(
      lowering_platforms=("cuda",)).as_text()


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


@pytest.mark.parametrize("lead,h,dtype", [((2,), 640, jnp.bfloat16), ((2,), 1024, jnp.float32),
                                          ((2, 0), 1024, jnp.bfloat16)])
def test_dispatch_falls_back_loudly_on_hopper_for_what_the_kernel_does_not_tile(monkeypatch, caplog, lead, h, dtype):
  """On a Hopper with the kernel chosen, a hidden size off 1024, f32 rows or no rows at all (an empty grid) run the
  reference, with a warning."""
  x, delta, w = inputs(lead, h, seed=4, dtype=dtype)
  monkeypatch.setattr(norm_ops, "DEFAULT", "mosaic_gpu")
  monkeypatch.setattr(norm_ops, "_on_hopper", lambda: True)
  with caplog.at_level(logging.WARNING, logger=norm_ops.__name__):
    got = add_rms_norm(x, delta, w, EPS)
  assert "falls back to XLA" in caplog.text
  for a, b in zip(got, add_rms_norm_reference(x, delta, w, EPS)):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_kernel_inside_the_model_in_interpret_mode(monkeypatch):
    """A bf16 model forward with every residual add and norm on the kernel (interpret mode): the hidden states it
    returns and its logits match the XLA path's, and the kernel ran at each of the layers' adds."""
    from specpilot.models import target

    calls = []

    def kernel(x, delta, w, eps, prefix=None):
        calls.append(delta is None)
        return norm_mosaic_gpu.add_rms_norm(x, delta, w, eps, prefix=prefix, interpret=plgpu.InterpretGPUParams())

    cfg = tm.target_config(vocab=32, hidden=512, layers=2, heads=4, kv_heads=2, head_dim=128)
    w, cache = tm.bf16_step_inputs(cfg)
    tokens = jnp.asarray([[3, 7]], jnp.int32)

    def run():
        out = target.forward(w, cfg, tokens, cache.lengths[:, None] + jnp.arange(2)[None], cache, None, (0, 1))
        return out.logits, out.hidden

    (want_logits, want_hidden), (got_logits, got_hidden) = tm.xla_then_kernels(monkeypatch, {norm_ops: kernel}, run)
    assert calls == [True, False, False, False, False]  # the first layer's norm has no add; then 2 adds a layer
    np.testing.assert_allclose(np.asarray(got_hidden, np.float32), np.asarray(want_hidden, np.float32), rtol=0.02,
                               atol=0.02)  # the streams after layers 0 and 1 (the last one final-normed)
    np.testing.assert_allclose(np.asarray(got_logits), np.asarray(want_logits), atol=0.05, rtol=0.02)


def test_model_hands_the_o_and_down_splits_to_the_kernel(monkeypatch):
  """With the skinny kernel and the add + norm kernel both chosen (interpret mode), the o and down projections reach
  the norm kernel as unsummed K splits, and the forward's logits match the XLA path's."""
  from pallas_kernels.skinny_matmul import ops as skinny_ops
  from specpilot.models import target

  deltas = []

  def norm_kernel(x, delta, w, eps, prefix=None):
    deltas.append(type(delta).__name__)
    return norm_mosaic_gpu.add_rms_norm(x, delta, w, eps, prefix=prefix, interpret=plgpu.InterpretGPUParams())

  cfg = tm.target_config(vocab=32, hidden=512, layers=1, heads=4, kv_heads=2, head_dim=128, intermediate=512)
  w, cache = tm.bf16_step_inputs(cfg)
  tokens = jnp.asarray([[3]], jnp.int32)

  def run():
    return target.forward(w, cfg, tokens, cache.lengths[:, None], cache).logits

  want, got = tm.xla_then_kernels(monkeypatch, {norm_ops: norm_kernel, skinny_ops: tm.interpreted_skinny}, run)
  assert deltas == ["NoneType", "SplitKPartials", "SplitKPartials"]  # input norm, then after o and after down
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=0.05, rtol=0.02)


def test_drafter_hands_its_residual_updates_to_the_kernel(monkeypatch):
  """The DFlash drafter's residual adds and norms run on the add + norm kernel as the target's do (interpret mode,
  with the skinny kernel at the block's 8 rows), in a round (``ingest_and_draft``: ``draft_logits`` is the same pass
  without the new context rows): the input norm of layer 0, then the o and down projections' K splits unsummed, the
  last into the final norm, the new context rows riding each input norm's output as its prefix; the logits and the
  new context match the XLA path's."""
  from pallas_kernels.skinny_matmul import ops as skinny_ops
  from specpilot.models import dflash
  from specpilot.models.kv_cache import KVCache

  deltas = []

  def norm_kernel(x, delta, w, eps, prefix=None):
    deltas.append(type(delta).__name__ + ("+prefix" if prefix is not None else ""))
    return norm_mosaic_gpu.add_rms_norm(x, delta, w, eps, prefix=prefix, interpret=plgpu.InterpretGPUParams())

  tcfg = tm.target_config(vocab=32, hidden=512, layers=2, heads=4, kv_heads=2, head_dim=128, intermediate=512)
  dlayers = tm.drafter_layers_config(tcfg, num_layers=2, heads=4, kv_heads=2, head_dim=128)
  _, tw, dcfg, dw = tm.random_pair(tcfg, block_size=8, drafter_layers=dlayers, dtype=jnp.bfloat16)
  kv = np.random.default_rng(0).normal(size=(2, 2, 1, 16, 2, 128))
  ctx = KVCache(k=jnp.asarray(kv[0], jnp.bfloat16), v=jnp.asarray(kv[1], jnp.bfloat16),
                lengths=jnp.asarray([5], jnp.int32))
  block = jnp.asarray([[3] + [dcfg.mask_token_id] * 7], jnp.int32)

  feats = jax.random.normal(jax.random.key(5), (1, 4, 2 * 512)).astype(jnp.bfloat16)
  n_new = jnp.asarray([3], jnp.int32)

  def run():
    logits, new_ctx = dflash.ingest_and_draft(dw, dcfg, tw.embed, tw.lm_head, ctx, feats, n_new, block)
    return logits, new_ctx.k

  want, got = tm.xla_then_kernels(monkeypatch, {norm_ops: norm_kernel, skinny_ops: tm.interpreted_skinny}, run)
  # layer 0's input norm, o, layer 1's input norm (layer 0's down), o, the final norm (layer 1's down); the fc
  # output's hidden norm is XLA's, before the layers
  assert deltas == ["NoneType+prefix", "SplitKPartials", "SplitKPartials+prefix", "SplitKPartials", "SplitKPartials"]
  for a, b in zip(got, want):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=0.05, rtol=0.02)
