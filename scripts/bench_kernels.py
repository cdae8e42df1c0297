"""Kernel benchmarks, one command for both kernels: the W12 fused matmul and tree attention.

    PYTHONPATH=$PWD python3 scripts/bench_kernels.py --out $OUT                    # H200: both kernels
    PYTHONPATH=$PWD python3 scripts/bench_kernels.py --out $OUT --only w12 --sweep
    python scripts/bench_kernels.py --out OUT --quick                             # CPU smoke run

Needs only jax and numpy (argparse, no Hydra, no specpilot), like scripts/bench.py.

What is measured
----------------
ceiling    The memory ceiling of this device, measured in the same run over one big f32 buffer
           (``--ceiling-mib``, 2 GiB): ``read`` a jitted sum (bytes read), ``read_write`` a jitted ``a + 1``
           and ``d2d_copy`` a device-to-device copy (``jnp.array(a, copy=True)``; both charged bytes read +
           written); wall clock as below and, on a GPU, CUPTI device time. ``ceiling_Bps`` is the largest
           wall-clock rate; every ``% ceil`` column divides by it.
w12        ``x @ W`` for bf16 ``x`` [M, K] and a W12 weight [K, N], at the Qwen3-8B layer shapes K x N in
           {4096x12288 (gate or up), 12288x4096 (down), 4096x6144 (fused qkv), 4096x151936 (lm_head)} and
           M in {1, 16, 64}. Weights are normal(0, 0.02) times a per-output-channel scale in [1/4, 4]
           (bf16), packed once per shape on the host (``pack_s``, bits/weight and escapes are reported).
           Methods, all jitted:
             kernel[i]  ``w12.matmul(implementation="mosaic_gpu")`` with TuningConfig ``w12_sweep()[i]``
                        (``kernel[0]``: ``mosaic_gpu.DEFAULT_CONFIG``): the fused Mosaic GPU kernel plus the
                        XLA ops around it (x padding and permutation, split-K sum, escape patch); on a
                        machine without an H100/H200: ``mosaic_gpu.w12_matmul`` in Pallas GPU-interpret
                        mode with ``decode="smem"``, a correctness smoke run whose times mean nothing;
             xla_decode ``w12.matmul(implementation="xla_decode")``: the decode as elementwise ops and one
                        XLA dot, escapes patched after (does XLA fuse the decode into the dot?);
             reference  ``w12_matmul_reference``: unpack to bf16, then an f32-accumulated dot;
             xla_bf16   XLA's bf16 dot (f32 accumulation) on the unpacked bf16 weight;
             skinny_bf16 (GPU only) ``skinny_matmul``'s Mosaic GPU kernel on that bf16 weight, the other bf16
                        matmul the must-show compares with;
             int8       (GPU only) the TLV level-1 matmul: the same weight quantized to int8 per output
                        column, ``quant_matmul.matmul(implementation="mosaic_gpu")`` (jax's Hopper
                        mixed-type kernel, default TuningConfig); ``int8_ref`` is its jnp reference. Both
                        are compared with the int8 reference, not the W12 one (quantization is lossy).
           Bytes: the W12 methods are charged the stored W12 bytes (both planes with K padding, the bases,
           6 bytes per escape), ``xla_bf16`` the bf16 bytes (2 K N), int8 K N + 4 N; activations and outputs are not
           counted (under 2 % at M <= 64). Every output is compared with the reference on the first copy:
           ``max abs err``, ``rel err`` (over the largest |reference| output) and ``exact`` (the fraction
           of bit-equal outputs); ``ok`` means rel err <= 1e-2 (f32 accumulation order and the bf16
           rounding of the output differ between methods, so bit equality is not expected).
skinny     ``x @ W`` for bf16 ``x`` [M, K] and a bf16 ``W`` [K, N] at Qwen3-8B's fused layer shapes
           (``SKINNY_SHAPES``: qkv, o, gate_up, down, lm_head) and M in {1, 16, 64}: ``skinny[i]``,
           ``skinny_matmul.matmul(implementation="mosaic_gpu")`` with TuningConfig ``skinny_sweep()[i]``
           (``skinny[0]``: its ``DEFAULT_CONFIG``; GPU-interpret mode on a machine without a Hopper), against
           ``xla_bf16``, XLA's dot. Charged 2 K N bytes; compared with an f32 numpy matmul (``ok``: rel err
           <= 1e-2), the same columns as the W12 table.
tree_attention
           ``pallas_kernels.tree_attention.bench.bench_shape`` per (B, n): the Mosaic GPU kernel against
           the model's XLA attention and ``jax.nn.dot_product_attention`` at Qwen3-8B heads, a 2048-token
           prefix (its module docstring says what is timed); ``KV TB/s`` is its K/V bytes over the median.

Timing (both kernels; ``tree_attention.bench.time_per_call``): after warm-up calls, ``median us`` / ``min us``
over ``--trials`` trials of ``--calls`` back-to-back calls (cycling through the copies, blocking on the last
with ``block_until_ready``) divided by the calls; ``device us``: CUPTI's GPU time per call (launch gaps
excluded), when available. Inputs are rotated over enough copies (distinct device buffers) that one pass
over them moves at least 4 x L2 (60 MB on the H200), so the cache does not flatter the numbers; ``TB/s`` is
the charged bytes over ``median us``.

How it runs
-----------
Each case (the ceiling; packing one W12 shape; one W12 shape at one M; one tree-attention (B, n)) runs in
its own Python subprocess with a hard time limit (``--case-timeout``, and ``--total-time-limit`` for the
run), so a slow compile or a hung kernel costs one case: it is reported as a timeout or an error (with the
tail of its log, kept in ``OUT/logs/``), the rows it finished are kept, and the rest continue. The parent
never starts a jax backend. ``OUT/kernels_bench.json`` is rewritten after every case; at the end
``OUT/kernels_bench.md`` gets the markdown tables, which are also printed. Exit code 1 when any case or row
failed or a kernel output disagreed with the reference.

``--quick``: one small W12 shape (512 x 256, M = 1) and one tree shape (B = 1, n = 16, prefix 64), two
copies and a few timed calls, for a CPU smoke run: there both kernels run in Pallas GPU-interpret mode
(Mosaic GPU kernels cannot run on CPU otherwise), and the XLA methods on the CPU backend.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from specpilot.argtypes import positive_int  # noqa: E402

L2_BYTES = 60 * 2**20  # H200
ROTATE_L2_MULTIPLE = 4
MAX_COPIES = 16
W12_SHAPES = ((4096, 12288, "gate|up"), (12288, 4096, "down"), (4096, 6144, "qkv"), (4096, 151936, "lm_head"))
W12_TOKENS = (1, 16, 64)
SKINNY_SHAPES = ((4096, 6144, "qkv"), (4096, 4096, "o"), (4096, 24576, "gate_up"), (12288, 4096, "down"),
                 (4096, 151936, "lm_head"))
TREE_BATCHES, TREE_NODES, TREE_PREFIX = (1, 8), (16, 64, 256), 2048
QUICK = dict(w12_shapes=((512, 256, "quick"),), w12_tokens=(1,), tree_batches=(1,), tree_nodes=(16,),
             tree_prefix=64, trials=2, calls=2, max_copies=2, ceiling_mib=32)
REL_TOL = 1e-2


def w12_sweep():
    import dataclasses

    from pallas_kernels.w12 import TuningConfig
    from pallas_kernels.w12.mosaic_gpu import DEFAULT_CONFIG

    # 128 a step, the default before 2026-12-03: the split-K rows [8..14] keep it, as their recorded times had it
    # (docs/results/2026-12-03-w12-depth-cluster-h200/)
    at_128 = dataclasses.replace(DEFAULT_CONFIG, tile_k=128)
    return (
        DEFAULT_CONFIG,  # what w12.matmul runs on a Hopper: decode into wgmma's A registers (register_decode.py)
        dataclasses.replace(DEFAULT_CONFIG, blocks_per_sm=8),
        # one block an SM, the other side of DEFAULT_CONFIG's two (faster on an H100, slower on the H200:
        # docs/results/2026-12-05-w12-split-check-h200/)
        dataclasses.replace(DEFAULT_CONFIG, blocks_per_sm=1),
        dataclasses.replace(at_128, blocks_per_sm=1),
        at_128,
        TuningConfig(),  # SMEM decode, split_k auto: every SM gets a block
        # the escape lists' correction in XLA, the default before 2026-12-04 (since: in the kernel)
        dataclasses.replace(DEFAULT_CONFIG, escapes_in_kernel=False),
        # step i's decode beside step i - 1's wgmma
        dataclasses.replace(DEFAULT_CONFIG, overlap_decode=True),
        # two K splits, what the decode loop's o and down projections hand their consumer (split_k.CONSUMER_SPLIT_K):
        # ~1 block an SM, so the pipeline depth is the bytes in flight
        *(dataclasses.replace(at_128, split_k=2, max_concurrent_steps=d)
          for d in (2, 4, 6, 8)),
        # at two splits one warpgroup an SM decodes alone (Nsight Compute: one warp a scheduler, an issue every 2.6
        # cycles): step i's decode beside step i - 1's wgmma, or twice the K a step, gives that warp more to issue
        *(dataclasses.replace(at_128, split_k=2, max_concurrent_steps=d,
                              overlap_decode=True) for d in (4, 6)),
        dataclasses.replace(DEFAULT_CONFIG, split_k=2, tile_k=256, max_concurrent_steps=2),
        # the capped split as w12_matmul runs it now: 256 a step, CONSUMER_DEPTH (3) ahead
        dataclasses.replace(DEFAULT_CONFIG, split_k=2, max_concurrent_steps=3),
    )


def skinny_sweep():
    import dataclasses

    from pallas_kernels.skinny_matmul.mosaic_gpu import DEFAULT_CONFIG

    replace = dataclasses.replace
    return (
        DEFAULT_CONFIG,
        replace(DEFAULT_CONFIG, blocks_per_sm=1),
        replace(DEFAULT_CONFIG, blocks_per_sm=4, max_concurrent_steps=2),
        replace(DEFAULT_CONFIG, max_concurrent_steps=6),
        replace(DEFAULT_CONFIG, tile_k=256, max_concurrent_steps=3, blocks_per_sm=1),
        replace(DEFAULT_CONFIG, tile_k=256, max_concurrent_steps=2),
        replace(DEFAULT_CONFIG, tile_k=64, max_concurrent_steps=8),
        replace(DEFAULT_CONFIG, max_concurrent_steps=2),  # at 65-72 rows two blocks an SM fit shared memory
        replace(DEFAULT_CONFIG, tile_m=64),  # above 64 rows two token blocks, each reading every weight
        replace(DEFAULT_CONFIG, persistent=False),  # one block a work item, in waves
    )


def _shape(text: str) -> str:
    """A weight shape KxN of two positive integers (kept as text: `plan` splits it)."""
    k, sep, n = text.lower().partition("x")
    if not (sep and k.isdigit() and n.isdigit() and int(k) > 0 and int(n) > 0):
        raise argparse.ArgumentTypeError(f"expected KxN, e.g. 4096x12288, got {text!r}")
    return text


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="output folder (or a path ending in .json)")
    ap.add_argument("--only", choices=("w12", "skinny", "tree_attention"), help="one kernel only (the ceiling always runs)")
    ap.add_argument("--quick", action="store_true", help="one small shape per kernel, few calls: a CPU smoke run")
    ap.add_argument("--sweep", action="store_true",
                    help="also time the alternative TuningConfigs (w12_sweep(), skinny_sweep(), "
                         "tree_attention.bench.SWEEP)")
    ap.add_argument("--shapes", nargs="+", default=None, metavar="KxN", type=_shape,
                    help="W12 and skinny weight shapes (default: W12 " + " ".join(f"{k}x{n}" for k, n, _ in W12_SHAPES)
                         + "; skinny " + " ".join(f"{k}x{n}" for k, n, _ in SKINNY_SHAPES) + ")")
    ap.add_argument("--tokens", type=positive_int, nargs="+", default=None,
                    help=f"W12 / skinny M values (default {W12_TOKENS})")
    ap.add_argument("--trials", type=positive_int, default=None, help="timed trials per method (default 30)")
    ap.add_argument("--calls", type=positive_int, default=None, help="back-to-back calls per trial (default 32)")
    ap.add_argument("--ceiling-mib", type=positive_int, default=None, help="buffer of the ceiling measurement (2048)")
    ap.add_argument("--interpret", choices=("auto", "on", "off"), default="auto",
                    help="kernels in Pallas GPU-interpret mode (auto: when the device is not an H100/H200)")
    ap.add_argument("--case-timeout", type=float, default=150.0, help="seconds one case may take")
    ap.add_argument("--total-time-limit", type=float, default=None,
                    help="start no case after this many seconds (and cut the last one short to fit)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--case", help=argparse.SUPPRESS)  # internal: run one case (a JSON file)
    ap.add_argument("--case-result", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


# ---- child side: one case per process -----------------------------------------------------------------------


class Result:
    """The case's result file, rewritten (atomically) after every row so a killed case keeps its rows."""

    def __init__(self, path: str):
        self.path, self.data = Path(path), {"rows": []}

    def update(self, **kw):
        self.data.update(kw)
        self._write()

    def add_row(self, row: dict):
        self.data["rows"].append(row)
        self._write()

    def _write(self):
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, default=float))
        tmp.replace(self.path)


def _on_hopper() -> bool:
    from pallas_kernels.device import on_hopper

    return on_hopper()


def _interpret(mode: str) -> bool:
    return mode == "on" or (mode == "auto" and not _on_hopper())


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:2000]


def case_ceiling(case: dict, result: Result) -> None:
    import jax
    import jax.numpy as jnp

    from pallas_kernels.tree_attention.bench import device_time_per_call, time_per_call

    device = jax.devices()[0]
    result.update(device=device.device_kind, platform=device.platform, jax=jax.__version__,
                  hopper=_on_hopper(), host=platform.node())
    nbytes = case["mib"] * 2**20
    x = jnp.ones((nbytes // 4,), jnp.float32)
    gpu = device.platform == "gpu"
    for name, fn, moved in (("read", jax.jit(lambda a: jnp.sum(a)), nbytes),
                            ("read_write", jax.jit(lambda a: a + 1.0), 2 * nbytes),
                            ("d2d_copy", lambda a: jnp.array(a, copy=True), 2 * nbytes)):
        median_us, min_us = time_per_call(fn, [(x,)], case["trials"], case["calls"])
        row = dict(method=name, bytes=moved, median_us=median_us, min_us=min_us, Bps=moved / median_us * 1e6)
        if gpu:
            try:
                row["device_us"] = device_time_per_call(fn, [(x,)])
                row["Bps_device"] = moved / row["device_us"] * 1e6 if row["device_us"] else None
            except Exception as e:  # CUPTI missing or taken
                row["device_us"], row["device_error"] = None, _error(e)
        result.add_row(row)
    result.update(ceiling_Bps=max(r["Bps"] for r in result.data["rows"]))


def case_w12_prepare(case: dict, result: Result) -> None:
    """Random bf16 weights of one shape, packed once; the planes go to an .npz for the M cases."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from pallas_kernels import w12

    k, n = case["k"], case["n"]
    start = time.perf_counter()
    key_w, key_s = jax.random.split(jax.random.key(case["seed"]))
    scale = jnp.exp(jax.random.uniform(key_s, (n,), jnp.float32, np.log(0.25), np.log(4.0)))
    w = np.asarray((0.02 * jax.random.normal(key_w, (k, n), jnp.float32) * scale).astype(jnp.bfloat16))
    generated = time.perf_counter()
    packed = w12.pack(w)
    packed_at = time.perf_counter()
    del w
    np.savez(case["planes"], **{p: np.asarray(getattr(packed, p)) for p in W12_LEAVES},
             shape=np.array(packed.shape), group_k=np.array(packed.group_k))
    result.update(k=k, n=n, bits_per_weight=w12.bits_per_weight(packed), escapes=packed.num_escapes,
                  w12_bytes=w12_stored_bytes(packed), bf16_bytes=2 * k * n,
                  generate_s=generated - start, pack_s=packed_at - generated)


W12_LEAVES = ("sign_mantissa", "exponent_codes", "base_exponent", "column_escape_rows", "column_escape_bits",
              "escape_index", "escape_bits")


def w12_stored_bytes(packed) -> int:
    """Every byte a W12 matmul may read: planes, bases and the whole side table (6 bytes an entry, used or not)."""
    planes = packed.sign_mantissa.size + packed.exponent_codes.size + packed.base_exponent.size
    return int(planes + 6 * (packed.column_escape_rows.size + packed.escape_index.size))


def case_w12(case: dict, result: Result) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from pallas_kernels import w12
    from pallas_kernels.w12 import mosaic_gpu as w12_mosaic_gpu
    from pallas_kernels.w12.reference import w12_matmul_reference

    planes = np.load(case["planes"])
    packed = w12.W12Array(
        **{p: jnp.asarray(planes[p]) for p in W12_LEAVES},
        shape=tuple(int(d) for d in planes["shape"]), group_k=int(planes["group_k"]))
    k, n = packed.shape
    m, copies = case["m"], case["copies"]
    interpret = _interpret(case["interpret"])
    gpu = jax.devices()[0].platform == "gpu" and not interpret

    def fresh(a):
        return jnp.array(a, copy=True)

    packed_sets = [packed] + [jax.tree.map(fresh, packed) for _ in range(copies - 1)]
    w_bf16 = w12.unpack(packed)
    w_sets = [w_bf16] + [fresh(w_bf16) for _ in range(copies - 1)]
    rng = np.random.default_rng(case["seed"] + m)
    xs = [jnp.asarray(rng.standard_normal((m, k), np.float32), jnp.bfloat16) for _ in range(copies)]
    buffers = {a.unsafe_buffer_pointer() for a in w_sets} | {p.sign_mantissa.unsafe_buffer_pointer()
                                                             for p in packed_sets}
    assert len(buffers) == 2 * copies, "weight copies share device buffers: the rotation would be fake"

    reference = jax.jit(w12_matmul_reference)
    expected = np.asarray(reference(xs[0], packed_sets[0]), np.float32)
    scale = float(np.abs(expected).max()) or 1.0
    result.update(k=k, n=n, m=m, copies=copies, interpret=interpret, escapes=packed.num_escapes,
                  w12_bytes=w12_stored_bytes(packed), bf16_bytes=2 * k * n)

    def kernel(config: dict):
        return mosaic_kernel(w12_mosaic_gpu.w12_matmul, w12.matmul, w12.TuningConfig(**config), interpret)

    def xla_bf16():
        return jax.jit(lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32).astype(x.dtype))

    def xla_decode():
        return jax.jit(lambda x, p: w12.matmul(x, p, implementation="xla_decode"))

    w12_args = list(zip(xs, packed_sets))
    if interpret:  # interpret mode's wgmma reads SMEM only: register-decode configs run the SMEM decode there (and
        # its escapes after the kernel: the in-kernel correction is the register decode's)
        case["configs"] = [c | dict(decode="smem", escapes_in_kernel=False) for c in case["configs"]]
    methods = [(f"kernel[{i}]", lambda c=c: kernel(c), w12_args, "w12", c) for i, c in enumerate(case["configs"])]
    methods += [("xla_decode", xla_decode, w12_args, "w12", None),
                ("reference", lambda: reference, w12_args, "w12", None),
                ("xla_bf16", xla_bf16, list(zip(xs, w_sets)), "bf16", None)]
    expected_of = {"w12": expected, "bf16": expected}
    if gpu and m <= 64:  # the other bf16 matmul of the must-show's "best bf16" (issue #4): skinny_matmul's kernel
        from pallas_kernels import skinny_matmul

        methods.append(("skinny_bf16", lambda: jax.jit(
            lambda x, w: skinny_matmul.matmul(x, w, implementation="mosaic_gpu")), list(zip(xs, w_sets)), "bf16", None))
    if gpu:  # the int8 kernel cannot run in interpret mode
        from pallas_kernels import quant_matmul
        from specpilot.models.weights import quantize

        q_sets = [quantize(w.astype(jnp.float32), "int8") for w in w_sets]
        q_ref = jax.jit(lambda x, qa: quant_matmul.matmul(x, qa, implementation="reference"))
        expected_of["int8"] = np.asarray(q_ref(xs[0], q_sets[0]), np.float32)

        def int8():
            return jax.jit(lambda x, qa: quant_matmul.matmul(x, qa, implementation="mosaic_gpu"))

        methods += [("int8", int8, list(zip(xs, q_sets)), "int8", None),
                    ("int8_ref", lambda: q_ref, list(zip(xs, q_sets)), "int8", None)]
    for name, build, arg_sets, fmt, config in methods:
        weight_bytes = {"w12": w12_stored_bytes(packed), "bf16": 2 * k * n, "int8": k * n + 4 * n}[fmt]
        row = dict(method=name, k=k, n=n, m=m, copies=copies, format=fmt, weight_bytes=weight_bytes)
        result.add_row(measure_matmul(row, build, arg_sets, expected_of[fmt], scale, config, interpret, gpu, case))


def mosaic_kernel(direct, dispatch, config, interpret: bool):
    """A matmul kernel with ``config``, jitted on ``(x, weight)``: ``direct(x, weight, config=, interpret=)`` in
    Pallas GPU-interpret mode, else the public ``dispatch(x, weight, implementation="mosaic_gpu", config=)``."""
    import jax
    from jax.experimental.pallas import mosaic_gpu as plgpu

    if interpret:
        return jax.jit(lambda x, w: direct(x, w, config=config, interpret=plgpu.InterpretGPUParams()))
    return jax.jit(lambda x, w: dispatch(x, w, implementation="mosaic_gpu", config=config))


def measure_matmul(row: dict, build, arg_sets, want, scale: float, config, interpret: bool, gpu: bool,
                   case: dict) -> dict:
    """One method's row of a matmul case: ``build()`` jitted, its output on the first argument set against
    ``want`` (``ok``: max error <= REL_TOL x ``scale``; ``exact``: the bit-equal fraction), then its time per call
    over every set (wall, and CUPTI device time on a GPU). An error is reported on the row; the case goes on."""
    import numpy as np

    from pallas_kernels.tree_attention.bench import device_time_per_call, time_per_call

    if config is not None:
        row |= dict(config=config, mode="interpret" if interpret else "mosaic_gpu")
    try:
        fn = build()
        out = np.asarray(fn(*arg_sets[0]), np.float32)
        err = float(np.abs(out - want).max())
        row |= dict(max_abs_err=err, rel_err=err / scale, exact=float(np.mean(out == want)),
                    ok=bool(err <= REL_TOL * scale))
        row["median_us"], row["min_us"] = time_per_call(fn, arg_sets, case["trials"], case["calls"])
        row["TBps"] = row["weight_bytes"] / row["median_us"] / 1e6
        if gpu:
            try:
                row["device_us"] = device_time_per_call(fn, arg_sets)
                row["TBps_device"] = row["weight_bytes"] / row["device_us"] / 1e6 if row["device_us"] else None
            except Exception as e:  # CUPTI missing or taken
                row["device_us"], row["device_error"] = None, _error(e)
    except Exception as e:  # report and go on: the other methods' rows still matter
        row["error"] = _error(e)
        traceback.print_exc()
    print(f"{row['method']}: {json.dumps(row, default=float)}", flush=True)
    return row


def case_skinny(case: dict, result: Result) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from pallas_kernels import skinny_matmul
    from pallas_kernels.skinny_matmul import mosaic_gpu as skinny_mosaic_gpu

    k, n, m, copies = case["k"], case["n"], case["m"], case["copies"]
    interpret = _interpret(case["interpret"])
    gpu = jax.devices()[0].platform == "gpu" and not interpret
    rng = np.random.default_rng(case["seed"] + m)
    w0 = (rng.standard_normal((k, n), np.float32) * 0.02).astype(jnp.bfloat16)
    x0 = rng.standard_normal((m, k), np.float32).astype(jnp.bfloat16)
    expected = x0.astype(np.float32) @ w0.astype(np.float32)
    scale = float(np.abs(expected).max()) or 1.0
    w_sets = [jnp.asarray(w0)] + [jnp.asarray(w0) * (1 + i) for i in range(1, copies)]  # distinct buffers
    xs = [jnp.asarray(x0)] + [jnp.asarray(rng.standard_normal((m, k), np.float32), jnp.bfloat16)
                              for _ in range(copies - 1)]
    result.update(k=k, n=n, m=m, copies=copies, interpret=interpret, bf16_bytes=2 * k * n)

    def kernel(config: dict):
        return mosaic_kernel(skinny_mosaic_gpu.skinny_matmul, skinny_matmul.matmul,
                             skinny_matmul.TuningConfig(**config), interpret)

    methods = [(f"skinny[{i}]", lambda c=c: kernel(c), c) for i, c in enumerate(case["configs"])]
    methods.append(("xla_bf16", lambda: jax.jit(lambda x, w: skinny_matmul.matmul(x, w, implementation="xla")), None))
    # `exact` counts outputs equal to the f32 product rounded to bf16, as the W12 case does against its reference
    want = expected.astype(jnp.bfloat16).astype(np.float32)
    for name, build, config in methods:
        row = dict(method=name, k=k, n=n, m=m, copies=copies, format="bf16", weight_bytes=2 * k * n)
        result.add_row(measure_matmul(row, build, list(zip(xs, w_sets)), want, scale, config, interpret, gpu, case))


def case_tree_attention(case: dict, result: Result) -> None:
    import dataclasses

    import jax

    from pallas_kernels.tree_attention import bench as tree_bench

    interpret = _interpret(case["interpret"])
    sweep = tree_bench.SWEEP if case["sweep"] else tree_bench.SWEEP[:1]
    result.update(b=case["b"], nodes=case["nodes"], prefix=case["prefix"], interpret=interpret,
                  sweep=[dataclasses.asdict(c) for c in sweep], device=jax.devices()[0].device_kind)
    rows = tree_bench.bench_shape(case["b"], case["nodes"], case["prefix"], case["trials"], sweep,
                                  interpret=interpret, calls=case["calls"], max_copies=case["max_copies"])
    for row in rows:
        if row["method"].startswith("kernel"):
            row["mode"] = "interpret" if interpret else "mosaic_gpu"
        result.add_row(row)


CASES = {"ceiling": case_ceiling, "w12_prepare": case_w12_prepare, "w12": case_w12, "skinny": case_skinny,
         "tree_attention": case_tree_attention}


def run_case_here(case_file: str, result_file: str) -> int:
    case = json.loads(Path(case_file).read_text())
    result = Result(result_file)
    CASES[case["kind"]](case, result)
    return 0


# ---- parent side: plan, run each case in a subprocess, report -------------------------------------------------


def plan(args) -> list[dict]:
    import dataclasses

    quick = QUICK if args.quick else {}
    trials = args.trials or quick.get("trials", 30)
    calls = args.calls or quick.get("calls", 32)
    max_copies = quick.get("max_copies", MAX_COPIES)
    common = dict(trials=trials, calls=calls, interpret=args.interpret, seed=args.seed)
    cases = [dict(kind="ceiling", name="ceiling", mib=args.ceiling_mib or quick.get("ceiling_mib", 2048), **common)]
    # tree attention first: its cases are short, and a total time limit then cuts the long W12 sweep
    if args.only in (None, "tree_attention"):
        prefix = quick.get("tree_prefix", TREE_PREFIX)
        for b in quick.get("tree_batches", TREE_BATCHES):
            for nodes in quick.get("tree_nodes", TREE_NODES):
                cases.append(dict(kind="tree_attention", name=f"tree_attention_b{b}_n{nodes}", b=b, nodes=nodes,
                                  prefix=prefix, sweep=args.sweep, max_copies=32 if not args.quick else 2,
                                  **common))
    if args.only in (None, "w12"):
        configs = [dataclasses.asdict(c) for c in (w12_sweep() if args.sweep else w12_sweep()[:1])]
        shapes = quick.get("w12_shapes", W12_SHAPES)
        if args.shapes:
            labels = {(k, n): label for k, n, label in W12_SHAPES}
            shapes = [(k, n, labels.get((k, n), "")) for k, n in (map(int, s.lower().split("x")) for s in args.shapes)]
        for k, n, label in shapes:
            shape = f"{k}x{n}"
            cases.append(dict(kind="w12_prepare", name=f"w12_prepare_{shape}", k=k, n=n, label=label,
                              planes=f"{shape}.npz", **common))
            w12_bytes = 1.5 * k * n
            copies = max(2, min(max_copies, math.ceil(ROTATE_L2_MULTIPLE * L2_BYTES / w12_bytes)))
            for m in args.tokens or quick.get("w12_tokens", W12_TOKENS):
                cases.append(dict(kind="w12", name=f"w12_{shape}_m{m}", k=k, n=n, m=m, label=label, copies=copies,
                                  planes=f"{shape}.npz", configs=configs, needs=f"w12_prepare_{shape}", **common))
    if args.only in (None, "skinny"):
        configs = [dataclasses.asdict(c) for c in (skinny_sweep() if args.sweep else skinny_sweep()[:1])]
        shapes = quick.get("w12_shapes", SKINNY_SHAPES)
        if args.shapes:
            shapes = [(k, n, "") for k, n in (map(int, s.lower().split("x")) for s in args.shapes)]
        for k, n, label in shapes:
            copies = max(2, min(max_copies, math.ceil(ROTATE_L2_MULTIPLE * L2_BYTES / (2 * k * n))))
            for m in args.tokens or quick.get("w12_tokens", W12_TOKENS):
                cases.append(dict(kind="skinny", name=f"skinny_{k}x{n}_m{m}", k=k, n=n, m=m, label=label,
                                  copies=copies, configs=configs, **common))
    return cases


def tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])[-1500:]


def run_case(case: dict, scratch: Path, logs: Path, timeout: float) -> dict:
    """Runs one case in a subprocess with a hard time limit; returns its result plus status fields."""
    case = dict(case)
    if "planes" in case:
        case["planes"] = str(scratch / case["planes"])
    case_file, result_file = scratch / f"{case['name']}.case.json", scratch / f"{case['name']}.result.json"
    case_file.write_text(json.dumps(case))
    log_file = logs / f"{case['name']}.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--case", str(case_file), "--case-result", str(result_file)]
    start = time.perf_counter()
    status, error = "ok", None
    with log_file.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
            if rc != 0:
                status, error = "error", f"exit code {rc}: {tail(log_file)}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the case's own process group: the child and anything it started
            proc.wait()
            status, error = "timeout", f"killed after {timeout:.0f}s (case time limit): {tail(log_file, 3)}"
    result = json.loads(result_file.read_text()) if result_file.is_file() else {"rows": []}
    result |= dict(name=case["name"], kind=case["kind"], status=status, seconds=round(time.perf_counter() - start, 2),
                   log=str(log_file))
    if error:
        result["error"] = error
    return result


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def method(row: dict) -> str:
    return row["method"] + (" (interpret)" if row.get("mode") == "interpret" else "")


def _timings(r: dict, rate_key: str, c_bps) -> list[str]:
    """median us | min us | device us | TB/s | % ceil of one timed row (`rate_key`: its TB/s column)."""
    pct = 100 * r[rate_key] * 1e12 / c_bps if c_bps else None
    return [f"{r['median_us']:.1f}", f"{r['min_us']:.1f}", _fmt(r.get("device_us"), ".1f"), f"{r[rate_key]:.3f}",
            _fmt(pct, ".0f")]


def _row(head: str, r: dict, n_cells: int, cells) -> str:
    """A table row: `head` (the key columns), then `cells(r)`, or the row's error over those `n_cells` columns."""
    if "error" in r:
        return f"{head} ERROR: {r['error'][:160].replace('|', '/')} |" + "|" * (n_cells - 1)
    values = cells(r)
    assert len(values) == n_cells, (len(values), n_cells)
    return f"{head} {' | '.join(values)} |"


def matmul_table(rows: list, c_bps) -> list[str]:
    """The W12 and skinny tables: one line per (shape, M, method)."""
    if not rows:
        return []
    lines = [("| K x N | M | method | weight MiB | median us | min us | device us | TB/s | % ceil | "
              "max abs err | rel err | exact | ok |"), "|" + "---|" * 13]
    for r in rows:
        lines.append(_row(f"| {r['k']}x{r['n']} | {r['m']} | {method(r)} | {r['weight_bytes'] / 2**20:.1f} |", r, 9,
                          lambda r: [*_timings(r, "TBps", c_bps), f"{r['max_abs_err']:.3g}", f"{r['rel_err']:.2g}",
                                     f"{r['exact']:.3f}", "yes" if r["ok"] else "NO"]))
    return [*lines, ""]


def w12_must_show(rows: list, c_bps) -> list[str]:
    """Issue #4's check per (shape, M): the fastest W12 kernel against the fastest bf16 matmul (XLA's dot or
    skinny_matmul), on device µs where CUPTI gave them (else median wall µs), and the W12 kernel's share of the
    ceiling in compressed bytes. Targets: ratio <= 0.80 and >= 75 %."""
    def us(r):
        return r.get("device_us") or r.get("median_us")

    cases = {}
    for r in rows:
        if "error" not in r and r.get("ok") and us(r):
            cases.setdefault((r["k"], r["n"], r["m"]), []).append(r)
    lines = []
    for (k, n, m), group in cases.items():
        w12_rows = [r for r in group if r["method"].startswith("kernel")]
        bf16_rows = [r for r in group if r["format"] == "bf16"]
        if not w12_rows or not bf16_rows:
            continue
        w, b = min(w12_rows, key=us), min(bf16_rows, key=us)
        ratio = us(w) / us(b)
        pct = 100 * w["weight_bytes"] / (us(w) * 1e-6) / c_bps if c_bps else None
        met = ratio <= 0.80 and pct is not None and pct >= 75
        basis = "device" if w.get("device_us") and b.get("device_us") else "wall"
        lines.append(f"| {k}x{n} | {m} | {method(w)} {us(w):.1f} | {b['method']} {us(b):.1f} | {basis} | {ratio:.2f} | "
                     f"{_fmt(pct, '.0f')} | {'yes' if met else 'no'} |")
    if not lines:
        return []
    head = ["W12 must-show (issue #4): fastest W12 kernel against the fastest bf16 matmul; targets ratio <= 0.80 and "
            ">= 75 % of the ceiling in compressed bytes.", "",
            "| K x N | M | W12 us | best bf16 us | timing | ratio | % ceil | met |", "|" + "---|" * 8]
    return [*head, *lines, ""]


def markdown(res: dict) -> str:
    ceiling = res.get("ceiling") or {}
    c_bps = ceiling.get("ceiling_Bps")
    title = (f"# Kernel benchmarks: {res.get('device', '?')} ({res.get('platform', '?')}), "
             f"jax {res.get('jax', '?')}, {res['date']}")
    lines = [title, "", f"`{res['command']}`", ""]
    if c_bps:
        rates = ", ".join(f"{r['method']} {r['Bps'] / 1e12:.3f} TB/s"
                          + (f" (device {r['Bps_device'] / 1e12:.3f})" if r.get("Bps_device") else "")
                          for r in ceiling.get("rows", []))
        lines += [f"Ceiling ({ceiling.get('mib')} MiB buffer): {rates}; `% ceil` divides by {c_bps / 1e12:.3f} TB/s.",
                  ""]
    rows = res["w12"]["rows"] + res["skinny"]["rows"] + res["tree_attention"]["rows"]
    if any(r.get("mode") == "interpret" for r in rows):
        lines += [("Rows marked (interpret) ran a kernel in Pallas GPU-interpret mode: a correctness check, "
                   "their times mean nothing."), ""]
    if res["w12"]["rows"] or res["w12"]["shapes"]:
        lines += ["## W12 matmul", "", "| K x N | layer | bits/weight | escapes | pack s |", "|---|---|---|---|---|"]
        for shape, s in res["w12"]["shapes"].items():
            lines.append(f"| {shape} | {s.get('label', '')} | {_fmt(s.get('bits_per_weight'), '.4f')} | "
                         f"{_fmt(s.get('escapes'), ',')} | {_fmt(s.get('pack_s'), '.1f')} |")
        lines += [""]
        lines += matmul_table(res["w12"]["rows"], c_bps) + w12_must_show(res["w12"]["rows"], c_bps)
    if res["skinny"]["rows"]:
        lines += ["## Few-token bf16 matmul (skinny_matmul)", ""] + matmul_table(res["skinny"]["rows"], c_bps)
    if res["tree_attention"]["rows"]:
        lines += ["## Tree attention", "", ("| B | n | prefix | method | median us | min us | device us | KV TB/s | "
                                            "% ceil | floor us | max abs err |"), "|" + "---|" * 11]
        for r in res["tree_attention"]["rows"]:
            lines.append(_row(f"| {r['batch']} | {r['nodes']} | {r['prefix']} | {method(r)} |", r, 7,
                              lambda r: [*_timings(r, "kv_TBps", c_bps), f"{r['kv_floor_us']:.1f}",
                                         f"{r['max_abs_err']:.4f}"]))
        lines.append("")
    bad = [c for c in res["cases"] if c["status"] != "ok"]
    lines += [f"## Cases: {len(res['cases']) - len(bad)} of {len(res['cases'])} ok", ""]
    lines += [f"- {c['name']}: {c['status']}: {c.get('error', '')[:300]}" for c in bad]
    return "\n".join(lines) + "\n"


def failures(res: dict) -> int:
    rows = res["w12"]["rows"] + res["skinny"]["rows"] + res["tree_attention"]["rows"]
    return (sum(c["status"] != "ok" for c in res["cases"]) + sum("error" in r for r in rows)
            + sum(r.get("ok") is False for r in rows))


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.case:
        return run_case_here(args.case, args.case_result)
    if not args.out:
        print("bench_kernels.py: --out is required", file=sys.stderr)
        return 2
    out = Path(args.out)
    json_path = out if out.suffix == ".json" else out / "kernels_bench.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    logs = json_path.parent / "logs"
    logs.mkdir(exist_ok=True)
    cases = plan(args)
    command = "python " + " ".join(["scripts/bench_kernels.py", *(sys.argv[1:] if argv is None else argv)])
    res = dict(date=time.strftime("%Y-%m-%d %H:%M:%S"), command=command,
               args={k: v for k, v in vars(args).items() if k not in ("case", "case_result")}, quick=args.quick,
               l2_bytes=L2_BYTES, rotate_l2_multiple=ROTATE_L2_MULTIPLE, ceiling=None,
               w12=dict(shapes={}, rows=[]), skinny=dict(rows=[]), tree_attention=dict(rows=[]), cases=[])
    start = time.perf_counter()
    print(f"{len(cases)} cases, each in its own process, at most {args.case_timeout:.0f}s each", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_kernels_") as scratch:
        done = {}
        for case in cases:
            left = None if args.total_time_limit is None else args.total_time_limit - (time.perf_counter() - start)
            need = case.get("needs")
            if need and done.get(need) != "ok":
                r = dict(name=case["name"], kind=case["kind"], status="skipped", error=f"{need} did not succeed",
                         rows=[])
            elif left is not None and left < 1:
                r = dict(name=case["name"], kind=case["kind"], status="skipped", error="total time limit", rows=[])
            else:
                timeout = args.case_timeout if left is None else min(args.case_timeout, left)
                r = run_case(case, Path(scratch), logs, timeout)
            done[case["name"]] = r["status"]
            res["cases"].append({k: v for k, v in r.items() if k in ("name", "kind", "status", "seconds", "error",
                                                                        "log")})
            if case["kind"] == "ceiling":
                res["ceiling"] = {**r, "mib": case["mib"]}
                res |= {k: r[k] for k in ("device", "platform", "jax", "host", "hopper") if k in r}
            elif case["kind"] == "w12_prepare":
                res["w12"]["shapes"][f"{case['k']}x{case['n']}"] = {
                    "label": case["label"], **{k: v for k, v in r.items() if k not in ("rows", "log", "name", "kind")}}
            elif case["kind"] in ("w12", "skinny"):
                res[case["kind"]]["rows"] += r["rows"]
            else:
                res["tree_attention"]["rows"] += r["rows"]
            status = r["status"] + (f" ({r['error'][:300]})" if r.get("error") else "")
            print(f"[{time.perf_counter() - start:6.1f}s] {case['name']}: {status}", flush=True)
            json_path.write_text(json.dumps(res, indent=1, default=float))
    md = markdown(res)
    json_path.with_suffix(".md").write_text(md)
    print("\n" + md, flush=True)
    bad = failures(res)
    print(f"wrote {json_path} and {json_path.with_suffix('.md')}; {bad} failure(s)", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
