"""W12 format: bit-exact round trips on adversarial bf16, the bit budget, the matmul."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from pallas_kernels import w12
from pallas_kernels.w12 import format as w12_format

BF16 = ml_dtypes.bfloat16


def bits_to_bf16(bits) -> np.ndarray:
  return np.asarray(bits, np.uint16).view(BF16)


def assert_round_trip(w, **pack_kwargs) -> w12.W12Array:
  packed = w12.pack(w, **pack_kwargs)
  out = w12.unpack(packed)
  assert out.dtype == jnp.bfloat16 and out.shape == w.shape
  np.testing.assert_array_equal(np.asarray(out).view(np.uint16), np.asarray(w).view(np.uint16))
  return packed


def scaled_normal_weights(k, n, seed=0):
  """normal(0, 0.02) with per-output-channel scales spanning 1e-3 .. 1e1."""
  rng = np.random.default_rng(seed)
  scale = np.exp(rng.uniform(np.log(1e-3), np.log(1e1), size=n))
  return (rng.normal(0.0, 0.02, size=(k, n)) * scale[None, :]).astype(BF16)


SPECIALS = np.array(
    [0x0000, 0x8000,  # +0, -0
     0x0001, 0x8001, 0x007F, 0x807F, 0x0040,  # subnormals
     0x0080, 0x8080,  # smallest normals
     0x7F7F, 0xFF7F,  # largest finite
     0x7F80, 0xFF80,  # +-inf
     0x7FC0, 0xFFC0, 0x7F81, 0xFF81, 0x7FFF, 0xFFFF, 0x7FA5],  # NaN payloads
    np.uint16)


class TestRoundTrip:

  def test_every_bf16_bit_pattern(self):
    w = bits_to_bf16(np.arange(2**16, dtype=np.uint32).astype(np.uint16).reshape(256, 256))
    packed = assert_round_trip(w)
    assert packed.num_escapes > 0  # the side table is exercised, not bypassed

  def test_every_bit_pattern_transposed_and_small_groups(self):
    w = bits_to_bf16(np.arange(2**16, dtype=np.uint32).astype(np.uint16).reshape(256, 256).T)
    assert_round_trip(w, group_k=64)

  @pytest.mark.parametrize("shape", [(1, 1), (3, 257), (257, 3), (64, 1), (65, 2), (130, 70)])
  def test_specials_in_odd_shapes(self, shape):
    rng = np.random.default_rng(sum(shape))
    w = bits_to_bf16(rng.choice(SPECIALS, size=shape))
    assert_round_trip(w)

  def test_all_zero_columns_need_no_escapes(self):
    w = np.zeros((128, 8), BF16)
    w[:, 3] = -0.0
    assert w12.pack(w).num_escapes == 0
    assert_round_trip(w)

  def test_specials_mixed_into_normal_weights(self):
    w = scaled_normal_weights(192, 96, seed=1)
    bits = w.view(np.uint16).copy()
    rng = np.random.default_rng(1)
    where = rng.choice(bits.size, size=200, replace=False)
    bits.reshape(-1)[where] = rng.choice(SPECIALS, size=200)
    assert_round_trip(bits_to_bf16(bits))

  @pytest.mark.parametrize("seed", [0, 1, 2])
  def test_random_bit_patterns(self, seed):
    rng = np.random.default_rng(seed)
    w = bits_to_bf16(rng.integers(0, 2**16, size=(97, 131), dtype=np.uint16))
    assert_round_trip(w, group_k=128)

  def test_wide_exponent_range_in_one_block(self):
    # every magnitude from 2**-133 (subnormal) to 2**127 inside single (row, group) blocks
    rng = np.random.default_rng(3)
    mags = np.ldexp(1.0 + rng.random((512, 16)), rng.integers(-133, 128, size=(512, 16)))
    w = (mags * rng.choice([-1.0, 1.0], size=mags.shape)).astype(BF16)
    packed = assert_round_trip(w)
    assert packed.num_escapes > 0

  def test_huge_values_are_native_and_inf_nan_escape(self):
    # the highest window (base 240) ends at exponent field 254: the largest finite values are in it, field 255
    # (+-inf, NaN with its payload) always goes to the side table
    w = np.array([[3e38], [-1e38], [np.inf], [-np.inf], [np.nan]], np.float32).astype(BF16)
    packed = assert_round_trip(w)
    assert int(packed.base_exponent[0, 0]) == w12_format.MAX_BASE == 240
    assert sorted(w12_format.side_table_positions(packed).tolist()) == [2, 3, 4]

  def test_zeros_and_subnormals_are_exact_without_the_side_table(self):
    # code 15 is exponent field 0 with the byte as stored: +-0.0 and subnormals in a block of normal weights
    w = scaled_normal_weights(256, 8, seed=7)
    bits = w.view(np.uint16).copy()
    bits[::3, :] = np.array([0x0000, 0x8000, 0x0001, 0x807F, 0x0040, 0x8001, 0x0000, 0x8000], np.uint16)
    w = bits_to_bf16(bits)
    packed = assert_round_trip(w)
    escaped_rows = w12_format.side_table_positions(packed) // 8
    assert not np.any(escaped_rows % 3 == 0)  # none of the 688 zeros and subnormals is in the side table

  def test_channel_lists_hold_the_first_escapes_and_the_rest_overflow(self):
    k, n = 1024, 4  # column_capacity(1024) = 1: one listed escape per channel
    assert w12_format.column_capacity(k) == 1
    w = np.full((k, n), 1.0, np.float32)
    for row in (5, 300, 900):
      w[row, 2] = 1e30  # three escapes in channel 2
    w[17, 0] = -1e-30  # one in channel 0
    w = w.astype(BF16)
    packed = assert_round_trip(w)
    assert packed.column_capacity == 1 and packed.num_escapes == 4
    np.testing.assert_array_equal(np.asarray(packed.column_escape_rows)[:, 0], [17, 0, 5, 0])
    np.testing.assert_array_equal(np.asarray(packed.column_escape_bits)[:, 0] != 0, [True, False, True, False])
    np.testing.assert_array_equal(np.asarray(packed.escape_index), [300 * n + 2, 900 * n + 2])
    x = np.zeros((2, k), BF16)
    x[0, 300], x[1, 17], x[1, 5] = 1.0, 2.0, -1.0
    for implementation in ("reference", "xla_decode"):
      y = np.asarray(w12.matmul(x, packed, implementation=implementation), np.float32)
      np.testing.assert_allclose(y, x.astype(np.float32) @ w.astype(np.float32), rtol=1e-2)

  def test_accepts_jax_arrays(self):
    w = jnp.asarray(scaled_normal_weights(64, 32))
    assert_round_trip(w)


class TestLayout:

  def test_plane_shapes(self):
    packed = w12.pack(scaled_normal_weights(200, 48), group_k=128)
    assert packed.shape == (200, 48)
    assert packed.sign_mantissa.shape == (48, 256) and packed.sign_mantissa.dtype == jnp.uint8
    assert packed.exponent_codes.shape == (48, 128) and packed.exponent_codes.dtype == jnp.uint8
    assert packed.base_exponent.shape == (48, 2) and packed.base_exponent.dtype == jnp.uint8
    assert packed.escape_index.dtype == jnp.int32 and packed.escape_bits.dtype == jnp.uint16
    assert packed.column_escape_rows.dtype == jnp.int32 and packed.column_escape_bits.dtype == jnp.uint16
    assert packed.column_escape_rows.shape == packed.column_escape_bits.shape == (48, packed.column_capacity)

  def test_stored_k_order_and_nibble_halves(self):
    # logical offsets 5, 37, 40 of a chunk are stored at 17, 49, 34 (the order the kernel's threads read);
    # stored position j: low nibble of byte j for j < 32, high nibble of byte j - 32 after
    assert w12_format.STORED_POSITION[[5, 37, 40]].tolist() == [17, 49, 34]
    w = np.zeros((128, 1), BF16)
    w[64 + 5, 0] = -1.0  # the second chunk: the order repeats per 64-chunk
    w[64 + 37, 0] = 1.0
    w[64 + 40, 0] = 2.0
    packed = w12.pack(w)
    base = int(packed.base_exponent[0, 0])
    nib = np.asarray(packed.exponent_codes[0])
    code_one = 127 - base  # 1.0 has exponent field 127
    assert base == 128 - 14  # the smallest base whose window [b, b + 14] holds fields 127 and 128
    assert nib[32 + 17] == code_one | (code_one << 4)
    assert nib[32 + 2] == (code_one + 1) << 4 | w12_format.ESCAPE_CODE  # stored position 2: a zero, code 15
    assert np.count_nonzero(nib != 0xFF) == 2  # every other element is a zero
    byte = np.asarray(packed.sign_mantissa[0])
    # the mantissas are 0; -1.0's sign (stored at 64 + 17) sits in its pair partner's byte, stored at 64 + 16
    assert byte[64 + 16] == 1 and np.count_nonzero(byte) == 1

  def test_escapes_decode_to_zero_in_the_hot_loop(self):
    w = bits_to_bf16(np.arange(2**16, dtype=np.uint32).astype(np.uint16).reshape(256, 256))
    packed = w12.pack(w)
    hot = np.asarray(jax.jit(w12_format.unpack_transposed_bits)(packed))[:, :256].T.reshape(-1)
    escaped = w12_format.side_table_positions(packed)
    assert escaped.size == packed.num_escapes > 0
    np.testing.assert_array_equal(hot[escaped], 0)

  def test_pytree_round_trip_keeps_static_metadata(self):
    packed = w12.pack(scaled_normal_weights(64, 16))
    leaves, treedef = jax.tree_util.tree_flatten(packed)
    assert len(leaves) == 7
    rebuilt = jax.tree_util.tree_unflatten(treedef, leaves)
    assert rebuilt.shape == packed.shape and rebuilt.group_k == packed.group_k

  def test_jitted_unpack_matches(self):
    w = bits_to_bf16(np.random.default_rng(4).integers(0, 2**16, size=(130, 70), dtype=np.uint16))
    packed = w12.pack(w)
    np.testing.assert_array_equal(
        np.asarray(jax.jit(w12.unpack)(packed)).view(np.uint16), w.view(np.uint16))


class TestBitBudget:

  @pytest.mark.parametrize("k,n", [(1024, 512), (4096, 256)])
  def test_scaled_normal_weights_fit_in_12_1_bits(self, k, n):
    packed = assert_round_trip(scaled_normal_weights(k, n))
    assert w12.bits_per_weight(packed) <= 12.1

  def test_bits_per_weight_counts_everything(self):
    packed = w12.pack(scaled_normal_weights(1024, 64), group_k=256)
    entries = packed.column_escape_rows.size + packed.escape_index.size  # every list slot counts, used or not
    assert entries >= packed.num_escapes > 0 and packed.column_capacity > 0
    expected = (8 * 1024 * 64 + 4 * 1024 * 64 + 8 * 4 * 64 + 48 * entries) / (1024 * 64)
    assert w12.bits_per_weight(packed) == pytest.approx(expected)


class TestBadInput:

  @pytest.mark.parametrize("dtype", [np.float32, np.float16, np.uint16])
  def test_non_bf16_is_refused_by_name(self, dtype):
    with pytest.raises(ValueError, match=np.dtype(dtype).name):
      w12.pack(np.zeros((4, 4), dtype))

  def test_non_matrix_is_refused(self):
    with pytest.raises(ValueError, match="2-D"):
      w12.pack(np.zeros((2, 2, 2), BF16))

  def test_bad_group_k_is_refused(self):
    with pytest.raises(ValueError, match="group_k"):
      w12.pack(np.zeros((4, 4), BF16), group_k=100)

  def test_unknown_implementation_is_refused(self):
    packed = w12.pack(np.zeros((4, 4), BF16))
    with pytest.raises(ValueError, match="implementation"):
      w12.matmul(jnp.zeros((1, 4), jnp.bfloat16), packed, implementation="triton")

  def test_feature_mismatch_is_refused(self):
    packed = w12.pack(np.zeros((4, 4), BF16))
    with pytest.raises(ValueError, match="features"):
      w12.matmul(jnp.zeros((1, 5), jnp.bfloat16), packed)


class TestMatmul:

  @pytest.mark.parametrize("m", [1, 7, 64])
  @pytest.mark.parametrize("implementation", [None, "reference"])
  def test_matches_f32_matmul(self, m, implementation):
    w = scaled_normal_weights(256, 96, seed=m)
    x = np.random.default_rng(m).normal(size=(m, 256)).astype(BF16)
    packed = w12.pack(w)
    y = jax.jit(lambda x, p: w12.matmul(x, p, implementation=implementation))(x, packed)
    assert y.dtype == jnp.bfloat16 and y.shape == (m, 96)
    expected = x.astype(np.float32) @ w.astype(np.float32)
    np.testing.assert_allclose(np.asarray(y, np.float32), expected, rtol=1e-2, atol=1e-2 * np.abs(expected).max())

  def test_leading_batch_dims_and_f32_activations(self):
    w = scaled_normal_weights(128, 32)
    x = np.random.default_rng(5).normal(size=(2, 3, 128)).astype(np.float32)
    y = w12.matmul(x, w12.pack(w))
    assert y.dtype == jnp.float32 and y.shape == (2, 3, 32)
    np.testing.assert_allclose(np.asarray(y), x @ w.astype(np.float32), rtol=1e-5, atol=1e-6)

  def test_escaped_weights_reach_the_output(self):
    w = scaled_normal_weights(128, 16)
    w[7, 3] = BF16(1e30)  # far outside its channel's window: an escape
    packed = w12.pack(w)
    assert 7 * 16 + 3 in w12_format.side_table_positions(packed)
    x = np.zeros((1, 128), BF16)
    x[0, 7] = 1.0
    y = np.asarray(w12.matmul(x, packed), np.float32)
    np.testing.assert_array_equal(y[0], w[7].astype(np.float32))
