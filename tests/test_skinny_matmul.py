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

from pallas_kernels import skinny_matmul, split_k, tma
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
          ((3,), 384, 128, Config(tile_k=128, split_k=1)),  # bf16 out of exactly 3 rows, the 8-row stores clipped
          ((4,), 512, 64, Config(tile_k=256, split_k=2, max_concurrent_steps=1)),
          ((65,), 256, 128, Config()),  # a 64-node verify's rows: one token block of 72
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
    with pytest.raises(NotImplementedError, match="K=192 is not a multiple of tile_k=128"):
      self.run(jnp.ones((1, 192), jnp.bfloat16), jnp.ones((192, 64), jnp.bfloat16), Config())
    with pytest.raises(NotImplementedError, match="bf16"):
      self.run(x.astype(jnp.float32), jnp.ones((128, 64), jnp.bfloat16), Config())
    with pytest.raises(ValueError, match="x has 128 features, the weight expects 256"):
      self.run(x, jnp.ones((256, 64), jnp.bfloat16), Config())


@pytest.mark.parametrize("m", [1, 16, 64, 65, 256])
def test_hopper_lowering_at_qwen3_shapes(m):
  """Mosaic GPU lowers the kernel for sm_90 on a CPU-only jaxlib: the transposed weight operand and the
  split-K grid are legal wgmma/TMA at the real tile sizes (4096 x 12288 gate|up, default config)."""
  x = jnp.ones((m, 4096), jnp.bfloat16)
  w = jnp.ones((4096, 12288), jnp.bfloat16)
  lowered = jax.jit(skinny_mosaic_gpu.skinny_matmul).trace(x, w).lower(lowering_platforms=("cuda",))
  assert "mosaic_gpu" in lowered.as_text()
  assert "skinny_matmul_body" in lowered.as_text()  # the kernel's name in CUPTI profiles (bench_roofline's split)


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


@pytest.mark.parametrize("m,reduce,rows", [(3, True, 3), (1, True, 1), (3, False, 8), (8, True, 8), (12, True, 16)])
def test_a_returned_unsplit_result_has_exactly_its_rows(m, reduce, rows):
  """Below 8 token rows a returned one-split result is the kernel's output itself, of ``m`` rows (the 8-row box's
  store clipped by TMA), so no row slice (an XLA copy kernel) follows it; a consumer (``reduce=False``) gets the box's
  8 rows its loads expect. Lowered for sm_90: the Mosaic GPU call's result type."""
  x, w = jnp.ones((m, 384), jnp.bfloat16), jnp.ones((384, 128), jnp.bfloat16)
  run = functools.partial(skinny_mosaic_gpu.skinny_matmul, config=Config(tile_k=128, split_k=1), reduce=reduce)
  text = jax.jit(run).trace(x, w).lower(lowering_platforms=("cuda",)).as_text()
  calls = [line for line in text.splitlines() if "custom_call" in line and "mosaic_gpu" in line]
  assert len(calls) == 1 and f"-> tensor<1x1x{rows}x128xbf16>" in calls[0]
  assert split_k.exact_rows(3, 8, halves=2, reduce=True) == 8  # f32 halves are summed by XLA: the box's rows


@pytest.mark.parametrize("m,tile_m,blocks", [(1, 8, 1), (64, 64, 1), (65, 72, 1), (200, 200, 1), (256, 256, 1),
                                             (300, 256, 2)])
def test_the_default_token_tile_reads_each_weight_once(m, tile_m, blocks):
  """``tile_m=0`` puts up to 256 rows in one block (one read of each weight tile); the padded rows are what the
  kernel wrote (``SplitKPartials``' row axis is ``blocks * tile_m``)."""
  assert split_k.token_tile(0, m) == tile_m
  x, w = jnp.ones((m, 512), jnp.bfloat16), jnp.ones((512, 64), jnp.bfloat16)
  run = functools.partial(skinny_mosaic_gpu.skinny_matmul, reduce=False)
  partials = jax.eval_shape(run, x, w)
  assert partials.halves.shape[-2] == blocks * tile_m


def test_wide_token_tiles_shorten_the_pipeline_to_fit_shared_memory():
  """At 256 rows the default config's 4 stages of 64 KB activation tiles do not fit: the auto tile takes the deepest
  pipeline that does; a config that names its tile gets a one-line error (the dispatcher falls back to XLA)."""
  assert skinny_mosaic_gpu._pipeline_depth(Config(), 256, 32, 2) == 2
  assert skinny_mosaic_gpu._pipeline_depth(Config(), 72, 32, 2) == 4
  assert skinny_mosaic_gpu._smem_bytes(256, 128, 2, 2) <= split_k.SMEM_LIMIT
  with pytest.raises(NotImplementedError, match="shared memory a block at 256 token rows"):
    skinny_mosaic_gpu._pipeline_depth(Config(tile_m=256), 256, 32, 2)


@pytest.mark.parametrize("config", [Config(), Config(tile_k=256, max_concurrent_steps=3, blocks_per_sm=1),
                                    Config(max_concurrent_steps=2)])
def test_hopper_lowering_of_a_verify_pass_rows(config):
  """A 64-node verify's 65 rows (one 72-row token block) lower for sm_90 at the o projection's shape."""
  x, w = jnp.ones((65, 4096), jnp.bfloat16), jnp.ones((4096, 4096), jnp.bfloat16)
  run = functools.partial(skinny_mosaic_gpu.skinny_matmul, config=config, reduce=False)
  assert "skinny_matmul_body" in jax.jit(run).trace(x, w).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("lead,k,n,config,sms", [
    ((65,), 512, 192, Config(split_k=2), 2),  # 6 items on 2 blocks: 3 each, a 72-row token block
    ((20,), 384, 128, Config(tile_m=8, split_k=3, max_concurrent_steps=2), 5),  # 18 items on 5: 4 or 3 each
    ((3,), 256, 64, Config(tile_k=64, split_k=1, max_concurrent_steps=3), 1),  # one block, one item: bf16 out
    ((9,), 512, 128, Config(tile_k=64, split_k=4, max_concurrent_steps=3, blocks_per_sm=2), 3),  # 2 an SM: 6
])
def test_persistent_grid_writes_what_one_block_an_item_writes(monkeypatch, lead, k, n, config, sms):
  """``persistent``: a few blocks walking every (channels, tokens, K split) item through one pipeline, the pipeline's
  loads running into the next item, store the same partials bit for bit as one block an item (each item sums its
  steps in the same order), whatever the items a block gets."""
  import dataclasses

  monkeypatch.setattr(skinny_mosaic_gpu, "num_sms", lambda: sms)
  x, w = random_pair(lead, k, n, seed=k + n + sms)
  params = plgpu.InterpretGPUParams()
  want = skinny_mosaic_gpu.skinny_matmul(x, w, config=config, interpret=params, reduce=False)
  got = skinny_mosaic_gpu.skinny_matmul(x, w, config=dataclasses.replace(config, persistent=True), interpret=params,
                                        reduce=False)
  # bit patterns as integers: a low half read as bf16 may be a NaN, which equals nothing
  np.testing.assert_array_equal(np.asarray(got.halves).view(np.uint16), np.asarray(want.halves).view(np.uint16))
  assert_matches_f32(got.sum(), x, w)


def test_persistent_blocks_are_the_resident_ones():
  """One block a resident slot: at 72 rows one fits an SM (four stages of weight and activation tiles), at 8 rows
  ``blocks_per_sm`` do; never more blocks than items."""
  smem72 = skinny_mosaic_gpu._smem_bytes(72, 128, 4, 2)
  assert skinny_mosaic_gpu.persistent_blocks(384, smem72, 2) == skinny_mosaic_gpu.num_sms()
  assert skinny_mosaic_gpu.persistent_blocks(384, skinny_mosaic_gpu._smem_bytes(8, 128, 4, 2), 2) == \
      2 * skinny_mosaic_gpu.num_sms()
  assert skinny_mosaic_gpu.persistent_blocks(40, smem72, 2) == 40


def test_hopper_lowering_of_the_persistent_grid():
  """The persistent form of a 64-node verify's o projection lowers for sm_90: one grid axis, dynamic item counts."""
  x, w = jnp.ones((65, 4096), jnp.bfloat16), jnp.ones((4096, 4096), jnp.bfloat16)
  run = functools.partial(skinny_mosaic_gpu.skinny_matmul, config=Config(persistent=True), reduce=False)
  assert "skinny_matmul_body" in jax.jit(run).trace(x, w).lower(lowering_platforms=("cuda",)).as_text()


def test_pad_for_tma_pads_only_what_tma_cannot_tile():
  assert tma.pad_for_tma(jnp.ones((1, 4096)), (8, 64)).shape == (1, 4096)  # decode: no pad kernel
  assert tma.pad_for_tma(jnp.ones((8, 40)), (8, 64)).shape == (8, 40)  # smaller than a tile
  assert tma.pad_for_tma(jnp.ones((14, 120)), (8, 64)).shape == (16, 128)
  padded = tma.pad_for_tma(jnp.full((9, 64), 2.0), (8, 64))
  assert padded.shape == (16, 64) and float(padded[9:].sum()) == 0.0 and float(padded[:9].sum()) == 2.0 * 9 * 64


def test_tuning_config_rejects_bad_tiles():
  with pytest.raises(ValueError, match="tile_m"):
    Config(tile_m=12)
  with pytest.raises(ValueError, match="tile_m"):
    Config(tile_m=264)
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

  @pytest.mark.parametrize("m,k,n", [(65, 12288, 4096), (65, 4096, 6144), (16, 4096, 4096), (1, 4096, 12288)])
  def test_persistent_grid_equals_one_block_an_item(self, m, k, n):
    x, w = random_pair((m,), k, n, seed=m + k)
    run = lambda persistent: jax.jit(lambda x, w: skinny_mosaic_gpu.skinny_matmul(  # noqa: E731
        x, w, config=Config(persistent=persistent), reduce=False).halves)(x, w)
    np.testing.assert_array_equal(np.asarray(run(True)).view(np.uint16), np.asarray(run(False)).view(np.uint16))


def test_dispatch(monkeypatch, caplog):
  """XLA unless DEFAULT says the kernel and the device is a Hopper; prefill-sized M and unsupported
  inputs fall back to XLA, the latter with a warning."""
  calls = []
  monkeypatch.setattr(skinny_ops, "_mosaic_gpu", lambda x, w, c, r: calls.append(x.shape) or skinny_matmul.skinny_matmul_reference(x, w))
  x, w = random_pair((3,), 128, 64, seed=0)
  skinny_matmul.matmul(x, w)
  monkeypatch.setattr(skinny_ops, "DEFAULT", "mosaic_gpu")
  skinny_matmul.matmul(x, w)  # not a Hopper
  assert calls == []
  monkeypatch.setattr(skinny_ops, "_on_hopper", lambda: True)
  skinny_matmul.matmul(x, w)
  skinny_matmul.matmul(jnp.ones((skinny_ops.MAX_TOKENS + 1, 128), jnp.bfloat16), w)  # above MAX_TOKENS: XLA
  assert calls == [(3, 128)]
  big = jnp.ones((16, 128), jnp.bfloat16)
  monkeypatch.setattr(skinny_ops, "MAX_TOKENS_BY_SHAPE", {(128, 64): 16})  # this weight's shape only
  skinny_matmul.matmul(big, w)
  skinny_matmul.matmul(big, random_pair((16,), 128, 128, seed=1)[1])  # another shape: MAX_TOKENS, XLA
  assert calls == [(3, 128), (16, 128)]
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
  joined = jax.jit(split_k.f32_from_halves)(jnp.asarray(halves))
  assert joined.shape == (3, 8, 64) and joined.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(joined).view(np.uint32), bits)
  again = jax.jit(split_k.halves_from_f32)(joined)  # and back: the W12 SMEM decode's partials take this way
  np.testing.assert_array_equal(np.asarray(again).view(np.uint16), halves.view(np.uint16))


def _split_of(x, w):
  """The K split the kernel runs with: the leading axis of its partial-sum output in the traced program."""
  def kernels(jaxpr):  # the kernel sits in the jitted call of ``lowering.lowered_once``
    for e in jaxpr.eqns:
      if e.primitive.name in ("pallas_call", "custom_vmap_call"):  # plgpu.kernel
        yield e
      for sub in (p.jaxpr for p in e.params.values() if hasattr(getattr(p, "jaxpr", None), "eqns")):
        yield from kernels(sub)

  (eqn,) = kernels(jax.make_jaxpr(skinny_mosaic_gpu.skinny_matmul)(x, w).jaxpr)
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


def test_splits_for_a_consumer_are_few(monkeypatch):
  """``reduce=False`` runs at most ``CONSUMER_SPLIT_K`` splits (the consumer reads each one), unless the config or
  ``SPLIT_K_BY_SHAPE`` names the split; ``reduce=True`` keeps the auto split."""
  from pallas_kernels.split_k import SplitKPartials

  x, w = jnp.ones((1, 1024), jnp.bfloat16), jnp.ones((1024, 256), jnp.bfloat16)
  assert _split_of(x, w) > split_k.CONSUMER_SPLIT_K == 2
  partials = jax.eval_shape(functools.partial(skinny_mosaic_gpu.skinny_matmul, reduce=False), x, w)
  assert isinstance(partials, SplitKPartials) and partials.num_splits == 2
  named = jax.eval_shape(functools.partial(skinny_mosaic_gpu.skinny_matmul, reduce=False,
                                           config=Config(split_k=4)), x, w)
  assert named.num_splits == 4
  monkeypatch.setattr(split_k, "CONSUMER_SPLIT_K", 1)  # one split: the plain bf16 result
  assert jax.eval_shape(functools.partial(skinny_mosaic_gpu.skinny_matmul, reduce=False), x, w).shape == (1, 256)

