"""The device's measured limits: HBM read bandwidth and dense matmul throughput.

Ceilings are only as honest as these two numbers, so they are measured, never typed in:
- bandwidth: a jitted read-only reduction over several buffers whose total is far beyond the last-level
  cache (2 GiB on a GPU, 60 MB L2 on an H200), random values, median of timed calls;
- matmul peak: a large square matmul (bf16 on GPU, float32 on CPU, where bf16 dots are emulated) on
  random values, median of timed calls.

Results are cached per device kind in `<cache>/hw/<kind>.json` (`<cache>` = $SPECPILOT_CACHE or
~/.cache/specpilot), so a search or a benchmark pays the few seconds once per machine.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np


@dataclasses.dataclass(frozen=True)
class Hardware:
    name: str  # device kind, e.g. "NVIDIA H200" or "cpu"
    hbm_bytes_per_s: float
    matmul_flops_per_s: float
    platform: str = "unknown"
    matmul_dtype: str = "bfloat16"
    measured_at: str = ""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Hardware":
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})

    def ms(self, bytes_moved: float, flops: float) -> float:
        """The ceiling of work that must move `bytes_moved` and compute `flops`: whichever limit binds."""
        return 1e3 * max(bytes_moved / self.hbm_bytes_per_s, flops / self.matmul_flops_per_s)


def cache_root() -> Path:
    return Path(os.environ.get("SPECPILOT_CACHE") or Path.home() / ".cache" / "specpilot")


def device_kind() -> str:
    import jax

    return str(jax.devices()[0].device_kind)


def _file_name(kind: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", kind).strip("_") or "device"


def _median_ms(fn, *args, iters: int, back_to_back: int = 4) -> float:
    """Median over `iters` samples of the mean time of `back_to_back` calls issued without waiting in
    between, so the host's dispatch overlaps the device's work and is not counted."""
    import jax

    jax.block_until_ready(fn(*args))  # compile + warm up
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        for _ in range(back_to_back):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / back_to_back)
    return 1e3 * statistics.median(times)


def _random(shape, dtype, seed: int):
    """Random values (never time on zeros): jax's generator on an accelerator, numpy's on a CPU, where
    threefry is slow."""
    import jax
    import jax.numpy as jnp

    if jax.devices()[0].platform == "cpu":
        return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, dtype=np.float32), dtype)
    return jax.random.normal(jax.random.key(seed), shape, dtype)


def measure_bandwidth(total_bytes: int, buffers: int = 4, iters: int = 5) -> float:
    """Bytes/s of one jitted read-only reduction over `buffers` random bf16 buffers of `total_bytes`."""
    import jax
    import jax.numpy as jnp

    n = max(total_bytes // (2 * buffers), 1024)
    bufs = [_random((n,), jnp.bfloat16, seed) for seed in range(buffers)]
    f = jax.jit(lambda *xs: sum(jnp.sum(x, dtype=jnp.float32) for x in xs))
    ms = _median_ms(f, *bufs, iters=iters)
    return sum(b.nbytes for b in bufs) / (ms * 1e-3)


def measure_matmul(size: int, dtype_name: str, iters: int = 5) -> float:
    """FLOP/s of one jitted `size`³ matmul on random values."""
    import jax
    import jax.numpy as jnp

    dtype = jnp.dtype(dtype_name)
    a, b = _random((size, size), dtype, 10), _random((size, size), dtype, 11)
    f = jax.jit(lambda x, y: x @ y)
    ms = _median_ms(f, a, b, iters=iters)
    return 2.0 * size**3 / (ms * 1e-3)


def calibrate(bandwidth_bytes: int | None = None, matmul_size: int | None = None) -> Hardware:
    """Measure the current device (a few seconds on a GPU, about a second on a CPU)."""
    import jax

    dev = jax.devices()[0]
    gpu = dev.platform != "cpu"
    bw_bytes = bandwidth_bytes or (2 << 30 if gpu else 64 << 20)
    size = matmul_size or (8192 if gpu else 384)
    mm_dtype = "bfloat16" if gpu else "float32"
    return Hardware(
        name=str(dev.device_kind),
        hbm_bytes_per_s=measure_bandwidth(bw_bytes),
        matmul_flops_per_s=measure_matmul(size, mm_dtype),
        platform=dev.platform,
        matmul_dtype=mm_dtype,
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
    )


def load_or_calibrate(cache_dir: str | Path | None = None, refresh: bool = False, **calibrate_kw) -> Hardware:
    """The cached calibration of this device kind, measuring (and caching) it when absent or `refresh`."""
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "hw"
    path = root / f"{_file_name(device_kind())}.json"
    if path.is_file() and not refresh:
        try:
            return Hardware.from_json(json.loads(path.read_text()))
        except (json.JSONDecodeError, KeyError, TypeError):
            pass  # a damaged cache file is remeasured
    hw = calibrate(**calibrate_kw)
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(hw.to_json(), indent=1))
        tmp.replace(path)
    except OSError as e:  # a read-only home must not stop a benchmark: it just recalibrates next time
        print(f"calibration not cached ({e})", file=sys.stderr)
    return hw
