"""Tuning knobs of the Hopper int8 x bf16 matmul (static: each value is one compile)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class TuningConfig:
    """Tiles of ``y.T = q_t @ x.T`` with weights on the wgmma M side, tokens on N.

    tile_out: output channels per warpgroup (wgmma M, a multiple of 64); two compute
      warpgroups split channels, so one block owns ``2 * tile_out`` of them and N must
      be a multiple of that.
    tile_tokens: tokens per block (wgmma N, a multiple of 64: the bf16 activation tile
      is 128-byte swizzled); the token count is padded up to a multiple of it.
    tile_k: reduction depth per pipeline step (a multiple of 64); K must be a multiple.
    max_concurrent_steps: TMA pipeline depth.
    grid_tile_width: width of the planar-snake walk over (channel, token) blocks.

    Defaults are untuned: the 128-channel x 64-token x 128-K tile fits in ~160 KB of
    SMEM with a 4-deep pipeline and an f32 epilogue (the scale is applied outside).
    """

    tile_out: int = 64
    tile_tokens: int = 64
    tile_k: int = 128
    max_concurrent_steps: int = 4
    grid_tile_width: int = 1

    def __post_init__(self):
        for name in ("tile_out", "tile_tokens", "tile_k"):
            value = getattr(self, name)
            if value <= 0 or value % 64:
                raise ValueError(f"{name} must be a positive multiple of 64, got {value}")
        if self.max_concurrent_steps < 1 or self.grid_tile_width < 1:
            raise ValueError(
                f"max_concurrent_steps and grid_tile_width must be >= 1, got "
                f"{self.max_concurrent_steps}, {self.grid_tile_width}"
            )

    @property
    def block_out(self) -> int:
        """Output channels per block: two compute warpgroups of ``tile_out`` each."""
        return 2 * self.tile_out
