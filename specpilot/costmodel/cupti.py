"""GPU time of one call, kernel by kernel, from CUPTI (through jax's Mosaic GPU extension, which ships its hooks).

Wall-clock timings of a small jitted program carry the host's dispatch: on the H200 even AR's commit stage, a
few tiny kernels, read ~0.3 ms per round (docs/results/2026-11-30-costmodel-h200-pruned-tree/). The sum of its
kernels' run times is what the stage costs the device; launch gaps between them are not in it (XLA's command
buffers remove most of those in the fused loop).
"""

from __future__ import annotations

from typing import Any, Callable


def kernel_timings(call: Callable[[], Any]) -> list[tuple[str, float]]:
    """Runs ``call()`` (blocking on its result) under CUPTI; (kernel name, ms) per launch, in order.

    CUPTI is attached for this call only and detached after it, so other timings in the process are not
    perturbed. Raises RuntimeError where there is no CUPTI (a CPU, or a jaxlib without Mosaic GPU)."""
    import jax

    if jax.devices()[0].platform != "gpu":
        raise RuntimeError(f"CUPTI kernel timings need an NVIDIA GPU; this backend is {jax.devices()[0].platform!r}")
    try:
        from jax._src.lib import mosaic_gpu as mosaic_gpu_lib

        ext = mosaic_gpu_lib._mosaic_gpu_ext
    except (ImportError, AttributeError) as e:
        raise RuntimeError(f"CUPTI kernel timings need jaxlib's Mosaic GPU extension: {e}") from e
    ext._cupti_init()
    try:
        jax.block_until_ready(call())
    finally:
        timings = ext._cupti_get_timings(True)
    return [(str(name), float(ms)) for name, ms in timings or []]


def gpu_ms(call: Callable[[], Any]) -> float:
    """The summed run time of ``call()``'s kernels, in ms (``kernel_timings``)."""
    return sum(ms for _, ms in kernel_timings(call))
