"""The few-token bf16 matmul kernel against XLA's dot: in Pallas GPU-interpret mode on CPU, cross-lowered
for Hopper on CPU, and on a real Hopper when one is present."""

import functools
import json
import logging
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import skinny_matmul, tma
from pallas_kernels.add_rms_norm.reference import rms_norm
from pallas_kernels.skinny_matmul import mosaic_gpu as skinny_mosaic_gpu
from pallas_kernels.skinny_matmul import ops as skinny_ops

REPO = Path(__file__).resolve().parents[1]

BF16 = ml_dtypes.bfloat16
Config = skinny_matmul.TuningConfig


def random_pair(lead, k, n, seed):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(*lead, k)).astype(BF16)
  # per-channel scales over four decades, so a wrong column or a lost split shows up
  w = (rng.normal(0.0, 0.02, size=(k, n)) * np.exp(rng.uniform(np.log(1e-2), np.log(1e2), n))).astype(BF16)
  return jnp.asarray(x), jnp.asarray(w)


def assert_matches_f32(y, x, w):
  expected = np.asarray(x, np.float32) @ np.asarray(w, np.float32)
  assert y.dtype == jnp.bfloat16 and y.shape == expected.shape
  # per column: f32 accumulation orders differ, the bf16 output rounds at 2^-8 relative
  scale = np.abs(expected).max(axis=tuple(range(expected.ndim - 1)), keepdims=True)
  err = np.abs(np.asarray(y, np.float32) - expected)
  bad = err > 1e-2 * np.abs(expected) + 1e-2 * scale
  assert not bad.any(), f"{bad.sum()} of {bad.size} outputs off, first at {np.argwhere(bad)[0]}"



class SkinnyMatmulSuite:
  """Cases every implementation must pass; subclasses say how to run one."""

  def run(self, x, w, config):
    raise NotImplementedError

  @pytest.mark.parametrize(
      "lead,k,n,config",
      [
          ((5,), 256, 128, Config(tile_m=8)),  # 2 channel blocks x 2 K steps
          ((1,), 512, 64, Config(tile_m=64, split_k=2)),  # decode-sized M, two K splits added after
          ((3,), 512, 64, Config(tile_k=64, blocks_per_sm=4)),  # the automatic split: one step per split
          ((20,), 256, 192, Config(tile_m=8, tile_k=64, max_concurrent_steps=2)),  # 3 token blocks
          ((2, 7), 384, 64, Config(tile_k=128, split_k=1)),  # leading dims, 3 steps, no split: bf16 out
          ((4,), 512, 64, Config(tile_k=256, split_k=2, max_concurrent_steps=1)),
      ],
  )
  def test_matches_f32_matmul(self, lead, k, n, config):
    x, w = random_pair(lead, k, n, seed=k + n)
    assert_matches_f32(self.run(x, w, config), x, w)


class TestXla(SkinnyMatmulSuite):

  def run(self, x, w, config):
    return skinny_matmul.matmul(x, w, implementation="xla")


class TestMosaicGpuInterpret(SkinnyMatmulSuite):

  def run(self, x, w, config):
    return skinny_mosaic_gpu.skinny_matmul(x, w, config=config, interpret=plgpu.InterpretGPUParams())

  def test_unsupported_inputs_raise(self):
    x = jnp.ones((1, 128), jnp.bfloat16)
    with pytest.raises(NotImplementedError, match="multiple of 64"):
      self.run(x, jnp.ones((128, 48), jnp.bfloat16), Config())
    with pytest.raises(NotImplementedError, match="split_k=2"):
      self.run(jnp.ones((1, 384), jnp.bfloat16), jnp.ones((384, 64), jnp.bfloat16), Config(split_k=2))
    with pytest.raises(NotImplementedError, match="bf16"):
      self.run(x.astype(jnp.float32), jnp.ones((128, 64), jnp.bfloat16), Config())
    with pytest.raises(ValueError, match="x has 128 features, the weight expects 256"):
      self.run(x, jnp.ones((256, 64), jnp.bfloat16), Config())


@pytest.mark.parametrize("m", [1, 16, 64])
def test_hopper_lowering_at_qwen3_shapes(m):
  """Mosaic GPU lowers the kernel for sm_90 on a CPU-only jaxlib: the transposed weight operand and the
  split-K grid are legal wgmma/TMA at the real tile sizes (4096 x 12288 gate|up, default config)."""
  x = jnp.ones((m, 4096), jnp.bfloat16)
  w = jnp.ones((4096, 12288), jnp.bfloat16)
  lowered = jax.jit(skinny_mosaic_gpu.skinny_matmul).trace(x, w).lower(lowering_platforms=("cuda",))
  assert "mosaic_gpu" in lowered.as_text()


@pytest.mark.parametrize("lead,k,config", [((20,), 256, Config(tile_m=8, tile_k=64, max_concurrent_steps=2)),
                                           ((2, 7), 384, Config(tile_k=128, split_k=1)), ((5,), 256, Config(tile_m=8)),
                                           ((70,), 256, Config(tile_m=64, tile_k=64))])
def test_hopper_lowering_of_odd_token_counts(lead, k, config):
  """Token counts off a multiple of 8 lower for sm_90: x goes in unpadded only where TMA can tile it (at most 8
  rows, or a multiple of 8; ``pad_for_tma``), the rest is padded. GPU interpret mode does not check TMA tiling:
  the H200 found these (``docs/results/2026-11-30-ar-tree-attention-h200/``)."""
  x, w = jnp.ones((*lead, k), jnp.bfloat16), jnp.ones((k, 192), jnp.bfloat16)
  run = functools.partial(skinny_mosaic_gpu.skinny_matmul, config=config)
  assert "mosaic_gpu" in jax.jit(run).trace(x, w).lower(lowering_platforms=("cuda",)).as_text()


def test_pad_for_tma_pads_only_what_tma_cannot_tile():
  assert tma.pad_for_tma(jnp.ones((1, 4096)), (8, 64)).shape == (1, 4096)  # decode: no pad kernel
  assert tma.pad_for_tma(jnp.ones((8, 40)), (8, 64)).shape == (8, 40)  # smaller than a tile
  assert tma.pad_for_tma(jnp.ones((14, 120)), (8, 64)).shape == (16, 128)
  padded = tma.pad_for_tma(jnp.full((9, 64), 2.0), (8, 64))
  assert padded.shape == (16, 64) and float(padded[9:].sum()) == 0.0 and float(padded[:9].sum()) == 2.0 * 9 * 64


def test_tuning_config_rejects_bad_tiles():
  with pytest.raises(ValueError, match="tile_m"):
    Config(tile_m=12)
  with pytest.raises(ValueError, match="tile_k"):
    Config(tile_k=96)
  with pytest.raises(ValueError, match="blocks_per_sm"):
    Config(blocks_per_sm=0)


@pytest.mark.gpu
@pytest.mark.skipif(not skinny_ops._on_hopper(), reason="needs an H100/H200")
class TestMosaicGpu(SkinnyMatmulSuite):

  def run(self, x, w, config):
    return jax.jit(lambda x, w: skinny_matmul.matmul(x, w, implementation="mosaic_gpu", config=config))(x, w)

  @pytest.mark.parametrize("m", [1, 16, 64])
  def test_qwen3_down_projection(self, m):
    x, w = random_pair((m,), 12288, 4096, seed=m)
    assert_matches_f32(self.run(x, w, None), x, w)

  def test_swiglu_prologue_at_the_down_projection(self):
    gate_up = jnp.asarray((np.random.default_rng(5).normal(size=(3, 24576)) * 4).astype(BF16))
    w = random_pair((3,), 12288, 4096, seed=5)[1]
    run = jax.jit(lambda x, w: skinny_matmul.matmul(x, w, swiglu=True, implementation="mosaic_gpu"))
    gate, up = jnp.split(gate_up, 2, axis=-1)
    assert_matches_f32(run(gate_up, w), jax.nn.silu(gate) * up, w)

  @pytest.mark.parametrize("m,n", [(1, 6144), (5, 24576), (1, 151936)])
  def test_norm_prologue_at_qwen3_shapes(self, m, n):
    x, g, w = _norm_inputs((m,), 4096, n, seed=m + n)
    run = jax.jit(lambda x, g, w: skinny_matmul.matmul(x, w, norm=(g, EPS), implementation="mosaic_gpu"))
    assert_matches_f32(run(x, g, w), rms_norm(x, g, EPS), w)


def test_dispatch(monkeypatch, caplog):
  """XLA unless DEFAULT says the kernel and the device is a Hopper; prefill-sized M and unsupported
  inputs fall back to XLA, the latter with a warning."""
  calls = []
  monkeypatch.setattr(skinny_ops, "_mosaic_gpu", lambda x, w, c, norm, swiglu: calls.append(x.shape) or skinny_matmul.skinny_matmul_reference(x, w))
  x, w = random_pair((3,), 128, 64, seed=0)
  skinny_matmul.matmul(x, w)
  monkeypatch.setattr(skinny_ops, "DEFAULT", "mosaic_gpu")
  skinny_matmul.matmul(x, w)  # not a Hopper
  assert calls == []
  monkeypatch.setattr(skinny_ops, "_on_hopper", lambda: True)
  skinny_matmul.matmul(x, w)
  skinny_matmul.matmul(jnp.ones((skinny_ops.MAX_TOKENS + 1, 128), jnp.bfloat16), w)  # above MAX_TOKENS: XLA
  assert calls == [(3, 128)]
  monkeypatch.undo()
  monkeypatch.setattr(skinny_ops, "DEFAULT", "mosaic_gpu")
  monkeypatch.setattr(skinny_ops, "_on_hopper", lambda: True)
  with caplog.at_level(logging.WARNING, logger=skinny_ops.__name__):
    y = skinny_matmul.matmul(x.astype(jnp.float32), w)  # the kernel wants bf16
  assert "falls back to XLA" in caplog.text and y.dtype == jnp.float32
  with pytest.raises(ValueError, match="unknown skinny_matmul implementation"):
    skinny_matmul.matmul(x, w, implementation="cublas")


def test_f32_from_halves_is_exact_for_every_bit_pattern():
  """Split partial sums travel as their high and low 16 bits; joining them must give the f32 back bit for bit
  (NaN payloads, -0.0, subnormals included)."""
  bits = np.random.default_rng(0).integers(0, 2**32, size=(3, 8, 64), dtype=np.uint64).astype(np.uint32)
  bits[0, 0, :4] = [0x80000000, 0x00000001, 0x7FC00001, 0xFF800000]
  halves = np.stack([(bits >> 16).astype(np.uint16), (bits & 0xFFFF).astype(np.uint16)], axis=1).view(BF16)
  joined = jax.jit(skinny_mosaic_gpu.f32_from_halves)(jnp.asarray(halves))
  assert joined.shape == (3, 8, 64) and joined.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(joined).view(np.uint32), bits)


def _split_of(x, w):
  """The K split the kernel runs with: the leading axis of its partial-sum output in the traced program."""
  jaxpr = jax.make_jaxpr(skinny_mosaic_gpu.skinny_matmul)(x, w)
  (eqn,) = [e for e in jaxpr.eqns if e.primitive.name in ("pallas_call", "custom_vmap_call")]  # plgpu.kernel
  return eqn.outvars[0].aval.shape[0]


def test_split_k_by_shape_overrides_the_auto_split_only_for_its_shape(monkeypatch):
  x, w = jnp.ones((1, 1024), jnp.bfloat16), jnp.ones((1024, 256), jnp.bfloat16)
  auto = _split_of(x, w)
  monkeypatch.setattr(skinny_mosaic_gpu, "SPLIT_K_BY_SHAPE", {(1024, 256): 2, (4096, 4096): 1})
  jax.clear_caches()
  assert auto != 2 and _split_of(x, w) == 2
  np.testing.assert_allclose(  # and it still computes x @ w
      np.asarray(skinny_mosaic_gpu.skinny_matmul(x, w, interpret=plgpu.InterpretGPUParams()), np.float32), 1024.0)
  monkeypatch.setattr(skinny_mosaic_gpu, "SPLIT_K_BY_SHAPE", {(1024, 256): 3})  # 8 K steps: 3 does not divide
  jax.clear_caches()
  with pytest.raises(ValueError, match=r"split_k=3 for W\[1024, 256\]"):
    _split_of(x, w)
  jax.clear_caches()


def test_split_probe_runs_and_picks_a_split(tmp_path, monkeypatch):
  """``scripts/h200/split_probe.py`` end to end in interpret mode on tiny shapes (its GPU run costs device
  minutes; a broken script should fail here)."""
  import importlib.util

  monkeypatch.syspath_prepend(str(REPO / "scripts" / "h200"))  # as running the script puts its folder first
  spec = importlib.util.spec_from_file_location("split_probe", REPO / "scripts" / "h200" / "split_probe.py")
  probe = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(probe)
  out = tmp_path / "splits.json"
  best = probe.main(["--shapes", "256x128", "128x256", "--splits", "1", "2", "--links", "2", "--iters", "1",
                     "--interpret", "--json", str(out)])
  assert set(best) == {"256x128", "128x256"} and all(s in (1, 2) for s in best.values())
  assert json.loads(out.read_text()) == best


# ---- the RMSNorm prologue (norm=(g, eps)) ---------------------------------------------------------------------


def _norm_inputs(lead, k, n, seed):
  x, w = random_pair(lead, k, n, seed)
  rows = np.exp(np.random.default_rng(seed + 1).uniform(-3, 3, (*lead, 1)))  # rows of very different scales
  g = (1 + 0.1 * np.random.default_rng(seed + 2).normal(size=(k,))).astype(BF16)
  return (x.astype(jnp.float32) * rows).astype(jnp.bfloat16), jnp.asarray(g), w


def _norm_reference(x, g, w):
  return skinny_matmul.skinny_matmul_reference(rms_norm(x, g, EPS), w)


EPS = 1e-6


@pytest.mark.parametrize("lead,k,n", [((1,), 512, 128), ((3,), 1024, 192), ((20,), 256, 64), ((2, 35), 256, 128)])
def test_norm_prologue_is_rms_norm_then_matmul_in_interpret_mode(lead, k, n):
  """The kernel norms each token row (whole-row statistics, rows of scales 1e-1.3 to 1e1.3) and multiplies: the
  reference's roundings, so equal to it but for the order of the f32 sums (the norm's and the matmul's)."""
  x, g, w = _norm_inputs(lead, k, n, seed=k + n)
  got = skinny_mosaic_gpu.skinny_matmul(x, w, norm=(g, EPS), interpret=plgpu.InterpretGPUParams())
  want = _norm_reference(x, g, w)
  assert got.shape == want.shape and got.dtype == jnp.bfloat16
  a, b = np.asarray(got, np.float32), np.asarray(want, np.float32)
  scale = np.abs(b).max(axis=tuple(range(b.ndim - 1)), keepdims=True)
  assert np.all(np.abs(a - b) <= 2.0 ** -7 * np.abs(b) + 1e-3 * scale), np.max(np.abs(a - b))
  assert np.mean(a == b) > 0.95
  with pytest.raises(ValueError, match="norm weight has shape"):
    skinny_mosaic_gpu.skinny_matmul(x, w, norm=(g[:-1], EPS), interpret=plgpu.InterpretGPUParams())


@pytest.mark.parametrize("lead,k,n", [((1,), 256, 128), ((6,), 512, 64), ((2, 35), 128, 64)])
def test_swiglu_prologue_is_silu_times_up_then_matmul_in_interpret_mode(lead, k, n):
  """``x = [gate | up]``; the kernel multiplies silu(gate) by up tile by tile (gates of either sign and large
  magnitude: exp's overflow side included) and then by W."""
  rng = np.random.default_rng(k + n)
  gate_up = jnp.asarray((rng.normal(size=(*lead, 2 * k)) * 4).astype(BF16))
  w = random_pair(lead, k, n, seed=k)[1]
  got = skinny_mosaic_gpu.skinny_matmul(gate_up, w, swiglu=True, interpret=plgpu.InterpretGPUParams())
  gate, up = jnp.split(gate_up, 2, axis=-1)
  assert_matches_f32(got, jax.nn.silu(gate) * up, w)
  eye = jnp.eye(k, n, dtype=jnp.bfloat16)  # the activations themselves: jax.nn.silu's bf16 ops, bit for bit
  acts = skinny_mosaic_gpu.skinny_matmul(gate_up, eye, swiglu=True, interpret=plgpu.InterpretGPUParams())
  np.testing.assert_array_equal(np.asarray(acts, np.float32), np.asarray((jax.nn.silu(gate) * up)[..., :n], np.float32))
  with pytest.raises(ValueError, match=r"\[gate \| up\]"):
    skinny_mosaic_gpu.skinny_matmul(gate, w, swiglu=True, interpret=plgpu.InterpretGPUParams())
  with pytest.raises(ValueError, match="one prologue at a time"):
    skinny_mosaic_gpu.skinny_matmul(gate_up, w, swiglu=True, norm=(jnp.ones((k,), jnp.bfloat16), EPS))


def test_swiglu_prologue_lowers_for_hopper_at_the_down_projection():
  run = jax.jit(lambda x, w: skinny_mosaic_gpu.skinny_matmul(x, w, swiglu=True))
  sds = jax.ShapeDtypeStruct
  text = run.trace(sds((1, 24576), jnp.bfloat16), sds((12288, 4096), jnp.bfloat16)).lower(
      lowering_platforms=("cuda",)).as_text()
  assert "mosaic_gpu" in text


@pytest.mark.parametrize("k,n", [(4096, 6144), (4096, 24576), (4096, 151936)])
def test_norm_prologue_lowers_for_hopper_at_qwen3_shapes(k, n):
  """Warpgroup semantics, the 64-row activation tile and the whole-row reads lower for sm_90 on the CPU (register
  <-> swizzled SMEM moves of 8-row tiles do not: the reason for the 64-row tile)."""
  run = jax.jit(lambda x, g, w: skinny_mosaic_gpu.skinny_matmul(x, w, norm=(g, EPS)))
  sds = jax.ShapeDtypeStruct
  text = run.trace(sds((1, k), jnp.bfloat16), sds((k,), jnp.bfloat16), sds((k, n), jnp.bfloat16)).lower(
      lowering_platforms=("cuda",)).as_text()
  assert "mosaic_gpu" in text


def test_fuses_norm_only_where_the_kernel_serves(monkeypatch):
  x, w = jnp.ones((1, 128), jnp.bfloat16), jnp.ones((128, 64), jnp.bfloat16)
  assert not skinny_ops.fuses_norm(x, w)  # FUSE_NORM off
  monkeypatch.setattr(skinny_ops, "FUSE_NORM", True)
  monkeypatch.setattr(skinny_ops, "DEFAULT", "mosaic_gpu")
  assert not skinny_ops.fuses_norm(x, w)  # not a Hopper
  monkeypatch.setattr(skinny_ops, "_on_hopper", lambda: True)
  assert skinny_ops.fuses_norm(x, w)
  assert not skinny_ops.fuses_norm(jnp.ones((skinny_ops.MAX_TOKENS + 1, 128), jnp.bfloat16), w)  # a verify pass
  assert not skinny_ops.fuses_norm(x.astype(jnp.float32), w)
  assert not skinny_ops.fuses_norm(x, w.astype(jnp.float32))
  assert not skinny_ops.fuses_swiglu(x, w)  # FUSE_SWIGLU off
  monkeypatch.setattr(skinny_ops, "FUSE_SWIGLU", True)
  assert skinny_ops.fuses_swiglu(x, w)


def test_norm_prologue_inside_the_model(monkeypatch):
  """A bf16 decode step with the norms in the kernel's prologue (interpret mode): the same logits and hidden states
  as the XLA path within bf16 rounding, and the kernel took a norm at both norms of every layer and the final one."""
  from specpilot.models import target
  from specpilot.models.kv_cache import KVCache
  from specpilot.models.weights import init_random_target
  from tests import models as tm

  normed, swiglus = [], []

  def kernel(x, w, config, norm, swiglu):
    normed.append(norm is not None)
    swiglus.append(swiglu)
    return skinny_mosaic_gpu.skinny_matmul(x, w, norm=norm, swiglu=swiglu, config=config,
                                           interpret=plgpu.InterpretGPUParams())

  cfg = tm.target_config(vocab=64, hidden=128, layers=2, heads=2, kv_heads=1, head_dim=64, intermediate=128)
  w = init_random_target(cfg, 1, jnp.bfloat16)
  kv = np.random.default_rng(0).normal(size=(2, cfg.num_layers, 1, 16, cfg.num_kv_heads, cfg.head_dim))
  cache = KVCache(k=jnp.asarray(kv[0], jnp.bfloat16), v=jnp.asarray(kv[1], jnp.bfloat16),
                  lengths=jnp.asarray([5], jnp.int32))
  tokens = jnp.asarray([[3]], jnp.int32)

  def run():
    out = target.forward(w, cfg, tokens, cache.lengths[:, None], cache, None, (0,))
    return np.asarray(out.logits), np.asarray(out.hidden, np.float32)

  want_logits, want_hidden = run()
  monkeypatch.setattr(skinny_ops, "DEFAULT", "mosaic_gpu")
  monkeypatch.setattr(skinny_ops, "FUSE_NORM", True)
  monkeypatch.setattr(skinny_ops, "_on_hopper", lambda: True)
  monkeypatch.setattr(skinny_ops, "_mosaic_gpu", kernel)
  got_logits, got_hidden = run()
  assert normed.count(True) == 2 * cfg.num_layers + 1 and normed.count(False) == 2 * cfg.num_layers  # o, down
  assert [c for c in swiglus if c] == []
  np.testing.assert_allclose(got_hidden, want_hidden, rtol=0.02, atol=0.02)
  np.testing.assert_allclose(got_logits, want_logits, rtol=0.02, atol=0.05)
  assert (got_logits.argmax(-1) == want_logits.argmax(-1)).all()
  monkeypatch.setattr(skinny_ops, "FUSE_SWIGLU", True)  # and the MLP's silu(gate) * up in the down projection's
  normed.clear()
  swiglus.clear()
  both_logits, both_hidden = run()
  assert swiglus.count(True) == cfg.num_layers and normed.count(True) == 2 * cfg.num_layers + 1
  np.testing.assert_allclose(both_hidden, want_hidden, rtol=0.02, atol=0.02)
  np.testing.assert_allclose(both_logits, want_logits, rtol=0.02, atol=0.05)


def test_prologue_depth_keeps_two_blocks_per_sm():
  """A prologue's 64-row activation tiles take SMEM: the pipeline is as deep as two resident blocks allow."""
  depth = skinny_mosaic_gpu._prologue_depth
  assert depth(4, 64, 64, 2, True, False, 2) == 4  # the norm at PROLOGUE_CONFIG's tile_k
  assert depth(4, 64, 64, 2, False, True, 2) == 3  # the SwiGLU: two activation tiles a stage
  assert depth(4, 64, 128, 2, True, False, 2) == 2
  assert depth(4, 64, 256, 2, False, True, 2) == 1  # never below one stage
  for norm, swiglu in ((True, False), (False, True)):
    d = depth(8, 64, 64, 2, norm, swiglu, 2)
    stage = 64 * 64 * 2 + 64 * 64 * 2 * (1 + swiglu) + 128 * norm
    fixed = 2 * 64 * 64 * 2 + 64 * 64 * 2 + 256 * norm + 1024
    assert 2 * (fixed + d * stage) <= skinny_mosaic_gpu.SMEM_PER_SM < 2 * (fixed + (d + 1) * stage)
