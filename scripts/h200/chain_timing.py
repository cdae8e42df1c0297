"""What ``split_probe.py`` (and the chain probes deleted after ``63e1118``) time: a jitted call by wall clock.

A chain of dependent kernels is timed whole, by the host's clock around synchronised calls, because what the probes
look for (kernels overlapping, launch gaps, a sum kernel between two matmuls) is invisible in a sum of kernel times.
"""

from __future__ import annotations

import statistics
import time

import jax


def wall_ms(fn, args, iters: int) -> float:
  """Median wall-clock ms of ``iters`` synchronised calls of ``fn(*args)``, after one untimed call."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(iters):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append((time.perf_counter() - t0) * 1e3)
  return statistics.median(times)
