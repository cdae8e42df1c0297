"""The public SwiGLU: one entry point, the implementation picked per backend.

``DEFAULT == "xla"``: the jnp reference (one XLA fusion). ``"mosaic_gpu"`` on an H100/H200 with 16-bit activations
and an intermediate size the kernel tiles runs ``mosaic_gpu.swiglu``; anything else falls back to the reference, with
a warning on a Hopper, so a fallback is never silent. Naming an implementation disables the fallback.
"""

from __future__ import annotations

import logging
from typing import Literal

import jax

from pallas_kernels.device import on_hopper as _on_hopper  # a module name tests can patch
from pallas_kernels.split_k import SplitKPartials
from pallas_kernels.swiglu.reference import swiglu_reference

_log = logging.getLogger(__name__)

Implementation = Literal["xla", "mosaic_gpu"]
_IMPLEMENTATIONS = ("xla", "mosaic_gpu")
DEFAULT: Implementation = "xla"
"""``"xla"``: on the H200 the kernel took 54.6 us a decode step against XLA's 51.0 (36 calls), and it pays only where
PDL chains the package's kernels, which it does not inside XLA's command buffers
(docs/results/2026-12-01-pdl-early-loads-h200/). ``bench_roofline.py --swiglu mosaic_gpu`` (rows ``chain_*``) turns
it on. Read at trace time."""


def _mosaic_gpu(gate_up):
  from pallas_kernels.swiglu import mosaic_gpu  # lazy: needs a Mosaic GPU capable jaxlib

  return mosaic_gpu.swiglu(gate_up)


def swiglu(gate_up: jax.Array | SplitKPartials, *, implementation: Implementation | None = None) -> jax.Array:
  """``silu(gate) * up`` of a fused gate|up projection ``[..., 2 I]`` (or the skinny kernel's ``SplitKPartials`` of
  it), rounded once (``reference.swiglu_reference``)."""
  if implementation not in (None, *_IMPLEMENTATIONS):
    raise ValueError(f"unknown swiglu implementation {implementation!r}; expected one of {_IMPLEMENTATIONS}")
  if implementation == "mosaic_gpu":
    return _mosaic_gpu(gate_up)
  if implementation == "xla" or DEFAULT == "xla" or not _on_hopper():
    return swiglu_reference(gate_up)
  try:
    return _mosaic_gpu(gate_up)
  except (NotImplementedError, ImportError) as e:
    _log.warning("swiglu falls back to XLA for gate_up%s %s: %s", tuple(gate_up.shape), gate_up.dtype, e)
    return swiglu_reference(gate_up)
