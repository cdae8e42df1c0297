"""W12 decoded straight into wgmma's register A operand: four weights per 32-bit word.

The SMEM-decode kernel (``mosaic_gpu._smem_decode_call``) decodes 16-bit elements one at a time,
writes bf16 tiles back to SMEM and lets wgmma read them: on the H200 each SM decoded ~9 GB/s of W12
bytes where the read ceiling needs ~25-33 (docs/results/2026-11-30-kernels-h200-splitk/). Here each
thread loads whole 32-bit words of the byte and nibble planes from swizzled SMEM and turns a word of
4 weights into two bf16x2 registers with 9 integer instructions (bytewise SIMD within a word: adds
that cannot carry across bytes, ``prmt`` for byte masks and byte interleaving, a funnel rotate), which go to wgmma as
its A fragment. The same code runs on numpy arrays (``NUMPY_OPS``, every thread at once, for the
CPU tests) and emits MLIR (``mosaic_gpu._MlirOps``) inside the kernel: one decode, two backends.

Which weights a thread decodes. wgmma's A fragment fixes the rows: thread ``t`` of the warpgroup
holds rows ``16 * (t // 32) + (t % 32) // 4`` and that + 8, and in every 16-wide K tile the
positions ``2q, 2q + 1, 8 + 2q, 9 + 2q`` with ``q = t % 4``. The *stored* K order inside a tile is
free as long as the activations use the same order, so a thread reads 4 consecutive stored weights
(one byte-plane word) per K tile: in a 64-wide W12 chunk, K tile ``i`` of thread ``q`` holds stored
offsets ``32 (i // 2) + 8 q + 4 (i % 2) + (0..3)``, whose codes sit in the low (``i < 2``) or high
nibbles of one nibble-plane word. ``pack`` stores the planes in that order (``format.STORED_POSITION``),
so the A fragment holds the weights in their logical K order and ``x`` goes in as it is.

SMEM: the planes arrive by TMA swizzled as wide as their rows allow (128 B, or 64 B for the nibbles of
a 128-wide step), so the 8 rows a warp reads spread over all banks: 8-byte loads, two wavefronts per
warp-load, the minimum.
"""

from __future__ import annotations

import numpy as np

CHUNK = 64
"""Stored K per decoded A fragment: one W12 nibble chunk, four 16-wide wgmma K tiles."""

ROWS = 64
"""Output channels of one row block: wgmma's M group. A block of ``R`` row blocks (``TuningConfig.tile_n = 64 R``)
decodes each into its own M group of one wgmma; the thread's rows are the same in each, 64 apart."""


class NumpyOps:
  """uint32 numpy arithmetic with the semantics of the PTX ops the kernel emits (and the few f32 ops of
  ``escape_correction``)."""

  @staticmethod
  def const(v):
    return np.uint32(v)

  @staticmethod
  def add(a, b):
    return np.uint32(a) + np.uint32(b)

  @staticmethod
  def mul(a, b):
    return np.uint32(a) * np.uint32(b)

  @staticmethod
  def and_(a, b):
    return np.uint32(a) & np.uint32(b)

  @staticmethod
  def xor(a, b):
    return np.uint32(a) ^ np.uint32(b)

  @staticmethod
  def not_(a):
    return ~np.uint32(a)

  @staticmethod
  def shl(a, s):
    return np.uint32(a) << np.uint32(s)

  @staticmethod
  def shr(a, s):
    return np.uint32(a) >> np.uint32(s)

  @staticmethod
  def rotate_right_1(a):
    """32-bit rotate right by one: PTX ``shf.r.wrap.b32 d, a, a, 1`` (one instruction)."""
    return (np.uint32(a) >> np.uint32(1)) | (np.uint32(a) << np.uint32(31))

  @staticmethod
  def prmt(a, b, selector):
    """PTX ``prmt.b32 d, a, b, selector``: byte ``i`` of ``d`` is byte ``s & 7`` of ``b:a`` (``a``
    the low word), or that byte's sign bit replicated when ``s & 8``; ``s`` is nibble ``i``."""
    a, b = np.asarray(a, np.uint32), np.asarray(b, np.uint32)
    source = (b.astype(np.uint64) << np.uint64(32)) | a.astype(np.uint64)
    out = np.zeros(np.broadcast(a, b).shape, np.uint32)
    for i in range(4):
      s = (selector >> (4 * i)) & 0xF
      byte = ((source >> np.uint64(8 * (s & 7))) & np.uint64(0xFF)).astype(np.uint32)
      if s & 8:
        byte = np.where(byte & 0x80, np.uint32(0xFF), np.uint32(0))
      out |= byte << np.uint32(8 * i)
    return out


  @staticmethod
  def f32_from_bf16_bits(bits):
    """A bf16 bit pattern (the low 16 bits of a uint32) as the f32 it widens to, exactly."""
    return (np.uint32(bits) << np.uint32(16)).view(np.float32)

  @staticmethod
  def fadd(a, b):
    return np.float32(a) + np.float32(b)

  @staticmethod
  def fmul(a, b):
    with np.errstate(invalid="ignore"):  # inf * 0 of an unused list entry: NaN, dropped by select_nonzero
      return np.float32(a) * np.float32(b)

  @staticmethod
  def select_nonzero(flag, value):
    """``value`` where the uint32 ``flag`` is nonzero, else +0.0."""
    return np.where(np.uint32(flag) != 0, np.float32(value), np.float32(0.0))


NUMPY_OPS = NumpyOps()


def decode_word(ops, byte_word, nibble_word, base_word, high_nibbles: bool):
  """Four W12 weights -> two bf16x2 words (weights 0, 1 and 2, 3), bit-exact (format.py's decode).

  ``byte_word``: 4 bytes of the byte plane (``m << 1`` | the pair partner's sign: weights 0 and 1 are partners, and
  2 and 3); ``nibble_word``: the 4 nibble-plane bytes whose low (or high, ``high_nibbles``) nibbles are their codes;
  ``base_word``: the block's base exponent ``b`` in every byte (``b * 0x01010101``). Codes 0..14 give exponent
  ``b + code``, code 15 exponent 0; ``b + 15 <= 255``, so the bytewise add never carries. Each ``prmt`` puts a pair's
  exponents above its bytes: per 16-bit half ``e << 8 | m << 1 | s'``, the bf16 rotated left by one with its
  partner's sign at the bottom, so one 32-bit rotate right by one gives both bf16s with their own signs. 9 integer
  instructions (10 for the high nibbles); format version 3's byte (``s << 7 | m``) took 11 (12): a shift and a
  select for each byte half.
  """
  codes = ops.and_(ops.shr(nibble_word, 4) if high_nibbles else nibble_word, 0x0F0F0F0F)
  escape = ops.add(codes, 0x71717171)  # bit 7 of each byte: code == 15
  escape = ops.prmt(escape, escape, 0xBA98)  # each byte: its bit 7 replicated
  exponent = ops.and_(ops.add(codes, base_word), ops.not_(escape))
  return (ops.rotate_right_1(ops.prmt(byte_word, exponent, 0x5140)),
          ops.rotate_right_1(ops.prmt(byte_word, exponent, 0x7362)))


def swizzled_offset(ops, row, col, row_bytes: int):
  """Byte offset of ``[row, col]`` in a TMA-written SMEM tile whose rows are ``row_bytes`` wide.

  The tile is stored as Mosaic GPU's ``TilingTransform((8, S))`` + ``SwizzleTransform(S)`` leave it,
  ``S = min(row_bytes, 128)``: ``[rows / 8, row_bytes / S, 8, S]`` row-major, then inside each
  ``8 x S`` tile the 16-byte chunk ``^= (offset // 128) % (S // 16)`` (Mosaic GPU's and the
  hardware's rule; tiles are ``8 S``-aligned, so the group is the row within the tile when S = 128).
  """
  swizzle = min(row_bytes, 128)
  log_swizzle = swizzle.bit_length() - 1
  tile_bytes = 8 * swizzle
  offset = ops.add(ops.add(ops.mul(ops.shr(row, 3), 8 * row_bytes), ops.mul(ops.shr(col, log_swizzle), tile_bytes)),
                   ops.add(ops.mul(ops.and_(row, 7), swizzle), ops.and_(col, swizzle - 1)))
  group = ops.and_(ops.shr(offset, 7), swizzle // 16 - 1)
  return ops.xor(offset, ops.shl(group, 4))


def swizzle_parts(ops, row, quad, row_bytes: int):
  """A thread's share of ``swizzled_offset`` for its rows ``row`` and ``row + 8`` and columns ``8 quad + C``,
  ``C`` a multiple of 32 known at trace time: ``(a, x)`` such that

      swizzled_offset(row + 8 h, 8 quad + C) == a + 8 h row_bytes + (C >> log S) 8 S + ((C & (S - 1)) ^ x)

  (``chunk_offset``). Why it holds, with ``S = min(row_bytes, 128)``: the swizzle XORs byte bits 4-6 with
  ``((row & 7) S) >> 7``, which depends on neither ``h`` nor the column; the column's low part ``8 quad + C'``
  has ``8 quad`` in bits 3-4 and ``C'`` in bits 5-6, so the XOR splits into ``8 quad ^ (x4)`` (bit 4, per
  thread: folded into ``a``) and ``C' ^ x`` (bits 5-6). One XOR and one add per load, where the whole formula
  (``swizzled_offset``) is about ten integer instructions."""
  swizzle = min(row_bytes, 128)
  r7 = ops.and_(row, 7)
  bits = ops.shl(ops.shr(ops.mul(r7, swizzle), 7), 4)  # bits 4-6: the 16-byte chunk XOR of these rows
  a = ops.add(ops.add(ops.mul(ops.shr(row, 3), 8 * row_bytes), ops.mul(r7, swizzle)),
              ops.xor(ops.mul(quad, 8), ops.and_(bits, 0x10)))
  return a, ops.and_(bits, 0x60)


def chunk_offset(ops, parts, half: int, col: int, row_bytes: int):
  """``swizzled_offset(row + 8 half, 8 quad + col)`` from ``swizzle_parts``; ``col`` a multiple of 32."""
  a, x = parts
  swizzle = min(row_bytes, 128)
  log_swizzle = swizzle.bit_length() - 1
  low = col & (swizzle - 1)
  return ops.add(a, ops.add(ops.xor(x, low) if low else x, 8 * row_bytes * half + (col >> log_swizzle) * 8 * swizzle))


def thread_rows(ops, thread):
  """The first of the two rows (``row``, ``row + 8``) that wgmma's A fragment and accumulator give ``thread``."""
  return ops.add(ops.mul(ops.shr(thread, 5), 16), ops.shr(ops.and_(thread, 31), 2))


def decode_chunk(ops, thread, load_words, base_words, chunk: int, step_k: int, row_block: int = 0):
  """One thread's A fragment of stored K chunk ``chunk`` (64 wide) of rows ``64 row_block ..`` + 64 of a step's
  ``[64 R, step_k]`` tiles (a block of ``R`` row blocks decodes each into its own wgmma M group).

  ``load_words(plane, offset)`` returns the two uint32 words at byte ``offset`` of the byte plane
  (``plane == "bytes"``, rows ``step_k`` bytes wide) or the nibble plane (``"nibbles"``, rows
  ``step_k // 2``); ``base_words`` the step's base exponents of the thread's two rows (``thread_rows``), each
  in every byte (``b * 0x01010101``). Returns ``{(col_tile, half): word}``:
  the bf16x2 register of wgmma's A fragment for column tile ``col_tile`` (8 positions) of the chunk
  and row ``half`` (row, row + 8).
  """
  first_row = ops.add(thread_rows(ops, thread), ROWS * row_block)
  quad = ops.and_(thread, 3)
  planes = {"bytes": step_k, "nibbles": step_k // 2}
  parts = {plane: swizzle_parts(ops, first_row, quad, row_bytes) for plane, row_bytes in planes.items()}
  registers = {}
  for half in range(2):
    base_word = base_words[half]
    nibbles = load_words("nibbles", chunk_offset(ops, parts["nibbles"], half, 32 * chunk, planes["nibbles"]))
    for high in range(2):
      words = load_words("bytes", chunk_offset(ops, parts["bytes"], half, CHUNK * chunk + 32 * high, planes["bytes"]))
      for w in range(2):
        tile = 2 * high + w  # 16-wide K tile of the chunk
        pair01, pair23 = decode_word(ops, words[w], nibbles[w], base_word, bool(high))
        registers[(2 * tile, half)] = pair01
        registers[(2 * tile + 1, half)] = pair23
  return registers


def simulate_chunk(byte_tile: np.ndarray, nibble_tile: np.ndarray, bases: np.ndarray, chunk: int) -> np.ndarray:
  """What the kernel's A fragment holds, computed with numpy for all 128 threads at once.

  ``byte_tile`` uint8 ``[64 R, step_k]`` and ``nibble_tile`` uint8 ``[64 R, step_k // 2]`` are the logical
  tiles (stored K order); they are swizzled here as TMA would store them, then read through
  ``decode_chunk``, one row block at a time. Returns the uint16 bf16 bits ``[64 R, 64]`` in wgmma position order:
  the chunk's logical K order, for planes ``pack`` wrote.
  """
  step_k = byte_tile.shape[1]
  memories = {name: _swizzle_as_tma(tile) for name, tile in (("bytes", byte_tile), ("nibbles", nibble_tile))}

  def load_words(plane, offset):
    memory = memories[plane]
    return tuple(memory[offset // 4 + w] for w in range(2))

  thread = np.arange(128, dtype=np.uint32)
  warp, lane = thread // 32, thread % 32
  out = np.zeros((byte_tile.shape[0], CHUNK), np.uint16)
  for block in range(byte_tile.shape[0] // ROWS):
    rows = thread_rows(NUMPY_OPS, thread) + ROWS * block
    base_words = [bases[rows + 8 * half].astype(np.uint32) * np.uint32(0x01010101) for half in range(2)]
    registers = decode_chunk(NUMPY_OPS, thread, load_words, base_words, chunk, step_k, block)
    for (col_tile, half), word in registers.items():
      row = ROWS * block + 16 * warp + 8 * half + lane // 4
      col = 8 * col_tile + 2 * (lane % 4)
      out[row, col] = word & 0xFFFF
      out[row, col + 1] = word >> 16
  return out


def _swizzle_as_tma(tile: np.ndarray) -> np.ndarray:
  """The tile's bytes where a TMA copy with a row-wide swizzle puts them, as little-endian uint32."""
  rows, row_bytes = tile.shape
  logical = np.arange(rows * row_bytes, dtype=np.uint32)  # row-major logical order
  physical = swizzled_offset(NUMPY_OPS, logical // row_bytes, logical % row_bytes, row_bytes)
  memory = np.zeros(rows * row_bytes, np.uint8)
  memory[physical] = tile.reshape(-1)
  return memory.view("<u4")


def escape_entries(ops, thread, load_entry, count: int, row_block: int = 0, first=0, stride: int = 1):
  """One thread's list entries for ``escape_correction``: ``[half][j] = load_entry(row, first + stride j)`` for
  ``j < count``, for its two accumulator rows of row block ``row_block`` (``thread_rows`` + 64 ``row_block``, and that
  + 8). ``first`` and ``stride`` pick a K split's share of the lists (``first`` may be a traced value; ``load_entry``
  returns an unused entry past the lists' capacity). Apart so a kernel can issue these loads long before it adds the
  sums (before its pipeline): they depend on nothing the kernel computes."""
  first_row = ops.add(thread_rows(ops, thread), ROWS * row_block)
  return [[load_entry(ops.add(first_row, 8 * half), ops.add(first, stride * j)) for j in range(count)]
          for half in range(2)]


def escape_correction(ops, thread, entries, load_x, tile_m: int):
  """One thread's share of the channel lists' escape correction, in wgmma's accumulator layout: the f32 values
  ``sum_c x[col, rows[n, c]] * W[rows[n, c], n]`` to add to its accumulator registers, so a kernel can patch its
  own output instead of leaving a gather or a scatter to XLA (``TuningConfig.escapes_in_kernel``):
  ``escape_sums`` of ``escape_x``, which a kernel may also call apart (the loads, then the sums).

  The accumulator fragment of ``[64, tile_m]`` gives thread ``t`` rows ``16 (t // 32) + (t % 32) // 4`` and that
  + 8 (``half``), and in every 8-wide column tile the columns ``2 (t % 4)`` and that + 1. ``entries`` is
  ``escape_entries``' (a list entry ``(k, bits)`` of each row and position; ``bits``: the raw bf16 in a uint32, 0 for
  an unused entry); ``load_x(col, k, bits)`` returns the raw bf16 bits of ``x[col, k]``, or 0 for a column past
  ``x``'s rows or an unused entry (``bits`` 0), which it should not read: most of a list's slots are unused (a list
  holds as many as its fullest channel), and at 64 tokens reading ``x`` for every slot moved ~5x the escapes' bytes
  through L2 (docs/results/2026-12-04-w12-m64-h200/). Returns ``{(col_tile, half): (value_col0, value_col1)}``. The
  entries are added in list order; an unused one adds +0.0 whatever ``x`` is (no ``0 * inf``).
  """
  return escape_sums(ops, entries, escape_x(ops, thread, entries, load_x, tile_m), tile_m)


def escape_x(ops, thread, entries, load_x, tile_m: int) -> list:
  """The ``x`` bits ``escape_sums`` multiplies, one ``load_x`` a (half, column tile, column, entry), in that order
  (a flat list: a kernel carries them as one register array)."""
  first_col = ops.mul(ops.and_(thread, 3), 2)
  return [load_x(ops.add(first_col, 8 * col_tile + e), k, bits)
          for half in range(2) for col_tile in range(tile_m // 8) for e in range(2) for k, bits in entries[half]]


def escape_sums(ops, entries, x_bits, tile_m: int):
  """``escape_correction``'s values from ``escape_x``'s bits: no loads, only the products and their sums."""
  x_bits = iter(x_bits)
  out = {}
  for half in range(2):
    for col_tile in range(tile_m // 8):
      pair = []
      for _ in range(2):
        total = None
        for _, bits in entries[half]:
          term = ops.select_nonzero(bits, ops.fmul(ops.f32_from_bf16_bits(next(x_bits)), ops.f32_from_bf16_bits(bits)))
          total = term if total is None else ops.fadd(total, term)
        pair.append(total)
      out[(col_tile, half)] = tuple(pair)
  return out


def split_share(capacity: int, splits: int) -> int:
  """Entries of each list a K split adds when ``splits`` splits share the lists' ``capacity`` (split ``s`` takes
  entries ``s, s + splits, ...``)."""
  return -(-capacity // splits)


def simulate_escape_correction(rows: np.ndarray, bits: np.ndarray, x: np.ndarray, tile_m: int, split: int = 0,
                               splits: int = 1) -> np.ndarray:
  """What ``escape_correction`` gives the 128 threads of K split ``split`` of ``splits`` (its share of the lists,
  ``split_share``), computed with numpy and placed at its ``[64 R, tile_m]`` positions, one row block at a time: the
  block's lists ``rows`` int32 / ``bits`` uint16 ``[64 R, C]`` and ``x`` bf16 ``[m, K]`` (``m <= tile_m``)."""
  x_bits = x.view(np.uint16)
  thread = np.arange(128, dtype=np.uint32)
  capacity = rows.shape[1]

  def load_entry(row, c):
    valid = c < capacity
    c = np.minimum(c, capacity - 1)
    return rows[row, c].astype(np.uint32), np.where(valid, bits[row, c], 0).astype(np.uint32)

  def load_x(col, k, used):  # reads x only where a kernel does: an unused entry's k may lie anywhere
    valid = np.broadcast_to((col < x_bits.shape[0]) & (used != 0), thread.shape)
    out = np.zeros(thread.shape, np.uint32)
    out[valid] = x_bits[np.broadcast_to(col, thread.shape)[valid], np.broadcast_to(k, thread.shape)[valid]]
    return out

  out = np.zeros((rows.shape[0], tile_m), np.float32)
  warp, lane = thread // 32, thread % 32
  for block in range(rows.shape[0] // ROWS):
    entries = escape_entries(NUMPY_OPS, thread, load_entry, split_share(capacity, splits), block, np.uint32(split),
                             splits)
    values = escape_correction(NUMPY_OPS, thread, entries, load_x, tile_m)
    for (col_tile, half), pair in values.items():
      for e, value in enumerate(pair):
        out[ROWS * block + 16 * warp + 8 * half + lane // 4, 8 * col_tile + 2 * (lane % 4) + e] = value
  return out
