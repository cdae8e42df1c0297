"""The public W12 matmul: one entry point, the implementation picked per backend."""

from __future__ import annotations

import logging
from typing import Literal

import jax

from pallas_kernels.device import on_hopper as _on_hopper  # a module name tests can patch
from pallas_kernels.split_k import SplitKPartials
from pallas_kernels.w12.config import TuningConfig
from pallas_kernels.w12.format import W12Array
from pallas_kernels.w12.reference import w12_matmul_reference
from pallas_kernels.w12.xla_decode import w12_matmul_xla_decode

_log = logging.getLogger(__name__)

Implementation = Literal["reference", "xla_decode", "mosaic_gpu"]
_IMPLEMENTATIONS = ("reference", "xla_decode", "mosaic_gpu")
DEFAULT: Implementation = "mosaic_gpu"  # what ``implementation=None`` runs; see `matmul`


def _mosaic_gpu(x, packed, config, reduce=True):
  from pallas_kernels.w12 import mosaic_gpu  # lazy: needs a Mosaic GPU capable jaxlib

  return mosaic_gpu.w12_matmul(x, packed, config=config, reduce=reduce)


def matmul(
    x: jax.Array,
    packed: W12Array,
    *,
    implementation: Implementation | None = None,
    config: TuningConfig | None = None,
    reduce: bool = True,
) -> jax.Array | SplitKPartials:
  """``x @ W`` for ``x`` ``[..., K]`` and a W12 weight ``[K, N]``; f32 accumulation. ``reduce=False``: the kernel may
  return its K splits unsummed (``SplitKPartials``, ``mosaic_gpu.w12_matmul`` says when), for a consumer kernel.

  ``implementation=None`` runs ``DEFAULT``: the fused Mosaic GPU kernel on a Hopper
  (``mosaic_gpu.DEFAULT_CONFIG``, the register decode: 7x faster than the reference and
  1.0-1.3x a bf16 dot on the H200, docs/results/2026-11-30-w12-registers-h200/), the
  reference (unpack + dot) on any other device. ``xla_decode`` (the decode as XLA ops
  feeding one dot) is not fused by XLA and stays an explicit choice. On a Hopper, a shape
  the kernel does not support falls back to the reference with a warning (at trace
  time), so the result is never silently wrong. Naming an
  implementation disables the fallback, which is what tests and benchmarks want.

  Activations are taken to be finite: the fused paths multiply an escaped weight as +0.0 and add its true product
  afterwards, so an infinite ``x[m, k]`` where column ``n`` has an escape at row ``k`` gives NaN at ``[m, n]`` where
  the reference gives ±inf (0 × inf). A model whose activations overflow has diverged on either path.
  """
  if implementation not in (None, *_IMPLEMENTATIONS):
    raise ValueError(f"unknown w12 implementation {implementation!r}; expected one of {_IMPLEMENTATIONS}")
  chosen = implementation or DEFAULT
  if chosen == "reference":
    return w12_matmul_reference(x, packed)
  if chosen == "xla_decode":
    return w12_matmul_xla_decode(x, packed)
  if implementation == "mosaic_gpu":
    return _mosaic_gpu(x, packed, config, reduce)
  if not _on_hopper():
    return w12_matmul_reference(x, packed)
  try:
    return _mosaic_gpu(x, packed, config, reduce)
  except (NotImplementedError, ImportError) as e:
    _log.warning("w12 matmul falls back to the reference for x%s, W%s: %s", x.shape, packed.shape, e)
    return w12_matmul_reference(x, packed)
