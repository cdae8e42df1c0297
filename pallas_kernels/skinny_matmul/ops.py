"""The public few-token bf16 matmul: one entry point, the implementation picked per backend and size.

What runs when (``implementation=None``):
- ``DEFAULT == "mosaic_gpu"``, a Hopper GPU, at most ``MAX_TOKENS`` token rows, bf16 ``x`` and ``w``,
  ``N`` a multiple of 64 and ``K`` of ``tile_k``: the Mosaic GPU kernel (``mosaic_gpu.py``);
- anything else (CPU, prefill-sized M, f32, odd shapes): XLA's dot (``reference.py``); on a Hopper an
  unsupported shape logs a warning at trace time, so a fallback is never silent.
Naming an implementation disables the fallback, which is what tests and benchmarks want.
"""

from __future__ import annotations

import logging
import math
from typing import Literal

import jax

from pallas_kernels.device import on_hopper as _on_hopper  # a module name tests can patch
from pallas_kernels.skinny_matmul.config import TuningConfig
from pallas_kernels.skinny_matmul.reference import skinny_matmul_reference
from pallas_kernels.split_k import SplitKPartials

_log = logging.getLogger(__name__)

Implementation = Literal["xla", "mosaic_gpu"]
_IMPLEMENTATIONS = ("xla", "mosaic_gpu")
DEFAULT: Implementation = "xla"
"""``"xla"``, measured (docs/results/2026-11-30-skinny-matmul-h200/). Alone the kernel leaves the fused decode loop
where it was (5.85 against 5.87 ms a step); with XLA command buffers it gave 5.03 against 5.29. With attention on the
tree-attention kernel (``attention=pallas_tree``) its loop is the best AR step so far, 4.69-4.87 ms against XLA's
5.12-5.57, command buffers or not (docs/results/2026-11-30-ar-tree-attention-h200/). A 36-layer forward then compiled
in 45 s instead of 7, jax lowering each of its ~145 call sites apart; since ``pallas_kernels.lowering.lowered_once``
it lowers each distinct kernel once (a fast-path AR + DDTree bench compiled in 32.4 s on an H100, where it had taken
245.6 s on the H200: docs/results/2026-12-06-lowered-once-bench-h100/). Benchmarks and deployments that want it set it
(``bench.py --matmul mosaic_gpu --command-buffers``, ``bench_roofline.py --matmul mosaic_gpu``)."""
MAX_TOKENS = 8
"""Above this many token rows, XLA's dot: on the H200 the kernel beats it at M = 1 (Qwen3-8B's five layer shapes,
4.06 against 4.30 ms per step of matmuls) and only ties at M = 16 and 64
(docs/results/2026-11-30-skinny-matmul-h200/); at 256 a verify pass is compute-bound and this kernel (one
warpgroup, 64-row wgmmas, waited each step) is built for streaming, not for peak FLOPs. A 64-node verify (65 rows)
with every matmul on the kernel (one 72-row token block, its K splits handed to the add + norm and rope kernels) tied
XLA's dots: 5.278 against 5.306 ms a pass. The splits passed saved 0.32 ms of small kernels; the kernel streamed 3.5
TB/s at 72 rows against XLA's 3.7 and lost it back (docs/results/2026-12-02-verify-skinny-barrier-h200/)."""

MAX_TOKENS_BY_SHAPE: dict[tuple[int, int], int] = {(4096, 4096): 72, (12288, 4096): 72, (4096, 6144): 72}
"""``MAX_TOKENS`` for one weight shape ``(K, N)``: Qwen3-8B's o, down and q|k|v projections take the kernel up to 72
rows (one token block of 72: a 64-node verify's 65 rows), gate|up and the LM head stay on XLA's dot above 8. Why:
these three hand their K splits to the add + norm and q/k norm + rope kernels unsummed, which spares XLA's split-K
reduce kernels. A 64-node verify on the H200 took 5.022 against 5.257 ms a pass with every matmul on XLA's dot above
8 rows, in one machine start (-0.235 ms: the three shapes' kernels streamed 2085 against XLA's 2116 us a pass, and
0.38 ms of reduce kernels went; docs/results/2026-12-05-verify-hybrid-h200/); with gate|up on the kernel too it had
tied XLA (``MAX_TOKENS``). At a DFlash-b16 drafter's 16 block rows (24 in a round with the committed rows) the kernel
streams them as fast as XLA's dots and the drafter round went 0.974 -> 0.962 ms
(docs/results/2026-12-01-drafter-norm-h200/, docs/results/2026-12-02-drafter-qkv-merge-h200/); batched drafter
passes of 32-64 rows take it too, not timed. ``bench_roofline.py --skinny-max-tokens KxN=ROWS`` changes entries.
Read at trace time."""

PASS_SPLITS = True
"""``matmul(..., reduce=False)`` hands the kernel's K splits to the consumer unsummed (``SplitKPartials``). False:
XLA sums them first, as with ``reduce=True`` (the model before the add + norm kernel took them; ``bench_roofline.py``
row ``summed_splits_decode_loop``). Read at trace time."""


def _kernel_chosen(x: jax.Array, w: jax.Array) -> bool:
  """``DEFAULT`` asks for the kernel, ``x`` has at most ``MAX_TOKENS`` token rows (``MAX_TOKENS_BY_SHAPE`` for ``w``'s
  shape) and the device is a Hopper."""
  rows = MAX_TOKENS_BY_SHAPE.get(tuple(w.shape), MAX_TOKENS)
  return DEFAULT == "mosaic_gpu" and math.prod(x.shape[:-1]) <= rows and _on_hopper()


def _mosaic_gpu(x, w, config, reduce):
  from pallas_kernels.skinny_matmul import mosaic_gpu  # lazy: needs a Mosaic GPU capable jaxlib

  return mosaic_gpu.skinny_matmul(x, w, config=config, reduce=reduce)


def matmul(x: jax.Array, w: jax.Array, *, implementation: Implementation | None = None,
           config: TuningConfig | None = None, reduce: bool = True) -> jax.Array | SplitKPartials:
  """``x @ w`` for ``x`` ``[..., K]`` and ``w`` ``[K, N]``, f32 accumulation, returned in ``x.dtype``.

  ``reduce=False`` lets the kernel return its output as it wrote it (``SplitKPartials``: the K splits unsummed, or the
  padded result of an unsplit K) for a consumer kernel that reads it itself (``add_rms_norm``, ``qk_norm_rope``,
  ``swiglu``); XLA's dot returns the array either way.

  The kernel reads its first weight tiles before the PDL wait (``pallas_kernels.pdl``): ``w`` must not be written by
  the kernel launched just before it, which holds for a weight that enters the program as an input (the models'), not
  for one computed in it right before the matmul (a slice, a cast or a transpose of a weight in the same program)."""
  if implementation not in (None, *_IMPLEMENTATIONS):
    raise ValueError(f"unknown skinny_matmul implementation {implementation!r}; expected one of {_IMPLEMENTATIONS}")
  reduce = reduce or not PASS_SPLITS
  if implementation == "mosaic_gpu":
    return _mosaic_gpu(x, w, config, reduce)
  if implementation == "xla" or not _kernel_chosen(x, w):
    return skinny_matmul_reference(x, w)
  try:
    return _mosaic_gpu(x, w, config, reduce)
  except (NotImplementedError, ImportError) as e:
    _log.warning("skinny matmul falls back to XLA for x%s %s, W%s %s: %s", x.shape, x.dtype, w.shape, w.dtype, e)
    return skinny_matmul_reference(x, w)
