"""The public residual add + RMSNorm: one entry point, the implementation picked per backend.

``DEFAULT == "xla"``: the jnp reference (what XLA fuses itself). ``"mosaic_gpu"`` on an H100/H200 with 16-bit
activations and a hidden size the kernel tiles runs ``mosaic_gpu.add_rms_norm``; anything else falls back to the
reference, with a warning on a Hopper, so a fallback is never silent. Naming an implementation disables the
fallback, which is what tests and benchmarks want.
"""

from __future__ import annotations

import logging
from typing import Literal

import jax

from pallas_kernels.add_rms_norm.reference import add_rms_norm_reference
from pallas_kernels.device import on_hopper as _on_hopper  # a module name tests can patch
from pallas_kernels.split_k import SplitKPartials

_log = logging.getLogger(__name__)

Implementation = Literal["xla", "mosaic_gpu"]
_IMPLEMENTATIONS = ("xla", "mosaic_gpu")
DEFAULT: Implementation = "xla"
"""``"xla"``, measured: on the H200 the kernel saved 0.03-0.05 ms of a Qwen3-8B decode step
(docs/results/2026-12-01-pdl-h200/), and it moves the normed rows by a rounding step against XLA's fusion, so it is
opt-in: the config's ``kernels.norm`` (``kernels=hopper``) or the benchmarks' ``--norm`` set it
(``pallas_kernels.choices``)."""


def _mosaic_gpu(x, delta, w, eps, prefix=None):
  from pallas_kernels.add_rms_norm import mosaic_gpu  # lazy: needs a Mosaic GPU capable jaxlib

  return mosaic_gpu.add_rms_norm(x, delta, w, eps, prefix=prefix)


def add_rms_norm(x: jax.Array, delta: jax.Array | SplitKPartials | None, w: jax.Array, eps: float, *,
                 prefix: jax.Array | None = None, implementation: Implementation | None = None
                 ) -> tuple[jax.Array, jax.Array]:
  """``(s, rms_norm(s) * w)`` with ``s = x + delta`` (``delta=None``: ``s = x``), over the last axis. ``delta`` may
  be a matmul's unsummed K splits (``SplitKPartials``): the kernel adds them as it reads the row. ``prefix``
  ``[..., P, H]`` (x ``[..., T, H]``): rows that skip the norm, put before each request's normed rows in the second
  output (the DFlash round's new context rows: no concatenation kernel of their own)."""
  if implementation not in (None, *_IMPLEMENTATIONS):
    raise ValueError(f"unknown add_rms_norm implementation {implementation!r}; expected one of {_IMPLEMENTATIONS}")
  if implementation == "mosaic_gpu":
    return _mosaic_gpu(x, delta, w, eps, prefix)
  if implementation == "xla" or DEFAULT == "xla" or not _on_hopper():
    return add_rms_norm_reference(x, delta, w, eps, prefix)
  try:
    return _mosaic_gpu(x, delta, w, eps, prefix)
  except (NotImplementedError, ImportError) as e:
    _log.warning("add_rms_norm falls back to XLA for x%s %s: %s", x.shape, x.dtype, e)
    return add_rms_norm_reference(x, delta, w, eps, prefix)
