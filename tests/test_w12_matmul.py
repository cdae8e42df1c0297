"""One W12 matmul suite, run by every implementation: reference, Mosaic GPU interpreted
on CPU, and Mosaic GPU on a real Hopper when one is present."""

import logging
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import split_k, w12
from pallas_kernels.w12 import format as w12_format
from pallas_kernels.w12 import mosaic_gpu as w12_mosaic_gpu
from pallas_kernels.w12 import ops as w12_ops

BF16 = ml_dtypes.bfloat16


def weights_with_escapes(k, n, seed):
  """Per-channel scaled normals plus the values the hot loop must not see."""
  rng = np.random.default_rng(seed)
  w = rng.normal(0.0, 0.02, size=(k, n)) * np.exp(rng.uniform(np.log(1e-3), np.log(1e1), n))
  w = w.astype(BF16)
  w[1, 2] = BF16(1e30)  # escape
  w[9, 2] = BF16(-2e30)  # a second in channel 2: past a one-entry channel list, an overflow escape
  w[2, 3] = BF16(-3e-30)  # escape
  w[3, 4] = BF16(-0.0)
  w[4, 5] = np.uint16(0x0003).view(BF16)  # subnormal, code 15 with its byte
  return w


class W12MatmulSuite:
  """Cases every implementation must pass; subclasses say how to run one."""

  def run(self, x, packed, config):
    raise NotImplementedError

  @pytest.mark.parametrize(
      "k,n,m,group_k,config",
      [
          # 2 channel blocks x 2 K steps, one base group per step
          (256, 128, 5, 128, w12.TuningConfig(tile_n=64, tile_m=8, tile_k=128)),
          # K padded 120 -> 128, 3 token blocks
          (120, 64, 20, 128, w12.TuningConfig(tile_n=64, tile_m=8, tile_k=64)),
          # decode-sized M, one base group wider than K
          (128, 64, 1, 256, w12.TuningConfig(tile_n=64, tile_m=64, tile_k=128)),
          # split-K: 4 K steps in 2 splits of 2, partial sums added after; and no split at all
          (512, 64, 3, 128, w12.TuningConfig(tile_n=64, tile_m=8, tile_k=128, split_k=2)),
          (512, 64, 3, 256, w12.TuningConfig(tile_n=64, tile_m=8, tile_k=128, split_k=1)),
          # the automatic split aiming at 4 blocks per SM: one step per split here
          (512, 64, 3, 128, w12.TuningConfig(tile_n=64, tile_m=8, tile_k=128, blocks_per_sm=4, max_concurrent_steps=2)),
          # decode overlapped with the previous step's wgmma (two slots), with and without a split
          (512, 128, 9, 128, w12.TuningConfig(tile_n=64, tile_m=16, tile_k=64, split_k=1, overlap_decode=True)),
          (512, 64, 2, 512, w12.TuningConfig(tile_n=64, tile_m=8, tile_k=64, split_k=2, overlap_decode=True)),
          # decode into wgmma's registers (a real Hopper only): padded K, split-K, decode-sized M
          (256, 128, 5, 128, w12.TuningConfig(tile_m=8, tile_k=128, decode="registers")),
          (120, 64, 20, 128, w12.TuningConfig(tile_m=8, tile_k=64, decode="registers")),
          (512, 64, 3, 128, w12.TuningConfig(tile_m=8, tile_k=128, split_k=2, decode="registers")),
          (128, 64, 1, 256, w12.TuningConfig(tile_m=64, tile_k=128, max_concurrent_steps=2, decode="registers")),
          (768, 128, 3, 256, w12.TuningConfig(tile_m=8, tile_k=256, max_concurrent_steps=2, decode="registers")),
          # K = 1024: one-entry channel lists (gathers in the split-K sum) and an overflow scatter, both
          (1024, 64, 3, 256, w12.TuningConfig(tile_n=64, tile_m=8, tile_k=128, split_k=2)),
          (1024, 64, 20, 256, w12.TuningConfig(tile_n=64, tile_m=8, tile_k=128, split_k=2)),  # > GATHER_ROWS: scattered
          (1024, 128, 2, 512, w12.TuningConfig(tile_m=8, tile_k=128, split_k=2, decode="registers")),
          # the channel lists' correction added by the kernel, each K split its share (one token block)
          (1024, 128, 3, 512, w12.TuningConfig(tile_m=8, tile_k=128, split_k=2, decode="registers",
                                               escapes_in_kernel=True)),
          (1024, 64, 1, 1024, w12.TuningConfig(tile_m=8, tile_k=128, decode="registers", escapes_in_kernel=True)),
          # ... with two row blocks a block
          (1024, 128, 12, 512, w12.TuningConfig(tile_n=128, tile_m=16, tile_k=128, split_k=2, decode="registers",
                                                escapes_in_kernel=True)),
          # the register decode overlapped with the previous step's wgmma: a split, the escapes in the kernel, and
          # one step a split (no overlap: the pipeline is one step deep)
          (512, 64, 3, 128, w12.TuningConfig(tile_m=8, tile_k=64, split_k=2, max_concurrent_steps=2,
                                             decode="registers", overlap_decode=True)),
          (1024, 128, 3, 512, w12.TuningConfig(tile_m=8, tile_k=128, split_k=2, decode="registers",
                                               escapes_in_kernel=True, overlap_decode=True)),
          (512, 64, 1, 128, w12.TuningConfig(tile_m=8, tile_k=128, split_k=4, decode="registers",
                                             overlap_decode=True)),
          # blocks of several 64-channel row blocks against one activation tile: padded K at 64 token rows, a full
          # 256-channel block, the escapes in the kernel, the overlapped decode with three
          (120, 128, 40, 128, w12.TuningConfig(tile_n=128, tile_m=64, tile_k=64, decode="registers")),
          (512, 256, 16, 128, w12.TuningConfig(tile_n=256, tile_m=16, tile_k=128, decode="registers")),
          (1024, 256, 3, 512, w12.TuningConfig(tile_n=128, tile_m=8, tile_k=128, split_k=2, decode="registers",
                                               escapes_in_kernel=True)),
          (512, 192, 3, 128, w12.TuningConfig(tile_n=192, tile_m=8, tile_k=64, split_k=2, max_concurrent_steps=2,
                                              decode="registers", overlap_decode=True)),
          # the default at 48 token rows: a wide activation tile, so the automatic split capped at two
          (1024, 128, 48, 512, w12_mosaic_gpu.DEFAULT_CONFIG),
      ],
  )
  def test_matches_f32_matmul(self, k, n, m, group_k, config):
    w = weights_with_escapes(k, n, seed=m)
    x = np.random.default_rng(k + m).normal(size=(m, k)).astype(BF16)
    packed = w12.pack(w, group_k=group_k)
    assert packed.num_escapes >= 3 and packed.escape_index.shape[0] >= 1  # the overflow is exercised everywhere
    assert packed.column_capacity == w12_format.column_capacity(w12_format.padded_k(k))  # <= 1: channel 2 overflows
    y = self.run(jnp.asarray(x), packed, config)
    assert y.dtype == jnp.bfloat16 and y.shape == (m, n)
    expected = x.astype(np.float32) @ w.astype(np.float32)
    reference = np.asarray(w12.matmul(x, packed, implementation="reference"), np.float32)
    # per channel: the scales span four decades, and a fixed atol would pass a kernel that loses the small channels
    channel_scale = np.abs(reference).max(axis=0)
    bad = np.abs(np.asarray(y, np.float32) - reference) > 1e-2 * np.abs(reference) + 1e-2 * channel_scale
    assert not bad.any(), f"{bad.sum()} of {bad.size} outputs off the reference, first at {np.argwhere(bad)[0]}"
    typical = np.abs(expected[:, 8:]).max()  # columns past the planted 1e30 escape
    np.testing.assert_allclose(np.asarray(y, np.float32), expected, rtol=1e-2, atol=1e-2 * typical)


class TestReference(W12MatmulSuite):

  def run(self, x, packed, config):
    return w12.matmul(x, packed, implementation="reference")


class TestXlaDecode(W12MatmulSuite):

  def run(self, x, packed, config):
    return jax.jit(lambda x, p: w12.matmul(x, p, implementation="xla_decode"))(x, packed)

  def test_leading_dims_and_no_escapes(self):
    w = np.random.default_rng(0).normal(0, 0.02, size=(64, 32)).astype(BF16)
    packed = w12.pack(w)
    assert packed.num_escapes == 0
    x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 3, 64)).astype(BF16))
    y = w12.matmul(x, packed, implementation="xla_decode")
    assert y.shape == (2, 3, 32)
    np.testing.assert_allclose(np.asarray(y, np.float32),
                               np.asarray(w12.matmul(x, packed, implementation="reference"), np.float32),
                               rtol=1e-2, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(jax.devices()[0].platform != "gpu", reason="needs an NVIDIA GPU (XLA's GPU fusion of the decode)")
class TestXlaDecodeGpu(TestXlaDecode):
  """The same cases, selected by `-m gpu` (scripts/h200/kernels.sh): on a GPU, XLA may fuse the decode."""


class TestMosaicGpuInterpret(W12MatmulSuite):

  def run(self, x, packed, config):
    if config.decode == "registers":  # its pieces are tested on CPU in test_w12_register_decode.py
      pytest.skip("interpret mode's wgmma reads SMEM only; decode='registers' runs on a real Hopper")
    return w12_mosaic_gpu.w12_matmul(x, packed, config=config, interpret=plgpu.InterpretGPUParams())

  def test_unsupported_shapes_raise_not_implemented(self):
    packed = w12.pack(np.ones((128, 48), BF16))
    with pytest.raises(NotImplementedError, match="tile_n"):
      self.run(jnp.ones((1, 128), jnp.bfloat16), packed, w12.TuningConfig(tile_n=64))
    packed = w12.pack(np.ones((384, 64), BF16), group_k=128)
    with pytest.raises(NotImplementedError, match="split_k=2"):
      self.run(jnp.ones((1, 384), jnp.bfloat16), packed, w12.TuningConfig(tile_k=128, split_k=2))


def test_auto_split_k_fills_the_sms():
  assert split_k.auto_split_k(n_blocks=64, k_steps=96, num_sms=132) == 3  # Qwen3-8B down, M <= 64
  assert split_k.auto_split_k(n_blocks=192, k_steps=32, num_sms=132) == 1  # gate|up: enough blocks
  assert split_k.auto_split_k(n_blocks=1, k_steps=6, num_sms=132) == 6  # capped at one step each
  # four blocks per SM: 64 x 12 = 768 >= 528 (12 divides 96; 9, 10 and 11 do not)
  assert split_k.auto_split_k(n_blocks=64, k_steps=96, num_sms=132, blocks_per_sm=4) == 12
  with pytest.raises(ValueError, match="blocks_per_sm"):
    w12.TuningConfig(blocks_per_sm=0)


@pytest.mark.parametrize("m,config", [(3, w12.TuningConfig(tile_m=8, tile_k=128, split_k=1)),
                                      (10, w12.TuningConfig(tile_m=16, tile_k=128, split_k=2))])
def test_inf_nan_and_negative_zero_weights_reach_the_output_as_in_the_reference(m, config):
  """±inf and NaN weights (always escaped: the hot loop reads +0.0, the patch adds ``x * W``) and -0.0 (code 15, in
  the planes) through the SMEM decode in interpret mode and the XLA decode: the output's inf, -inf and NaN sit where
  the reference's do, a zero activation on an inf weight included (0 x inf), and the rest matches. Up to
  ``GATHER_ROWS`` rows the channel lists are gathered, above they are scattered; a second special in a channel
  overflows its list."""
  rng = np.random.default_rng(m)
  w = rng.normal(0.0, 0.02, size=(256, 64)).astype(BF16)
  w[5, 1], w[6, 2], w[7, 3], w[200, 3], w[8, 4] = BF16(np.inf), BF16(-np.inf), BF16(np.nan), BF16(-np.inf), BF16(-0.0)
  w[9, 6], w[250, 6] = BF16(np.inf), BF16(-np.inf)  # inf - inf: NaN
  x = rng.normal(size=(m, 256)).astype(BF16)
  x[1, 5], x[:, 9], x[:, 250] = 0.0, 1.0, 1.0  # 0 x inf: NaN in row 1, channel 1; inf - inf in channel 6
  packed = w12.pack(w, group_k=128)
  assert packed.num_escapes >= 6 and packed.escape_index.shape[0] >= 1  # -0.0 is no escape
  want = np.asarray(w12.matmul(jnp.asarray(x), packed, implementation="reference"), np.float32)
  assert np.isnan(want[1, 1]) and np.isinf(want[0, 1]) and np.isnan(want[:, 3]).all() and np.isnan(want[:, 6]).all()
  for got in (w12_mosaic_gpu.w12_matmul(jnp.asarray(x), packed, config=config, interpret=plgpu.InterpretGPUParams()),
              w12.matmul(jnp.asarray(x), packed, implementation="xla_decode")):
    got = np.asarray(got, np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.where(np.isnan(want), 0, got)[:, :7], np.where(np.isnan(want), 0, want)[:, :7])
    np.testing.assert_allclose(got[:, 7:], want[:, 7:], rtol=1e-2, atol=1e-3)

@pytest.mark.gpu
@pytest.mark.skipif(not w12_ops._on_hopper(), reason="needs an H100/H200")
class TestMosaicGpu(W12MatmulSuite):

  def run(self, x, packed, config):
    return jax.jit(lambda x, p: w12.matmul(x, p, implementation="mosaic_gpu", config=config))(x, packed)


def test_default_falls_back_to_reference_loudly(monkeypatch, caplog):
  monkeypatch.setattr(w12_ops, "_on_hopper", lambda: True)
  monkeypatch.setattr(w12_ops, "DEFAULT", "mosaic_gpu")
  packed = w12.pack(np.ones((64, 64), BF16))
  x = jnp.ones((2, 64), jnp.float32)  # the kernel wants bf16 activations
  with caplog.at_level(logging.WARNING, logger=w12_ops.__name__):
    y = w12.matmul(x, packed)
  assert "falls back" in caplog.text
  np.testing.assert_array_equal(np.asarray(y), np.full((2, 64), 64.0, np.float32))


def test_default_implementation_is_what_matmul_runs(monkeypatch):
  calls = []
  monkeypatch.setattr(w12_ops, "w12_matmul_xla_decode", lambda x, p: calls.append("xla_decode") or x @ w12.unpack(p))
  packed = w12.pack(np.ones((64, 32), BF16))
  x = jnp.ones((2, 64), jnp.bfloat16)
  w12.matmul(x, packed)
  assert calls == []  # the reference by default
  monkeypatch.setattr(w12_ops, "DEFAULT", "xla_decode")
  w12.matmul(x, packed)
  assert calls == ["xla_decode"]
  w12.matmul(x, packed, implementation="reference")  # a named implementation wins over DEFAULT
  assert calls == ["xla_decode"]


def test_unsummed_splits_go_to_a_consumer_only_when_nothing_is_left_to_patch():
  """``reduce=False`` (interpret mode, SMEM decode): a weight without escapes, K split in two, comes back as
  ``SplitKPartials`` whose sum is the reduced result bit for bit, and the add + norm kernel takes them; a weight
  with escapes corrected after the kernel comes back summed."""
  from pallas_kernels.add_rms_norm import add_rms_norm_reference
  from pallas_kernels.add_rms_norm import mosaic_gpu as norm_mosaic_gpu

  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.normal(size=(1, 512)).astype(BF16))
  config = w12.TuningConfig(tile_n=64, tile_m=8, tile_k=128, split_k=2)
  interpret = plgpu.InterpretGPUParams()
  magnitudes = rng.uniform(2.0 ** -8, 2.0 ** -2, size=(512, 1024)) * rng.choice([-1.0, 1.0], size=(512, 1024))
  clean = w12.pack(magnitudes.astype(BF16), group_k=128)  # six binades: inside every code window
  assert not clean.has_side_table

  def run(packed, reduce):
    return w12_mosaic_gpu.w12_matmul(x, packed, config=config, interpret=interpret, reduce=reduce)

  partials, summed = run(clean, False), run(clean, True)
  assert isinstance(partials, split_k.SplitKPartials) and partials.num_splits == 2 and partials.shape == (1, 1024)
  np.testing.assert_array_equal(np.asarray(partials.sum(), np.float32), np.asarray(summed, np.float32))
  np.testing.assert_allclose(np.asarray(summed, np.float32), np.asarray(x, np.float32) @ w12.unpack(clean).astype(
      np.float32), rtol=2e-2, atol=2e-3)
  resid = jnp.asarray(rng.normal(size=(1, 1024)).astype(BF16))
  norm_w = jnp.ones((1024,), jnp.bfloat16)
  got = norm_mosaic_gpu.add_rms_norm(resid, partials, norm_w, 1e-6, interpret=interpret)
  np.testing.assert_array_equal(np.asarray(got[0], np.float32),
                                np.asarray(add_rms_norm_reference(resid, summed, norm_w, 1e-6)[0], np.float32))
  escaped = w12.pack(weights_with_escapes(512, 64, seed=0), group_k=128)
  assert escaped.has_side_table and not isinstance(run(escaped, False), split_k.SplitKPartials)


@pytest.mark.parametrize("overflow,splits", [(False, 2), (True, 2), (False, 1), (True, 1)])
def test_register_kernel_hands_its_splits_on_when_it_corrects_every_escape(overflow, splits):
  """The register decode with ``escapes_in_kernel`` (traced for sm_90 on the CPU): with every escape in the channel
  lists, ``reduce=False`` returns the kernel's splits unsummed and the program adds nothing after the kernel (one
  split: the bf16 result itself, no f32 halves to convert); with an overflow, XLA patches and sums as before."""
  w = np.full((1024, 128), 0.5, np.float32)
  w[3, 5], w[9, 6] = 1e30, -1e30
  if overflow:
    w[700, 5] = 1e30  # a second escape in channel 5: the one-entry list overflows
  packed = w12.pack(w.astype(BF16), group_k=1024)
  config = w12.TuningConfig(decode="registers", tile_k=128, tile_m=8, split_k=splits, escapes_in_kernel=True)
  x = jnp.ones((1, 1024), jnp.bfloat16)
  out = jax.eval_shape(lambda x, p: w12_mosaic_gpu.w12_matmul(x, p, config=config, reduce=False), x, packed)
  assert isinstance(out, split_k.SplitKPartials) != overflow
  if not overflow:
    assert out.halves.shape == (splits, 2 if splits > 1 else 1, 8, 128) and out.shape == (1, 128)
    eqns = jax.make_jaxpr(lambda x, p: w12_mosaic_gpu.w12_matmul(x, p, config=config))(x, packed).jaxpr.eqns
    rows = 1 if splits == 1 else 8  # a returned bf16 result has exactly its rows (split_k.exact_rows)
    # the kernel (its custom_vmap_call), then XLA's ops
    assert eqns[0].outvars[0].aval.shape == (*out.halves.shape[:2], rows, 128)
    after = {v.aval.dtype for e in eqns[1:] for v in e.outvars}
    assert (jnp.dtype(jnp.float32) in after) == (splits > 1)  # a sum after the kernel only for splits


@pytest.mark.parametrize("tile_n,tile_m", [(64, 8), (128, 16), (64, 32)])
def test_register_kernel_loads_its_share_of_the_escape_lists_before_its_pipeline(monkeypatch, tile_n, tile_m):
  """``escapes_in_kernel`` (traced and lowered for sm_90 on the CPU, K = 3072: three-entry lists, two K splits): the
  lists' entries are loaded before the pipeline's first decode, once a row block, and their sums added after its last
  one; each split takes its share of each list (entries ``s``, ``s + 2``: two of three). The ``x`` values they
  multiply are loaded after the pipeline."""
  from pallas_kernels.w12 import register_decode

  w = np.full((3072, 128), 0.5, np.float32)
  w[[3, 700, 2000], 5] = 1e30
  packed = w12.pack(w.astype(BF16), group_k=1024)
  assert packed.column_capacity == 3 and not packed.escape_index.shape[0]
  calls = []  # (name, args) in trace order
  for name in ("escape_entries", "decode_chunk", "escape_x", "escape_sums"):
    real = getattr(register_decode, name)
    monkeypatch.setattr(register_decode, name, lambda *a, real=real, name=name: (calls.append((name, a)), real(*a))[1])
  config = w12.TuningConfig(decode="registers", tile_m=tile_m, tile_k=128, split_k=2, escapes_in_kernel=True,
                            tile_n=tile_n)
  fn = jax.jit(lambda x, p: w12_mosaic_gpu.w12_matmul(x, p, config=config))
  assert "mosaic_gpu" in fn.trace(jax.ShapeDtypeStruct((tile_m - 3, 3072), jnp.bfloat16), packed).lower(
      lowering_platforms=("cuda",)).as_text()
  events = [name for name, _ in calls]
  decodes = [i for i, e in enumerate(events) if e == "decode_chunk"]
  blocks = tile_n // register_decode.ROWS
  for name in ("escape_entries", "escape_x", "escape_sums"):
    assert events.count(name) == blocks, name
  # escape_entries(ops, thread, load, count, row_block, first, stride)
  assert [(a[3], a[4], a[6]) for name, a in calls if name == "escape_entries"] == [(2, b, 2) for b in range(blocks)]
  assert max(i for i, e in enumerate(events) if e == "escape_entries") < decodes[0]
  loads = [i for i, e in enumerate(events) if e == "escape_x"]
  assert min(loads) > decodes[-1]
  assert events.index("escape_sums") > max(decodes[-1], max(loads))


def test_register_kernel_with_overlapped_wgmma_lowers_for_hopper(monkeypatch):
  """``overlap_decode`` on the register decode lowers for sm_90 on the CPU, each step leaving its own wgmmas in
  flight (``wgmma_wait(chunks)``) and the last ones awaited after the pipeline; a split of one step stays synchronous
  (``delay_release`` needs a deeper pipeline)."""
  w = np.full((1024, 128), 0.5, np.float32)
  w[3, 5] = 1e30
  packed = w12.pack(w.astype(BF16), group_k=1024)
  x = jax.ShapeDtypeStruct((1, 1024), jnp.bfloat16)
  waits = []
  wgmma_wait = plgpu.wgmma_wait
  monkeypatch.setattr(plgpu, "wgmma_wait", lambda n: (waits.append(n), wgmma_wait(n))[1])

  def traced_waits(**fields):
    waits.clear()
    jax.clear_caches()  # a kernel traced before (``lowering.lowered_once``) would not be traced again
    config = w12.TuningConfig(decode="registers", tile_m=8, tile_k=128, escapes_in_kernel=True, **fields)
    fn = jax.jit(lambda x, p: w12_mosaic_gpu.w12_matmul(x, p, config=config))
    assert "mosaic_gpu" in fn.trace(x, packed).lower(lowering_platforms=("cuda",)).as_text()
    return list(waits)

  assert traced_waits(split_k=2) == [0]  # 4 steps a split, each waiting for its own wgmmas
  assert traced_waits(split_k=2, overlap_decode=True) == [2, 0]  # two 64-wide chunks a step left in flight
  assert traced_waits(split_k=8, overlap_decode=True) == [0]  # one step a split


def test_register_kernel_hands_a_consumer_few_splits(monkeypatch):
  """With no split in its config, the register decode hands a consumer at most ``CONSUMER_SPLIT_K`` splits (it reads
  every one in its one block: in the H200's W12 decode loop the auto splits made the 73 add + norm calls 508 us a
  step), while a reduced result keeps the auto split that fills the SMs. The capped call takes ``CONSUMER_TILE_K`` a
  step, the reduced one the config's, and both lower so for sm_90."""
  w = np.full((1024, 128), 0.5, np.float32)
  w[3, 5] = 1e30  # one escape, corrected in the kernel
  packed = w12.pack(w.astype(BF16), group_k=1024)
  x = jnp.ones((1, 1024), jnp.bfloat16)
  config = w12.TuningConfig(decode="registers", tile_k=128, tile_m=8, escapes_in_kernel=True)

  def splits(reduce):  # the kernel's output is bf16 [split_k, halves, Mp, N]
    jaxpr = jax.make_jaxpr(lambda x, p: w12_mosaic_gpu.w12_matmul(x, p, config=config, reduce=reduce))(x, packed)
    return {int(s) for s in re.findall(r"bf16\[(\d+),2,8,128\]", str(jaxpr))}

  handed = jax.eval_shape(lambda x, p: w12_mosaic_gpu.w12_matmul(x, p, config=config, reduce=False), x, packed)
  assert isinstance(handed, split_k.SplitKPartials) and handed.num_splits == split_k.CONSUMER_SPLIT_K == 2
  assert splits(True) == {8} and splits(False) == {2}  # 2 channel blocks: the auto split takes all 8 K steps
  steps, call = [], w12_mosaic_gpu._register_decode_call
  monkeypatch.setattr(w12_mosaic_gpu, "_register_decode_call",
                      lambda *a, **kw: (steps.append(kw["tile_k"]), call(*a, **kw))[1])
  for reduce in (False, True):
    fn = jax.jit(lambda x, p, reduce=reduce: jax.tree.leaves(w12_mosaic_gpu.w12_matmul(x, p, config=config,
                                                                                       reduce=reduce)))
    assert "mosaic_gpu" in fn.trace(x, packed).lower(lowering_platforms=("cuda",)).as_text()
  assert steps == [w12_mosaic_gpu.CONSUMER_TILE_K, config.tile_k]  # capped: 4 steps of 256, 2 a split; else the config's


@pytest.mark.gpu
@pytest.mark.skipif(not w12_ops._on_hopper(), reason="needs an H100/H200")
@pytest.mark.parametrize("k,n", [(4096, 4096), (12288, 4096)])
def test_register_kernel_splits_sum_to_the_reduced_result_on_the_gpu(k, n):
  """Qwen3-8B's o and down projections at one token row with the default config and the escapes in the kernel: the
  unsummed splits the norm kernel would get add up to the reduced result, which matches the reference."""
  import dataclasses

  w = weights_with_escapes(k, n, seed=k)
  w[9, 2] = 0  # no overflow: every escape in its channel list
  packed = w12.pack(w)
  config = dataclasses.replace(w12_mosaic_gpu.DEFAULT_CONFIG, escapes_in_kernel=True)
  x = jnp.asarray(np.random.default_rng(k).normal(size=(1, k)).astype(BF16))
  run = jax.jit(lambda x, p, reduce: w12.matmul(x, p, implementation="mosaic_gpu", config=config, reduce=reduce),
                static_argnums=2)
  partials = run(x, packed, False)
  assert isinstance(partials, split_k.SplitKPartials) and partials.num_splits <= split_k.CONSUMER_SPLIT_K
  config = dataclasses.replace(config, split_k=partials.num_splits)  # the reduced result of the same splits
  summed = run(x, packed, True)
  np.testing.assert_array_equal(np.asarray(jax.jit(lambda p: p.sum())(partials), np.float32),
                                np.asarray(summed, np.float32))
  want = np.asarray(w12.matmul(x, packed, implementation="reference"), np.float32)
  np.testing.assert_allclose(np.asarray(summed, np.float32), want, rtol=2e-2, atol=2e-2 * np.abs(want).max())


@pytest.mark.gpu
@pytest.mark.skipif(not w12_ops._on_hopper(), reason="needs an H100/H200")
@pytest.mark.parametrize("k,n,m", [(4096, 24576, 1), (4096, 8192, 16)])
def test_register_kernel_stores_bf16_at_one_split_on_the_gpu(k, n, m):
  """At one K split with every escape corrected in the kernel, the kernel stores the bf16 result itself (no f32
  halves, no XLA op after it): rounded as XLA rounds the f32 sums when the correction is left to it (channels without
  escapes bit for bit), and within the reference's tolerance everywhere."""
  import dataclasses

  w = weights_with_escapes(k, n, seed=k + m)
  w[9, 2] = 0  # no overflow: every escape in its channel list
  packed = w12.pack(w)
  x = jnp.asarray(np.random.default_rng(m).normal(size=(m, k)).astype(BF16))
  one = dataclasses.replace(w12_mosaic_gpu.DEFAULT_CONFIG, split_k=1)
  run = jax.jit(lambda x, p, config: w12_mosaic_gpu.w12_matmul(x, p, config=config), static_argnums=2)
  got = np.asarray(run(x, packed, one), np.float32)
  after = np.asarray(run(x, packed, dataclasses.replace(one, escapes_in_kernel=False)), np.float32)
  clean = np.asarray(packed.column_escape_bits == 0).all(axis=1)  # channels with no escape
  assert 0 < clean.sum() < n
  np.testing.assert_array_equal(got[:, clean], after[:, clean])
  reference = np.asarray(w12.matmul(x, packed, implementation="reference"), np.float32)
  np.testing.assert_allclose(got, reference, rtol=2e-2, atol=2e-2 * np.abs(reference).max())


def test_register_kernel_widens_or_deepens_its_steps_when_a_consumer_caps_its_split():
  """Capped to ``CONSUMER_SPLIT_K`` splits the register decode runs ~1 block an SM, so it takes ``CONSUMER_TILE_K`` a
  step where K, the base-exponent groups and the split allow it, and loads ``CONSUMER_DEPTH`` steps ahead where shared
  memory allows; a config already deeper keeps its depth. At 64 token rows only a grid of at most one block an SM
  does so."""
  capped = w12_mosaic_gpu._capped_config
  narrow = w12.TuningConfig(decode="registers", tile_k=128, blocks_per_sm=4, max_concurrent_steps=2)
  wide_k, deep = w12_mosaic_gpu.CONSUMER_TILE_K, w12_mosaic_gpu.CONSUMER_DEPTH
  assert narrow.tile_k < wide_k and narrow.max_concurrent_steps < deep
  down = capped(narrow, 8, kp=12288, group_k=4096, split_k=2, grid_blocks=128)  # 48 wide steps, 24 a split
  assert (down.tile_k, down.max_concurrent_steps) == (wide_k, deep)
  # already wide: deepened
  default = capped(w12_mosaic_gpu.DEFAULT_CONFIG, 8, kp=12288, group_k=1024, split_k=2, grid_blocks=128)
  assert (default.tile_k, default.max_concurrent_steps) == (wide_k, deep)
  for kp, group_k, split in [(12288, 128, 2), (896, 896, 2), (12288, 4096, 5)]:  # groups, K, split in the way
    kept = capped(narrow, 8, kp=kp, group_k=group_k, split_k=split, grid_blocks=128)
    assert (kept.tile_k, kept.max_concurrent_steps) == (narrow.tile_k, deep), (kp, group_k)
  # 64 rows: a lone block an SM widens and deepens as shared memory allows; more blocks than SMs keep the config
  lone = capped(narrow, 64, kp=12288, group_k=4096, split_k=2, grid_blocks=128)
  assert lone.tile_k == wide_k and lone.max_concurrent_steps == deep
  assert capped(narrow, 64, kp=4096, group_k=4096, split_k=2, grid_blocks=384) == narrow
  assert capped(narrow, 32, kp=4096, group_k=4096, split_k=2, grid_blocks=384).tile_k == wide_k
  six = capped(w12.TuningConfig(decode="registers", tile_k=256, max_concurrent_steps=6), 8, 12288, 4096, 2, 128)
  assert (six.tile_k, six.max_concurrent_steps) == (256, 6)
  wide = w12.TuningConfig(decode="registers", tile_k=256, tile_m=256, max_concurrent_steps=1)
  # 256 rows of 256-deep tiles: shared memory stops it
  fits = capped(wide, 256, 12288, 4096, 2, 64).max_concurrent_steps
  assert 1 <= fits < deep
  assert w12_mosaic_gpu._register_smem_bytes(wide, 256, fits) <= split_k.SMEM_LIMIT
  assert w12_mosaic_gpu._register_smem_bytes(wide, 256, fits + 1) > split_k.SMEM_LIMIT


def test_default_step_narrows_to_what_k_the_groups_and_the_activation_tile_allow(monkeypatch):
  """The default's 256 K a step halves where the padded K or the base-exponent groups are not multiples of it, and
  where its activation tile would pass ``ACTIVATION_STEP_BYTES`` (64 token rows); what ``w12_matmul`` traces follows."""
  widest = w12_mosaic_gpu._widest_step
  default = w12_mosaic_gpu.DEFAULT_CONFIG
  assert default.tile_k == 256 and widest(default, 12288, 1024, 16) == default
  assert widest(default, 640, 1024, 8).tile_k == 128 and widest(default, 576, 1024, 8).tile_k == 64
  assert widest(default, 4096, 128, 8).tile_k == 128
  assert widest(default, 12288, 1024, 32).tile_k == 256 and widest(default, 12288, 1024, 64).tile_k == 128
  rng = np.random.default_rng(3)
  packed = w12.pack(jnp.asarray(rng.normal(size=(2048, 64)), jnp.bfloat16), group_k=1024)
  # 16 rows: 256 a step, the automatic split (all 8 steps); 64 rows: narrowed to 128, the split capped at two, and
  # with 2 blocks in all (fewer than SMs) the capped form's wide, deep step
  assert default_register_calls(monkeypatch, packed, (16, 64)) == [
      (8, 256, 2), (split_k.CONSUMER_SPLIT_K, w12_mosaic_gpu.CONSUMER_TILE_K, w12_mosaic_gpu.CONSUMER_DEPTH)]


def default_register_calls(monkeypatch, packed, rows):
  """(split_k, tile_k, max_concurrent_steps) of the register-decode kernel that ``w12_matmul`` without a config traces
  (and lowers for sm_90) at each token count of ``rows``."""
  traced = []
  real = w12_mosaic_gpu._register_decode_call
  monkeypatch.setattr(w12_mosaic_gpu, "_register_decode_call", lambda *a, **kw: (
      traced.append((kw["split_k"], kw["tile_k"], kw["max_concurrent_steps"])), real(*a, **kw))[1])
  k = packed.shape[0]
  for m in rows:
    jax.jit(w12_mosaic_gpu.w12_matmul).trace(jax.ShapeDtypeStruct((m, k), jnp.bfloat16), packed).lower(
        lowering_platforms=("cuda",))
  return traced


def test_wide_activation_tiles_aim_the_split_at_more_blocks_than_one_wave(monkeypatch):
  """At 64 token rows the automatic split aims at ``WIDE_TILE_BLOCKS_PER_SM`` blocks an SM (then capped at
  ``CONSUMER_SPLIT_K``), not the default's two: a layer with between 2 and 4 channel blocks an SM (gate|up on the
  H200) gets two splits at 64 rows and one at 1 row, and one with fewer than one an SM (the down projection) splits
  at 1 row to give every SM two blocks. Scaled down: 5 and 1 channel blocks on 2 SMs."""
  monkeypatch.setattr(w12_mosaic_gpu, "num_sms", lambda: 2)
  assert w12_mosaic_gpu.DEFAULT_CONFIG.blocks_per_sm == 2 < w12_mosaic_gpu.WIDE_TILE_BLOCKS_PER_SM == 4
  packed = w12.pack(jnp.asarray(np.random.default_rng(4).normal(size=(2048, 320)), jnp.bfloat16), group_k=1024)
  # 1 row: 5 blocks >= 1 an SM, no split, 256 a step; 64 rows: 10 blocks, the narrowed step as the config has it
  assert default_register_calls(monkeypatch, packed, (1, 64)) == [(1, 256, 2), (2, 128, 2)]
  narrow = w12.pack(jnp.asarray(np.random.default_rng(5).normal(size=(2048, 64)), jnp.bfloat16), group_k=1024)
  # 1 channel block at 1 row: 4 splits give the 2 SMs two blocks each
  assert default_register_calls(monkeypatch, narrow, (1,)) == [(4, 256, 2)]


def test_one_split_where_it_fills_the_sms_and_its_result_is_returned_exactly(monkeypatch):
  """``ONE_SPLIT_FILLS``: a layer with between 1 and 2 channel blocks an SM (4096x12288 on the H200) takes one split
  at 1 and 16 rows, not the two that two blocks an SM would ask, and at 1 row the kernel's bf16 output has exactly
  the one row (``split_k.exact_rows``): nothing runs after it. Without the rule, two splits. Scaled down: 3 channel
  blocks on 2 SMs, lowered for sm_90."""
  monkeypatch.setattr(w12_mosaic_gpu, "num_sms", lambda: 2)
  packed = w12.pack(jnp.asarray(np.random.default_rng(6).normal(size=(2048, 192)), jnp.bfloat16), group_k=1024)
  assert default_register_calls(monkeypatch, packed, (1, 16)) == [(1, 256, 2), (1, 256, 2)]
  text = jax.jit(w12_mosaic_gpu.w12_matmul).trace(jax.ShapeDtypeStruct((1, 2048), jnp.bfloat16), packed).lower(
      lowering_platforms=("cuda",)).as_text()
  calls = [line for line in text.splitlines() if "custom_call" in line and "mosaic_gpu" in line]
  assert len(calls) == 1 and "-> tensor<1x1x1x192xbf16>" in calls[0]
  monkeypatch.setattr(w12_mosaic_gpu, "ONE_SPLIT_FILLS", False)
  jax.clear_caches()  # the rule is read at trace time
  assert default_register_calls(monkeypatch, packed, (1,)) == [(2, 256, 2)]


@pytest.mark.gpu
@pytest.mark.skipif(not w12_ops._on_hopper(), reason="needs an H100/H200")
@pytest.mark.parametrize("k,n,m,tile_n", [(4096, 12288, 64, 128), (12288, 4096, 64, 128), (4096, 6144, 16, 256),
                                          (4096, 6144, 5, 192)])
def test_wider_channel_blocks_change_no_bit_on_the_gpu(k, n, m, tile_n):
  """A block of several 64-channel row blocks computes each row block's sums as a 64-channel block does (the same
  K order, one wgmma M group each): at one split the output equals the 64-channel kernel's bit for bit, with the
  escapes corrected after the kernel and in it."""
  import dataclasses

  w = weights_with_escapes(k, n, seed=k + n + m)
  packed = w12.pack(w)
  x = jnp.asarray(np.random.default_rng(m).normal(size=(m, k)).astype(BF16))
  run = jax.jit(lambda x, p, config: w12_mosaic_gpu.w12_matmul(x, p, config=config), static_argnums=2)
  for in_kernel in (False, True):
    narrow = dataclasses.replace(w12_mosaic_gpu.DEFAULT_CONFIG, tile_k=128, split_k=2, max_concurrent_steps=2,
                                 escapes_in_kernel=in_kernel)
    want = np.asarray(run(x, packed, narrow), np.float32)
    got = np.asarray(run(x, packed, dataclasses.replace(narrow, tile_n=tile_n)), np.float32)
    np.testing.assert_array_equal(got, want, err_msg=f"escapes_in_kernel={in_kernel}")
  reference = np.asarray(w12.matmul(x, packed, implementation="reference"), np.float32)
  np.testing.assert_allclose(want, reference, rtol=2e-2, atol=2e-2 * np.abs(reference).max())
