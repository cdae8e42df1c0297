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


def median_kernel_us(call: Callable[[], Any], iters: int, per: float = 1.0) -> dict[str, float]:
    """Each kernel name's µs (its launches in one ``call()`` summed, divided by ``per``: calls or steps inside it),
    the median over ``iters`` runs (``kernel_timings``)."""
    import collections
    import statistics

    runs = collections.defaultdict(list)
    for _ in range(iters):
        totals = collections.Counter()
        for name, ms in kernel_timings(call):
            totals[name] += ms * 1e3 / per
        for name, us in totals.items():
            runs[name].append(us)
    return {name: statistics.median(us) for name, us in runs.items()}


def kernel_summary(parts: dict[str, float], width: int = 40) -> str:
    """``median_kernel_us``'s result as one line, the largest first: ``name 12.34, name 5.67``."""
    return ", ".join(f"{name[:width]} {us:.2f}" for name, us in sorted(parts.items(), key=lambda kv: -kv[1]))
