"""The gate|up projection with SwiGLU in its epilogue against its jnp reference (``swiglu(x @ w_gate_up)``): in Pallas
GPU-interpret mode on CPU, cross-lowered for sm_90, through the public dispatch and the weight-leaf dispatch, and on
an H100/H200 (marked gpu); for bf16 weights and for W12 ones (whose register decode has no interpret mode: lowered on
the CPU, run on the GPU)."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

import models as tm
from pallas_kernels import skinny_matmul, swiglu, w12
from pallas_kernels.swiglu_matmul import mosaic_gpu as sm_mosaic_gpu
from pallas_kernels.swiglu_matmul import ops as sm_ops
from pallas_kernels.swiglu_matmul import swiglu_matmul, swiglu_matmul_reference
from pallas_kernels.w12 import mosaic_gpu as w12_mosaic_gpu
from pallas_kernels.w12 import ops as w12_ops
from specpilot.models import weights

INTERPRET = plgpu.InterpretGPUParams()
Config = sm_mosaic_gpu.TuningConfig


def random_pair(lead, k, inter, seed):
  """bf16 ``x`` and ``w_gate_up`` whose gate channels span four decades of scale (silu's tails and its near-zero
  region both show) and whose up channels differ from the gate's, so a swapped or shifted column block shows."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(*lead, k))
  scale = np.exp(rng.uniform(np.log(1e-2), np.log(1e2), 2 * inter))
  w = rng.normal(size=(k, 2 * inter)) * scale / np.sqrt(k)
  return tm.on_device(x), tm.on_device(w)


def assert_close(got, x, w):
  """Equal to the reference but where the projection's f32 sums, added in another order, round to a neighbouring
  bf16 value: the difference then stays within what a bf16 step or two of gate and of up can move
  ``silu(gate) * up``, plus the output's own rounding (2^-7 let one of 12288 outputs through on the H200), plus what
  the sums' order moves where they cancel: an f32 sum of products is off by a few f32 steps of ``sum |x w|``, not of
  its value (2^-6 alone failed one output on the H200: gate -7.3e-6 from terms summing to 671 in magnitude)."""
  want = swiglu_matmul_reference(x, w)
  assert got.shape == want.shape and got.dtype == want.dtype
  x64, w64 = np.asarray(x, np.float64).reshape(-1, x.shape[-1]), np.asarray(w, np.float64)
  gate, up = np.split(x64 @ w64, 2, axis=-1)
  gate_terms, up_terms = np.split(np.abs(x64) @ np.abs(w64), 2, axis=-1)
  sig = 1 / (1 + np.exp(-gate))
  d_gate, d_up = np.abs(sig * (1 + gate * (1 - sig)) * up), np.abs(gate * sig)  # d out / d gate, d out / d up
  sensitivity = d_gate * np.abs(gate) + d_up * np.abs(up)
  order = 2.0**-20 * (d_gate * gate_terms + d_up * up_terms)
  a = np.asarray(got, np.float64).reshape(gate.shape)
  b = np.asarray(want, np.float64).reshape(gate.shape)
  bad = np.abs(a - b) > 2.0**-6 * (sensitivity + np.abs(b)) + order + 1e-30
  assert not bad.any(), f"{bad.sum()} of {bad.size} outputs off, first at {np.argwhere(bad)[0]}"
  assert np.mean(a == b) > 0.95


class SwigluMatmulSuite:
  def run(self, x, w, config):
    raise NotImplementedError

  @pytest.mark.parametrize(
      "lead,k,inter,config",
      [
          ((1,), 256, 128, Config()),  # decode: one row, 2 channel blocks x 2 K steps
          ((5,), 384, 192, Config(max_concurrent_steps=2)),  # 3 K steps through 2 slots: slots refilled
          ((20,), 256, 64, Config(tile_m=8, tile_k=64)),  # 3 token blocks, 4 steps
          ((2, 3), 512, 128, Config(tile_k=256, max_concurrent_steps=1)),  # leading dims, one slot
      ],
  )
  def test_matches_reference(self, lead, k, inter, config):
    x, w = random_pair(lead, k, inter, seed=k + inter + len(lead))
    assert_close(self.run(x, w, config), x, w)


class TestMosaicGpuInterpret(SwigluMatmulSuite):
  def run(self, x, w, config):
    return sm_mosaic_gpu.swiglu_matmul(x, w, config=config, interpret=INTERPRET)

  def test_unsupported_and_bad_inputs(self):
    x, w = random_pair((2,), 256, 128, seed=0)
    with pytest.raises(ValueError, match="x has 128 features, w_gate_up expects 256"):
      self.run(x[:, :128], w, None)
    with pytest.raises(ValueError, match="odd width 255"):
      self.run(x, w[:, :255], None)
    with pytest.raises(NotImplementedError, match="bf16"):
      self.run(x.astype(jnp.float32), w, None)
    with pytest.raises(NotImplementedError, match="intermediate size 96"):
      self.run(x, w[:, :192], None)
    with pytest.raises(NotImplementedError, match="K=192 is not a multiple of tile_k=128"):
      self.run(x[:, :192], w[:192], None)


def test_config_rejects_bad_tiles():
  with pytest.raises(ValueError, match="tile_m"):
    Config(tile_m=12)
  with pytest.raises(ValueError, match="tile_k"):
    Config(tile_k=96)
  with pytest.raises(ValueError, match="max_concurrent_steps"):
    Config(max_concurrent_steps=0)


@pytest.mark.parametrize("m", [1, 16])
def test_lowers_for_cuda_as_one_kernel_with_its_swiglu(m):
  """At Qwen3-8B's gate|up shape (4096 x 2 * 12288) the program is the one Mosaic GPU call: no XLA SwiGLU (no
  exponential) and no slice, pad or sum after it; the call writes the ``[M, I]`` activation itself."""
  sds = jax.ShapeDtypeStruct
  run = jax.jit(lambda x, w: sm_mosaic_gpu.swiglu_matmul(x, w))
  hlo = run.trace(sds((m, 4096), jnp.bfloat16), sds((4096, 24576), jnp.bfloat16)).lower(
      lowering_platforms=("cuda",)).as_text()
  (call,) = [line for line in hlo.splitlines() if "stablehlo.custom_call" in line]
  assert f"-> tensor<{m}x12288xbf16>" in call
  ops = {line.split("=", 1)[1].split()[0] for line in hlo.splitlines() if " = stablehlo." in line}
  assert ops == {"stablehlo.custom_call"}, ops


def test_named_implementations_and_unknown_name():
  x, w = random_pair((3,), 256, 64, seed=4)
  np.testing.assert_array_equal(np.asarray(swiglu_matmul(x, w, implementation="xla")),
                                np.asarray(swiglu_matmul_reference(x, w)))
  with pytest.raises(ValueError, match="unknown swiglu_matmul implementation 'triton'"):
    swiglu_matmul(x, w, implementation="triton")


def test_default_is_the_two_step_path_the_models_ran_before(monkeypatch):
  """Off (``DEFAULT = "xla"``) or above ``MAX_TOKENS`` rows, the dispatch is ``swiglu(skinny_matmul.matmul(...))``
  with each step's own choice, bit for bit."""
  x, w = random_pair((2,), 256, 128, seed=5)
  before = swiglu.swiglu(skinny_matmul.matmul(x, w, reduce=False))
  np.testing.assert_array_equal(np.asarray(swiglu_matmul(x, w)), np.asarray(before))
  monkeypatch.setattr(sm_ops, "DEFAULT", "mosaic_gpu")
  monkeypatch.setattr(sm_ops, "_on_hopper", lambda: True)
  many, _ = random_pair((sm_ops.MAX_TOKENS + 1,), 256, 128, seed=6)
  np.testing.assert_array_equal(np.asarray(swiglu_matmul(many, w)),
                                np.asarray(swiglu.swiglu(skinny_matmul.matmul(many, w, reduce=False))))


def test_unsupported_shape_falls_back_loudly(monkeypatch, caplog):
  monkeypatch.setattr(sm_ops, "DEFAULT", "mosaic_gpu")
  monkeypatch.setattr(sm_ops, "_on_hopper", lambda: True)
  x, w = random_pair((1,), 256, 96, seed=7)  # I = 96: no whole 64-channel blocks
  with caplog.at_level(logging.WARNING, logger=sm_ops.__name__):
    out = swiglu_matmul(x, w)
  assert "falls back to two kernels" in caplog.text
  np.testing.assert_array_equal(np.asarray(out), np.asarray(swiglu.swiglu(skinny_matmul.matmul(x, w))))


def test_weight_leaf_dispatch():
  """A bf16 leaf goes through ``swiglu_matmul``; an int8 leaf keeps its own matmul, then SwiGLU."""
  x, w = random_pair((2,), 256, 128, seed=8)
  np.testing.assert_array_equal(np.asarray(weights.linear_swiglu(x, w)), np.asarray(swiglu_matmul(x, w)))
  q = weights.quantize(w, "int8")
  np.testing.assert_array_equal(np.asarray(weights.linear_swiglu(x, q)),
                                np.asarray(swiglu.swiglu(weights.linear(x, q))))


@pytest.mark.gpu
@pytest.mark.skipif(not sm_ops._on_hopper(), reason="needs an H100/H200")
class TestMosaicGpu(SwigluMatmulSuite):
  def run(self, x, w, config):
    return jax.jit(lambda a, b: sm_mosaic_gpu.swiglu_matmul(a, b, config=config))(x, w)

  @pytest.mark.parametrize("m", [1, 16, 24])
  def test_qwen3_8b_shape(self, m):
    x, w = random_pair((m,), 4096, 12288, seed=m)
    assert_close(self.run(x, w, None), x, w)

  def test_through_the_dispatch(self, monkeypatch):
    monkeypatch.setattr(sm_ops, "DEFAULT", "mosaic_gpu")
    x, w = random_pair((1,), 4096, 12288, seed=9)
    assert_close(jax.jit(lambda a, b: weights.linear_swiglu(a, b))(x, w), x, w)  # a fresh trace: DEFAULT set

  @pytest.mark.parametrize("m", [1, 16])
  @pytest.mark.parametrize("tile_k,steps", [(128, 3), (128, 4), (64, 6), (256, 2)])
  def test_cluster_handover_is_race_free(self, m, tile_k, steps):
    """The up block's tile crosses the cluster after a barrier one thread a block arrives on: with a thread still
    writing, the gate block reads a half-written tile (one of these configs on an H100 before ``commit_smem`` came
    first). Thirty calls, each equal to the reference and all the same bits."""
    x, w = random_pair((m,), 4096, 12288, seed=tile_k + steps + m)
    run = jax.jit(lambda a, b: sm_mosaic_gpu.swiglu_matmul(a, b, config=Config(tile_k=tile_k,
                                                                                max_concurrent_steps=steps)))
    first = run(x, w)
    assert_close(first, x, w)
    for _ in range(30):
      np.testing.assert_array_equal(np.asarray(run(x, w)), np.asarray(first))


# ---- W12 gate|up weights: the register decode with the same cluster epilogue (``w12.mosaic_gpu.w12_swiglu_matmul``)

def w12_pair(lead, k, inter, seed):
  """``random_pair`` with the weight packed: its normals carry escapes (values far below their row's base exponent)
  in most channels; those past the channel lists' capacity (the overflow, which the kernel leaves to XLA) zeroed."""
  x, w = random_pair(lead, k, inter, seed)
  packed = w12.pack(w)
  while packed.escape_index.shape[0]:
    w = w.reshape(-1).at[packed.escape_index].set(0).reshape(w.shape)
    packed = w12.pack(w)
  assert packed.column_capacity
  return x, packed


@pytest.mark.parametrize("m", [1, 16])
def test_w12_lowers_for_cuda_as_one_kernel_with_its_swiglu(m):
  """A W12 gate|up weight (scaled down: K = 1024, I = 256) is one Mosaic GPU call writing the ``[M, I]`` activation:
  no SwiGLU, escape patch, slice or sum in XLA after it."""
  x, packed = w12_pair((m,), 1024, 256, seed=m)
  hlo = jax.jit(w12_mosaic_gpu.w12_swiglu_matmul).trace(x, packed).lower(lowering_platforms=("cuda",)).as_text()
  (call,) = [line for line in hlo.splitlines() if "stablehlo.custom_call" in line]
  assert f"-> tensor<{m}x256xbf16>" in call
  ops = {line.split("=", 1)[1].split()[0] for line in hlo.splitlines() if " = stablehlo." in line}
  assert ops == {"stablehlo.custom_call"}, ops


def test_w12_kernel_refuses_what_it_does_not_tile():
  """More than 32 token rows, an overflow escape (not in the channel lists) or no whole 64-channel blocks of
  intermediate size: NotImplementedError, so the dispatch takes the two steps."""
  x, packed = w12_pair((33,), 1024, 128, seed=10)
  with pytest.raises(NotImplementedError, match="one token block of at most 32 rows, got 33 rows"):
    w12_mosaic_gpu.w12_swiglu_matmul(x, packed)
  w = np.array(w12.unpack(packed), np.float32)
  w[[3, 700, 900, 1000], 5] = 1e30  # four escapes in one channel: past its lists' capacity
  with pytest.raises(NotImplementedError, match="channel lists' escapes only"):
    w12_mosaic_gpu.w12_swiglu_matmul(x[:1], w12.pack(jnp.asarray(w, jnp.bfloat16)))
  with pytest.raises(NotImplementedError, match="intermediate size a multiple of 64, got the gate|up width 192"):
    w12_mosaic_gpu.w12_swiglu_matmul(x[:1], w12.pack(w12.unpack(packed)[:, :192]))


def test_w12_leaf_dispatch(monkeypatch):
  """A W12 leaf goes through ``swiglu_matmul`` as a bf16 one does: off Hopper (or off) the two steps, equal bit for
  bit to the reference of the unpacked weight; with the kernel on, ``W12_FUSED``, a Hopper and at most ``MAX_TOKENS``
  rows, the W12 kernel (spied on here: CPU), unless W12's own matmul is not the kernel."""
  x, packed = w12_pair((2,), 1024, 128, seed=11)
  want = np.asarray(swiglu_matmul_reference(x, w12.unpack(packed)))
  for got in (swiglu_matmul(x, packed), swiglu_matmul(x, packed, implementation="xla"),
              weights.linear_swiglu(x, packed)):
    np.testing.assert_array_equal(np.asarray(got), want)
  calls = []
  monkeypatch.setattr(w12_mosaic_gpu, "w12_swiglu_matmul",
                      lambda a, p: (calls.append(a.shape), swiglu_matmul_reference(a, w12.unpack(p)))[1])
  monkeypatch.setattr(sm_ops, "DEFAULT", "mosaic_gpu")
  monkeypatch.setattr(sm_ops, "_on_hopper", lambda: True)
  monkeypatch.setattr(sm_ops, "W12_FUSED", False)
  swiglu_matmul(x, packed)  # W12_FUSED off: the two steps
  monkeypatch.setattr(sm_ops, "W12_FUSED", True)
  np.testing.assert_array_equal(np.asarray(weights.linear_swiglu(x, packed)), want)
  many, _ = w12_pair((sm_ops.MAX_TOKENS + 1,), 1024, 128, seed=12)
  swiglu_matmul(many, packed)
  monkeypatch.setattr(w12_ops, "DEFAULT", "reference")
  swiglu_matmul(x, packed)
  assert calls == [(2, 1024)]


@pytest.mark.gpu
@pytest.mark.skipif(not sm_ops._on_hopper(), reason="needs an H100/H200")
class TestW12MosaicGpu:
  @pytest.mark.parametrize("m", [1, 16, 32])
  def test_qwen3_8b_shape(self, m):
    """Qwen3-8B's gate|up in W12 against the reference of its unpacked weight, and thirty calls the same bits (the
    cluster handover race-free with the register decode's barriers, Pallas' automatic ones off)."""
    x, packed = w12_pair((m,), 4096, 12288, seed=m)
    run = jax.jit(w12_mosaic_gpu.w12_swiglu_matmul)
    first = run(x, packed)
    assert_close(first, x, w12.unpack(packed))
    for _ in range(30):
      np.testing.assert_array_equal(np.asarray(run(x, packed)), np.asarray(first))

  def test_through_the_dispatch(self, monkeypatch):
    monkeypatch.setattr(sm_ops, "DEFAULT", "mosaic_gpu")
    monkeypatch.setattr(sm_ops, "W12_FUSED", True)
    x, packed = w12_pair((1,), 4096, 12288, seed=13)
    assert_close(jax.jit(lambda a, p: weights.linear_swiglu(a, p))(x, packed), x, w12.unpack(packed))  # fresh trace
