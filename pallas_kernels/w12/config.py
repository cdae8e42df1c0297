"""Tuning knobs of the fused W12 matmul kernel (static: each value is one compile)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class TuningConfig:
  """Tile sizes for ``y.T = W.T @ x.T`` with weights on the wgmma M side.

  tile_n: output channels per block (wgmma M: 64 an M group). The register decode takes 64-256
    (``mosaic_gpu.REGISTER_TILE_N``: 1-4 row blocks against one activation tile); on the H200 128 was
    slower than 64 with the escapes in the kernel at M = 1, 16 and 64 (docs/results/2026-12-04-w12-wide-blocks-h200/).
  tile_m: tokens per block (wgmma N: a multiple of 8, up to 256); small batches
    waste no work because tokens sit on the flexible wgmma dimension.
  tile_k: reduction depth per pipeline step; a multiple of 64 (one W12 nibble chunk)
    that divides the weight's ``group_k`` so a step reads one base exponent.
  max_concurrent_steps: TMA pipeline depth; deep pipelines keep HBM busy at small M.
  split_k: independent K ranges reduced afterwards (f32 partial sums), to occupy all
    SMs when ``N / tile_n`` alone is fewer blocks than SMs; 0 = ``auto_split_k``, which the register decode caps at
    ``split_k.CONSUMER_SPLIT_K`` for a consumer kernel and for token tiles over 32 rows
    (``mosaic_gpu.ACTIVATION_STEP_BYTES``).
  blocks_per_sm: what the automatic split aims at: at least this many blocks per SM. More
    resident blocks (with a shallower pipeline, so their SMEM fits) hide more of the decode's
    latency, but each split adds partial sums to write and add: the SMEM decode went from 89 to 63 us at 4 on the
    H200 (docs/results/2026-11-30-w12-registers-h200/), and the register decode is fastest at 2 on the H200
    (``mosaic_gpu.DEFAULT_CONFIG``), where one split does not already give every SM a block
    (``mosaic_gpu.ONE_SPLIT_FILLS``). At a wide activation tile (48-64 token rows) the register decode aims at no
    fewer than ``mosaic_gpu.WIDE_TILE_BLOCKS_PER_SM`` before capping the split.
  decode: where the weights are decoded. ``"smem"``: 16-bit element ops on SMEM tiles, written back
    as bf16 SMEM tiles that wgmma reads (runs in GPU interpret mode, so the CPU tests run it).
    ``"registers"``: ``register_decode``, 32-bit words into wgmma's register A fragment (tile_n
    64-256, tile_k 64, 128 or 256; needs a real Hopper: interpret mode's wgmma reads SMEM only).
  overlap_decode: decode step i while step i - 1's wgmma runs (async wgmma, activation tiles released a step
    late): the SMEM decode into one of two SMEM slots, the register decode into fresh registers. Off: with the
    register decode it was 0.2-1.8 us a call slower on the H200 (``scripts/h200/w12_probe.py``,
    docs/results/2026-12-02-verify-skinny-barrier-h200/).
  escapes_in_kernel: the register decode adds the channel lists' escape correction to its accumulators
    (``register_decode.escape_correction``), for one token block (M <= tile_m); XLA then only adds the splits (and
    scatters an overflow, if any). Each block loads its K split's share of its channels' lists (entries ``s``,
    ``s + split_k``, ...) into registers before its pipeline (4 a thread per entry of the share) and adds it after.
    Why: in the H200's decode loop the split-K sums carrying the escape gathers took 5-18 us each, ~0.85 ms a step
    (docs/results/2026-12-01-partials-w12v3-h200/), and above ``GATHER_ROWS`` rows the XLA scatter took 9 us at
    M = 16 and 40 at 64 on 12288x4096 (docs/results/2026-12-04-w12-wide-blocks-h200/). On in ``DEFAULT_CONFIG``.
  The correction's ``x`` loads were also tried in the pipeline's first step, their bits carried through it in
  registers (``early_escape_x``): on the H200 (2026-12-05, docs/results/2026-12-05-w12-m1-forms-h200/) it moved M = 1
  by -0.4 to +0.9 us a call and cost M = 16 up to 4.5 us; removed (the code is at commit fafafe9).
  A warp-specialised form (blocks of 128 channels: two compute warpgroups and a TMA warpgroup) was built and measured
  slower on the H200 (35.8 against 23.3 us at 4096x12288, M = 1; docs/results/2026-12-02-verify-skinny-barrier-h200/)
  and, its two compute warpgroups sharing each activation tile, no faster at 16 or 64 rows either (3.7-6.3 us slower
  at 16, a tie at best at 64; docs/results/2026-12-05-w12-warp-specialized-m16-m64-h100/); its code is at commit
  854cbfd.
  """

  tile_n: int = 64
  tile_m: int = 64
  tile_k: int = 128
  max_concurrent_steps: int = 4
  split_k: int = 0
  overlap_decode: bool = False
  blocks_per_sm: int = 1
  decode: str = "smem"
  escapes_in_kernel: bool = False

  def __post_init__(self):
    if self.tile_n % 64:
      raise ValueError(f"tile_n must be a multiple of 64 (wgmma M), got {self.tile_n}")
    if self.tile_m % 8 or not 8 <= self.tile_m <= 256:
      raise ValueError(f"tile_m must be a multiple of 8 in [8, 256], got {self.tile_m}")
    if self.tile_k % 64:
      raise ValueError(f"tile_k must be a multiple of 64 (a W12 nibble chunk), got {self.tile_k}")
    if self.decode not in ("smem", "registers"):
      raise ValueError(f"decode must be 'smem' or 'registers', got {self.decode!r}")
    if self.escapes_in_kernel and self.decode != "registers":
      raise ValueError("escapes_in_kernel needs decode='registers'")
    if self.max_concurrent_steps < 1 or self.split_k < 0 or self.blocks_per_sm < 1:
      raise ValueError(
          f"max_concurrent_steps and blocks_per_sm must be >= 1 and split_k >= 0, got "
          f"{self.max_concurrent_steps}, {self.blocks_per_sm}, {self.split_k}")
