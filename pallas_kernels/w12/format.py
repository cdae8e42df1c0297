"""W12: a fixed-rate, bit-exact 12-bit storage format for bf16 weights.

Why: a decode step reads every weight once, so bytes moved set its floor. A trained
bf16 weight spends 8 bits on an exponent that, inside one output channel, takes only
a dozen or so distinct values. Re-coding the exponent as 4 bits relative to a
per-block base saves 25 % of weight traffic with no loss at all: every bf16 bit
pattern round-trips exactly, the rare ones through a small side table.

Layout (the spec; `pack` writes it, `unpack` and the kernels read it)
---------------------------------------------------------------------
The logical weight ``W`` is bf16 ``[K, N]`` (in_features x out_features), used as
``x @ W``. The planes are stored *transposed*, output-channel major (``[N, ...]``,
K contiguous), because the fused kernel puts weight rows on the wgmma M side and
tokens on N (``y.T = W.T @ x.T``), as jax's ``hopper_mixed_type_matmul_mgpu`` does
with int8 weights: a weight tile is then a plain ``[tile_n, tile_k]`` TMA box.

``Kp`` is K rounded up to a multiple of ``PAIR_SPAN`` (64); the padding is +0.0.
For a bf16 word ``u`` write ``s = u >> 15``, ``e = (u >> 7) & 0xFF``, ``m = u & 0x7F``.

Stored K order: inside every 64-chunk, logical offset ``p`` is stored at position
``STORED_POSITION[p]`` (so stored ``[n, 64 c + STORED_POSITION[p]]`` is ``W[64 c + p, n]``).
It is the order in which the register-decode kernel's threads read 4 consecutive stored
weights per 32-bit word into wgmma's A fragment (``register_decode``): stored this way, the
kernel multiplies by ``x`` as it is, where the natural order needed a permuted copy of ``x``
per call (one more XLA kernel per matmul).

``sign_mantissa``   uint8 ``[N, Kp]``     ``m << 1 | s'`` of each weight, in stored order: its mantissa, and in bit 0
                    the sign of its *pair partner*, the weight at stored position ``j ^ 1`` (an escaped element
                    counts as ``m = s = 0``). Why: the register decode builds a pair's bf16x2 word as
                    ``e << 8 | byte`` per 16-bit half, each half the bf16 rotated left by one bit with the other
                    half's sign, and one 32-bit funnel rotate right (``shf.r.wrap``) turns the pair into both bf16s.
``exponent_codes``  uint8 ``[N, Kp // 2]``  one 4-bit code per element, two per byte.
                    Nibble order: stored K is cut into chunks of ``PAIR_SPAN`` = 64; stored
                    position ``64 c + j`` lives in byte ``32 c + (j % 32)``, in the low
                    nibble when ``j < 32`` and the high nibble when ``j >= 32``. So one
                    byte tile ``[n0:n1, 32c:32c+32]`` holds two contiguous 32-wide K
                    runs: ``codes & 0xF`` and ``codes >> 4`` decode into two adjacent
                    sub-tiles with no register interleave, and any ``tile_k`` that is a
                    multiple of 64 sees whole chunks.
``base_exponent``   uint8 ``[N, ceil(Kp / group_k)]``  ``b`` for the block of one output
                    channel ``n`` times the K range ``[g * group_k, (g + 1) * group_k)``.
                    The default ``group_k`` (1024) costs 8/1024 bit per weight and still
                    tracks magnitudes that drift along K; kernels need
                    ``group_k % tile_k == 0`` so that a tile reads a single base.
Side table (escapes: the elements the planes cannot hold; their byte is 0, so the hot loop decodes them to +0.0
and a kernel adds ``x[:, k] * W[k, n]`` to its output afterwards; ``unpack`` simply overwrites):
``column_escape_rows`` int32 ``[N, C]``  the logical ``k`` of output channel ``n``'s escapes, the first ``C`` of
                    them in K order; ``C`` is the most any channel has, capped so that the lists take at most
                    ``COLUMN_ESCAPE_BITS`` bits per weight (``column_capacity``). Unused entries are 0.
``column_escape_bits`` uint16 ``[N, C]``  their raw bf16 bits; 0 marks an unused entry (+0.0 is never escaped).
                    Per-channel lists let the correction be a gather that XLA fuses into the split-K sum after
                    the kernel, where a scatter was a kernel of its own per matmul.
``escape_index``    int32 ``[E]``   the overflow: escapes past a channel's ``C``, as flat indices ``k * N + n``
                    into the logical ``[K, N]`` (sorted); usually empty.
``escape_bits``     uint16 ``[E]``  their raw bf16 bits.

Codes:
  * ``0..14``  exponent field ``b + code``.
  * ``15``     exponent field 0: the byte's sign and mantissa as stored. Exact for +-0.0 and every subnormal
               (pruned or padded zero columns cost nothing extra); an escape otherwise (out-of-window normals,
               +-inf, NaN), whose byte is then 0.

Base choice: per block, ``b`` (0..240) maximises the number of elements whose exponent field lies in
``[b, b + 14]``; elements with field 0 are free under any ``b`` and are not counted. Ties go to the smallest
``b``. ``b + 15 <= 255``, so a bytewise ``code + b`` never carries into the next byte, even for code 15 (whose sum
the decode then masks); exponent field 255 (+-inf, NaN) is always escaped.

Decode (what the hot loop computes, per element at stored position ``j``)::

    e = 0 if code[j] == 15 else b + code[j]
    u = (byte[j ^ 1] & 1) << 15 | e << 7 | byte[j] >> 1

Cost: 12 bits + 8 / group_k per weight for the base + 48 bits per side-table entry (``C`` per channel, and the
overflow). Normal weights with per-channel scales escape only values more than 2**14 below their block's largest
binade, a few in 10**4: 12.06 bits at K = 4096. The ≤ 12.1-bit budget holds for K a multiple of 64 of a few hundred
or more (every Qwen3 / Llama linear); ragged K pays its padding (12 Kp / K: 12.34 bits at K = 1000), tiny K its base
(8 / Kp: 12.13 at K = 64), and scales spread along K inside one block by more than 2**14 pay escapes (12.4 bits at
three decades of per-K-row scale). Every case stays lossless; only the rate moves.

Scope: ``pack`` takes one non-empty 2-D ``[K, N]`` bf16 weight, the linear layers' shape. Vectors (norm scales,
biases) stay bf16: they are a few kilobytes of a model.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

FORMAT_VERSION = 4
"""Version of the layout above (2: the stored K order; 3: code 15 is exponent field 0 (zeros and subnormals exact,
escapes decode to +0.0), codes 0..14 the window, per-channel escape lists; 4: the byte is ``m << 1`` and the pair
partner's sign); bump it on any change, so stored packed weights (e.g. the W12 weight cache of
``specpilot/models/hf.py``) are rebuilt rather than misread."""

PAIR_SPAN = 64
"""K chunk whose two 32-wide halves share the bytes of the nibble plane."""


def _stored_position(p: np.ndarray) -> np.ndarray:
  """Stored position (in a 64-chunk) of logical offset ``p``: wgmma's A fragment gives thread ``q = t % 4`` the
  positions ``2q, 2q + 1, 8 + 2q, 9 + 2q`` of every 16-wide K tile; a thread reads one 32-bit word of the byte
  plane (4 stored weights) per tile, tile ``i`` of thread ``q`` at stored ``32 (i // 2) + 8 q + 4 (i % 2)``, and
  tiles 0-1 / 2-3 take the low / high nibbles of one nibble-plane word."""
  tile, within = p // 16, p % 16
  second, quad, element = within // 8, (within % 8) // 2, within % 2
  return 32 * (tile // 2) + 8 * quad + 4 * (tile % 2) + 2 * second + element


STORED_POSITION = _stored_position(np.arange(PAIR_SPAN))
"""Stored position of each logical offset of a 64-chunk (a permutation)."""

LOGICAL_OFFSET = np.argsort(STORED_POSITION)
"""Logical offset held at each stored position of a 64-chunk: the inverse of ``STORED_POSITION``."""

NUM_WINDOW_CODES = 15
"""Codes 0..14 map to the exponent window ``[b, b + 14]``."""

ESCAPE_CODE = 15
"""Exponent field 0: zeros and subnormals, exact; escapes (byte 0) otherwise."""
MAX_BASE = 255 - ESCAPE_CODE
"""Largest base: ``b + 15`` still fits a byte, so the decode's bytewise add never carries."""

DEFAULT_GROUP_K = 1024
ESCAPE_ENTRY_BITS = 32 + 16
"""A side-table entry stores an int32 index and the raw 16 bits."""
COLUMN_ESCAPE_BITS = 0.08
"""Bits per weight the per-channel escape lists may take (``column_capacity``); with the planes and bases that keeps
a normal weight within 12.1 bits. Escapes past the cap go to the overflow list."""

_ROWS_PER_HISTOGRAM_CHUNK = 4096
"""Bounds pack's host memory: histograms are 256 int64 counters per block."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class W12Array:
  """A bf16 ``[K, N]`` weight stored in the W12 layout (see the module docstring).

  A pytree: the five arrays are leaves, the logical shape and ``group_k`` are static,
  so it passes through ``jit``, ``device_put`` and sharding like any weight leaf.
  """

  sign_mantissa: jax.Array
  exponent_codes: jax.Array
  base_exponent: jax.Array
  column_escape_rows: jax.Array
  column_escape_bits: jax.Array
  escape_index: jax.Array
  escape_bits: jax.Array
  shape: tuple[int, int] = dataclasses.field(metadata=dict(static=True))
  group_k: int = dataclasses.field(default=DEFAULT_GROUP_K, metadata=dict(static=True))

  @property
  def dtype(self):
    return jnp.dtype(jnp.bfloat16)

  @property
  def ndim(self) -> int:
    return 2

  @property
  def column_capacity(self) -> int:
    """``C``: side-table entries per output channel (static)."""
    return int(self.column_escape_rows.shape[1])

  @property
  def has_side_table(self) -> bool:
    """Whether a matmul must add a correction (static: from shapes, so usable under ``jit``)."""
    return self.column_capacity > 0 or self.escape_index.shape[0] > 0

  @property
  def num_escapes(self) -> int:
    """Escaped elements (a host count: reads the lists, so not under ``jit``)."""
    return int(np.count_nonzero(np.asarray(self.column_escape_bits))) + int(self.escape_index.shape[0])


def padded_k(k: int) -> int:
  return -(-k // PAIR_SPAN) * PAIR_SPAN


def _as_bf16_bits(w) -> np.ndarray:
  """Host uint16 view of a bf16 array; refuses anything else by name."""
  dtype = getattr(w, "dtype", None)
  if dtype is None or np.dtype(dtype) != np.dtype(ml_dtypes.bfloat16):
    raise ValueError(f"w12.pack needs a bfloat16 array, got dtype {dtype}")
  if np.ndim(w) != 2:
    raise ValueError(f"w12.pack needs a 2-D [K, N] weight, got shape {tuple(np.shape(w))}")
  if np.size(w) == 0:
    raise ValueError(f"w12.pack needs a non-empty weight, got shape {tuple(np.shape(w))}")
  return np.asarray(w).view(np.uint16)


def _choose_bases(exponent: np.ndarray, num_groups: int, group_k: int) -> np.ndarray:
  """Per (row, K group) base maximising the elements inside its 15-binade window.

  ``exponent`` is the uint8 exponent field, ``[N, Kp]``. Counting in a histogram
  per block and sliding a window over its prefix sums makes this exact (not a
  heuristic around the max) at O(256) per block.
  """
  rows, kp = exponent.shape
  group_of_col = np.arange(kp) // group_k
  bases = np.empty((rows, num_groups), np.uint8)
  for r0 in range(0, rows, _ROWS_PER_HISTOGRAM_CHUNK):
    e = exponent[r0:r0 + _ROWS_PER_HISTOGRAM_CHUNK].astype(np.int64)
    chunk_rows = e.shape[0]
    block = np.arange(chunk_rows)[:, None] * num_groups + group_of_col[None, :]
    hist = np.bincount((block * 256 + e).ravel(), minlength=chunk_rows * num_groups * 256)
    hist = hist.reshape(chunk_rows * num_groups, 256)
    hist[:, 0] = 0  # exponent field 0 has its own code under any base
    cum = np.concatenate([np.zeros((hist.shape[0], 1), np.int64), np.cumsum(hist, axis=1)], axis=1)
    # window for base b covers fields b .. b+14, i.e. cum[b + 15] - cum[b]
    b = np.arange(MAX_BASE + 1)
    inside = cum[:, b + NUM_WINDOW_CODES] - cum[:, b]
    bases[r0:r0 + chunk_rows] = np.argmax(inside, axis=1).reshape(chunk_rows, num_groups)
  return bases


def pack(w, group_k: int = DEFAULT_GROUP_K) -> W12Array:
  """Converts a bf16 ``[K, N]`` weight to W12 on the host (a one-time conversion).

  Lossless for every bit pattern; see the module docstring for the layout.
  """
  if group_k <= 0 or group_k % PAIR_SPAN:
    raise ValueError(f"group_k must be a positive multiple of {PAIR_SPAN}, got {group_k}")
  bits = _as_bf16_bits(w)
  k, n = bits.shape
  if k * n >= 2**31:
    raise ValueError(f"w12.pack indexes escapes with int32; {k}x{n} has too many elements")
  kp = padded_k(k)
  num_groups = -(-kp // group_k)

  bits_t = np.zeros((n, kp), np.uint16)  # zero padding: code 15 with byte 0, +0.0 with no side-table entry
  bits_t[:, :k] = bits.T
  exponent = ((bits_t >> 7) & 0xFF).astype(np.uint8)
  sign, mantissa = (bits_t >> 15).astype(np.uint8), (bits_t & 0x7F).astype(np.uint8)

  bases = _choose_bases(exponent, num_groups, group_k)
  base_per_col = np.repeat(bases, group_k, axis=1)[:, :kp].astype(np.int16)
  offset = exponent.astype(np.int16) - base_per_col
  is_zero_field = exponent == 0
  in_window = (offset >= 0) & (offset < NUM_WINDOW_CODES) & ~is_zero_field
  escaped = ~(in_window | is_zero_field)
  code = np.where(in_window, offset, ESCAPE_CODE).astype(np.uint8)
  sign, mantissa = (np.where(escaped, np.uint8(0), a) for a in (sign, mantissa))
  code, sign, mantissa = map(to_stored_order, (code, sign, mantissa))
  byte = (mantissa << 1) | pair_partner(sign)

  # nibble order: within each 64-chunk, j < 32 -> low nibble, j >= 32 -> high nibble
  chunks = code.reshape(n, kp // PAIR_SPAN, 2, PAIR_SPAN // 2)
  nibbles = (chunks[:, :, 0, :] | (chunks[:, :, 1, :] << 4)).reshape(n, kp // 2)

  esc_n, esc_k = np.nonzero(escaped)  # row-major: by channel, then K (padding never escapes, so esc_k < k)
  esc_bits = bits_t[esc_n, esc_k].astype(np.uint16)
  counts = np.bincount(esc_n, minlength=n)
  capacity = min(int(counts.max(initial=0)), column_capacity(kp))
  rank = np.arange(esc_n.size) - np.repeat(np.cumsum(counts) - counts, counts)  # position in its channel's list
  listed = rank < capacity
  column_rows = np.zeros((n, capacity), np.int32)
  column_bits = np.zeros((n, capacity), np.uint16)
  column_rows[esc_n[listed], rank[listed]] = esc_k[listed]
  column_bits[esc_n[listed], rank[listed]] = esc_bits[listed]
  flat = esc_k[~listed].astype(np.int64) * n + esc_n[~listed]
  order = np.argsort(flat, kind="stable")

  return W12Array(
      sign_mantissa=jnp.asarray(byte),
      exponent_codes=jnp.asarray(nibbles.astype(np.uint8)),
      base_exponent=jnp.asarray(bases),
      column_escape_rows=jnp.asarray(column_rows),
      column_escape_bits=jnp.asarray(column_bits),
      escape_index=jnp.asarray(flat[order].astype(np.int32)),
      escape_bits=jnp.asarray(esc_bits[~listed][order]),
      shape=(k, n),
      group_k=group_k,
  )


def column_capacity(kp: int) -> int:
  """The most side-table entries a channel's list may hold for a (padded) depth ``kp``: ``COLUMN_ESCAPE_BITS`` per
  weight."""
  return int(COLUMN_ESCAPE_BITS * kp / ESCAPE_ENTRY_BITS)


def to_stored_order(a):
  """``[..., Kp]`` in logical K order -> stored order (module docstring); numpy or jax arrays."""
  return a.reshape(*a.shape[:-1], -1, PAIR_SPAN)[..., LOGICAL_OFFSET].reshape(a.shape)


def to_logical_order(a):
  """The inverse of ``to_stored_order``."""
  return a.reshape(*a.shape[:-1], -1, PAIR_SPAN)[..., STORED_POSITION].reshape(a.shape)


def pair_partner(a):
  """``a`` with stored positions ``j`` and ``j ^ 1`` swapped along its last axis (even length); numpy or jax arrays.
  Its own inverse."""
  return a.reshape(*a.shape[:-1], -1, 2)[..., ::-1].reshape(a.shape)


def decode_codes(exponent_codes: jax.Array) -> jax.Array:
  """Nibble plane ``[..., Kp // 2]`` -> one code per element ``[..., Kp]`` (uint8)."""
  lead = exponent_codes.shape[:-1]
  chunks = exponent_codes.reshape(*lead, -1, PAIR_SPAN // 2)
  codes = jnp.stack([chunks & 0xF, chunks >> 4], axis=-2)
  return codes.reshape(*lead, -1)


def decode_bits(byte: jax.Array, partner: jax.Array, codes: jax.Array, base: jax.Array) -> jax.Array:
  """The hot-loop decode: bf16 bits from the element's byte, its pair partner's byte (``pair_partner`` of the byte
  plane: bit 0 is this element's sign), its code and its block's base.

  Shapes broadcast; ``base`` is the per-element (already expanded) base. Escapes
  come out as +0.0, which is what lets kernels patch them with a sparse add.
  """
  byte, partner = byte.astype(jnp.uint16), partner.astype(jnp.uint16)
  codes = codes.astype(jnp.uint16)
  exponent = jnp.where(codes == ESCAPE_CODE, jnp.uint16(0), base.astype(jnp.uint16) + codes)
  return ((partner & 1) << 15) | (exponent << 7) | (byte >> 1)


def unpack_transposed_bits(packed: W12Array) -> jax.Array:
  """uint16 ``[N, Kp]`` decoded planes in logical K order, escapes still +0.0 (no side table)."""
  n, kp = packed.sign_mantissa.shape
  codes = decode_codes(packed.exponent_codes)
  base = jnp.repeat(packed.base_exponent, packed.group_k, axis=1)[:, :kp]  # a base spans whole chunks
  byte = packed.sign_mantissa
  return to_logical_order(decode_bits(byte, pair_partner(byte), codes, base))


def column_escape_correction_t(x2: jax.Array, packed: W12Array, m_pad: int) -> jax.Array:
  """f32 ``[N, m_pad]``: ``sum_c x2[:, rows[n, c]] * W[rows[n, c], n]`` over channel ``n``'s listed escapes, zero
  past ``x2``'s rows. ``C`` gathers of ``x``'s columns and elementwise work, no scatter and no reduction: XLA fuses it
  into whatever adds it (the split-K sum after a fused kernel), so the correction costs no kernel of its own."""
  n = packed.shape[1]
  values = jax.lax.bitcast_convert_type(packed.column_escape_bits, jnp.bfloat16).astype(jnp.float32)
  total = jnp.zeros((n, x2.shape[0]), jnp.float32)
  for c in range(packed.column_capacity):
    x_of_entry = x2[:, packed.column_escape_rows[:, c]].T.astype(jnp.float32)  # [N, M]
    listed = (packed.column_escape_bits[:, c] != 0)[:, None]  # an unused entry adds nothing, even for x = inf
    total = total + jnp.where(listed, x_of_entry * values[:, c, None], 0.0)
  return jnp.pad(total, ((0, 0), (0, m_pad - x2.shape[0])))


def side_table(packed: W12Array, lists: bool = True) -> tuple[jax.Array, jax.Array]:
  """Every side-table entry as flat ``k * N + n`` indices and raw bits: the channel lists' (unused ones included,
  with bits 0; only with ``lists``), then the overflow."""
  if not lists:
    return packed.escape_index, packed.escape_bits
  n = packed.shape[1]
  listed = packed.column_escape_rows * n + jnp.arange(n, dtype=jnp.int32)[:, None]
  return (jnp.concatenate([listed.reshape(-1), packed.escape_index]),
          jnp.concatenate([packed.column_escape_bits.reshape(-1), packed.escape_bits]))


def scatter_escapes_t(y_t: jax.Array, x2: jax.Array, packed: W12Array, lists: bool = False) -> jax.Array:
  """``y_t`` (f32 ``[N, M']``, or ``[S, N, M']`` split-K partial sums: patched in partial 0, in place) plus the
  overflow escapes' ``x2[:, k] * W[k, n]`` (with ``lists``, the channel lists' too); ``M' >= M``, the rows of
  ``x2``. Each escape adds a contiguous row of M values, which the GPU scatters coalesced. A kernel of its own."""
  n = packed.shape[1]
  index, bits = side_table(packed, lists)
  if not index.shape[0]:
    return y_t
  rows, cols = index // n, index % n
  values = jax.lax.bitcast_convert_type(bits, jnp.bfloat16).astype(jnp.float32)
  contributions = jnp.where((bits != 0)[:, None], x2[:, rows].T.astype(jnp.float32) * values[:, None], 0.0)
  contributions = jnp.pad(contributions, ((0, 0), (0, y_t.shape[-1] - x2.shape[0])))
  if y_t.ndim == 3:
    return y_t.at[0, cols].add(contributions)
  return y_t.at[cols].add(contributions)


def add_escapes(y: jax.Array, x2: jax.Array, packed: W12Array) -> jax.Array:
  """``y + x2 @ E`` for the sparse matrix ``E`` of escaped elements: the patch a matmul adds after decoding
  escapes as +0.0. ``y``: f32 ``[M, N]``; ``x2``: ``[M, >= K]``."""
  y_t = y.T + column_escape_correction_t(x2, packed, y.shape[0]) if packed.column_capacity else y.T
  return scatter_escapes_t(y_t, x2, packed).T


@jax.jit
def unpack(packed: W12Array) -> jax.Array:
  """W12 -> the exact bf16 ``[K, N]`` weight; pure jnp, so it runs on any backend.

  Works on uint16 until the final bitcast so NaN payloads and -0.0 survive. Jitted
  because eager dispatch of its dozen small ops costs more than the decode itself.
  """
  k, n = packed.shape
  bits = unpack_transposed_bits(packed)[:, :k].T.reshape(-1)
  index, values = side_table(packed)
  index = jnp.where(values != 0, index, k * n)  # unused list entries: past the end, dropped
  bits = bits.at[index].set(values, mode="drop")
  return jax.lax.bitcast_convert_type(bits.reshape(k, n), jnp.bfloat16)


def side_table_positions(packed: W12Array) -> np.ndarray:
  """Host int64 array: flat ``k * N + n`` of every escaped element (the channel lists' used entries, then the
  overflow): where ``unpack`` patches and the hot loop reads +0.0."""
  index, bits = map(np.asarray, side_table(packed))
  return index[bits != 0].astype(np.int64)


def bits_per_weight(packed: W12Array) -> float:
  """Stored bits per logical weight: both planes (with K padding), bases and the side table (every list entry,
  used or not, and the overflow)."""
  k, n = packed.shape
  plane_bytes = packed.sign_mantissa.size + packed.exponent_codes.size + packed.base_exponent.size
  escape_bits = (packed.column_escape_rows.size + packed.escape_index.size) * ESCAPE_ENTRY_BITS
  return (8 * plane_bytes + escape_bits) / (k * n)
