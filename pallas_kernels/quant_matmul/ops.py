"""The public weight-only quantized matmul: one entry point, the implementation picked per backend.

Why a kernel: TLV's level-1 pass runs on int8 ``QuantArray`` weights to read half the
bytes of the bf16 verify, but plain XLA on the H200 materialises ``q.astype(bf16)`` as a
bf16 copy before the dot, so level 1 took 25.7 ms against 13.9 ms for the bf16 verify
(Qwen3-8B shapes, batch 1; docs/results/2026-11-30-bench-qwen3_8b-h200/README.md).

What runs when (``implementation=None`` and ``DEFAULT_TO_KERNEL``):
- int8 weights, bf16/f16 activations, on a Hopper GPU (compute capability 9.0), with
  ``N`` a multiple of ``2 * tile_out`` and ``K`` of ``tile_k`` (every Qwen3-8B linear):
  ``mosaic_gpu.quant_matmul``, jax's mixed-type Hopper kernel, token rows padded up to
  ``tile_tokens``.
- fp8 weights: the reference (jax's kernel rejects fp8 as unbenchmarked).
- anything else (CPU, f32 activations, odd shapes): the reference; on Hopper such a
  fallback logs a warning at trace time, so it is never silent.
``DEFAULT_TO_KERNEL`` is False, measured: the kernel passes its GPU tests on the H200
(docs/results/2026-11-30-kernels-h200/), but alone, at M = 1, it takes 64 / 25 us where the
reference takes 24 / 15 us (12288x4096 / 4096x6144; docs/results/2026-11-30-kernels-h200-splitk/):
there XLA fuses the int8->bf16 conversion into its own GEMM and reads int8 at ~2 TB/s. Whether
the whole level-1 pass still materialises bf16 copies, as in the earlier measurement above, is
for the next bench; flip the default only with a number that shows the kernel faster.
A compile failure would surface when the surrounding jit compiles, outside this fallback.
Naming an implementation disables the fallback, which is what tests and benchmarks want.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import jax
import jax.numpy as jnp

from pallas_kernels.device import on_hopper as _on_hopper  # a module name tests can patch
from pallas_kernels.quant_matmul.config import TuningConfig
from pallas_kernels.quant_matmul.reference import quant_matmul_reference

_log = logging.getLogger(__name__)

Implementation = Literal["reference", "mosaic_gpu"]
_IMPLEMENTATIONS = ("reference", "mosaic_gpu")
DEFAULT_TO_KERNEL = False  # see the module docstring


def _mosaic_gpu(x, qa, config):
    from pallas_kernels.quant_matmul import mosaic_gpu  # lazy: needs a Mosaic GPU capable jaxlib

    return mosaic_gpu.quant_matmul(x, qa.q_t, qa.scale, config=config)


def matmul(
    x: jax.Array,
    qa: Any,
    *,
    implementation: Implementation | None = None,
    config: TuningConfig | None = None,
) -> jax.Array:
    """``x @ (q * scale)`` for ``x`` ``[..., K]`` and a ``QuantArray`` ``qa`` (logical ``[K, N]``).

    ``qa`` is anything with ``q_t`` (``[N, K]`` int8 or fp8) and ``scale`` (``[N]`` f32),
    i.e. ``specpilot.models.weights.QuantArray``. f32 accumulation, result in ``x.dtype``.
    """
    if implementation not in (None, *_IMPLEMENTATIONS):
        raise ValueError(f"unknown quant matmul implementation {implementation!r}; expected one of {_IMPLEMENTATIONS}")
    if implementation == "reference":
        return quant_matmul_reference(x, qa.q_t, qa.scale)
    if implementation == "mosaic_gpu":
        return _mosaic_gpu(x, qa, config)
    if not (DEFAULT_TO_KERNEL and qa.q_t.dtype == jnp.int8 and _on_hopper()):
        return quant_matmul_reference(x, qa.q_t, qa.scale)
    try:
        return _mosaic_gpu(x, qa, config)
    except (NotImplementedError, ImportError) as e:
        _log.warning(
            "quant matmul falls back to the reference for x%s, W%s (%s): %s",
            x.shape,
            tuple(qa.q_t.shape[::-1]),
            qa.q_t.dtype,
            e,
        )
        return quant_matmul_reference(x, qa.q_t, qa.scale)
