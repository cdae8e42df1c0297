"""The register-decode W12 kernel's pieces on CPU: the word decode (every byte, code and base), the
thread -> weight mapping through swizzled SMEM against ``unpack``, and its Mosaic GPU lowering.

The kernel itself needs a real Hopper (GPU interpret mode's wgmma reads SMEM only); it runs the shared
suite there (``test_w12_matmul.py``, ``TestMosaicGpu``)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from pallas_kernels import w12
from pallas_kernels.w12 import mosaic_gpu as w12_mosaic_gpu
from pallas_kernels.w12 import register_decode as rd
from pallas_kernels.w12.format import LOGICAL_OFFSET, MAX_BASE, STORED_POSITION, decode_bits, side_table_positions

BF16 = ml_dtypes.bfloat16


@pytest.mark.parametrize("high_nibbles", [False, True])
def test_decode_word_is_format_decode_for_every_byte_code_and_base(high_nibbles):
  """All 256 bytes x 16 codes x every base, four lanes of a word at once with different codes and bytes (so
  a carry or a mask leaking between bytes, or a sign taken from the wrong partner, shows), and junk in the other
  nibble."""
  byte = np.arange(256, dtype=np.uint32)
  code = np.arange(16, dtype=np.uint32)
  base = np.arange(MAX_BASE + 1, dtype=np.uint32)
  b, c, e = np.meshgrid(byte, code, base, indexing="ij")
  b, c, e = b.ravel(), c.ravel(), e.ravel()
  lanes_bytes = [b, b ^ 0x5A, 255 - b, (b * 7) % 256]
  lanes_codes = [c, (c + 1) % 16, 15 - c, (c + 7) % 16]
  byte_word = sum(x << (8 * i) for i, x in enumerate(lanes_bytes)).astype(np.uint32)
  junk = np.uint32(0xA) if high_nibbles else np.uint32(0x5)
  shift = 4 if high_nibbles else 0
  nibble_word = sum(((x << shift) | (junk << (4 - shift))) << (8 * i) for i, x in enumerate(lanes_codes))
  pair01, pair23 = rd.decode_word(rd.NUMPY_OPS, byte_word, nibble_word.astype(np.uint32),
                                  (e * 0x01010101).astype(np.uint32), high_nibbles)
  got = [pair01 & 0xFFFF, pair01 >> 16, pair23 & 0xFFFF, pair23 >> 16]
  for lane in range(4):  # lanes 0, 1 and 2, 3 are pair partners: each holds the other's sign
    want = decode_bits(jnp.asarray(lanes_bytes[lane].astype(np.uint8)),
                       jnp.asarray(lanes_bytes[lane ^ 1].astype(np.uint8)),
                       jnp.asarray(lanes_codes[lane].astype(np.uint8)), jnp.asarray(e.astype(np.uint8)))
    np.testing.assert_array_equal(got[lane], np.asarray(want), err_msg=f"lane {lane}")


def test_numpy_prmt_follows_ptx():
  a, b = np.uint32(0x83_02_81_00), np.uint32(0x07_86_05_04)
  assert int(rd.NUMPY_OPS.prmt(a, b, 0x5140)) == 0x05_81_04_00  # bytes a0 b0 a1 b1 (a is the low word)
  assert int(rd.NUMPY_OPS.prmt(a, b, 0xBA98)) == 0xFF_00_FF_00  # sign of a's bytes replicated
  assert int(rd.NUMPY_OPS.prmt(a, b, 0x7654)) == int(b)


def test_stored_k_order_is_a_permutation_of_each_chunk():
  assert sorted(STORED_POSITION.tolist()) == list(range(rd.CHUNK))
  # wgmma K tile 0 of thread 0: positions 0, 1, 8, 9 read stored 0..3
  assert STORED_POSITION[[0, 1, 8, 9]].tolist() == [0, 1, 2, 3]
  assert (STORED_POSITION[LOGICAL_OFFSET] == np.arange(rd.CHUNK)).all()


@pytest.mark.parametrize("step_k,n", [(64, 64), (128, 64), (256, 64), (128, 128), (256, 192)])
def test_every_thread_decodes_its_fragment_through_swizzled_smem(step_k, n):
  """The A fragment the 128 threads assemble (loads through the swizzle, decode, placement) is the
  unpacked weight tile in its logical K order (``pack`` stores the planes in the order the threads read them),
  escapes as +0.0 (patched after the kernel); a tile of several row blocks (``tile_n`` 128, 192) decodes each from
  its own rows of the one swizzled tile."""
  rng = np.random.default_rng(step_k + n)
  k = 4 * step_k
  w = (rng.normal(0, 0.02, size=(k, n)) * np.exp(rng.uniform(-4, 4, n))).astype(BF16)
  w[5, 7], w[70, 3], w[9, n - 1] = BF16(1e30), BF16(-0.0), BF16(-3e33)  # escapes (one in the last row) and a -0
  packed = w12.pack(w, group_k=256)  # kernels need group_k % step_k == 0: one base per step
  planes = np.asarray(packed.sign_mantissa), np.asarray(packed.exponent_codes)
  bases = np.asarray(packed.base_exponent)
  decoded = np.asarray(jax.lax.bitcast_convert_type(w12.unpack(packed), jnp.uint16)).T  # [N, K]
  escaped = np.zeros(decoded.shape, bool)
  flat = side_table_positions(packed)
  escaped.reshape(-1)[flat % n * k + flat // n] = True
  assert escaped.sum() >= 1
  for step in range(k // step_k):
    byte_tile = planes[0][:, step * step_k:(step + 1) * step_k]
    nibble_tile = planes[1][:, step * step_k // 2:(step + 1) * step_k // 2]
    step_bases = bases[:, step * step_k // 256]
    for chunk in range(step_k // rd.CHUNK):
      cols = step * step_k + chunk * rd.CHUNK + np.arange(rd.CHUNK)
      want = np.where(escaped[:, cols], np.uint16(0), decoded[:, cols])
      np.testing.assert_array_equal(rd.simulate_chunk(byte_tile, nibble_tile, step_bases, chunk), want)


@pytest.mark.parametrize("m,k,tile_k,group_k,split,tile_n", [
    (1, 512, 128, 1024, 0, 64), (64, 512, 64, 1024, 0, 64), (5, 512, 256, 1024, 0, 64), (20, 120, 64, 1024, 0, 64),
    (14, 512, 128, 1024, 0, 64),
    (1, 512, 128, 128, 1, 64),  # four K groups a split: the step picks its bases among four
    (1, 768, 128, 384, 3, 64),  # splits of 256 starting inside 384-wide groups: two groups each, the last slice clamped
    (64, 512, 128, 1024, 0, 128), (16, 768, 128, 384, 3, 256),  # several row blocks a block
])
def test_register_kernel_lowers_for_hopper_on_cpu(m, k, tile_k, group_k, split, tile_n):
  """Mosaic GPU's Python lowering (layouts, the inline decode, wgmma from registers, TMA tiling of an unpadded
  ``x``: 20 x 120 failed on the H200 before ``pad_for_tma``; the bases of several K groups held in registers; blocks
  of several 64-channel row blocks, one wgmma M group each) runs without a GPU."""
  packed = w12.pack((np.random.default_rng(0).normal(size=(k, 256)) * 0.02).astype(BF16), group_k=group_k)
  config = w12.TuningConfig(decode="registers", tile_m=64, tile_k=tile_k, split_k=split, tile_n=tile_n)
  x = jnp.ones((m, k), jnp.bfloat16)
  lowered = jax.jit(lambda x, p: w12_mosaic_gpu.w12_matmul(x, p, config=config)).trace(x, packed).lower(
      lowering_platforms=("cuda",))
  assert "mosaic_gpu" in lowered.as_text()


def test_split_groups_counts_every_group_a_split_touches():
  """``split_groups`` against a brute force over every split start: the most groups any split of ``span`` touches."""
  for group_k in (64, 128, 384, 1024):
    for span in (64, 128, 256, 512, 768, 2048):
      kp = 12 * max(span, group_k)
      total = -(-kp // group_k)
      touched = max(len({k // group_k for k in range(start, start + span)}) for start in range(0, kp, span))
      assert w12_mosaic_gpu.split_groups(span, group_k, total) >= touched, (span, group_k)
      assert w12_mosaic_gpu.split_groups(span, group_k, total) <= touched + 1, (span, group_k)


@pytest.mark.parametrize("overflow,m", [(False, 1), (True, 1), (False, 16)])
def test_escape_lists_need_no_scatter(overflow, m):
  """Up to ``GATHER_ROWS`` token rows the channel lists' correction is gathers and adds (fused into the split-K sum
  on a GPU): a weight whose escapes all fit its lists lowers with no scatter at all, an overflow brings one. Above,
  the lists are scattered."""
  w = np.full((1024, 128), 0.5, np.float32)
  w[[3, 700], 5] = 1e30  # channel 5: two escapes; the lists hold one (column_capacity(1024) = 1) unless widened
  w[9, 6] = -1e30
  w = w.astype(BF16)
  if not overflow:
    w[700, 5] = BF16(0.25)
  packed = w12.pack(w, group_k=1024)
  assert packed.column_capacity == 1 and packed.escape_index.shape[0] == int(overflow)
  config = w12.TuningConfig(decode="registers", tile_k=128)
  text = jax.jit(lambda x, p: w12_mosaic_gpu.w12_matmul(x, p, config=config)).trace(
      jnp.ones((m, 1024), jnp.bfloat16), packed).lower(lowering_platforms=("cuda",)).as_text()
  assert 1 <= w12_mosaic_gpu.GATHER_ROWS < 16
  assert ("stablehlo.scatter" in text) == (overflow or m > w12_mosaic_gpu.GATHER_ROWS)


def test_register_decode_refuses_interpret_mode_and_odd_tiles():
  from jax.experimental.pallas import mosaic_gpu as plgpu

  packed = w12.pack(np.ones((256, 64), BF16))
  x = jnp.ones((1, 256), jnp.bfloat16)
  with pytest.raises(NotImplementedError, match="interpret"):
    w12_mosaic_gpu.w12_matmul(x, packed, config=w12.TuningConfig(decode="registers"), interpret=plgpu.InterpretGPUParams())
  wide = w12.pack(np.ones((1024, 64), BF16), group_k=1024)
  with pytest.raises(NotImplementedError, match="tile_k 64, 128 or 256"):
    w12_mosaic_gpu.w12_matmul(jnp.ones((1, 1024), jnp.bfloat16), wide,
                              config=w12.TuningConfig(decode="registers", tile_k=512))
  with pytest.raises(ValueError, match="decode"):
    w12.TuningConfig(decode="shared")


@pytest.mark.parametrize("row_bytes", [32, 64, 128, 256])
def test_chunk_offset_is_the_swizzled_offset_for_every_thread_half_and_column(row_bytes):
  """The kernel's per-load addressing (``swizzle_parts`` once, one XOR and one add per load) equals the full
  swizzle formula at every thread's rows and every 32-aligned column constant of the tile."""
  ops = rd.NUMPY_OPS
  thread = np.arange(128, dtype=np.uint32)
  row = (thread >> 5) * 16 + ((thread & 31) >> 2)
  quad = thread & 3
  parts = rd.swizzle_parts(ops, row, quad, row_bytes)
  for half in range(2):
    for col in range(0, row_bytes, 32):
      want = rd.swizzled_offset(ops, row + 8 * half, quad * 8 + col, row_bytes)
      np.testing.assert_array_equal(rd.chunk_offset(ops, parts, half, col, row_bytes), want, err_msg=f"{half}, {col}")


@pytest.mark.parametrize("tile_m,m,channels", [(8, 1, 64), (8, 5, 64), (16, 11, 64), (16, 3, 128)])
def test_every_thread_adds_its_escape_correction(tile_m, m, channels):
  """``escape_correction`` as the 128 threads run it (numpy): at each accumulator position it adds
  ``sum_c x[col, rows[n, c]] * W[rows[n, c], n]`` in list order, nothing past ``x``'s rows, and nothing for an unused
  entry, whose ``x`` it does not read (its k is out of range here); for every row block of a 128-channel block; and
  its K splits' shares add up to it."""
  rng = np.random.default_rng(tile_m + m + channels)
  capacity, k = 4, 512
  rows = rng.integers(0, k, size=(channels, capacity)).astype(np.int32)
  bits = rng.normal(size=(channels, capacity)).astype(BF16).view(np.uint16).copy()
  bits[::3, 3] = 0  # unused entries
  rows[::3, 3] = k + 1000  # read through an unused entry, x would raise IndexError
  x = rng.normal(size=(m, k)).astype(BF16)
  got = rd.simulate_escape_correction(rows, bits, x, tile_m)
  want = np.zeros((channels, tile_m), np.float32)
  values = bits.view(BF16).astype(np.float32)
  for r in range(channels):
    for c in range(capacity):
      if bits[r, c]:
        want[r, :m] = want[r, :m] + x[:, rows[r, c]].astype(np.float32) * values[r, c]
  np.testing.assert_array_equal(got, want)
  for splits in (2, 3, 5):  # K splits sharing the lists: split s adds entries s, s + splits, ... (none past 4)
    shares = [rd.simulate_escape_correction(rows, bits, x, tile_m, s, splits) for s in range(splits)]
    assert not shares[-1].any() if splits == 5 else shares[-1].any()
    np.testing.assert_allclose(sum(shares), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("overflow", [False, True])
def test_escapes_in_kernel_leave_xla_only_the_overflow(overflow):
  """With ``escapes_in_kernel`` the register kernel takes the channel lists (lowered for sm_90 on the CPU): the
  program after it gathers and scatters nothing unless the weight has an overflow."""
  w = np.full((1024, 128), 0.5, np.float32)
  w[3, 5], w[9, 6] = 1e30, -1e30
  if overflow:
    w[700, 5] = 1e30  # a second escape in channel 5: the one-entry list overflows
  packed = w12.pack(w.astype(BF16), group_k=1024)
  assert packed.column_capacity == 1 and packed.escape_index.shape[0] == int(overflow)
  config = w12.TuningConfig(decode="registers", tile_k=128, tile_m=8, escapes_in_kernel=True)
  text = jax.jit(lambda x, p: w12_mosaic_gpu.w12_matmul(x, p, config=config)).trace(
      jnp.ones((3, 1024), jnp.bfloat16), packed).lower(lowering_platforms=("cuda",)).as_text()
  assert "mosaic_gpu" in text
  assert ("stablehlo.scatter" in text) == overflow and ("stablehlo.gather" in text) == overflow
  with pytest.raises(ValueError, match="escapes_in_kernel needs decode='registers'"):
    w12.TuningConfig(escapes_in_kernel=True)


@pytest.mark.parametrize("steps,fits", [(3, True), (4, False)])
def test_register_kernel_refuses_a_config_over_shared_memory(steps, fits):
  """At 64 token rows and tile_k 256, a config whose pipeline needs more shared memory than a Hopper block has raises
  NotImplementedError naming the fix (so ``w12.matmul`` falls back loudly) instead of failing inside Mosaic GPU; one that
  fits lowers for sm_90."""
  packed = w12.pack((np.random.default_rng(0).normal(size=(1024, 256)) * 0.02).astype(BF16))
  config = w12.TuningConfig(decode="registers", tile_m=64, tile_k=256, split_k=1, max_concurrent_steps=steps)
  x = jnp.ones((64, 1024), jnp.bfloat16)
  lower = lambda: jax.jit(lambda x, p: w12_mosaic_gpu.w12_matmul(x, p, config=config)).trace(x, packed).lower(
      lowering_platforms=("cuda",))
  if fits:
    assert "mosaic_gpu" in lower().as_text()
  else:
    with pytest.raises(NotImplementedError, match="lower max_concurrent_steps or tile_k"):
      lower()
