"""The SwiGLU kernel against its jnp reference (the models' activation): in Pallas GPU-interpret mode on CPU, on the
gate|up projection's padded output and its K splits, cross-lowered for sm_90, inside the model, and on an H100/H200
(marked gpu)."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

import models as tm
from pallas_kernels.skinny_matmul import TuningConfig as SkinnyConfig
from pallas_kernels.skinny_matmul import mosaic_gpu as skinny_mosaic_gpu
from pallas_kernels.split_k import SplitKPartials
from pallas_kernels.swiglu import swiglu, swiglu_reference
from pallas_kernels.swiglu import mosaic_gpu as swiglu_mosaic_gpu
from pallas_kernels.swiglu import ops as swiglu_ops

INTERPRET = plgpu.InterpretGPUParams()


def gate_up_rows(lead, inter, seed, dtype=jnp.bfloat16):
  # gates over several decades and both signs: silu's tails and its near-zero region both show
  rng = np.random.default_rng(seed)
  gate = rng.normal(size=(*lead, inter)) * np.exp(rng.uniform(-4, 2.5, (*lead, inter)))
  up = rng.normal(size=(*lead, inter))
  return tm.on_device(np.concatenate([gate, up], axis=-1), dtype)


def assert_close(got, want):
  """Equal but for the f32 exponential's last bit, which can move a rounding to bf16 by one step."""
  a, b = np.asarray(got, np.float32), np.asarray(want, np.float32)
  assert got.shape == want.shape and got.dtype == want.dtype
  assert np.all(np.abs(a - b) <= 2.0 ** -7 * np.abs(b)), np.max(np.abs(a - b) / (np.abs(b) + 1e-30))
  assert np.mean(a == b) > 0.99


def test_reference_is_silu_gate_times_up_rounded_once():
  gate_up = gate_up_rows((3,), 256, seed=0)
  gate, up = (np.asarray(p, np.float64) for p in jnp.split(gate_up.astype(jnp.float32), 2, axis=-1))
  want = (gate / (1 + np.exp(-gate)) * up).astype(np.float32)
  got = np.asarray(swiglu_reference(gate_up), np.float32)
  np.testing.assert_allclose(got, want, rtol=2.0 ** -8, atol=0)


class SwigluSuite:
  def run(self, gate_up):
    raise NotImplementedError

  @pytest.mark.parametrize("lead,inter", [((1,), 12288), ((3,), 1024), ((2, 5), 2048)])
  def test_matches_reference(self, lead, inter):
    gate_up = gate_up_rows(lead, inter, seed=inter + len(lead))
    assert_close(self.run(gate_up), swiglu_reference(gate_up))


class TestMosaicGpuInterpret(SwigluSuite):
  def run(self, gate_up):
    return swiglu_mosaic_gpu.swiglu(gate_up, interpret=INTERPRET)

  def test_float16_rows(self):
    """f16, the kernel's other activation dtype (the suite runs bf16 only)."""
    gate_up = gate_up_rows((3,), 1024, seed=4, dtype=jnp.float16)
    assert_close(self.run(gate_up), swiglu_reference(gate_up))

  def test_unsupported_and_bad_inputs(self):
    gate_up = gate_up_rows((2,), 1024, seed=0)
    with pytest.raises(NotImplementedError, match="16-bit"):
      self.run(gate_up.astype(jnp.float32))
    with pytest.raises(NotImplementedError, match="multiple of 1024"):
      self.run(gate_up[:, :1280])
    with pytest.raises(ValueError, match="odd width 2047"):
      self.run(gate_up[:, :2047])


def projection(m, k, inter, split, seed, interpret=True):
  """The skinny kernel's gate|up projection of ``m`` rows, unreduced (``SplitKPartials``) or reduced."""
  rng = np.random.default_rng(seed)
  x = tm.on_device(rng.normal(size=(m, k)))
  w = tm.on_device(rng.normal(size=(k, 2 * inter)) * 3 / np.sqrt(k))
  return lambda reduce: skinny_mosaic_gpu.skinny_matmul(x, w, config=SkinnyConfig(split_k=split), reduce=reduce,
                                                        interpret=INTERPRET if interpret else None)


@pytest.mark.parametrize("m,split", [(1, 1), (3, 2)])
def test_kernel_reads_the_projection_as_the_skinny_kernel_wrote_it(m, split):
  """Unsplit, the skinny kernel hands over its padded output ([1, 1, Mp, N]); split, its K splits: the kernel's
  result equals the activation of the reduced projection either way."""
  matmul = projection(m, 256, 1024, split, seed=split)
  partials = matmul(reduce=False)
  assert isinstance(partials, SplitKPartials) and partials.num_splits == split
  assert partials.halves.shape[:2] == ((1, 1) if split == 1 else (split, 2))
  reduced = matmul(reduce=True)
  np.testing.assert_array_equal(np.asarray(partials.sum(), np.float32), np.asarray(reduced, np.float32))
  want = swiglu_reference(reduced)
  assert_close(swiglu_mosaic_gpu.swiglu(partials, interpret=INTERPRET), want)
  np.testing.assert_array_equal(np.asarray(swiglu_reference(partials), np.float32), np.asarray(want, np.float32))


@pytest.mark.parametrize("m", [1, 8])
def test_hopper_lowering_at_qwen3_shapes(m):
  """A Qwen3-8B decode step's gate|up output (4096 -> 2 x 12288, K unsplit) into the kernel, lowered for sm_90."""
  partials = jax.eval_shape(lambda: projection(m, 4096, 12288, 1, seed=0, interpret=False)(False))
  assert partials.halves.shape == (1, 1, 8, 24576)
  halves = jnp.zeros(partials.halves.shape, partials.halves.dtype)
  run = jax.jit(lambda p: swiglu_mosaic_gpu.swiglu(SplitKPartials(p, (m,), "bfloat16")))
  assert "mosaic_gpu" in run.trace(halves).lower(lowering_platforms=("cuda",)).as_text()


def test_dispatch_is_the_reference_off_hopper_and_refuses_unknown_names(monkeypatch):
  gate_up = gate_up_rows((2,), 1024, seed=3)
  monkeypatch.setattr(swiglu_ops, "DEFAULT", "mosaic_gpu")
  monkeypatch.setattr(swiglu_ops, "_on_hopper", lambda: False)
  np.testing.assert_array_equal(np.asarray(swiglu(gate_up), np.float32),
                                np.asarray(swiglu_reference(gate_up), np.float32))
  with pytest.raises(ValueError, match="unknown swiglu implementation 'triton'"):
    swiglu(gate_up, implementation="triton")


@pytest.mark.parametrize("lead,inter,dtype", [((2,), 640, jnp.bfloat16), ((2,), 1024, jnp.float32),
                                              ((0,), 1024, jnp.bfloat16)])
def test_dispatch_falls_back_loudly_on_hopper_for_what_the_kernel_does_not_tile(monkeypatch, caplog, lead, inter,
                                                                                 dtype):
  """On a Hopper with the kernel chosen, an intermediate size off 1024, f32 rows or no rows (an empty grid) run the
  reference, with a warning."""
  gate_up = gate_up_rows(lead, inter, seed=5, dtype=dtype)
  monkeypatch.setattr(swiglu_ops, "DEFAULT", "mosaic_gpu")
  monkeypatch.setattr(swiglu_ops, "_on_hopper", lambda: True)
  with caplog.at_level(logging.WARNING, logger=swiglu_ops.__name__):
    got = swiglu(gate_up)
  assert "falls back to XLA" in caplog.text
  np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(swiglu_reference(gate_up), np.float32))

def test_model_runs_the_kernel_on_the_gate_up_projection(monkeypatch):
  """With the skinny kernel and the SwiGLU kernel chosen (interpret mode), the layer's gate|up output reaches the
  SwiGLU kernel as the skinny kernel wrote it (here its K splits; the unsplit form is the test above's), and the
  forward's logits match the XLA path's."""
  from pallas_kernels.skinny_matmul import ops as skinny_ops
  from specpilot.models import target

  seen = []

  def swiglu_kernel(gate_up):
    seen.append(gate_up.halves.shape[:2] if isinstance(gate_up, SplitKPartials) else type(gate_up).__name__)
    return swiglu_mosaic_gpu.swiglu(gate_up, interpret=INTERPRET)

  cfg = tm.target_config(vocab=32, hidden=256, layers=1, heads=2, kv_heads=1, head_dim=128, intermediate=1024)
  w, cache = tm.bf16_step_inputs(cfg)
  tokens = jnp.asarray([[3]], jnp.int32)

  def run():
    return target.forward(w, cfg, tokens, cache.lengths[:, None], cache).logits

  want, got = tm.xla_then_kernels(monkeypatch, {swiglu_ops: swiglu_kernel, skinny_ops: tm.interpreted_skinny}, run)
  assert seen == [(2, 2)]  # the gate|up kernel's two K splits, unsummed (32 channel blocks: K split to fill the SMs)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=0.05, rtol=0.02)


@pytest.mark.gpu
@pytest.mark.skipif(not swiglu_ops._on_hopper(), reason="needs an H100/H200")
class TestMosaicGpu(SwigluSuite):
  def run(self, gate_up):
    return jax.jit(lambda g: swiglu(g, implementation="mosaic_gpu"))(gate_up)

  @pytest.mark.parametrize("m", [1, 8])
  def test_qwen3_8b_gate_up_output(self, m):
    matmul = projection(m, 4096, 12288, 1, seed=m, interpret=False)
    got = jax.jit(lambda: swiglu(matmul(reduce=False), implementation="mosaic_gpu"))()
    assert_close(got, swiglu_reference(jax.jit(lambda: matmul(reduce=True))()))
