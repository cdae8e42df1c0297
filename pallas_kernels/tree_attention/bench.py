"""Tree attention on one GPU: the Mosaic GPU kernel against XLA attention with a dense mask.

    PYTHONPATH=$PWD python3 -m pallas_kernels.tree_attention.bench --out $OUT

needs only jax and numpy. Shapes: Qwen3-8B attention (Hq=32, Hkv=8, D=128, bf16), a
cached prefix of 2048 per request, a random tree of n nodes, n in {16, 64, 256}, B in
{1, 8}. Timed per call:

* ``kernel[...]``: ``tree_attention(implementation="pallas")`` for each TuningConfig of
  ``SWEEP`` (the first is the default), combine included;
* ``xla_einsum``: the model's attention (``specpilot.models.target.attention``: einsum,
  masked softmax in f32, einsum) over the cache with the tree's K/V written in and the
  dense ``[B, n, S + n]`` mask the engine builds;
* ``xla_dpa``: ``jax.nn.dot_product_attention(implementation="xla")`` with that mask.

Cache update and mask construction are outside every timed call (the engine does both
once per step, not per layer). Inputs rotate over enough copies to exceed L2 (60 MB)
twice. ``median us`` / ``min us``: wall clock over trials of 32+ back-to-back calls
(cycling through the copies, blocking on the last) / calls, so launch gaps and host
dispatch count; ``device us``: CUPTI's sum of GPU kernel time per call (one jitted
program over all copies), which excludes them. ``KV TB/s`` is the K/V bytes (prefix
and tree, the floor of any implementation) over ``median us``; ``floor us`` the same
bytes at 4.8 TB/s. Every output is checked
against the f32 jnp reference (max abs error). A config that fails to compile or run is
reported with its error, and the rest still runs. Prints a table; writes JSON to
``--out`` (a folder, or a path ending in .json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import platform
import statistics
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.tree_attention import ancestors, ops
from pallas_kernels.tree_attention.config import TuningConfig
from pallas_kernels.tree_attention.reference import tree_attention_reference

HQ, HKV, HEAD_DIM = 32, 8, 128  # Qwen3-8B
L2_BYTES = 60 * 2**20
HBM_BYTES_PER_S = 4.8e12  # H200 spec sheet
SWEEP = (
    TuningConfig(),
    TuningConfig(block_kv=128, max_concurrent_steps=2),
    TuningConfig(min_blocks_per_split=4),
    TuningConfig(num_splits=1),
    TuningConfig(num_splits=16, min_blocks_per_split=1),
)


def model_attention(q, k, v, mask):
    """specpilot.models.target.attention, restated so the benchmark needs only jax (GQA, f32 softmax)."""
    b, t, hq, d = q.shape
    hkv = k.shape[2]
    qg = q.reshape(b, t, hkv, hq // hkv, d)
    s = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32) * (d**-0.5)
    s = jnp.where(mask[:, None, None], s, -1e30)
    p = jax.nn.softmax(s, axis=-1)
    o = jnp.einsum("bkgts,bskd->btkgd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return o.reshape(b, t, hq, d).astype(q.dtype)


def random_tree_bits(b, n, rng):
    parents = np.stack([[-1] + [int(rng.integers(0, i)) for i in range(1, n)] for _ in range(b)])
    return ancestors.parents_to_ancestor_bits(jnp.asarray(parents, jnp.int32))


def make_copy(b, n, prefix, bits, rng, heads=(HQ, HKV, HEAD_DIM)):
    """One independent set of inputs: kernel arguments and the dense-mask arguments."""
    hq, hkv, d = heads
    normal = lambda *shape: jnp.asarray(rng.standard_normal(shape, np.float32), jnp.bfloat16)
    q, k_cache, v_cache = normal(b, n, hq, d), normal(b, prefix, hkv, d), normal(b, prefix, hkv, d)
    k_tree, v_tree = normal(b, n, hkv, d), normal(b, n, hkv, d)
    lengths = jnp.full((b,), prefix, jnp.int32)
    kernel_args = (q, k_cache, v_cache, lengths, k_tree, v_tree, bits)
    mask = jnp.concatenate([jnp.ones((b, n, prefix), bool), ancestors.ancestor_bits_to_dense(bits, n)], axis=-1)
    dense_args = (q, jnp.concatenate([k_cache, k_tree], 1), jnp.concatenate([v_cache, v_tree], 1), mask)
    return kernel_args, dense_args


def time_per_call(fn, arg_sets, trials, calls=32):
    """Wall clock: median and min over trials of (time for ``calls`` back-to-back calls, cycling
    through the argument sets, blocking on the last) / calls, in us. Includes launch gaps."""
    for args in arg_sets[:2]:
        jax.block_until_ready(fn(*args))
    calls = max(calls, len(arg_sets))
    samples = []
    for _ in range(trials):
        start = time.perf_counter()
        for i in range(calls):
            out = fn(*arg_sets[i % len(arg_sets)])
        out.block_until_ready()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples), min(samples)


def device_time_per_call(fn, arg_sets, repeats=5):
    """GPU time only (CUPTI: the sum of the kernels' run times, combine included), median over
    ``repeats`` runs of one jitted program that calls ``fn`` once per argument set; None without CUPTI."""
    try:
        from jax.experimental.mosaic.gpu import profiler
    except ImportError:
        return None
    every_set = jax.jit(lambda sets: [fn(*args) for args in sets])
    _, times_ms = profiler.measure(every_set, iterations=repeats)(arg_sets)
    if times_ms is None:
        return None
    return statistics.median(times_ms) * 1e3 / len(arg_sets)


def bench_shape(b, n, prefix, trials, sweep, *, interpret=False, calls=32, max_copies=32, heads=(HQ, HKV, HEAD_DIM)):
    """Rows for one (B, n): the XLA methods and one kernel row per config of ``sweep``, at ``heads`` (Hq, Hkv, D).

    ``interpret=True`` runs the kernel rows in Pallas GPU-interpret mode (CPU smoke runs:
    their timings mean nothing) and skips the CUPTI device time; ``calls`` and
    ``max_copies`` shrink the timing loop for such runs."""
    rng = np.random.default_rng(b * 1000 + n)
    bits = random_tree_bits(b, n, rng)
    hq, hkv, d = heads
    kv_bytes = 2 * b * (prefix + n) * hkv * d * 2  # K and V, bf16: the floor of any implementation
    copies = max(2, min(max_copies, math.ceil(2 * L2_BYTES / kv_bytes)))
    sets = [make_copy(b, n, prefix, bits, rng, heads) for _ in range(copies)]
    kernel_sets = [s[0] for s in sets]
    dense_sets = [s[1] for s in sets]
    expected = np.asarray(jax.jit(tree_attention_reference)(*kernel_sets[0]), np.float32)

    methods = {
        "xla_einsum": (jax.jit(model_attention), dense_sets),
        "xla_dpa": (
            jax.jit(lambda q, k, v, m: jax.nn.dot_product_attention(q, k, v, mask=m[:, None], implementation="xla")),
            dense_sets,
        ),
    }
    for i, config in enumerate(sweep):
        run = jax.jit(lambda *a, config=config: ops.tree_attention(*a, implementation="pallas", config=config,
                                                                     interpret=interpret))
        methods[f"kernel[{i}]"] = (run, kernel_sets)

    rows = []
    for name, (fn, arg_sets) in methods.items():
        row = dict(method=name, batch=b, nodes=n, prefix=prefix, copies=copies, heads=list(heads))
        if name.startswith("kernel"):
            config = sweep[int(name[7:-1])]
            group = config.tiled_group(hq // hkv) or hq // hkv  # as the kernel runs it, padded where it must be
            row["config"] = dataclasses.asdict(config)
            row["splits"] = config.splits(
                b * hkv * math.ceil(n / (config.block_m // group)),
                prefix // config.block_kv + math.ceil(n / config.block_kv),
            )
        try:
            out = np.asarray(fn(*arg_sets[0]), np.float32)
            row["max_abs_err"] = float(np.abs(out - expected).max())
            row["median_us"], row["min_us"] = time_per_call(fn, arg_sets, trials, calls)
            try:
                row["device_us"] = None if interpret else device_time_per_call(fn, arg_sets)
            except Exception as e:  # CUPTI has one subscriber; a profiler elsewhere makes this fail
                row["device_us"], row["device_error"] = None, f"{type(e).__name__}: {e}"[:300]
            row["kv_TBps"] = kv_bytes / row["median_us"] / 1e6
            row["kv_floor_us"] = kv_bytes / HBM_BYTES_PER_S * 1e6
        except Exception as e:  # report and go on: the first GPU run must still give the XLA numbers
            row["error"] = f"{type(e).__name__}: {e}"[:2000]
            traceback.print_exc()
        rows.append(row)
    return rows


def print_table(rows):
    print(
        f"{'B':>2} {'n':>4} {'method':<11} {'splits':>6} {'median us':>10} {'min us':>8} {'device us':>10} "
        f"{'KV TB/s':>8} {'floor us':>8} {'max err':>8}"
    )
    for r in rows:
        head = f"{r['batch']:>2} {r['nodes']:>4} {r['method']:<11} {r.get('splits', ''):>6}"
        if "error" in r:
            print(f"{head} ERROR {r['error'][:100]}")
            continue
        device = "-" if r.get("device_us") is None else f"{r['device_us']:.1f}"
        print(
            f"{head} {r['median_us']:>10.1f} {r['min_us']:>8.1f} {device:>10} {r['kv_TBps']:>8.2f} "
            f"{r['kv_floor_us']:>8.1f} {r['max_abs_err']:>8.4f}"
        )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="folder (or .json path) for the results")
    parser.add_argument("--prefix", type=int, default=2048)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--nodes", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--heads", type=int, nargs=3, default=[HQ, HKV, HEAD_DIM], metavar=("HQ", "HKV", "D"),
                        help="query heads, KV heads, head dim (default Qwen3-8B's; 40 8 128 is Qwen3-14B's)")
    parser.add_argument("--no-sweep", action="store_true", help="only the default TuningConfig")
    parser.add_argument("--splits", type=int, nargs="+", default=None,
                        help="sweep these KV splits instead of SWEEP (0: the auto split), crossed with --steps")
    parser.add_argument("--steps", type=int, nargs="+", default=[4],
                        help="max_concurrent_steps values crossed with --splits (2 fits two CTAs an SM)")
    args = parser.parse_args(argv)

    device = jax.devices()[0]
    print(f"device: {device.device_kind} ({device.platform}), jax {jax.__version__}")
    if not ops._on_hopper():
        print("warning: not a Hopper GPU; the kernel rows will fail")
    sweep = SWEEP[:1] if args.no_sweep else SWEEP
    if args.splits:
        sweep = tuple(TuningConfig(max_concurrent_steps=st, num_splits=sp or None, min_blocks_per_split=1 if sp else 2)
                      for sp in args.splits for st in args.steps)
    for i, config in enumerate(sweep):
        print(f"kernel[{i}]: {config}")
    rows = []
    for b in args.batches:
        for n in args.nodes:
            shape_rows = bench_shape(b, n, args.prefix, args.trials, sweep, heads=tuple(args.heads))
            print_table(shape_rows)
            rows += shape_rows

    print("\nall shapes:")
    print_table(rows)
    result = dict(
        device=device.device_kind,
        jax=jax.__version__,
        host=platform.node(),
        date=time.strftime("%Y-%m-%d %H:%M:%S"),
        heads=args.heads,
        rows=rows,
    )
    if args.out:
        out = pathlib.Path(args.out)
        if out.suffix != ".json":
            out.mkdir(parents=True, exist_ok=True)
            out = out / "tree_attention_bench.json"
        out.write_text(json.dumps(result, indent=2))
        print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
