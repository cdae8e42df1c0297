"""The public gate|up projection + SwiGLU: one entry point, the implementation picked per backend and size.

What runs when (``implementation=None``):
- ``DEFAULT == "mosaic_gpu"``, a Hopper GPU, at most ``MAX_TOKENS`` token rows, bf16 ``x`` and ``w_gate_up``, an
  intermediate size a multiple of 64 and ``K`` of ``tile_k``: the fused kernel (``mosaic_gpu.py``); for a W12
  ``w_gate_up`` (``pallas_kernels.w12.W12Array``), only with ``W12_FUSED`` (on) and ``w12.ops.DEFAULT == "mosaic_gpu"``
  too, the W12 kernel with the same cluster epilogue (``w12.mosaic_gpu.w12_swiglu_matmul``);
- anything else: what the models ran before it, ``swiglu(matmul(x, w_gate_up, reduce=False))`` with
  ``skinny_matmul``'s matmul or W12's (each of the two on its own kernel or XLA's, as their own ``DEFAULT`` says); on
  a Hopper an unsupported shape logs a warning at trace time, so a fallback is never silent.
Naming an implementation disables the fallback, which is what tests and benchmarks want (``"xla"``: the jnp
reference).
"""

from __future__ import annotations

import logging
import math
from typing import Literal

import jax

from pallas_kernels import skinny_matmul, swiglu, w12
from pallas_kernels.device import on_hopper as _on_hopper  # a module name tests can patch
from pallas_kernels.swiglu_matmul.reference import swiglu_matmul_reference
from pallas_kernels.w12 import ops as w12_ops

_log = logging.getLogger(__name__)

Implementation = Literal["xla", "mosaic_gpu"]
_IMPLEMENTATIONS = ("xla", "mosaic_gpu")
DEFAULT: Implementation = "xla"
"""``"xla"``, as every kernel's default here (the library assumes no GPU); ``conf/kernels/hopper.yaml`` (the engines'
Hopper choice) and ``bench_roofline.py --swiglu-matmul mosaic_gpu`` turn it on. Measured on the H200 with the kernel's
cluster form: the AR step 4.241 against 4.303-4.306 ms, its matmuls 13.6 us and the SwiGLU fusion's 51.1 us gone
(docs/results/2026-12-06-swiglu-cluster-h200/); the first, 192-block form had tied. Read at trace time."""
W12_FUSED = True
"""Whether a W12 ``w_gate_up`` takes the fused W12 kernel when ``DEFAULT`` asks for the fused form (``False``: the W12
matmul, then XLA's SwiGLU). On: on an H100 the W12 decode loop with it took 4.972 / 5.022 ms a step against 5.029 /
5.085 with the two kernels (with / without command buffers over the loop), tokens identical; alone it is 2.5 us a call
under the two kernels at one token row (docs/results/2026-12-06-w12-swiglu-fixed-h100/). ``bench_roofline.py
--w12-swiglu-ab`` times both forms. Read at trace time."""
MAX_TOKENS = 32
"""Above this many token rows, the unfused path: a decode step's one row and a DFlash-b16 drafter's 16 (24 in a
round) take the kernel when it is on; a 64-node verify keeps XLA's dot, which is faster there
(``skinny_matmul.ops.MAX_TOKENS`` says why)."""


def _is_w12(w) -> bool:
  return isinstance(w, w12.W12Array)


def _kernel_chosen(x: jax.Array, w_gate_up) -> bool:
  return (DEFAULT == "mosaic_gpu" and math.prod(x.shape[:-1]) <= MAX_TOKENS and _on_hopper()
          and (not _is_w12(w_gate_up) or W12_FUSED and w12_ops.DEFAULT == "mosaic_gpu"))


def _mosaic_gpu(x, w_gate_up):
  if _is_w12(w_gate_up):
    from pallas_kernels.w12 import mosaic_gpu as w12_mosaic_gpu  # lazy: needs a Mosaic GPU capable jaxlib

    return w12_mosaic_gpu.w12_swiglu_matmul(x, w_gate_up)
  from pallas_kernels.swiglu_matmul import mosaic_gpu

  return mosaic_gpu.swiglu_matmul(x, w_gate_up)


def _unfused(x, w_gate_up):
  matmul = w12.matmul if _is_w12(w_gate_up) else skinny_matmul.matmul
  return swiglu.swiglu(matmul(x, w_gate_up, reduce=False))


def _reference(x, w_gate_up):
  return swiglu_matmul_reference(x, w12.unpack(w_gate_up) if _is_w12(w_gate_up) else w_gate_up)


def swiglu_matmul(x: jax.Array, w_gate_up: jax.Array | w12.W12Array, *,
                  implementation: Implementation | None = None) -> jax.Array:
  """``silu(x @ W_gate) * (x @ W_up)`` for ``w_gate_up`` ``[K, 2 I]`` (gate columns first; bf16 or W12), ``[..., I]``
  in ``x.dtype``, rounded as ``reference.swiglu_matmul_reference`` says (of the unpacked weight, for W12). Like
  ``skinny_matmul.matmul``, the kernel loads its first weight tiles before the PDL wait: ``w_gate_up`` must not be
  written by the kernel just before it."""
  if implementation not in (None, *_IMPLEMENTATIONS):
    raise ValueError(f"unknown swiglu_matmul implementation {implementation!r}; expected one of {_IMPLEMENTATIONS}")
  if implementation == "mosaic_gpu":
    return _mosaic_gpu(x, w_gate_up)
  if implementation == "xla":
    return _reference(x, w_gate_up)
  if not _kernel_chosen(x, w_gate_up):
    return _unfused(x, w_gate_up)
  try:
    return _mosaic_gpu(x, w_gate_up)
  except (NotImplementedError, ImportError) as e:
    _log.warning("swiglu matmul falls back to two kernels for x%s %s, W%s %s: %s", x.shape, x.dtype,
                 w_gate_up.shape, type(w_gate_up).__name__ if _is_w12(w_gate_up) else w_gate_up.dtype, e)
    return _unfused(x, w_gate_up)
