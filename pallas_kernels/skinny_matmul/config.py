"""Tuning knobs of the few-token bf16 matmul kernel (static: each value is one compile)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class TuningConfig:
  """Tiles of ``y.T = W.T @ x.T``: weight columns (output channels) on the wgmma M side, tokens on N.

  tile_m: tokens per block (wgmma N: a multiple of 8 up to 256); the token count is padded to a
    multiple of ``min(tile_m, M rounded up to 8)``, so one token costs an 8-wide tile, not a 64-wide one.
    0 (the default): all of M's rows in one block (``split_k.token_tile``), so each weight byte is read once per
    call at any M up to 256 (with 64, a 65-row verify pass read every weight twice: 30.2 against 23.0 us for the o
    projection, 129.1 against 58.2 for gate|up on the H200, docs/results/2026-12-02-verify-skinny-barrier-h200/).
    Three forms for such rows were built and measured slower there: 128 channels a block sharing each activation
    tile and async wgmma (code at commit bbf4b1f); each block's K-split activations loaded once and several weight
    columns streamed past them (gate|up 80 against 58 us, the 64-node verify 6.90 against 5.28 ms; code at 0d8e447,
    docs/results/2026-12-03-skinny-resident-w12-loop-h200/).
  tile_k: reduction depth per pipeline step (a multiple of 64). A step moves a ``[tile_k, 64]`` bf16
    weight tile (16 KB at 128) with one TMA.
  max_concurrent_steps: TMA pipeline depth: weight bytes in flight per block. With ``tile_m == 0`` lowered to the
    deepest pipeline whose tiles fit shared memory (wide token tiles at 128+ rows).
  split_k: K ranges reduced afterwards (f32 partial sums); 0 = ``split_k.auto_split_k`` aiming at
    ``blocks_per_sm`` blocks per SM. A decode step is memory-bound, so what matters is the bytes in
    flight per SM: ``blocks_per_sm * max_concurrent_steps * tile_k * 128`` bytes.
  persistent: one block per resident slot (``blocks_per_sm`` an SM, or fewer where shared memory holds fewer),
    each walking its share of the (channels, tokens, K split) work items through one pipeline
    (``split_k.streamed_items``), the output unchanged: a block that ends an item has the next item's first tiles in
    flight. Built for 64-72 token rows, where one block fits an SM; on the H200 it took 30 us off a 64-token verify's
    2.08 ms of this kernel and nothing at one row (``mosaic_gpu.DEFAULT_CONFIG`` turns it on).
  """

  tile_m: int = 0
  tile_k: int = 128
  max_concurrent_steps: int = 4
  split_k: int = 0
  blocks_per_sm: int = 2
  persistent: bool = False

  def __post_init__(self):
    if self.tile_m and (self.tile_m % 8 or not 8 <= self.tile_m <= 256):
      raise ValueError(f"tile_m must be 0 (all rows) or a multiple of 8 in [8, 256], got {self.tile_m}")
    if self.tile_k <= 0 or self.tile_k % 64:
      raise ValueError(f"tile_k must be a positive multiple of 64, got {self.tile_k}")
    if self.max_concurrent_steps < 1 or self.split_k < 0 or self.blocks_per_sm < 1:
      raise ValueError(
          f"max_concurrent_steps and blocks_per_sm must be >= 1 and split_k >= 0, got "
          f"{self.max_concurrent_steps}, {self.blocks_per_sm}, {self.split_k}")
