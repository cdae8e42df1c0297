"""Tuning knobs of the tree-attention kernel (static: each value is one compile)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class TuningConfig:
    """Tile sizes and the KV split of ``mosaic_gpu.tree_attention``.

    block_m: query rows per CTA (wgmma M, a multiple of 64). A row is one (tree node,
      query head) pair; the ``G = Hq / Hkv`` heads of one KV head share a block, so a
      block holds ``block_m / G`` nodes, which must be a multiple of 8. One warpgroup
      computes a block, so 64 is what its registers hold at D = 128.
    block_kv: keys per pipeline step (wgmma N of ``Q K^T``, K of ``P V``); a multiple
      of 64 that divides the cache capacity. The tree's keys are padded up to it.
    max_concurrent_steps: TMA pipeline depth (K and V buffers in flight).
    num_splits: CTAs that share one block of rows, each taking a contiguous slice of
      the KV blocks (prefix, then tree), merged by a log-sum-exp combine. ``None``
      picks ``num_sms // (B * Hkv * row_blocks)`` (at least 1, at most one split per
      ``min_blocks_per_split`` KV blocks), i.e. one wave that fills the GPU.
    num_sms: SMs to fill (132 on H100 SXM and H200).
    min_blocks_per_split: the auto split never gives a CTA fewer KV blocks than this.
    """

    block_m: int = 64
    block_kv: int = 64
    max_concurrent_steps: int = 4
    num_splits: int | None = None
    num_sms: int = 132
    min_blocks_per_split: int = 2

    def __post_init__(self):
        if self.block_m % 64 or self.block_m <= 0:
            raise ValueError(f"block_m must be a positive multiple of 64 (wgmma M), got {self.block_m}")
        if self.block_kv % 64 or not 64 <= self.block_kv <= 256:
            raise ValueError(f"block_kv must be a multiple of 64 in [64, 256], got {self.block_kv}")
        if self.max_concurrent_steps < 1:
            raise ValueError(f"max_concurrent_steps must be >= 1, got {self.max_concurrent_steps}")
        if self.num_splits is not None and self.num_splits < 1:
            raise ValueError(f"num_splits must be >= 1 or None, got {self.num_splits}")
        if self.num_sms < 1 or self.min_blocks_per_split < 1:
            raise ValueError("num_sms and min_blocks_per_split must be >= 1")

    def tiled_group(self, group: int) -> int | None:
        """The query heads a KV head's row block holds for ``group`` (G = Hq / Hkv): G where ``block_m / G`` is a
        whole multiple of 8 nodes, else the smallest count above G that is (the kernel pads the rest with zero heads
        and drops their rows: ``mosaic_gpu.padded_group``); None where none is (G > ``block_m / 8``)."""
        m = self.block_m
        return next((h for h in range(group, m // 8 + 1) if m % h == 0 and (m // h) % 8 == 0), None)

    def splits(self, ctas_without_split: int, kv_blocks: int) -> int:
        """KV splits for a grid of ``ctas_without_split`` row blocks over ``kv_blocks`` KV blocks."""
        if self.num_splits is not None:
            return self.num_splits
        fill = self.num_sms // max(ctas_without_split, 1)
        return max(1, min(fill, kv_blocks // self.min_blocks_per_split))
