"""Does CUPTI (``specpilot.costmodel.cupti``) see the kernels of a ``lax.switch`` branch?

The fifty-first session's batched table (``docs/results/2026-12-07-batched-order-gpu-time-h100/``) gave SpecPilot's
profiled round 1.67 ms of CUPTI kernel time against DDTree@64's 11.98, although its verify stage took 11.70 ms of wall
time: SpecPilot's verify is the only stage that runs a ``lax.switch`` (one verify per budget candidate). This probe
times one program four ways, kernel time (CUPTI, summed over one call's launches, the median of ``--calls``) beside
wall time (median of synchronised calls), with outputs checked equal to the branch run alone:
- ``branch alone``: ``--layers`` dependent matmuls, the work of the switch's big branch;
- ``switch``: ``lax.switch`` picking that branch (index computed on the device, as the engine's ``choose`` does);
- ``switch, donated``: the same, the branch writing a donated cache in place (``dynamic_update_slice``), as the
  engine's verify writes its KV cache;
- ``switch, small branch``: the switch picking its one-matmul branch (what the kernel time should fall to);
- ``prefix, branch`` and ``prefix, switch``: the same matmuls run first, then the big branch, alone or picked by a
  switch whose index comes from the prefix's result, as the engine's ``choose`` reads the tree its draft built. XLA's
  GPU conditional reads its index on the host, which waits for everything queued before it: the switch's wall time
  over the branch's is then the drain (the GPU idles while the host launches the branch, which it no longer runs
  ahead of). With ``--hidden 1024 --layers 64`` (short kernels, launch-bound as a batch-1 verify's are) that drain
  should grow with the layers; with long kernels stay ~tens of us. In the engines' fused loop on an H100 the drain
  was not the switch's cost: the switch moved to the top of the loop body cost more, and most of the 1.09 ms it adds
  a round was kernel time (docs/results/2026-12-07-switch-cost-h100/).
If ``switch`` shows about the branch's kernel time, CUPTI sees branch kernels and the engine's shortfall lies
elsewhere; if it shows next to nothing, branch kernels are lost and the ``XLA_FLAGS`` the wrapper varies
(``cupti_switch_probe.sh``: default, command buffers off, conditionals in command buffers) say which runtime path
loses them. On a machine without CUPTI the kernel column says why and the rest still runs (the CPU test does).

    PYTHONPATH=$PWD python3 scripts/h200/cupti_switch_probe.py [--layers 16 --hidden 4096 --rows 64]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from specpilot.costmodel.cupti import kernel_timings  # noqa: E402


def branches(layers: int):
    """The big branch (``layers`` dependent matmuls) and the small one (one matmul), each writing its result into
    rows [0, rows) of ``cache``."""

    def big(x, ws, cache):
        for w in ws[:layers]:
            x = jnp.tanh(x @ w)
        return x, jax.lax.dynamic_update_slice(cache, x, (0, 0))

    def small(x, ws, cache):
        x = jnp.tanh(x @ ws[0])
        return x, jax.lax.dynamic_update_slice(cache, x, (0, 0))

    return big, small


def programs(layers: int) -> dict:
    big, small = branches(layers)

    def switch(x, ws, cache):  # picks the big branch: x's first element is finite
        pick = jnp.where(jnp.isfinite(x[0, 0]), 1, 0).astype(jnp.int32)
        return jax.lax.switch(pick, [small, big], x, ws, cache)

    def prefix(x, ws):  # the work queued before the switch; its result decides the pick
        for w in ws[:layers]:
            x = jnp.tanh(x @ w)
        return x

    def prefix_branch(x, ws, cache):
        return big(prefix(x, ws), ws, cache)

    def prefix_switch(x, ws, cache):
        return switch(prefix(x, ws), ws, cache)

    def switch_small(x, ws, cache):  # picks the small branch
        pick = jnp.where(jnp.isfinite(x[0, 0]), 0, 1).astype(jnp.int32)
        return jax.lax.switch(pick, [small, big], x, ws, cache)

    return {
        "branch alone": (jax.jit(big), False),
        "switch": (jax.jit(switch), False),
        "switch, donated": (jax.jit(switch, donate_argnums=(2,)), True),
        "switch, small branch": (jax.jit(switch_small), False),
        "prefix, branch": (jax.jit(prefix_branch), False),
        "prefix, switch": (jax.jit(prefix_switch), False),
    }


def wall_ms(fn, args, iters: int) -> float:
    """Median wall-clock ms of ``iters`` synchronised calls, each on fresh ``args()`` made before the clock starts."""
    times = []
    for _ in range(iters):
        inputs = jax.block_until_ready(args())
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*inputs))
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def kernel_ms(fn, args, calls: int) -> tuple[float, int] | str:
    """(median kernel ms of one call, its launches), or why there is none."""
    sums, launches = [], 0
    for _ in range(calls):
        try:
            timings = kernel_timings(lambda: fn(*args()))
        except RuntimeError as e:
            return str(e)
        sums.append(sum(ms for _, ms in timings))
        launches = len(timings)
    return statistics.median(sums), launches


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args(argv)
    keys = jax.random.split(jax.random.key(0), args.layers + 1)
    dtype = jnp.bfloat16 if jax.devices()[0].platform == "gpu" else jnp.float32
    x = jax.random.normal(keys[0], (args.rows, args.hidden)).astype(dtype)
    ws = [(jax.random.normal(k, (args.hidden, args.hidden)) * args.hidden ** -0.5).astype(dtype) for k in keys[1:]]
    cache = jnp.zeros((4 * args.rows, args.hidden), dtype)
    big, small = branches(args.layers)
    want = {"big": np.asarray(jax.jit(big)(x, ws, cache)[0], np.float32),
            "small": np.asarray(jax.jit(small)(x, ws, cache)[0], np.float32),
            "prefix": np.asarray(programs(args.layers)["prefix, branch"][0](x, ws, cache)[0], np.float32)}
    print(f"{jax.devices()[0].device_kind}; {args.layers} matmuls of {args.rows}x{args.hidden} @ "
          f"{args.hidden}x{args.hidden} {jnp.dtype(dtype).name}")
    print("| program | kernel ms | launches | wall ms | output = its branch alone |\n|---|---|---|---|---|")
    rows = []
    for name, (fn, donated) in programs(args.layers).items():
        fresh = (lambda: (x, ws, jnp.array(cache))) if donated else (lambda: (x, ws, cache))
        out = np.asarray(fn(*fresh())[0], np.float32)
        same = bool(np.array_equal(out, want[next((k for k in ("small", "prefix") if k in name), "big")]))
        wall = wall_ms(fn, fresh, args.iters)
        got = kernel_ms(fn, fresh, args.calls)
        kernels, launches = got if isinstance(got, tuple) else (None, None)
        rows.append({"program": name, "kernel_ms": kernels, "launches": launches, "wall_ms": wall, "same": same})
        shown = f"{kernels:.3f} | {launches}" if kernels is not None else f"– ({got}) | –"
        print(f"| {name} | {shown} | {wall:.3f} | {same} |", flush=True)
    return rows


if __name__ == "__main__":
    main()
