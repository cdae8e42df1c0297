"""Decode at the HBM roofline (issue #8): the AR decode step of every implementation we have, side by side with
its HBM roofline, at Qwen3-8B shapes, batch 1, ~1k context, random bf16 weights.

GPU command (one H200, repo root, one call of the device tool; ≤ 9 min: no job runs past the 500 s budget, and
`timeout` stops the harness at 540 s, which still writes the report of what finished):

    SPECPILOT_COMMIT=<hash> PYTHONPATH=$PWD timeout 540 python3 scripts/bench_roofline.py --out $OUT/roofline

Expected timeline there (estimates: a 36-layer program compiles in 30-60 s, 45-70 s with the skinny kernel): the
W12 job moves its weights to the host (~25 s), then packs in the background; the xla job (calibration, 6 programs
compiled in parallel, timings) ~2 min; the skinny jobs ~1.5 min; the W12 GPU phase ~1 min once packed; torch CUDA
graphs ~1.5 min; torch eager ~25 s; the XLA-flag jobs ~50 s each; the budget cuts from the end, torch
max-autotune first (`--variants torch_peer_compile` alone in a second call, if so).

CPU smoke run (tiny shapes, float32, a few steps; what tests/test_bench_roofline.py runs):

    .venv/bin/python scripts/bench_roofline.py --quick --out outputs/roofline_quick --torch-python .venv-ref/bin/python

Writes into --out: `roofline.json` (everything, rewritten after every job), `roofline.md` (the table, also printed
last), `logs/<job>.log` (each job's output; the last lines of a job that timed out or failed go into both reports)
and `jobs/` (specs and raw results).

Variants (rows), each timed as the median of many device-synchronised steps; the weights (16.4 GB) are far
beyond the 60 MB L2, so no step reads them from cache:
- `xla_forward`: `specpilot.models.target.forward`, one token, jitted, KV cache donated, layers unrolled, one
  host round trip per step (block_until_ready) — the project's plain-XLA path;
- `xla_decode_loop`: `--loop-steps` decode steps inside one jitted `lax.fori_loop` (no host sync per step);
  ms = loop time ÷ steps;
- `skinny_forward` / `skinny_decode_loop`: `xla_forward` / `xla_decode_loop` again, in a process of their own with the
  bf16 linears on `pallas_kernels/skinny_matmul`'s Mosaic GPU kernel (`--matmul` sets the same thing for every job);
  `skinny_cmdbuf_while`: `skinny_decode_loop` under `xla_flags_cmdbuf_while`'s XLA_FLAGS;
- `xla_flags_*`: `xla_decode_loop` in a process with extra XLA_FLAGS (command buffers off / on for while loops,
  autotuning off; `--xla-flags NAME=FLAGS` adds more); every flag used exists in jax 0.11.2's XLA (an unknown
  flag aborts the process, and the CPU smoke run parses them all);
- `xla_forward_w12` / `xla_forward_w12_xla_decode` / `xla_forward_w12_kernel`: `xla_forward` on W12 weights
  (`pack_w12`'s layout), through each `w12.matmul` implementation set as `w12.ops.DEFAULT`: the jnp reference
  (unpack + dot), `xla_decode` (decode as elementwise ops feeding one dot) and the Mosaic GPU kernel (Hopper
  only); greedy tokens and time against a bf16 forward in the same process
  (issue target: W12 ≤ 0.80× bf16, identical tokens); `w12_kernel_decode_loop`: the decode loop on the W12 kernel
  against the bf16 decode loop in the same process (`--w12-xla-flags` adds XLA_FLAGS to that process, e.g. command
  buffers; `--matmul mosaic_gpu` puts its bf16 baseline on the skinny kernel; `--w12-swiglu-ab` times it with the
  fused W12 gate|up + SwiGLU kernel and, as a row of its own, with the two kernels). Packing 7.6 B weights on the host
  takes minutes, so this job starts first and packs in a process pool while the other jobs use the GPU; it gets
  the GPU when packed;
- `torch_peer_eager` / `torch_peer_compile` (`torch.compile(mode="max-autotune-no-cudagraphs")`) /
  `torch_peer_cudagraphs` (`mode="reduce-overhead"`, static cache written with `index_copy_`):
  `scripts/peer_torch_decode.py`, a gpt-fast-style PyTorch Qwen3, same shapes, CUDA-event timing;
- `verify_loop@T`: the same verify, `--loop-steps` of them in one jitted `lax.fori_loop` (each writes the same
  cache slots), ms = loop time ÷ steps: against `xla_decode_loop`'s step it compares like with like, where a
  host-synced verify idles the GPU longer than a host-synced AR forward (1.9 against 1.15 ms on the H200,
  docs/results/2026-11-30-ar-tree-attention-h200/);
- `verify_nodes@T`: the XLA forward over T ∈ --nodes tokens under a random tree mask (issue targets: 64 nodes
  ≤ 1.05× AR, 256 ≤ 1.25×);
- `drafter_b16`: one DFlash-b16 drafter pass (`specpilot.models.dflash.draft_logits`, 5 layers, 16 block rows
  over 1k context, LM head, argmax: the stock loop's draft; DDTree's vocabulary top-k belongs to the tree stage and
  its `tree.vocab_top_k`) against its roofline; `drafter_b16_tree` is the same pass with the block attention on the
  tree-attention kernel (`draft_logits(attention="pallas_tree")`: no context/block concatenation, no dense mask),
  its argmax compared with `drafter_b16`'s; `drafter_round_b16_tree` / `drafter_fused_b16_tree` add the round's
  ingest of the last committed rows (fc, then each layer's context K/V): as two calls, or as the engine's one pass
  (`DRAFTER_ROUND`).

Roofline of a row = bytes of weights + KV read (`specpilot.costmodel.counts`: target_pass / draft_pass) ÷ the
read bandwidth measured by `specpilot.costmodel.hardware` (a jitted reduction over 2 GiB), and ÷ 4.3 TB/s, the
H200's device copy rate.

`--matmul xla|mosaic_gpu`: what multiplies the bf16 linear layers in every JAX job (`skinny_matmul.ops.DEFAULT`):
XLA's dot or the few-token Mosaic GPU kernel (`pallas_kernels/skinny_matmul`); the report's `matmul` says which.
`--pdl`: every Mosaic GPU kernel in every JAX job launched with programmatic dependent launch
(`pallas_kernels/pdl.py`); the `pdl_decode_loop` row does it for itself, against `fused_norm_decode_loop`.

`--kernel-split`: after its timing, one more call of each AR forward (the W12 rows' bf16 forward included), each
verify and the drafter pass runs under CUPTI, and the row gets GPU µs and launches per kernel name (the 25 largest) and the matmul / rest split, printed as one
table per row: where a step's time goes, kernel by kernel.

Every job runs in its own subprocess with its own timeout, one at a time on the GPU; an error or a timeout is
reported in its rows and the next job runs. JAX would preallocate 75 % of GPU memory, and the W12 job's
process lives beside the others, so it gets XLA_PYTHON_CLIENT_MEM_FRACTION=0.30 and the other JAX jobs 0.60 on an
H200, 0.45 and 0.50 on an 80 GB H100 (`memory_fractions`; torch jobs have the rest; an explicit fraction in the
environment wins). JAX jobs that share weights (xla_forward,
xla_decode_loop, verify_nodes, drafter) share one process and compile their programs in parallel threads;
`--isolate` gives each its own. Plain argparse, no Hydra: the GPU machine has jax, torch and numpy only.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pallas_kernels.choices import OPS  # noqa: E402  (no jax import: the harness stays light)
from specpilot.argtypes import model_name, positive_int  # noqa: E402

NOMINAL_BYTES_PER_S = 4.3e12  # the H200's device-to-device copy rate (shared/GPU.md)
XLA_JOB = ("xla_forward", "xla_decode_loop", "verify_nodes", "verify_loop", "drafter")
DRAFTER_ROWS = {"drafter_b16": "xla", "drafter_b16_tree": "pallas_tree", "drafter_round_b16_tree": "pallas_tree",
                "drafter_fused_b16_tree": "pallas_tree"}
"""The "drafter" variant's rows and their attention. Rows for 1 and 4 KV splits and for the skinny kernel at 16 rows
ran at commit 69ccc2d and lost to ``drafter_b16_tree`` (docs/results/2026-12-01-drafter-tree-h200/)."""
DRAFTER_ROUND = {"drafter_round_b16_tree": False, "drafter_fused_b16_tree": True}
"""Rows of the drafter's whole share of a round, as the issue counts it ("5 layers + fc + head"): the last round's
committed features (``ROUND_NEW`` of the 16 pending rows) through fc into the context, then the block pass; the
value says whether as one pass. ``drafter_round_b16_tree`` is the two calls the engine made before (``ingest``,
then ``draft_logits``: each layer's QKV weight read twice), ``drafter_fused_b16_tree`` the one pass it makes now
(``dflash.ingest_and_draft``: read once). Their roofline adds fc and the hidden norm (``counts.context_ingest``)."""
DRAFTER_REFERENCE = {"drafter_b16_tree": "drafter_b16", "drafter_fused_b16_tree": "drafter_round_b16_tree"}
"""The row whose drafts a drafter row must reproduce; the rows not listed are references themselves."""
ROUND_NEW = 8
"""Committed rows a round row ingests (a typical accepted path plus its bonus token)."""
W12_JOB = ("xla_forward_w12", "xla_forward_w12_xla_decode", "xla_forward_w12_kernel", "w12_kernel_decode_loop")
W12_IMPLEMENTATION = {"xla_forward_w12": "reference", "xla_forward_w12_xla_decode": "xla_decode",
                      "xla_forward_w12_kernel": "mosaic_gpu", "w12_kernel_decode_loop": "mosaic_gpu"}
W12_LOOP = "w12_kernel_decode_loop"
"""The W12 job's decode loop (the kernel), against the bf16 decode loop in the same process: with
``--w12-xla-flags`` (command buffers) it is the W12 AR step in the best configuration, which a host-synced forward
cannot show (a W12 forward's GPU time was below bf16's while its wall time was 1.5x: the launches)."""
W12_TWO_STEP_SWIGLU = "w12_kernel_decode_loop, two-step swiglu"
"""``W12_LOOP`` with its gate|up and SwiGLU as two kernels, beside the fused form (``--w12-swiglu-ab``)."""
W12_ROWS = (*W12_JOB, W12_TWO_STEP_SWIGLU)  # what the W12 job may report
SKINNY_VARIANTS = {"skinny_forward": "xla_forward", "skinny_decode_loop": "xla_decode_loop"}
"""Rows measured again in a process of their own with the bf16 linears on ``skinny_matmul``'s Mosaic GPU kernel
(``skinny_matmul.ops.DEFAULT = "mosaic_gpu"``): the kernel and XLA's dot side by side in one run."""
FUSED_NORM_VARIANTS = {"fused_norm_decode_loop": "xla_decode_loop", "split_decode_loop": "xla_decode_loop",
                       "pdl_decode_loop": "xla_decode_loop", "summed_splits_decode_loop": "xla_decode_loop",
                       "rope_decode_loop": "xla_decode_loop", "pdl_rope_decode_loop": "xla_decode_loop",
                       "chain_decode_loop": "xla_decode_loop", "pdl_chain_decode_loop": "xla_decode_loop",
                       "fast_decode_loop": "xla_decode_loop"}
"""``skinny_decode_loop`` again with every residual add + RMSNorm on ``pallas_kernels.add_rms_norm``'s kernel, in a
process of its own: the kernel's effect on the best AR configuration, side by side in one run.
``split_decode_loop``: ``fused_norm_decode_loop``
with the skinny kernel's K splits from ``--skinny-splits``
(``skinny_matmul.mosaic_gpu.SPLIT_K_BY_SHAPE``; ``scripts/h200/split_probe.py`` writes them). ``pdl_decode_loop``:
``fused_norm_decode_loop`` with every Mosaic GPU kernel launched by programmatic dependent launch
(``pallas_kernels.pdl``). ``summed_splits_decode_loop``: ``fused_norm_decode_loop`` with the o and down projections'
K splits summed by XLA before the add + norm kernel (``skinny_matmul.ops.PASS_SPLITS = False``, the model before the
kernel took them). ``rope_decode_loop``: ``fused_norm_decode_loop`` with the q/k norm + rope on
``pallas_kernels.qk_norm_rope``'s kernel (``--rope``). ``pdl_rope_decode_loop``: ``rope_decode_loop`` under PDL (the
skinny kernel's first weight tiles and the tree-attention kernel's prefix loads issued before the grid-dependency
wait). ``chain_decode_loop``: ``rope_decode_loop`` with the SwiGLU and the attention's split merge on Mosaic GPU kernels
(``--swiglu``, ``--combine-kernel``), so every kernel of a layer is one of ours; ``pdl_chain_decode_loop``: that under
PDL. PDL on the H200 changed nothing (4.695 against 4.695 ms), nor did XLA's own PDL for its
fusions (``--xla-flags "on=--xla_gpu_enable_pdl=true --xla_gpu_enable_pdl_launch=true"``: 4.686 against 4.674 ms
off; docs/results/2026-12-01-pdl-h200/). With the early loads, inside XLA's command buffers nothing overlaps
(``pdl_rope`` 4.434, ``pdl_chain`` 4.431 against ``rope`` 4.397 ms); with them off (``XLA_FLAGS`` in the harness's
environment, which its jobs inherit and the report names) the kernels overlap and ``pdl_rope`` takes 4.374 ms
(docs/results/2026-12-01-pdl-early-loads-h200/). ``fast_decode_loop``: our fastest AR step whatever the run's flags
(``FAST_KERNELS``, ``conf/kernels/hopper.yaml``'s, and the tree-attention kernel at one node), so one run
of ``xla_decode_loop fast_decode_loop torch_peer_cudagraphs`` with no kernel flag puts plain XLA, ours and PyTorch side
by side (issue #8's AR row; with ``--matmul`` and the like, ``xla_decode_loop`` runs those kernels too)."""
FAST_KERNELS = dict(matmul="mosaic_gpu", norm="mosaic_gpu", rope="mosaic_gpu", swiglu_matmul="mosaic_gpu")
"""``fast_decode_loop``'s kernels: ``conf/kernels/hopper.yaml``'s choices (a test holds the two equal; the device
machine has no PyYAML to read the file). Until 2026-12-06 this row lacked the SwiGLU cluster kernel the file had
taken (4.333 ms against the 4.241 of ``rope_decode_loop`` with ``--swiglu-matmul mosaic_gpu``, one H200). The q|k|v
epilogue (``qkv_rope_matmul``) was in it from the forty-first to the forty-fifth session: faster on H100s, slower on
the H200 (4.267 / 4.305 against 4.248 / 4.240 ms, docs/results/2026-12-06-ar-row-h200/)."""
SKINNY_FLAG_VARIANTS = {"skinny_cmdbuf_while": "xla_flags_cmdbuf_while"}
"""The decode loop with the kernel and an ``XLA_FLAG_VARIANTS`` entry's flags: 5.03 ms on the H200 with XLA attention
(docs/results/2026-11-30-skinny-matmul-h200/); with ``--ar-attention pallas_tree`` the same as without the flags
(4.70 against 4.69 ms: docs/results/2026-11-30-ar-tree-attention-h200/)."""
XLA_FLAG_VARIANTS = {  # names checked against jax 0.11.2's XLA (`strings` on jaxlib); all parse on the CPU too
    "xla_flags_no_cmdbuf": "--xla_gpu_enable_command_buffer=",
    "xla_flags_cmdbuf_while": "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL --xla_gpu_graph_min_graph_size=1",
    "xla_flags_autotune0": "--xla_gpu_autotune_level=0",
    # skinny dots through cuBLAS instead of XLA's Triton GEMMs: the M=1 projections reached 44-53 % of read
    # bandwidth on the H200 (docs/results/2026-11-30-kernels-h200), where a GEMV is usually near the limit
    "xla_flags_no_triton_gemm": "--xla_gpu_enable_triton_gemm=false",
}
KERNELS_LISTED = 25  # --kernel-split: kernel names kept per row, the largest first
MATMUL_KERNEL_NAMES = ("gemm", "nvjet", "gemv", "cublas", "cutlass", "xmma", "matmul_body", "tree_attention_body",
                       "kernel_mosaic_gpu_kernel")
"""--kernel-split's split of a call into matmul-like kernels (XLA/cuBLAS GEMMs, the skinny and W12 matmuls, the
tree-attention kernel) and the rest. A Mosaic GPU kernel's CUPTI name is its body function's name +
``_mosaic_gpu_kernel``, and the package's bodies are named for what they do (``skinny_matmul_body``,
``w12_matmul_body``, ``tree_attention_body``; ``add_rms_norm_body`` counts as the rest). Before commit 91f6b13 every
body was ``kernel``, so every Mosaic GPU kernel was ``kernel_mosaic_gpu_kernel`` (counted matmul-like)."""
TORCH_MODES = {
    "torch_peer_eager": "eager",
    "torch_peer_cudagraphs": "reduce-overhead",
    "torch_peer_compile": "max-autotune-no-cudagraphs",
}
WHAT = {
    "xla_forward": "XLA forward, 1 token, host sync per step",
    "xla_decode_loop": "XLA, N steps in one fori_loop",
    "xla_forward_w12": "XLA forward, W12 weights (reference unpack + dot)",
    "xla_forward_w12_xla_decode": "XLA forward, W12 weights (decode as elementwise ops + one dot)",
    "xla_forward_w12_kernel": "XLA forward, W12 weights (Mosaic GPU kernel)",
    "w12_kernel_decode_loop": "xla_decode_loop, W12 weights (Mosaic GPU kernel), vs the bf16 loop in its process",
    W12_TWO_STEP_SWIGLU: "w12_kernel_decode_loop with gate|up and SwiGLU as two kernels (--w12-swiglu-ab)",
    "skinny_forward": "xla_forward, bf16 linears on the skinny_matmul kernel",
    "skinny_decode_loop": "xla_decode_loop, bf16 linears on the skinny_matmul kernel",
    "skinny_cmdbuf_while": "skinny_decode_loop with xla_flags_cmdbuf_while's command buffers",
    "fused_norm_decode_loop": "skinny_decode_loop, residual add + RMSNorm on the add_rms_norm kernel",
    "split_decode_loop": "fused_norm_decode_loop, the skinny kernel's K splits from --skinny-splits",
    "pdl_decode_loop": "fused_norm_decode_loop, the Mosaic GPU kernels launched with PDL",
    "summed_splits_decode_loop": "fused_norm_decode_loop, the K splits summed by XLA before the add + norm kernel",
    "rope_decode_loop": "fused_norm_decode_loop, q/k norm + rope on the qk_norm_rope kernel",
    "pdl_rope_decode_loop": "rope_decode_loop under PDL (weights and the cache prefix loaded before the wait)",
    "chain_decode_loop": "rope_decode_loop, SwiGLU and the attention merge on Mosaic GPU kernels",
    "pdl_chain_decode_loop": "chain_decode_loop under PDL",
    "fast_decode_loop": "our fastest AR step: rope_decode_loop's kernels and tree attention, whatever the flags",
    "torch_peer_eager": "PyTorch gpt-fast style, eager",
    "torch_peer_cudagraphs": "PyTorch, compile reduce-overhead (CUDA graphs)",
    "torch_peer_compile": "PyTorch, compile max-autotune-no-cudagraphs",
}
# Per-job timeouts (s; --quick halves them, --timeout-scale multiplies them). Jobs run in the order xla, skinny,
# skinny_cmdbuf_while, torch_peer_cudagraphs, torch_peer_eager, xla_flags_*, torch_peer_compile (the budget cuts
# from the end); w12 gets the GPU between two jobs as soon as it is packed. "xla_flags" is per flag job; "w12" its GPU phase.
DEFAULT_TIMEOUTS = {"xla": 240, "torch_peer_eager": 90, "torch_peer_cudagraphs": 180, "torch_peer_compile": 240,
                    "xla_flags": 120, "w12": 180}


def log(msg: str) -> None:
    print(msg, flush=True)


def write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    tmp.replace(path)


# =============================================================================================================
# The JAX worker: `bench_roofline.py --worker SPEC.json` (a subprocess of the harness)
# =============================================================================================================

def _pack_leaf(w):
    """One linear leaf → W12 with numpy leaves (runs in a pool process whose jax is pinned to the CPU)."""
    import jax
    import numpy as np

    from pallas_kernels import w12

    return jax.tree.map(np.asarray, w12.pack(w))


def _pool_init():
    os.environ["JAX_PLATFORMS"] = "cpu"  # pack() ends in jnp.asarray: never touch the GPU from a pool process


LOOP_KERNELS_SEEN_MIN = 0.5
"""A loop's kernel split whose kernels sum to less than this share of its step's wall time is reported as an error:
a loop runs back to back on the GPU, so the rest went unrecorded. On the H200 the bf16 loop of the W12 job, the
first loop timed in its process, showed 5.95 launches and 0.069 ms of a 4.43 ms step (2026-12-02 and -03), while the
W12 loop timed after it was recorded whole (376 launches, 4.80 of 4.81 ms). Why CUPTI missed the first is not known."""


def unrecorded_kernels(fields: dict, step_ms: float) -> str | None:
    """Why a loop's per-step kernel split (``kernel_fields``) cannot be trusted, or None: its kernels sum to less than
    ``LOOP_KERNELS_SEEN_MIN`` of the step's wall time."""
    if fields["kernels_ms"] >= LOOP_KERNELS_SEEN_MIN * step_ms:
        return None
    return (f"CUPTI saw {fields['kernels_ms']:.3f} ms of kernels in a {step_ms:.3f} ms step "
            f"({fields['kernel_launches']} launches): most of the loop's kernels went unrecorded")


def kernel_fields(timings: list, per: int = 1) -> dict:
    """CUPTI's ``(kernel name, ms)`` per launch -> a row's ``kernels`` (GPU µs and launches per name, the
    ``KERNELS_LISTED`` largest), ``kernels_ms`` and ``kernel_launches`` in all, and the matmul-like share
    (``MATMUL_KERNEL_NAMES``) as ``matmul_kernels_ms`` / ``matmul_launches``; all divided by ``per`` (a loop's
    steps: the fields are then per step, launches as a mean)."""
    by_name: dict[str, list] = {}
    for kernel, ms in timings:
        entry = by_name.setdefault(kernel, [0.0, 0])
        entry[0] += 1e3 * ms / per
        entry[1] += 1 / per
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:KERNELS_LISTED]
    heavy = [v for k, v in by_name.items() if any(p in k.lower() for p in MATMUL_KERNEL_NAMES)]
    count = (lambda n: round(n, 2)) if per > 1 else round
    return {"kernels_ms": sum(us for us, _ in by_name.values()) / 1e3,
            "kernel_launches": count(sum(n for _, n in by_name.values())),
            "matmul_kernels_ms": sum(us for us, _ in heavy) / 1e3,
            "matmul_launches": count(sum(n for _, n in heavy)),
            "kernels": [{"name": k[:120], "us": round(us, 2 if per > 1 else 1), "launches": count(n)}
                        for k, (us, n) in top]}


class Worker:
    """Builds the deployment of a spec and measures the spec's variants, saving after each one."""

    def __init__(self, spec: dict):
        import jax

        self.spec = spec
        self.res = {"job": spec["job"], "rows": {}, "device": str(jax.devices()[0].device_kind),
                    "platform": jax.devices()[0].platform, "jax": jax.__version__,
                    "xla_flags": os.environ.get("XLA_FLAGS", "")}
        self.cpu = jax.devices()[0].platform == "cpu"
        self.save()

    def save(self) -> None:
        write_json(Path(self.spec["result"]), self.res)

    def row(self, name: str, **fields) -> None:
        self.res["rows"].setdefault(name, {}).update(fields)
        self.save()

    def fail(self, name: str, e: BaseException) -> None:
        log(f"{name}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
        self.row(name, error=f"{type(e).__name__}: {str(e)[:500]}")

    # ---- shared pieces ----------------------------------------------------------------------------------

    def random_cache(self, layers: int, capacity: int, length: int, seed: int, dtype):
        """A KV cache of random values (never time on zeros), the same in every process for the same seed."""
        import jax
        import jax.numpy as jnp
        import numpy as np

        from specpilot.models.kv_cache import KVCache

        cfg = self.cfg
        shape = (layers, 1, capacity, cfg.num_kv_heads, cfg.head_dim)
        if self.cpu:  # threefry is slow on a CPU
            rng = np.random.default_rng(seed)
            k, v = (jnp.asarray(rng.standard_normal(shape, dtype=np.float32), dtype) for _ in range(2))
        else:
            k = jax.random.normal(jax.random.key(seed), shape, dtype)
            v = jax.random.normal(jax.random.key(seed + 1), shape, dtype)
        return KVCache(k=k, v=v, lengths=jnp.full((1,), length, jnp.int32))

    def ar_cache(self, dtype):
        s = self.spec
        return self.random_cache(self.cfg.num_layers, s["capacity_ar"], s["context"], s["seed"] + 100, dtype)

    def ar_step_fn(self):
        import dataclasses as dc

        import jax.numpy as jnp

        from specpilot.models.target import forward

        cfg = self.cfg

        def ar_step(w, tok, cache, adv):
            out = forward(w, cfg, tok, cache.lengths[:, None], cache, attention=self.spec["ar_attention"])
            nxt = jnp.argmax(out.logits[:, -1], axis=-1).astype(jnp.int32)[:, None]
            return nxt, dc.replace(out.cache, lengths=out.cache.lengths + adv)

        return ar_step

    def decode_loop_fn(self):
        import jax
        import jax.numpy as jnp

        ar_step = self.ar_step_fn()
        slots = max(self.spec["check_steps"], self.spec["loop_steps"])

        def decode_loop(w, tok, cache, n, adv):
            def body(i, carry):
                tok, cache, buf = carry
                tok, cache = ar_step(w, tok, cache, adv)
                return tok, cache, jax.lax.dynamic_update_slice(buf, tok, (0, i))

            buf = jnp.zeros((tok.shape[0], slots), jnp.int32)
            return jax.lax.fori_loop(0, n, body, (tok, cache, buf))  # n traced: one while loop, no unrolling

        return decode_loop

    @staticmethod
    def compile_all(lowered: dict, log_prefix: str = "") -> tuple[dict, dict]:
        """Compile lowered programs in parallel threads (XLA compiles with the GIL released)."""
        from concurrent.futures import ThreadPoolExecutor

        def one(item):
            name, low = item
            t0 = time.perf_counter()
            try:
                return name, low.compile(), time.perf_counter() - t0, None
            except Exception as e:  # reported on that variant's row
                return name, None, time.perf_counter() - t0, e

        compiled, errors = {}, {}
        with ThreadPoolExecutor(max_workers=max(1, len(lowered))) as pool:
            for name, exe, secs, err in pool.map(one, lowered.items()):
                log(f"{log_prefix}compiled {name} in {secs:.1f}s" + (f" FAILED: {err}" if err else ""))
                if err is None:
                    compiled[name] = (exe, secs)
                else:
                    errors[name] = err
        return compiled, errors

    def timed_calls(self, call, state, warmup: int, iters: int):
        """Median-able list of ms per call, each call synchronised (block_until_ready) before the next."""
        import jax

        for _ in range(warmup):
            state = call(state)
        jax.block_until_ready(state)
        ms = []
        for _ in range(iters):
            t0 = time.perf_counter()
            state = call(state)
            jax.block_until_ready(state)
            ms.append(1e3 * (time.perf_counter() - t0))
        return ms, state

    @staticmethod
    def stats(ms: list[float]) -> dict:
        import numpy as np

        return {"ms": statistics.median(ms), "ms_p10": float(np.percentile(ms, 10)),
                "ms_p90": float(np.percentile(ms, 90)), "n": len(ms)}

    def kernel_split(self, name: str, call, state, per: int = 1) -> None:
        """With --kernel-split: one more ``call(state)`` under CUPTI, its kernels grouped by name (GPU µs and
        launches, the ``KERNELS_LISTED`` largest) into the row as ``kernels``, their sum as ``kernels_ms``, and the
        matmul-like share (``MATMUL_KERNEL_NAMES``) as ``matmul_kernels_ms`` / ``matmul_launches``
        (``specpilot.costmodel.cupti``: one call, where jax's ``profiler.measure`` calls a function twice with the
        same arguments, which a program that donates its cache cannot take). ``per``: the call's loop steps; the
        fields are then per step (``kernels_per_step_of``), and ``gpu_idle_ms`` is the step's wall time the GPU ran
        no kernel."""
        if not self.spec.get("kernel_split"):
            return
        from specpilot.costmodel.cupti import kernel_timings

        try:
            timings = kernel_timings(lambda: call(state))
        except Exception as e:  # no CUPTI (a CPU run), or it is taken
            self.row(name, kernels_error=f"{type(e).__name__}: {str(e)[:200]}")
            return
        fields = kernel_fields(timings, per)
        if per > 1:
            fields["kernels_per_step_of"] = per
            step_ms = self.res["rows"].get(name, {}).get("ms")
            if step_ms:
                missed = unrecorded_kernels(fields, step_ms)
                if missed:
                    self.row(name, kernels_error=missed)
                    log(f"{name}: {missed}")
                    return
                fields["gpu_idle_ms"] = step_ms - fields["kernels_ms"]
        self.row(name, **fields)
        log(f"{name}: {fields['kernel_launches']} kernels, {fields['kernels_ms']:.3f} ms GPU time"
            + (" a step" if per > 1 else ""))

    def greedy(self, step, w, cache, steps: int):
        """Greedy tokens of `steps` AR steps from the spec's start token (the cache advances)."""
        import jax.numpy as jnp

        tok = jnp.full((1, 1), self.spec["start_token"], jnp.int32)
        one = jnp.ones((), jnp.int32)
        tokens = []
        for _ in range(steps):
            tok, cache = step(w, tok, cache, one)
            tokens.append(int(tok[0, 0]))
        return tokens, tok, cache

    def measure_ar(self, name: str, step, w, dtype, extra: dict | None = None) -> dict:
        """Greedy check, then the per-step time at a fixed cache length (the step writes the same slot)."""
        import jax.numpy as jnp

        s = self.spec
        tokens, tok, cache = self.greedy(step, w, self.ar_cache(dtype), s["check_steps"])
        zero = jnp.zeros((), jnp.int32)
        ms, state = self.timed_calls(lambda st: step(w, st[0], st[1], zero), (tok, cache), s["warmup"], s["iters"])
        row = {**self.stats(ms), "tokens": tokens, **(extra or {})}
        self.row(name, **row)
        self.kernel_split(name, lambda st: step(w, st[0], st[1], zero), state)
        log(f"{name}: {row['ms']:.3f} ms/step (p10 {row['ms_p10']:.3f}, p90 {row['ms_p90']:.3f}), tokens {tokens}")
        return row

    # ---- the xla job: xla_forward, xla_decode_loop, verify_nodes, drafter (and the flag jobs' loop) -----------

    def setup_target(self, dtype_name: str):
        import jax.numpy as jnp

        from specpilot.costmodel.measure import model_config
        from specpilot.models.weights import init_random_target

        self.cfg = model_config(self.spec["model"])
        dtype = jnp.dtype(dtype_name)
        t0 = time.perf_counter()
        w = init_random_target(self.cfg, self.spec["seed"], dtype)
        import jax

        jax.block_until_ready(w)
        self.res["init_s"] = time.perf_counter() - t0
        return w, dtype

    def export_for_torch(self, w, dtype, folder: Path) -> None:
        """The weight pytree and the AR cache as .npy files (bf16 as uint16 bits) for the torch peer."""
        import numpy as np

        folder.mkdir(parents=True, exist_ok=True)
        arrays = {"embed": w.embed, "final_norm": w.final_norm, "lm_head": w.lm_head}
        for i, lw in enumerate(w.layers):
            for f in ("attn_norm", "w_qkv", "q_norm", "k_norm", "w_o", "mlp_norm", "w_gate_up", "w_down"):
                if getattr(lw, f) is not None:
                    arrays[f"layers.{i}.{f}"] = getattr(lw, f)
        cache = self.ar_cache(dtype)
        arrays["cache_k"], arrays["cache_v"] = cache.k, cache.v
        meta = {}
        for name, a in arrays.items():
            a = np.asarray(a)
            kind = "bfloat16" if a.dtype.name == "bfloat16" else "float32"
            np.save(folder / f"{name}.npy", a.view(np.uint16) if kind == "bfloat16" else a.astype(np.float32))
            meta[name] = {"file": f"{name}.npy", "dtype": kind, "shape": list(a.shape)}
        np.save(folder / "cache_lengths.npy", np.asarray(cache.lengths))
        np.save(folder / "start_token.npy", np.asarray(self.spec["start_token"]))
        (folder / "meta.json").write_text(json.dumps({"arrays": meta}, indent=1))

    def xla_job(self) -> None:
        import jax
        import jax.numpy as jnp
        import numpy as np

        s = self.spec
        variants = s["variants"]
        w, dtype = self.setup_target(s["dtype"])
        cfg = self.cfg
        log(f"weights ready in {self.res['init_s']:.1f}s")
        if s.get("export"):
            t0 = time.perf_counter()
            try:
                self.export_for_torch(w, dtype, Path(s["export"]))
                self.res["export"] = s["export"]
                log(f"exported weights for the torch peer in {time.perf_counter() - t0:.1f}s")
            except Exception as e:
                self.res["export_error"] = f"{type(e).__name__}: {e}"
        one = jnp.ones((), jnp.int32)
        tok0 = jnp.full((1, 1), s["start_token"], jnp.int32)
        lowered = {}

        def lower(name, fn, donate, *args):
            try:
                lowered[name] = jax.jit(fn, donate_argnums=donate).lower(*args)
            except Exception as e:
                self.fail(name, e)

        t0 = time.perf_counter()
        if "xla_forward" in variants:
            lower("xla_forward", self.ar_step_fn(), (2,), w, tok0, self.ar_cache(dtype), one)
        if "xla_decode_loop" in variants:
            lower("xla_decode_loop", self.decode_loop_fn(), (2,), w, tok0, self.ar_cache(dtype), one, one)
        trees = {}  # nodes -> (tokens, positions, ancestor mask): one random tree per size, for both verify rows
        rng = np.random.default_rng(s["seed"])
        for t in s["nodes"] if {"verify_nodes", "verify_loop"} & set(variants) else []:
            mask, depth = random_tree(t, rng)
            toks = jnp.asarray(rng.integers(0, cfg.vocab_size, (1, t)), jnp.int32)
            trees[t] = (toks, jnp.asarray(s["context"] + depth[None, :], jnp.int32), jnp.asarray(mask[None]))
            verify = self.verify_fn()
            cache = self.verify_cache(t, dtype)
            if "verify_nodes" in variants:
                lower(f"verify_nodes@{t}", verify, (3,), w, *trees[t][:2], cache, trees[t][2])
            if "verify_loop" in variants:
                lower(f"verify_loop@{t}", self.verify_loop_fn(verify), (3,), w, *trees[t][:2], cache, trees[t][2], one)
        if "drafter" in variants:
            from specpilot.models.config import synthetic_drafter_config
            from specpilot.models.dflash import draft_logits, ingest, ingest_and_draft
            from specpilot.models.weights import init_random_drafter

            dcfg = synthetic_drafter_config(cfg, s["drafter_layers"], s["block_size"])
            dw = init_random_drafter(dcfg, s["seed"] + 1, dtype)
            ctx = self.random_cache(dcfg.layers.num_layers, round_up(s["context"], 128), s["context"], s["seed"] + 300,
                                    dtype)
            block = jnp.asarray([[s["start_token"]] + [dcfg.mask_token_id] * (dcfg.block_size - 1)], jnp.int32)

            def drafter(attention, top2=False):
                def draft(dw, embed, lm_head, ctx, block):
                    logits = draft_logits(dw, dcfg, embed, lm_head, ctx, block, attention=attention)[:, 1:]
                    if top2:  # untimed: the two largest logits per row, for the tokens check (`draft_gaps`)
                        return jax.lax.top_k(logits, 2)[0]
                    return jnp.argmax(logits, axis=-1)  # the stock loop's draft; DDTree's top-k: tree stage
                return draft

            feats = jax.random.normal(jax.random.key(s["seed"] + 400),
                                      (1, dcfg.block_size, len(dcfg.target_layer_ids) * cfg.hidden_size), dtype)
            n_new = jnp.full((1,), ROUND_NEW, jnp.int32)

            def drafter_round(fused, attention, top2=False):
                def draft(dw, embed, lm_head, ctx, block):
                    if fused:
                        logits = ingest_and_draft(dw, dcfg, embed, lm_head, ctx, feats, n_new, block,
                                                  attention=attention)[0]
                    else:
                        logits = draft_logits(dw, dcfg, embed, lm_head, ingest(dw, dcfg, ctx, feats, n_new), block,
                                              attention=attention)
                    logits = logits[:, 1:]
                    return jax.lax.top_k(logits, 2)[0] if top2 else jnp.argmax(logits, axis=-1)
                return draft

            for name, attention in DRAFTER_ROWS.items():
                make = functools.partial(drafter_round, DRAFTER_ROUND[name]) if name in DRAFTER_ROUND else drafter
                lower(name, make(attention), (), dw, w.embed, w.lm_head, ctx, block)
                lower(f"{name}:top2", make(attention, top2=True), (), dw, w.embed, w.lm_head, ctx, block)
        log(f"traced {len(lowered)} programs in {time.perf_counter() - t0:.1f}s")
        compiled, errors = self.compile_all(lowered)
        for name, e in errors.items():
            self.row(name, error=f"compile: {type(e).__name__}: {str(e)[:500]}")

        if "xla_forward" in compiled:
            exe, secs = compiled["xla_forward"]
            try:
                self.measure_ar(s.get("forward_label") or "xla_forward", exe, w, dtype, {"compile_s": secs})
            except Exception as e:
                self.fail(s.get("forward_label") or "xla_forward", e)
        if "xla_decode_loop" in compiled:
            exe, secs = compiled["xla_decode_loop"]
            try:
                self.measure_loop(s.get("loop_label") or "xla_decode_loop", exe, w, dtype, secs)
            except Exception as e:
                self.fail(s.get("loop_label") or "xla_decode_loop", e)
        for t in s["nodes"] if "verify_nodes" in variants else []:
            name = f"verify_nodes@{t}"
            if name not in compiled:
                continue
            exe, secs = compiled[name]
            try:
                toks, pos, mask = trees[t]
                cache = self.verify_cache(t, dtype)

                def call(st, exe=exe, toks=toks, pos=pos, mask=mask):
                    return exe(w, toks, pos, st[1], mask)

                ms, state = self.timed_calls(call, (None, cache), s["warmup"], s["verify_iters"])
                self.row(name, **self.stats(ms), compile_s=secs, nodes=t, attention=s["verify_attention"])
                self.kernel_split(name, call, state)
                log(f"{name}: {statistics.median(ms):.3f} ms")
            except Exception as e:
                self.fail(name, e)
        for t in s["nodes"] if "verify_loop" in variants else []:
            name = f"verify_loop@{t}"
            if name in compiled:
                try:
                    self.measure_verify_loop(name, t, compiled[name], w, trees[t], dtype)
                except Exception as e:
                    self.fail(name, e)
        for name, attention in DRAFTER_ROWS.items():
            if name not in compiled:
                continue
            exe, secs = compiled[name]
            try:
                draft_call = lambda st, exe=exe: exe(dw, w.embed, w.lm_head, ctx, block)  # noqa: E731
                ms, _ = self.timed_calls(draft_call, None, s["warmup"], s["verify_iters"])
                tokens = [int(t) for t in np.asarray(draft_call(None))[0]]
                top2 = compiled.get(f"{name}:top2")
                top2 = np.asarray(top2[0](dw, w.embed, w.lm_head, ctx, block))[0].tolist() if top2 else None
                self.row(name, **self.stats(ms), compile_s=secs, drafter_layers=dcfg.layers.num_layers,
                         block_size=dcfg.block_size, attention=attention, tokens=tokens, top2_logits=top2)
                self.kernel_split(name, draft_call, None)
                log(f"{name}: {statistics.median(ms):.3f} ms")
            except Exception as e:
                self.fail(name, e)

    def verify_fn(self):
        """One verify pass of a tree over a filled cache: the target's argmax per node and the cache."""
        import jax.numpy as jnp

        from specpilot.models.target import forward

        cfg, attention = self.cfg, self.spec["verify_attention"]

        def verify(w, toks, pos, cache, mask):
            out = forward(w, cfg, toks, pos, cache, mask, attention=attention)
            return jnp.argmax(out.logits, axis=-1).astype(jnp.int32), out.cache

        return verify

    def verify_cache(self, nodes: int, dtype):
        """The verify rows' cache: the committed context plus room for the tree (a fresh copy per call)."""
        s = self.spec
        return self.random_cache(self.cfg.num_layers, round_up(s["context"] + nodes, 128), s["context"],
                                 s["seed"] + 200, dtype)

    @staticmethod
    def verify_loop_fn(verify):
        """``n`` passes of ``verify`` in a ``fori_loop`` (each writes the same cache slots), like the decode loop's
        steps; returns the last pass's argmax and the cache."""
        import jax
        import jax.numpy as jnp

        def verify_loop(w, toks, pos, cache, mask, n):
            body = lambda _, carry: verify(w, toks, pos, carry[1], mask)  # noqa: E731
            return jax.lax.fori_loop(0, n, body, (jnp.zeros_like(toks), cache))  # n traced: one while loop

        return verify_loop

    def measure_verify_loop(self, name: str, t: int, compiled, w, tree, dtype) -> None:
        import jax.numpy as jnp

        s = self.spec
        exe, secs = compiled
        toks, pos, mask = tree
        cache = self.verify_cache(t, dtype)
        n = jnp.asarray(s["loop_steps"], jnp.int32)
        call = lambda st: exe(w, toks, pos, st[1], mask, n)
        ms, state = self.timed_calls(call, (None, cache), 1, s["loop_reps"])
        per_pass = [m / s["loop_steps"] for m in ms]
        self.row(name, **self.stats(per_pass), compile_s=secs, nodes=t, attention=s["verify_attention"],
                 loop_steps=s["loop_steps"])
        self.kernel_split(name, call, state, per=s["loop_steps"])
        log(f"{name}: {statistics.median(per_pass):.3f} ms per verify over {s['loop_steps']}-pass loops")

    def measure_loop(self, name: str, exe, w, dtype, compile_s: float) -> None:
        import jax
        import jax.numpy as jnp

        s = self.spec
        zero, one = jnp.zeros((), jnp.int32), jnp.ones((), jnp.int32)
        tok = jnp.full((1, 1), s["start_token"], jnp.int32)
        n_check = jnp.asarray(s["check_steps"], jnp.int32)
        tok, cache, buf = exe(w, tok, self.ar_cache(dtype), n_check, one)
        tokens = [int(x) for x in jax.device_get(buf)[0, : s["check_steps"]]]
        n = s["loop_steps"]
        n_arr = jnp.asarray(n, jnp.int32)

        def call(st):
            tok, cache, _ = exe(w, st[0], st[1], n_arr, zero)
            return tok, cache

        ms, state = self.timed_calls(call, (tok, cache), 1, s["loop_reps"])
        per_step = [m / n for m in ms]
        self.row(name, **self.stats(per_step), tokens=tokens, compile_s=compile_s, loop_steps=n,
                 xla_flags=os.environ.get("XLA_FLAGS", ""))
        self.kernel_split(name, call, state, per=n)
        log(f"{name}: {statistics.median(per_step):.3f} ms/step over {n}-step loops, tokens {tokens}")

    # ---- the w12 job ---------------------------------------------------------------------------------------

    def w12_job(self) -> None:
        import dataclasses as dc

        import jax
        import jax.numpy as jnp
        import numpy as np

        s = self.spec
        status = Path(s["status_dir"])
        w, dtype = self.setup_target("bfloat16")  # W12 is lossless bf16
        t0 = time.perf_counter()
        leaves = [("lm_head", w.lm_head)] + [(f"layers.{i}.{f}", getattr(lw, f)) for i, lw in enumerate(w.layers)
                                             for f in ("w_gate_up", "w_down", "w_qkv", "w_o")]
        host = sorted(((name, np.asarray(a)) for name, a in leaves), key=lambda na: -na[1].size)  # largest first:
        # they bound the pool's time
        self.res["to_host_s"] = time.perf_counter() - t0
        (status / "w12.packing").touch()  # the GPU is free for the other jobs from here
        t0 = time.perf_counter()
        workers = s["pack_workers"]
        if workers > 1 and sum(a.size for _, a in host) > 50_000_000:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                     initializer=_pool_init) as pool:
                packed = dict(zip([n for n, _ in host], pool.map(_pack_leaf, [a for _, a in host])))
        else:
            packed = {name: _pack_leaf(a) for name, a in host}
        del host
        self.res["pack_s"] = time.perf_counter() - t0
        self.res["pack_workers"] = workers
        log(f"packed {len(packed)} leaves in {self.res['pack_s']:.1f}s ({workers} workers)")
        self.save()
        (status / "w12.ready").touch()
        deadline = time.time() + s["go_timeout_s"]
        while not (status / "w12.go").exists():  # wait for the harness to hand over the GPU
            if time.time() > deadline:
                raise TimeoutError("the harness never handed over the GPU")
            time.sleep(0.2)
        t0 = time.perf_counter()
        packed = jax.device_put(packed)
        layers = [dc.replace(lw, **{f: packed[f"layers.{i}.{f}"] for f in ("w_gate_up", "w_down", "w_qkv", "w_o")})
                  for i, lw in enumerate(w.layers)]
        w12w = dc.replace(w, layers=layers, lm_head=packed["lm_head"])
        jax.block_until_ready(w12w)
        self.res["to_device_s"] = time.perf_counter() - t0

        import logging

        from pallas_kernels.w12 import ops as w12_ops

        class Grab(logging.Handler):
            def __init__(self):
                super().__init__()
                self.messages = []

            def emit(self, record):
                self.messages.append(record.getMessage())

        grab = Grab()
        logging.getLogger(w12_ops.__name__).addHandler(grab)
        step = self.ar_step_fn()
        tok0 = jnp.full((1, 1), s["start_token"], jnp.int32)
        one = jnp.ones((), jnp.int32)
        lowered, kernel_note = {}, None
        forwards = [v for v in W12_JOB if v != W12_LOOP and v in s["variants"]]
        for name, tree in ((("bf16", w),) if forwards else ()) + tuple((v, w12w) for v in forwards):
            default = w12_ops.DEFAULT
            w12_ops.DEFAULT = W12_IMPLEMENTATION.get(name, "reference")  # read at trace time by w12.matmul
            try:
                form = jax.jit(fresh(step), donate_argnums=(2,))
                lowered[name] = form.lower(tree, tok0, self.ar_cache(dtype), one)
            except Exception as e:
                self.fail(name, e)
            finally:
                w12_ops.DEFAULT = default
            if name == "xla_forward_w12_kernel":
                kernel_note = ("Mosaic GPU kernel" if w12_ops._on_hopper() else
                               "not a Hopper GPU: the reference path, same program as xla_forward_w12")
                if grab.messages:
                    kernel_note += f"; {len(grab.messages)} fallback(s) to the reference: {grab.messages[0][:200]}"
        compiled, errors = self.compile_all(lowered)
        for name, e in errors.items():
            self.row(name, error=f"compile: {type(e).__name__}: {str(e)[:500]}")
        base = None
        if "bf16" in compiled:
            try:
                self.measure_ar("bf16 (w12 job)", compiled["bf16"][0], w, dtype)
                base = self.res["rows"].pop("bf16 (w12 job)")  # with its kernel split, if any
                self.res["bf16"] = base
            except Exception as e:
                self.res["bf16_error"] = f"{type(e).__name__}: {e}"
        implementation = {"xla_forward_w12": "reference (unpack + dot)",
                          "xla_forward_w12_xla_decode": "xla_decode (elementwise decode + one dot)",
                          "xla_forward_w12_kernel": kernel_note}
        for name in W12_JOB:
            if name not in compiled:
                continue
            exe, secs = compiled[name]
            extra = {"compile_s": secs, "implementation": implementation[name],
                     "xla_flags": os.environ.get("XLA_FLAGS", "")}
            if base is not None:
                extra.update(bf16_ms=base["ms"], bf16_tokens=base["tokens"])
                if base.get("kernels"):
                    extra.update(bf16_kernels=base["kernels"], bf16_kernels_ms=base["kernels_ms"])
            try:
                row = self.measure_ar(name, exe, w12w, dtype, extra)
                if base is not None:
                    self.row(name, ratio_vs_bf16=row["ms"] / base["ms"],
                             tokens_equal_bf16=row["tokens"] == base["tokens"])
            except Exception as e:
                self.fail(name, e)
        if W12_LOOP in s["variants"]:
            self.w12_decode_loops(w, w12w, dtype, w12_ops)

    def w12_decode_loops(self, w, w12w, dtype, w12_ops) -> None:
        """``W12_LOOP``: the decode loop on the W12 kernel and on bf16 (the baseline of its ratio), one process; with
        ``w12_swiglu_ab`` the W12 loop with the fused gate|up + SwiGLU kernel (``swiglu_matmul.ops.W12_FUSED``, where
        ``--swiglu-matmul`` asks for the fused form) and with the two kernels (``W12_TWO_STEP_SWIGLU``), timed between
        the bf16 loop and the fused one."""
        import jax
        import jax.numpy as jnp

        from pallas_kernels.swiglu_matmul import ops as swiglu_matmul_ops

        s = self.spec
        loop = self.decode_loop_fn()
        args = (jnp.full((1, 1), s["start_token"], jnp.int32), self.ar_cache(dtype), jnp.zeros((), jnp.int32),
                jnp.ones((), jnp.int32))
        lowered = {}
        default, fused = w12_ops.DEFAULT, swiglu_matmul_ops.W12_FUSED
        kernel, ab = W12_IMPLEMENTATION[W12_LOOP], bool(s.get("w12_swiglu_ab"))
        forms = [("bf16", w, default, fused)]
        if ab:
            forms.append((W12_TWO_STEP_SWIGLU, w12w, kernel, False))
        forms.append((W12_LOOP, w12w, kernel, ab or fused))
        for name, tree, implementation, w12_fused in forms:
            w12_ops.DEFAULT, swiglu_matmul_ops.W12_FUSED = implementation, w12_fused  # read at trace time
            try:
                lowered[name] = jax.jit(fresh(loop), donate_argnums=(2,)).lower(tree, *args)
            except Exception as e:
                self.fail(W12_LOOP, e)
                return
            finally:
                w12_ops.DEFAULT, swiglu_matmul_ops.W12_FUSED = default, fused
        compiled, errors = self.compile_all(lowered, "loop: ")
        if errors:
            name, e = next(iter(errors.items()))
            self.row(W12_LOOP, error=f"compile {name}: {type(e).__name__}: {str(e)[:500]}")
            return
        try:
            self.measure_loop("bf16 loop (w12 job)", compiled["bf16"][0], w, dtype, compiled["bf16"][1])
            base = self.res["rows"].pop("bf16 loop (w12 job)")
            self.res["bf16_loop"] = base
            for name in (n for n, *_ in forms[1:]):
                self.measure_loop(name, compiled[name][0], w12w, dtype, compiled[name][1])
                row = self.res["rows"][name]
                self.row(name, bf16_ms=base["ms"], bf16_tokens=base["tokens"], ratio_vs_bf16=row["ms"] / base["ms"],
                         tokens_equal_bf16=row["tokens"] == base["tokens"])
        except Exception as e:
            self.fail(W12_LOOP, e)


def random_tree(n: int, rng):
    """Ancestor-or-self mask [n, n] and depths of a random tree (node 0 the root, parents before children)."""
    import numpy as np

    parent = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
    anc = np.eye(n, dtype=bool)
    for i in range(1, n):
        anc[i] |= anc[parent[i]]
    return anc, anc.sum(1) - 1


def fresh(fn):
    """A new function object that calls ``fn``, for each form of one program that differs from another only in a
    module setting read at trace time (``w12.ops.DEFAULT``, ``swiglu_matmul.ops.W12_FUSED``). JAX caches a trace by
    the function traced and its arguments' types, whatever jit wrapper traces it: lowering the same ``fn`` again after
    changing the setting hands back the first form's program. That made the forty-third session's W12 SwiGLU A/B time
    the two-step loop twice (docs/results/2026-12-06-w12-swiglu-plain-h100/)."""
    return functools.wraps(fn)(lambda *args: fn(*args))


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def apply_kernel_settings(spec: dict) -> dict:
    """The job spec's kernel choices set on the modules that read them at trace time (the skinny and norm kernels'
    defaults, split tables, PDL, the W12 kernel's default config); returns them for the job's result."""
    from pallas_kernels import choices

    res = {}
    choices.use(matmul=spec.get("matmul"), norm=spec.get("norm"), rope=spec.get("rope"), swiglu=spec.get("swiglu"),
                swiglu_matmul=spec.get("swiglu_matmul"), qkv_rope_matmul=spec.get("qkv_rope_matmul"),
                pdl=spec.get("pdl") or None)
    for item in spec.get("skinny_max_tokens") or []:  # "ROWS" or "KxN=ROWS"
        from pallas_kernels.skinny_matmul import ops as skinny_ops

        shape, _, rows = item.rpartition("=")
        if shape:
            skinny_ops.MAX_TOKENS_BY_SHAPE[tuple(map(int, shape.split("x")))] = int(rows)
        else:
            skinny_ops.MAX_TOKENS = int(rows)
    if spec.get("skinny_config"):
        import dataclasses as dc

        from pallas_kernels.skinny_matmul import mosaic_gpu as skinny_mosaic_gpu

        skinny_mosaic_gpu.DEFAULT_CONFIG = dc.replace(skinny_mosaic_gpu.DEFAULT_CONFIG, **spec["skinny_config"])
    res["skinny_config"] = dict(spec.get("skinny_config") or {})
    if spec.get("swiglu_matmul_config"):
        from pallas_kernels.swiglu_matmul import mosaic_gpu as swiglu_matmul_mosaic_gpu

        tile_k, steps = spec["swiglu_matmul_config"]
        swiglu_matmul_mosaic_gpu.DEFAULT_CONFIG = swiglu_matmul_mosaic_gpu.TuningConfig(
            tile_k=tile_k, max_concurrent_steps=steps)
    if spec.get("qkv_rope_matmul_config"):
        from pallas_kernels.qkv_rope_matmul import mosaic_gpu as qkv_rope_mosaic_gpu

        tile_k, steps, splits = spec["qkv_rope_matmul_config"]
        qkv_rope_mosaic_gpu.DEFAULT_CONFIG = qkv_rope_mosaic_gpu.TuningConfig(
            tile_k=tile_k, max_concurrent_steps=steps, splits=splits)
    if spec.get("combine_kernel"):
        from pallas_kernels.tree_attention import mosaic_gpu as ta_mosaic_gpu

        ta_mosaic_gpu.COMBINE_KERNEL = True
    if spec.get("skinny_splits"):
        from pallas_kernels.skinny_matmul import mosaic_gpu as skinny_mosaic_gpu

        skinny_mosaic_gpu.SPLIT_K_BY_SHAPE.update(
            {tuple(map(int, shape.split("x"))): split for shape, split in spec["skinny_splits"].items()})
    res["skinny_splits"] = spec.get("skinny_splits") or {}
    if spec.get("w12_config"):
        import dataclasses as dc

        from pallas_kernels.w12 import mosaic_gpu as w12_mosaic_gpu

        w12_mosaic_gpu.DEFAULT_CONFIG = dc.replace(w12_mosaic_gpu.DEFAULT_CONFIG, **spec["w12_config"])
    res["w12_config"] = dict(spec.get("w12_config") or {})
    if spec.get("pass_splits") is False:
        from pallas_kernels.skinny_matmul import ops as skinny_ops

        skinny_ops.PASS_SPLITS = False
    res["pass_splits"] = spec.get("pass_splits", True)
    res["matmul"] = spec.get("matmul") or "default"
    res["skinny_max_tokens"] = spec.get("skinny_max_tokens") or []
    res["norm"] = spec.get("norm") or "default"
    res["rope"] = spec.get("rope") or "default"
    res["swiglu"] = spec.get("swiglu") or "default"
    res["swiglu_matmul"] = spec.get("swiglu_matmul") or "default"
    res["swiglu_matmul_config"] = spec.get("swiglu_matmul_config")
    res["qkv_rope_matmul"] = spec.get("qkv_rope_matmul") or "default"
    res["qkv_rope_matmul_config"] = spec.get("qkv_rope_matmul_config")
    res["combine_kernel"] = bool(spec.get("combine_kernel"))
    res["pdl"] = bool(spec.get("pdl"))
    return res


def worker_main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    try:
        worker = Worker(spec)
    except Exception as e:
        write_json(Path(spec["result"]), {"job": spec["job"], "rows": {}, "error": f"{type(e).__name__}: {e}"})
        raise
    worker.res.update(apply_kernel_settings(spec))
    try:
        if spec.get("calibrate"):
            from specpilot.costmodel.hardware import load_or_calibrate

            t0 = time.perf_counter()
            hw = load_or_calibrate()
            worker.res["hw"] = hw.to_json()
            log(f"calibration: read {hw.hbm_bytes_per_s / 1e12:.3f} TB/s ({time.perf_counter() - t0:.1f}s)")
            worker.save()
        if spec["job"] == "w12":
            worker.w12_job()
        else:
            worker.xla_job()
    except Exception as e:
        worker.res["error"] = f"{type(e).__name__}: {str(e)[:500]}"
        worker.save()
        raise
    return 0


# =============================================================================================================
# The harness
# =============================================================================================================

@dataclasses.dataclass
class Job:
    name: str
    kind: str  # "jax" | "torch"
    rows: list[str]  # the rows it produces
    timeout: float
    spec: dict
    env: dict = dataclasses.field(default_factory=dict)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--out", help="output folder (default outputs/roofline/<date>_<time>)")
    ap.add_argument("--quick", action="store_true", help="tiny shapes, float32, few steps: a CPU smoke run")
    ap.add_argument("--model", default=None, type=model_name,
                    help="conf/model/<name>.yaml (default qwen3_8b; --quick: tiny)")
    ap.add_argument("--dtype", default=None, choices=("bfloat16", "float32"),
                    help="default bfloat16; --quick: float32")
    ap.add_argument("--context", type=positive_int, default=None, help="committed tokens (default 1024; --quick: 32)")
    ap.add_argument("--variants", nargs="+", default=None,
                    help="subset of: " + ", ".join([*XLA_JOB, *SKINNY_VARIANTS, *FUSED_NORM_VARIANTS, *SKINNY_FLAG_VARIANTS,
                                                    *W12_JOB, "xla_flags",
                                                    *XLA_FLAG_VARIANTS,
                                                    "torch_peer",
                                                    *TORCH_MODES]))
    ap.add_argument("--xla-flags", action="append", default=[], metavar="NAME=FLAGS",
                    help="an extra xla_flags variant: the decode loop under XLA_FLAGS=FLAGS (repeatable)")
    ap.add_argument("--nodes", nargs="+", type=positive_int, default=None,
                    help="verify_nodes tree sizes (default 16 64 256)")
    ap.add_argument("--verify-attention", default="xla", choices=("xla", "cudnn", "pallas_tree"))
    ap.add_argument("--ar-attention", default="xla", choices=("xla", "cudnn", "pallas_tree"),
                    help="attention of the JAX AR rows (forward, decode loops, W12 job): pallas_tree runs the "
                         "tree-attention kernel at one node, and the K/V writes after the last layer")
    ap.add_argument("--matmul", choices=("xla", "mosaic_gpu"), default=None,
                    help="bf16 linear layers in every JAX job: XLA's dot or the skinny_matmul kernel (sets "
                         "skinny_matmul.ops.DEFAULT; default: leave it as it is)")
    ap.add_argument("--skinny-max-tokens", nargs="+", default=[], metavar="ROWS|KxN=ROWS",
                    help="the most token rows a bf16 linear runs on the skinny kernel with --matmul mosaic_gpu: ROWS "
                         "for every weight (skinny_matmul.ops.MAX_TOKENS), KxN=ROWS for one weight shape "
                         "(ops.MAX_TOKENS_BY_SHAPE); default: leave them as they are")
    ap.add_argument("--skinny-config", default="", metavar="FIELD=VALUE,...",
                    help="skinny_matmul.TuningConfig fields set on its mosaic_gpu.DEFAULT_CONFIG in every JAX job, e.g. "
                         "tile_k=256,max_concurrent_steps=3,blocks_per_sm=1")
    ap.add_argument("--norm", choices=("xla", "mosaic_gpu"), default=None,
                    help="every residual add + RMSNorm of the target in every JAX job: XLA's or the add_rms_norm "
                         "kernel (sets add_rms_norm.ops.DEFAULT; default: leave it as it is)")
    ap.add_argument("--rope", choices=("xla", "mosaic_gpu"), default=None,
                    help="the q/k norm + rope after every q|k|v projection in every JAX job: XLA's or the "
                         "qk_norm_rope kernel (sets qk_norm_rope.ops.DEFAULT; default: leave it as it is)")
    ap.add_argument("--swiglu", choices=("xla", "mosaic_gpu"), default=None,
                    help="the MLP's SwiGLU in every JAX job: XLA's fusion or the swiglu kernel (sets "
                         "swiglu.ops.DEFAULT; default: leave it as it is)")
    ap.add_argument("--swiglu-matmul", choices=("xla", "mosaic_gpu"), default=None,
                    help="the gate|up projection with SwiGLU in its epilogue in every JAX job (mosaic_gpu: one kernel "
                         "for few rows; sets swiglu_matmul.ops.DEFAULT; default: leave it as it is)")
    ap.add_argument("--swiglu-matmul-config", type=positive_int, nargs=2, default=None, metavar=("TILE_K", "STEPS"),
                    help="that kernel's tile_k and max_concurrent_steps (swiglu_matmul.mosaic_gpu.DEFAULT_CONFIG)")
    ap.add_argument("--qkv-rope-matmul", choices=("xla", "mosaic_gpu"), default=None,
                    help="the q|k|v projection with the q/k norm + rope in its epilogue in every JAX job (mosaic_gpu: "
                         "one kernel for up to 8 rows; sets qkv_rope_matmul.ops.DEFAULT; default: leave it as it is)")
    ap.add_argument("--qkv-rope-matmul-config", type=positive_int, nargs=3, default=None,
                    metavar=("TILE_K", "STEPS", "SPLITS"),
                    help="that kernel's tile_k, max_concurrent_steps and K splits (qkv_rope_matmul.mosaic_gpu."
                         "DEFAULT_CONFIG)")
    ap.add_argument("--combine-kernel", action="store_true",
                    help="the tree-attention kernel's split merge on its Mosaic GPU kernel in every JAX job (sets "
                         "tree_attention.mosaic_gpu.COMBINE_KERNEL)")
    ap.add_argument("--skinny-splits", nargs="+", default=[], metavar="KxN=S|FILE",
                    help="the split_decode_loop row's K split per weight shape: KxN=S items or a JSON file of "
                         "{\"KxN\": S} (scripts/h200/split_probe.py --json)")
    ap.add_argument("--pdl", action="store_true",
                    help="every Mosaic GPU kernel in every JAX job launched with PDL (sets pallas_kernels.pdl.ENABLED)")
    ap.add_argument("--w12-xla-flags", default="", metavar="FLAGS",
                    help="XLA_FLAGS added for the W12 job's process (its bf16 baselines run under them too), e.g. "
                         "command buffers for w12_kernel_decode_loop")
    ap.add_argument("--w12-swiglu-ab", action="store_true",
                    help="w12_kernel_decode_loop with the fused W12 gate|up + SwiGLU kernel "
                         "(swiglu_matmul.ops.W12_FUSED; with --swiglu-matmul mosaic_gpu) and also with the two "
                         f"kernels (row {W12_TWO_STEP_SWIGLU!r}), in one process")
    ap.add_argument("--kernel-split", action="store_true",
                    help="after timing, one more call of each forward / verify / drafter pass under CUPTI: GPU time "
                         "per kernel name")
    ap.add_argument("--iters", type=positive_int, default=None, help="timed steps per variant (default 100)")
    ap.add_argument("--loop-steps", type=positive_int, default=None, help="steps per decode loop (default 64)")
    ap.add_argument("--torch-python", default=sys.executable, help="interpreter with torch for the peer")
    ap.add_argument("--torch-weights", choices=("auto", "export", "random"), default="auto",
                    help="the peer's weights: the JAX pytree exported via numpy (same greedy tokens expected), or "
                         "its own random ones (auto: export with --quick, random otherwise: 16 GB not worth writing)")
    ap.add_argument("--torch-sdpa-gqa", choices=("repeat", "native"), default="repeat",
                    help="the peer's GQA attention: repeat_interleave + SDPA (gpt-fast) or SDPA's enable_gqa")
    ap.add_argument("--torch-coordinate-descent", action="store_true",
                    help="inductor's coordinate_descent_tuning for the compiled peer modes (gpt-fast's setting; "
                         "longer compiles)")
    ap.add_argument("--torch-compile-backend", default=None,
                    help="torch.compile backend instead of the mode (e.g. aot_eager for a fast CPU check)")
    ap.add_argument("--pack-workers", type=positive_int, default=None,
                    help="W12 packing processes (default: half the cores)")
    ap.add_argument("--w12-config", default="", metavar="FIELD=VALUE,...",
                    help="w12.TuningConfig fields set on the W12 job's mosaic_gpu.DEFAULT_CONFIG, e.g. "
                         "overlap_decode=True,max_concurrent_steps=3 (escapes_in_kernel=False: the escape "
                         "lists' correction in XLA, as before 2026-12-04)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="no job runs past this many seconds (default 500; quick 300)")
    ap.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every job's timeout")
    ap.add_argument("--isolate", action="store_true", help="one process per JAX variant (slower: more compiles)")
    ap.add_argument("--worker", metavar="SPEC", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for item in args.skinny_max_tokens:
        if not re.fullmatch(r"(\d+x\d+=)?\d+", item):
            ap.error(f"--skinny-max-tokens: {item!r} is neither ROWS nor KxN=ROWS (e.g. 32 or 4096x4096=32)")
    try:
        args.w12_config = w12_config_fields(args.w12_config)
    except ValueError as e:
        ap.error(f"--w12-config: {e}")
    try:
        args.skinny_config = skinny_config_fields(args.skinny_config)
    except ValueError as e:
        ap.error(f"--skinny-config: {e}")
    if args.swiglu_matmul_config:
        tile_k, steps = args.swiglu_matmul_config
        if tile_k <= 0 or tile_k % 64 or steps < 1:
            ap.error(f"--swiglu-matmul-config: TILE_K must be a positive multiple of 64 and STEPS >= 1, got "
                     f"{tile_k} {steps}")
    if args.qkv_rope_matmul_config:
        tile_k, steps, splits = args.qkv_rope_matmul_config
        if tile_k % 64 or splits > 8:
            ap.error(f"--qkv-rope-matmul-config: TILE_K must be a multiple of 64 and SPLITS at most 8, got "
                     f"{tile_k} {steps} {splits}")
    return args


def w12_config_fields(text: str) -> dict:
    """``--w12-config``'s fields (``config_fields.parse_fields``), checked by building the config on the kernel's
    default (its own one-line ValueErrors)."""
    import dataclasses

    from pallas_kernels.config_fields import parse_fields
    from pallas_kernels.w12 import mosaic_gpu as w12_mosaic_gpu

    fields = parse_fields(text, type(w12_mosaic_gpu.DEFAULT_CONFIG))
    dataclasses.replace(w12_mosaic_gpu.DEFAULT_CONFIG, **fields)
    return fields


def skinny_config_fields(text: str) -> dict:
    """``--skinny-config``'s fields, checked by building the config on the skinny kernel's default."""
    import dataclasses

    from pallas_kernels.config_fields import parse_fields
    from pallas_kernels.skinny_matmul import mosaic_gpu as skinny_mosaic_gpu

    fields = parse_fields(text, type(skinny_mosaic_gpu.DEFAULT_CONFIG))
    dataclasses.replace(skinny_mosaic_gpu.DEFAULT_CONFIG, **fields)
    return fields


def settings(args) -> dict:
    q = args.quick
    s = {
        "model": args.model or ("tiny" if q else "qwen3_8b"),
        "dtype": args.dtype or ("float32" if q else "bfloat16"),
        "context": args.context or (32 if q else 1024),
        "batch": 1,
        "check_steps": 6 if q else 8,
        "warmup": 2 if q else 10,
        "iters": args.iters or (5 if q else 100),
        "verify_iters": 3 if q else 30,
        "loop_steps": args.loop_steps or (8 if q else 64),
        "loop_reps": 3 if q else 7,
        "nodes": args.nodes or ([4, 8] if q else [16, 64, 256]),
        "verify_attention": args.verify_attention,
        "ar_attention": args.ar_attention,
        "kernel_split": args.kernel_split,
        "w12_swiglu_ab": args.w12_swiglu_ab,
        "matmul": args.matmul,
        "skinny_max_tokens": args.skinny_max_tokens,
        "skinny_config": args.skinny_config,
        "norm": args.norm,
        "rope": args.rope,
        "swiglu": args.swiglu,
        "swiglu_matmul": args.swiglu_matmul,
        "swiglu_matmul_config": args.swiglu_matmul_config,
        "qkv_rope_matmul": args.qkv_rope_matmul,
        "qkv_rope_matmul_config": args.qkv_rope_matmul_config,
        "combine_kernel": args.combine_kernel,
        "pdl": args.pdl,
        "drafter_layers": 1 if q else 5,
        "block_size": 4 if q else 16,
        "seed": 0,
        "start_token": 1,
    }
    s["capacity_ar"] = round_up(s["context"] + s["check_steps"] + 1, 128)
    return s


def selected_variants(args) -> list[str]:
    known = [*XLA_JOB, *SKINNY_VARIANTS, *FUSED_NORM_VARIANTS, *SKINNY_FLAG_VARIANTS, *W12_JOB, *XLA_FLAG_VARIANTS,
             *TORCH_MODES]
    extra = [kv.split("=", 1)[0] for kv in args.xla_flags]
    if args.variants is None:
        return known + extra
    out = []
    for v in args.variants:
        group = {"xla_flags": list(XLA_FLAG_VARIANTS) + extra, "torch_peer": list(TORCH_MODES)}.get(v, [v])
        for g in group:
            if g not in known + extra:
                raise SystemExit(f"bench_roofline.py: unknown variant {g!r} (known: {', '.join(known + extra)})")
            if g not in out:
                out.append(g)
    return out


def parse_skinny_splits(items: list[str]) -> dict[str, int]:
    """``--skinny-splits`` items (``KxN=S``, or a JSON file of ``{"KxN": S}``) as one ``{"KxN": S}`` table."""
    table = {}
    for item in items:
        if "=" in item:
            shape, split = item.split("=", 1)
            pairs = {shape: split}
        else:
            path = Path(item)
            if not path.is_file():
                raise SystemExit(f"bench_roofline.py: --skinny-splits: {item!r} is neither KxN=S nor a file")
            pairs = json.loads(path.read_text())
        for shape, split in pairs.items():
            dims = shape.split("x")
            if len(dims) != 2 or not all(d.isdigit() for d in dims) or not str(split).isdigit() or int(split) < 1:
                raise SystemExit(f"bench_roofline.py: --skinny-splits: bad entry {shape}={split} (want KxN=S, S >= 1)")
            table[shape] = int(split)
    return table


def peer_model(name: str) -> dict:
    """The target's shapes as the torch peer reads them."""
    from specpilot.costmodel.measure import model_config

    c = model_config(name)
    return {"vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_layers": c.num_layers, "num_heads": c.num_heads, "num_kv_heads": c.num_kv_heads,
            "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope.theta,
            "rope_kind": c.rope.kind, "qk_norm": c.qk_norm}


def plan_jobs(args, s: dict, run: Path, chosen: list[str]) -> tuple[list[Job], Job | None]:
    """(the foreground jobs in order, the background W12 job or None)."""
    scale = args.timeout_scale * (0.5 if args.quick else 1.0)
    t = {k: v * scale for k, v in DEFAULT_TIMEOUTS.items()}
    flags = {**XLA_FLAG_VARIANTS, **dict(kv.split("=", 1) for kv in args.xla_flags)}
    torch_export = (args.torch_weights == "export" or (args.torch_weights == "auto" and args.quick)) and \
        any(v in chosen for v in TORCH_MODES) and any(v in chosen for v in XLA_JOB)
    # outside --out: at Qwen3-8B shapes it is 16 GB, and --out comes back from the GPU machine
    export_dir = Path(tempfile.mkdtemp(prefix="roofline-weights-")) if torch_export else None
    base = dict(s)

    def jax_job(name, variants, timeout, rows, env=None, **extra):
        spec = {**base, **extra, "job": "xla", "variants": variants, "result": str(run / "jobs" / f"{name}.json")}
        return Job(name, "jax", rows, timeout, spec, env or {})

    def rows_of(v):
        if v in ("verify_nodes", "verify_loop"):
            return [f"{v}@{n}" for n in s["nodes"]]
        return list(DRAFTER_ROWS) if v == "drafter" else [v]

    jobs = []
    xla = [v for v in XLA_JOB if v in chosen]
    if xla:
        if args.isolate:
            jobs += [jax_job(v, [v], t["xla"], rows_of(v)) for v in xla]
        else:
            jobs.append(jax_job("xla", xla, t["xla"], [r for v in xla for r in rows_of(v)],
                                export=str(export_dir) if export_dir else None))
        if export_dir and args.isolate:
            jobs[0].spec["export"] = str(export_dir)

    def torch_job(name):
        if name not in chosen:
            return
        mode = TORCH_MODES[name]
        spec = {"model": {**peer_model(s["model"]), "sdpa_gqa": args.torch_sdpa_gqa}, "dtype": s["dtype"],
                "context": s["context"], "capacity": s["capacity_ar"], "mode": mode, "check_steps": s["check_steps"],
                "warmup": s["warmup"], "iters": s["iters"], "seed": s["seed"], "start_token": s["start_token"],
                "weights": str(export_dir) if export_dir else None, "result": str(run / "jobs" / f"{name}.json")}
        if args.torch_compile_backend and mode != "eager":
            spec["compile_backend"] = args.torch_compile_backend
        if args.torch_coordinate_descent and mode != "eager":
            spec["coordinate_descent"] = True
        jobs.append(Job(name, "torch", [name], t[name], spec))

    def flag_job(name, f, **extra):  # the decode loop under extra XLA_FLAGS (the kernel's compile: twice the time)
        if name in chosen:
            jobs.append(jax_job(name, ["xla_decode_loop"], t["xla_flags"] * (2 if extra else 1), [name],
                                env={"XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " " + f).strip()},
                                loop_label=name, flags=f, **extra))

    # the order they run in: the budget cuts from the end (max-autotune compiles longest, tells least); the AR
    # comparison (XLA, the kernel, both under command buffers, PyTorch with CUDA graphs) comes first
    skinny = [v for v in SKINNY_VARIANTS if v in chosen]
    if skinny:
        labels = {("forward_label" if SKINNY_VARIANTS[v] == "xla_forward" else "loop_label"): v for v in skinny}
        jobs.append(jax_job("skinny", [SKINNY_VARIANTS[v] for v in skinny], t["xla"], skinny, matmul="mosaic_gpu",
                            **labels))
    if "fused_norm_decode_loop" in chosen:
        jobs.append(jax_job("fused_norm", ["xla_decode_loop"], t["xla"], ["fused_norm_decode_loop"],
                            matmul="mosaic_gpu", norm="mosaic_gpu", loop_label="fused_norm_decode_loop"))
    if "split_decode_loop" in chosen:
        jobs.append(jax_job("split", ["xla_decode_loop"], t["xla"], ["split_decode_loop"], matmul="mosaic_gpu",
                            norm="mosaic_gpu", loop_label="split_decode_loop",
                            skinny_splits=parse_skinny_splits(args.skinny_splits)))
    if "summed_splits_decode_loop" in chosen:
        jobs.append(jax_job("summed_splits", ["xla_decode_loop"], t["xla"], ["summed_splits_decode_loop"],
                            matmul="mosaic_gpu", norm="mosaic_gpu", pass_splits=False,
                            loop_label="summed_splits_decode_loop"))
    rope_kernels = dict(matmul="mosaic_gpu", norm="mosaic_gpu", rope="mosaic_gpu")
    chain_kernels = dict(rope_kernels, swiglu="mosaic_gpu", combine_kernel=True)
    for name, kernels in (("fast", dict(FAST_KERNELS, ar_attention="pallas_tree")), ("rope", rope_kernels),
                          ("pdl_chain", dict(chain_kernels, pdl=True)), ("pdl_rope", dict(rope_kernels, pdl=True)),
                          ("chain", chain_kernels)):
        if f"{name}_decode_loop" in chosen:
            jobs.append(jax_job(name, ["xla_decode_loop"], t["xla"], [f"{name}_decode_loop"],
                                loop_label=f"{name}_decode_loop", **kernels))
    if "pdl_decode_loop" in chosen:
        jobs.append(jax_job("pdl", ["xla_decode_loop"], t["xla"], ["pdl_decode_loop"], matmul="mosaic_gpu",
                            norm="mosaic_gpu", pdl=True, loop_label="pdl_decode_loop"))
    for name, of in SKINNY_FLAG_VARIANTS.items():
        flag_job(name, XLA_FLAG_VARIANTS[of], matmul="mosaic_gpu")
    torch_job("torch_peer_cudagraphs")
    torch_job("torch_peer_eager")
    for name, f in flags.items():
        flag_job(name, f)
    torch_job("torch_peer_compile")
    first_jax = next((j for j in jobs if j.kind == "jax"), None)
    if first_jax:  # measures the read bandwidth (a few seconds, cached per device kind) before its weights exist
        first_jax.spec["calibrate"] = True
    w12 = None
    w12_rows = [v for v in W12_JOB if v in chosen]
    if args.w12_swiglu_ab and W12_LOOP in chosen:
        w12_rows.append(W12_TWO_STEP_SWIGLU)
    if w12_rows:
        spec = {**base, "job": "w12", "variants": w12_rows, "status_dir": str(run),
                "w12_config": args.w12_config,
                "result": str(run / "jobs" / "w12.json"),
                "pack_workers": args.pack_workers or max(1, (os.cpu_count() or 2) // 2),
                "go_timeout_s": (args.budget_s or 600) + 60}
        w12_flags = (os.environ.get("XLA_FLAGS", "") + " " + args.w12_xla_flags).strip()
        env = {"XLA_FLAGS": w12_flags} if args.w12_xla_flags else {}
        w12 = Job("w12", "jax", w12_rows, t["w12"], spec, env)
        if not any(j.kind == "jax" for j in jobs):
            spec["calibrate"] = True
    return jobs, w12


class Runner:
    """Runs the jobs one at a time on the GPU (the W12 job packs in the background meanwhile)."""

    def __init__(self, args, out: Path, budget_s: float):
        self.args, self.out, self.budget = args, out, budget_s
        self.t0 = time.perf_counter()
        self.records: list[dict] = []
        self.active: list[subprocess.Popen] = []  # ended (by process group) if the harness is stopped
        (out / "logs").mkdir(parents=True, exist_ok=True)
        (out / "jobs").mkdir(parents=True, exist_ok=True)

    def remaining(self) -> float:
        return self.budget - (time.perf_counter() - self.t0)

    def command(self, job: Job) -> list[str]:
        spec_path = self.out / "jobs" / f"{job.name}.spec.json"
        write_json(spec_path, job.spec)
        if job.kind == "torch":
            return [self.args.torch_python, str(REPO / "scripts" / "peer_torch_decode.py"), "--spec", str(spec_path),
                    "--out", job.spec["result"]]
        return [sys.executable, str(Path(__file__).resolve()), "--worker", str(spec_path)]

    def env(self, job: Job, mem_fraction: str | None) -> dict:
        env = {**os.environ, **job.env, "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        if job.kind == "jax" and mem_fraction and "XLA_PYTHON_CLIENT_MEM_FRACTION" not in os.environ:
            env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = mem_fraction
        return env

    def run(self, job: Job, mem_fraction: str | None) -> dict:
        """One foreground job with its timeout (clipped to the budget); the record of how it ended."""
        timeout = min(job.timeout, max(self.remaining(), 1.0))
        logf = self.out / "logs" / f"{job.name}.log"
        log(f"[{time.perf_counter() - self.t0:6.1f}s] {job.name} (timeout {timeout:.0f}s) ...")
        t0 = time.perf_counter()
        rec = {"job": job.name, "status": "running", "timeout_s": timeout, "log": str(logf.relative_to(self.out))}
        self.records.append(rec)
        with open(logf, "w") as f:
            try:
                proc = subprocess.Popen(self.command(job), stdout=f, stderr=subprocess.STDOUT,
                                        env=self.env(job, mem_fraction), cwd=REPO, start_new_session=True)
            except OSError as e:  # e.g. a --torch-python that does not exist
                proc, status = None, f"could not start: {e}"
            if proc is not None:
                self.active.append(proc)
                try:
                    rc = proc.wait(timeout=timeout)
                    status = "ok" if rc == 0 else f"exit {rc}"
                except subprocess.TimeoutExpired:
                    kill(proc)
                    status = f"timeout after {timeout:.0f}s"
                finally:
                    self.active.remove(proc)
        rec.update(status=status, wall_s=time.perf_counter() - t0)
        if status != "ok":  # how far it got, in the report itself: the logs folder may stay on the machine
            rec["log_tail"] = log_tail(logf)
        log(f"[{time.perf_counter() - self.t0:6.1f}s] {job.name}: {status} in {rec['wall_s']:.1f}s")
        return rec


LOG_TAIL_LINES = 8


def log_tail(path: Path, lines: int = LOG_TAIL_LINES, width: int = 240) -> list[str]:
    """The last ``lines`` non-empty lines of a job's log, each cut to ``width`` characters ([] if there is none)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [line[:width] for line in text.splitlines() if line.strip()][-lines:]


def gpu_memory_mib() -> float | None:
    """The first GPU's memory in MiB from nvidia-smi (the harness itself never starts JAX on the GPU); None without
    one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        return float(out.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def memory_fractions(total_mib: float | None) -> tuple[str, str]:
    """XLA_PYTHON_CLIENT_MEM_FRACTION for (the foreground JAX jobs, the background W12 job). The W12 job holds the
    bf16 weights and their W12 copy (16.4 + 12.3 GB for Qwen3-8B) plus its loops' buffers: 0.30 of an H200's 141 GB,
    but on an 80 GB H100 0.30 ran out of memory putting the W12 copy on the device (2026-12-05,
    docs/results/2026-12-05-w12-split-rule-h100/), so there 0.45 (36 GB) and 0.50 for the foreground (its jobs hold
    one bf16 copy: 16.4 GB and their caches). Unknown memory: the H200's."""
    if total_mib is not None and total_mib < 100 * 1024:
        return "0.50", "0.45"
    return "0.60", "0.30"


def kill(proc: subprocess.Popen) -> None:
    """End a job and the processes it started (its own session), by its process group id."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


class W12Background:
    """The W12 job: started first, it builds the weights on the GPU, copies the linears to the host and signals
    `w12.packing`; it packs them on the CPU while the harness runs the other jobs, signals `w12.ready`, and
    waits for `w12.go` to take the GPU for compiling and timing."""

    def __init__(self, runner: Runner, job: Job):
        self.r, self.job = runner, job
        self.dir = Path(job.spec["status_dir"])
        self.proc = None
        self.done = False
        self.rec = {"job": "w12", "status": "not started", "log": "logs/w12.log"}
        runner.records.append(self.rec)

    def start(self, mem_fraction: str | None, wait_s: float) -> None:
        log(f"[{time.perf_counter() - self.r.t0:6.1f}s] w12: starting (weights to the host, then packing them)")
        self.t_start = time.perf_counter()
        self.logf = open(self.r.out / "logs" / "w12.log", "w")  # noqa: SIM115 (closed by finish_record)
        self.proc = subprocess.Popen(self.r.command(self.job), stdout=self.logf, stderr=subprocess.STDOUT,
                                     env=self.r.env(self.job, mem_fraction), cwd=REPO, start_new_session=True)
        self.r.active.append(self.proc)
        self.rec["status"] = "packing"
        deadline = time.perf_counter() + wait_s
        while time.perf_counter() < deadline and self.proc.poll() is None:
            if (self.dir / "w12.packing").exists():
                break
            time.sleep(0.2)
        if self.proc.poll() is not None:
            self.finish_record(f"exit {self.proc.returncode} before packing")
        elif not (self.dir / "w12.packing").exists():
            kill(self.proc)
            self.finish_record(f"timeout: weights not on the host after {wait_s:.0f}s")
        else:
            log(f"[{time.perf_counter() - self.r.t0:6.1f}s] w12: packing in the background")

    def finish_record(self, status: str) -> None:
        self.done = True
        if self.proc in self.r.active:
            self.r.active.remove(self.proc)
        self.rec.update(status=status, wall_s=time.perf_counter() - self.t_start)
        self.logf.close()
        if status != "ok":
            self.rec["log_tail"] = log_tail(self.r.out / self.rec["log"])
        log(f"[{time.perf_counter() - self.r.t0:6.1f}s] w12: {status}")

    def maybe_run(self, wait: bool = False) -> None:
        """Give the W12 job the GPU if it is packed (or, with `wait`, once it is, within the budget)."""
        if self.done or self.proc is None:
            return
        while wait and not (self.dir / "w12.ready").exists() and self.proc.poll() is None and self.r.remaining() > 20:
            time.sleep(0.5)
        if self.proc.poll() is not None:
            return self.finish_record(f"exit {self.proc.returncode} while packing")
        if not (self.dir / "w12.ready").exists():
            if wait:
                kill(self.proc)
                self.finish_record("budget spent before the weights were packed")
            return
        timeout = min(self.job.timeout, max(self.r.remaining(), 1.0))
        log(f"[{time.perf_counter() - self.r.t0:6.1f}s] w12: packed; GPU phase (timeout {timeout:.0f}s) ...")
        (self.dir / "w12.go").touch()
        try:
            rc = self.proc.wait(timeout=timeout)
            self.finish_record("ok" if rc == 0 else f"exit {rc}")
        except subprocess.TimeoutExpired:
            kill(self.proc)
            self.finish_record(f"timeout after {timeout:.0f}s of GPU phase")


# ---- the report -------------------------------------------------------------------------------------------

def roofline_costs(s: dict) -> dict:
    """{row: Cost} from the shapes alone."""
    from specpilot.costmodel import counts
    from specpilot.costmodel.measure import model_config
    from specpilot.models.config import synthetic_drafter_config

    cfg = model_config(s["model"])
    act = 4 if s["dtype"] == "float32" else 2
    ar = counts.target_pass(cfg, 1, 1, s["context"], "bf16", act)
    costs = {v: ar for v in ("xla_forward", "xla_decode_loop", *SKINNY_VARIANTS, *FUSED_NORM_VARIANTS,
                             *SKINNY_FLAG_VARIANTS, *TORCH_MODES)}
    costs.update({v: counts.target_pass(cfg, 1, 1, s["context"], "w12", 2) for v in W12_ROWS})
    costs.update({f"{v}@{t}": counts.target_pass(cfg, 1, t, s["context"], "bf16", act) for t in s["nodes"]
                  for v in ("verify_nodes", "verify_loop")})
    dcfg = synthetic_drafter_config(cfg, s["drafter_layers"], s["block_size"])
    draft = counts.draft_pass(dcfg, cfg, 1, s["block_size"], s["context"], "bf16", act)
    costs.update(dict.fromkeys(DRAFTER_ROWS, draft))
    costs.update(dict.fromkeys(DRAFTER_ROUND, draft + counts.context_ingest(dcfg, cfg, 1, s["block_size"], "bf16",
                                                                            act)))
    return costs


def build_report(s: dict, results: dict, records: list, order: list[str], args, t_total: float) -> dict:
    from specpilot.provenance import git_commit

    hw = next((r["hw"] for r in results.values() if r.get("hw")), None)
    bw = hw["hbm_bytes_per_s"] if hw else None
    costs = roofline_costs(s)
    job_of = {}
    for rec in records:
        for name in rec.get("rows", []):
            job_of[name] = rec
    rows = []
    ref_tokens = (results.get("xla_forward") or {}).get("tokens")
    for name in order:
        r = dict(results.get(name) or {})
        c = costs.get(name) or costs.get("xla_decode_loop")
        need = c.weights + c.lm_head + c.kv_read
        row = {"variant": name, "what": WHAT.get(name) or what_of(name, s), **r,
               "roofline": {"bytes": need, "bytes_all": c.bytes, "weights_bytes": c.weights + c.lm_head,
                            "kv_read_bytes": c.kv_read,
                            "ms_measured_bw": 1e3 * need / bw if bw else None,
                            "ms_nominal": 1e3 * need / NOMINAL_BYTES_PER_S}}
        if r.get("ms"):
            row["x_roofline_measured"] = r["ms"] / row["roofline"]["ms_measured_bw"] if bw else None
            row["x_roofline_nominal"] = r["ms"] / row["roofline"]["ms_nominal"]
            row["achieved_bytes_per_s"] = need / (r["ms"] * 1e-3)
        if not r.get("ms") and not r.get("error"):
            rec = job_of.get(name)
            row["error"] = (f"job {rec['job']}: {rec['status']} (see {rec.get('log')})" if rec
                            else "not run")
        # which greedy tokens this row must reproduce
        if name in W12_ROWS:
            ref, ref_name = r.get("bf16_tokens"), "bf16 forward, same process"
        elif name in DRAFTER_ROWS:
            ref_name = DRAFTER_REFERENCE.get(name)
            ref = (results.get(ref_name) or {}).get("tokens")
        elif name.startswith("torch_peer") and "exported" not in str(r.get("weights", "")):
            ref, ref_name = None, "n/a: random torch weights"
        else:
            ref, ref_name = ref_tokens, "xla_forward"
        if r.get("tokens") is not None and name != "xla_forward" and ref_name is not None:
            row["tokens_ref"] = ref_name
            row["tokens_match"] = (r["tokens"] == ref) if ref is not None else None
            if name in DRAFTER_ROWS and row["tokens_match"] is False:
                row["draft_gaps"] = draft_gaps(r, results.get(ref_name) or {})
        rows.append(row)
    by = {r["variant"]: r for r in rows}
    ar_ms = (by.get("xla_forward") or {}).get("ms")
    targets = []
    for name in W12_JOB:
        r = by.get(name) or {}
        if r.get("ratio_vs_bf16") is not None:
            targets.append({"what": f"{name} / bf16 (same process)", "value": r["ratio_vs_bf16"], "target": "≤ 0.80",
                            "ok": r["ratio_vs_bf16"] <= 0.80 and bool(r.get("tokens_match"))})
    loop_ms = (by.get("xla_decode_loop") or {}).get("ms")
    for t in s["nodes"]:
        for v, base in (("verify_nodes", ar_ms), ("verify_loop", loop_ms)):
            r = by.get(f"{v}@{t}") or {}
            if r.get("ms") and base:
                r["ratio_vs_ar"] = r["ms"] / base
    for t, lim in ((64, 1.05), (256, 1.25)):
        for v, what in (("verify_nodes", f"verify {t} nodes / AR step"),
                        ("verify_loop", f"verify {t} nodes / AR step, both in a loop (verify_loop / xla_decode_loop)")):
            r = by.get(f"{v}@{t}") or {}
            if r.get("ratio_vs_ar") is not None:
                targets.append({"what": what, "value": r["ratio_vs_ar"], "target": f"≤ {lim}",
                                "ok": r["ratio_vs_ar"] <= lim})
    for name in ("xla_forward", "xla_decode_loop", *SKINNY_VARIANTS, *FUSED_NORM_VARIANTS, *SKINNY_FLAG_VARIANTS):
        r = by.get(name) or {}
        if r.get("x_roofline_nominal"):
            fast = name == "fast_decode_loop"  # issue #8's AR row: <= 1.10x (4.2 ms at Qwen3-8B shapes)
            targets.append({"what": f"{name} / roofline at 4.3 TB/s", "value": r["x_roofline_nominal"],
                            "target": "≤ 1.10" if fast else "→ 1",
                            "ok": r["x_roofline_nominal"] <= 1.10 if fast else None})
    for name in DRAFTER_ROWS:  # wall time of a host-synced call, and GPU time (the pass inside the fused round)
        r = by.get(name) or {}
        if r.get("x_roofline_nominal"):
            targets.append({"what": f"{name} / roofline at 4.3 TB/s", "value": r["x_roofline_nominal"],
                            "target": "≤ 1.2", "ok": r["x_roofline_nominal"] <= 1.2})
        if r.get("kernels_ms"):
            gpu = r["kernels_ms"] / r["roofline"]["ms_nominal"]
            targets.append({"what": f"{name} GPU time / roofline at 4.3 TB/s", "value": gpu, "target": "≤ 1.2",
                            "ok": gpu <= 1.2})
    device = next((r.get("device") for r in results.values() if r.get("device")), None)
    torch_v = next((r.get("torch") for r in results.values() if r.get("torch")), None)
    jax_v = next((r.get("jax") for r in results.values() if r.get("jax")), None)
    return {
        "provenance": {"date": time.strftime("%Y-%m-%d %H:%M"), "device": device, "jax": jax_v, "torch": torch_v,
                       "commit": git_commit(),
                       "command": " ".join(shlex.quote(a) for a in ["python", *sys.argv]),
                       "xla_flags": os.environ.get("XLA_FLAGS", ""), "hardware": hw, "wall_s": t_total},
        "settings": s,
        "nominal_bytes_per_s": NOMINAL_BYTES_PER_S,
        "rows": rows,
        "targets": targets,
        "jobs": records,
    }


def what_of(name: str, s: dict) -> str:
    if name in DRAFTER_ROUND:
        return (f"DFlash drafter's round ({ROUND_NEW} committed rows through fc, {s['drafter_layers']} layers, "
                f"{s['block_size']} rows, argmax) as {'one pass' if DRAFTER_ROUND[name] else 'ingest, then draft'}, "
                f"attention {DRAFTER_ROWS[name]}")
    if name in DRAFTER_ROWS:
        return (f"DFlash drafter pass ({s['drafter_layers']} layers, {s['block_size']} rows, argmax), "
                f"attention {DRAFTER_ROWS[name]}")
    if name.startswith("verify_nodes@"):
        return f"XLA forward, {name.split('@')[1]} tree tokens (verify)"
    if name.startswith("verify_loop@"):
        return f"XLA forward, {name.split('@')[1]} tree tokens (verify), N in one fori_loop"
    if name.startswith("xla_flags"):
        return "decode loop, XLA_FLAGS " + ({**XLA_FLAG_VARIANTS}.get(name) or "(custom)")
    return name


def draft_gaps(row: dict, ref: dict) -> str | None:
    """Where a drafter row's argmax differs from the reference row's: the positions and, there, each row's gap between
    its two largest logits. A difference where the reference's gap is a rounding step of bf16 logits is a near tie
    that another summation order breaks the other way, not a wrong attention."""
    if not (row.get("top2_logits") and ref.get("top2_logits")):
        return None
    diff = [i for i, (a, b) in enumerate(zip(row["tokens"], ref["tokens"])) if a != b]
    gaps = ", ".join(f"position {i}: gap {ref['top2_logits'][i][0] - ref['top2_logits'][i][1]:.4f} "
                     f"(this row {row['top2_logits'][i][0] - row['top2_logits'][i][1]:.4f})" for i in diff)
    return f"{len(diff)} of {len(row['tokens'])} drafts differ; the reference's top-2 logit gap at {gaps}"


def fmt(x, digits=3):
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "NO"
    if isinstance(x, float):
        return f"{x:.{digits}f}" if abs(x) >= 10 ** -digits or x == 0 else f"{x:.2g}"
    return str(x)


def kernel_choices(s: dict) -> list[str]:
    """The run's settings that make its `xla_*` rows other than plain XLA (`--matmul`, `--norm`, ... set every JAX
    job's ops, and `--ar-attention` its AR rows' attention), as `op=implementation`."""
    ops = [f"{op}={s[op]}" for op in OPS if s.get(op) not in (None, "default", "xla")]
    return ops + ([f"attention={s['ar_attention']}"] if s.get("ar_attention", "xla") != "xla" else [])


def markdown(rep: dict) -> str:
    p, s = rep["provenance"], rep["settings"]
    hw = p.get("hardware")
    bw = f"{hw['hbm_bytes_per_s'] / 1e12:.2f} TB/s" if hw else "not measured"
    lines = [
        f"# Decode step vs HBM roofline: {s['model']}, {s['dtype']}, batch 1, context {s['context']}",
        "",
        f"- Date: {p['date']}. Device: {p['device']}. jax {p['jax']}, torch {p['torch']}. Commit `{p['commit']}`.",
        f"- Command: `{p['command']}` ({p['wall_s']:.0f} s)."
        + (f" XLA_FLAGS of every job: `{p['xla_flags']}`." if p.get("xla_flags") else ""),
        f"- Attention: AR rows `{s.get('ar_attention', 'xla')}`, verify rows `{s.get('verify_attention', 'xla')}`. "
        f"Matmuls: `{s.get('matmul') or 'default'}`"
        + (f" (at most rows: {' '.join(s['skinny_max_tokens'])})" if s.get("skinny_max_tokens") else "")
        + (f" (skinny config {s['skinny_config']})" if s.get("skinny_config") else "") + ". "
        f"Residual add + RMSNorm: `{s.get('norm') or 'default'}`. q/k norm + rope: `{s.get('rope') or 'default'}`. "
        f"SwiGLU: `{s.get('swiglu') or 'default'}`, in the gate|up matmul: `{s.get('swiglu_matmul') or 'default'}`"
        + (f" (tile_k, steps {tuple(s['swiglu_matmul_config'])})" if s.get("swiglu_matmul_config") else "") + ". "
        f"q|k|v with its norm + rope: `{s.get('qkv_rope_matmul') or 'default'}`"
        + (f" (tile_k, steps, splits {tuple(s['qkv_rope_matmul_config'])})" if s.get("qkv_rope_matmul_config") else "")
        + ". Attention merge: "
        f"`{'kernel' if s.get('combine_kernel') else 'xla'}`. "
        f"PDL: `{bool(s.get('pdl'))}` (rows may set their own).",
        (f"- Roofline = bytes of weights + KV read ÷ measured read bandwidth ({bw}) and ÷ 4.3 TB/s (nominal copy "
         f"rate). ms = median of synchronised steps (decode loop: loop time ÷ steps)."),
        "",
        ("| variant | what | ms / step | roofline ms (measured BW) | roofline ms (4.3 TB/s) | × roofline (4.3) "
         "| tokens match | note |"),
        "|---|---|---|---|---|---|---|---|",
    ]
    kernels = kernel_choices(s)
    for r in rep["rows"]:
        what = r["what"]
        if r["variant"] in ("xla_forward", "xla_decode_loop") and kernels:  # labelled XLA, but not plain XLA here
            what += f", with {', '.join(kernels)}: not plain XLA"
        note = r.get("error") or ""
        if not note:
            bits = []
            if r.get("ratio_vs_bf16") is not None:
                bits.append(f"{r['ratio_vs_bf16']:.2f}× bf16 ({r['bf16_ms']:.3f} ms)")
            if r.get("ratio_vs_ar") is not None:
                bits.append(f"{r['ratio_vs_ar']:.2f}× " + ("the decode loop's step" if r["variant"].startswith("verify_loop")
                                                          else "AR"))
            if r.get("compile_backend"):
                bits.append(f"backend {r['compile_backend']}")
            if r.get("cudagraph_skips"):
                bits.append(f"cudagraphs skipped ×{r['cudagraph_skips']}")
            if r.get("implementation") and r["variant"].startswith("xla_forward_w12_"):
                bits.append(r["implementation"])
            if r.get("draft_gaps"):
                bits.append(r["draft_gaps"])
            if r.get("compile_s") is not None:
                bits.append(f"compile {r['compile_s']:.0f}s")
            if r.get("first_steps_s") is not None and r["variant"] != "torch_peer_eager":
                bits.append(f"first steps {r['first_steps_s']:.0f}s")
            note = "; ".join(bits)
        tm = r.get("tokens_match")
        tm_cell = fmt(tm) if r.get("tokens_ref") else ("ref" if r["variant"] == "xla_forward" else "–")
        if str(r.get("tokens_ref") or "").startswith("n/a"):
            tm_cell = "n/a"
        lines.append(f"| {r['variant']} | {what} | {fmt(r.get('ms'))} | {fmt(r['roofline']['ms_measured_bw'])} "
                     f"| {fmt(r['roofline']['ms_nominal'])} | {fmt(r.get('x_roofline_nominal'), 2)} | {tm_cell} "
                     f"| {note.replace('|', '/')} |")
    if rep["targets"]:
        lines += ["", "| issue #8 check | value | target | met |", "|---|---|---|---|"]
        lines += [f"| {t['what']} | {t['value']:.3f} | {t['target']} | {fmt(t['ok'])} |" for t in rep["targets"]]
    for r in rep["rows"]:  # --kernel-split: GPU time per kernel name of one call
        for label, kernels, total in ((r["variant"], r.get("kernels"), r.get("kernels_ms")),
                                      (f"{r['variant']}: its bf16 forward", r.get("bf16_kernels"),
                                       r.get("bf16_kernels_ms"))):
            if kernels:
                split = ""
                if label == r["variant"] and r.get("kernel_launches") is not None:
                    split = (f", {r['kernel_launches']} launches; matmul-like {r['matmul_kernels_ms']:.3f} ms in "
                             f"{r['matmul_launches']} launches, the rest {total - r['matmul_kernels_ms']:.3f} ms in "
                             f"{r['kernel_launches'] - r['matmul_launches']}")
                per = r.get("kernels_per_step_of") if label == r["variant"] else None
                what = f"one step of {label} (a {per}-step loop ÷ {per})" if per else f"one call of {label}"
                idle = f", GPU idle {r['gpu_idle_ms']:.3f} ms of the step" if per and r.get("gpu_idle_ms") else ""
                lines += ["", f"Kernels of {what} (CUPTI, {total:.3f} ms GPU time in all{split}{idle}; the "
                          f"{len(kernels)} largest names):", "", "| kernel | µs | launches |", "|---|---|---|"]
                lines += [f"| `{k['name']}` | {k['us']:.1f} | {k['launches']} |" for k in kernels]
    lines += ["", "| job | status | wall s | timeout s |", "|---|---|---|---|"]
    lines += [f"| {j['job']} | {j['status']} | {fmt(j.get('wall_s'), 1)} | {fmt(j.get('timeout_s'), 0)} |"
              for j in rep["jobs"]]
    for j in rep["jobs"]:
        if j.get("log_tail"):
            lines += ["", f"Last lines of `{j['log']}` ({j['status']}):", "", "```", *j["log_tail"], "```"]
    return "\n".join(lines) + "\n"


def collect(run: Path, jobs: list[Job]) -> dict:
    """{row: fields} from every job's result file (a job cut short leaves the rows it finished)."""
    out = {}
    for job in jobs:
        p = Path(job.spec["result"])
        if not p.is_file():
            continue
        try:
            r = json.loads(p.read_text())
        except json.JSONDecodeError:
            continue
        if job.kind == "torch":
            out[job.name] = {k: v for k, v in r.items() if k != "traceback"}
            continue
        for name, fields in r.get("rows", {}).items():
            out[name] = {**fields, "device": r.get("device"), "jax": r.get("jax")}
        meta = {k: r[k] for k in ("hw", "device", "jax") if k in r}
        out.setdefault(f"_job:{job.name}", {}).update(meta)
        if r.get("error"):
            for name in job.rows:
                out.setdefault(name, {}).setdefault("error", f"job {job.name}: {r['error']}")
        for k in ("pack_s", "to_host_s", "to_device_s", "pack_workers"):
            if k in r:
                for name in job.rows:
                    out.setdefault(name, {})[k] = r[k]
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args.worker)
    s = settings(args)
    chosen = selected_variants(args)
    out = Path(args.out or REPO / "outputs" / "roofline" / time.strftime("%Y-%m-%d_%H-%M-%S"))
    out.mkdir(parents=True, exist_ok=True)
    for f in [out / "w12.packing", out / "w12.ready", out / "w12.go", *(out / "jobs").glob("*.json")]:
        f.unlink(missing_ok=True)  # a rerun into the same folder never reads the last run's results
    budget = args.budget_s or (300.0 if args.quick else 500.0)
    runner = Runner(args, out, budget)
    jobs, w12 = plan_jobs(args, s, out, chosen)
    order = [r for j in jobs for r in j.rows] + (w12.rows if w12 else [])
    order = sorted(order, key=row_rank)
    log(f"bench_roofline: {s['model']} {s['dtype']}, context {s['context']}; jobs: "
        f"{', '.join(j.name for j in jobs)}{' + w12 (background)' if w12 else ''}; budget {budget:.0f}s")
    # Memory: the background W12 process keeps ~30 GB; a foreground JAX process must leave room for it.
    fg_fraction, w12_fraction = memory_fractions(gpu_memory_mib()) if w12 else (None, None)

    def report():
        results = collect(out, jobs + ([w12] if w12 else []))
        for rec in runner.records:
            rec["rows"] = next((j.rows for j in jobs + ([w12] if w12 else []) if j.name == rec["job"]), [])
        rep = build_report(s, results, runner.records, order, args, time.perf_counter() - runner.t0)
        write_json(out / "roofline.json", rep)
        md = markdown(rep)
        (out / "roofline.md").write_text(md)
        return rep, md

    def stop(signum, frame):  # `timeout` or the device tool ends the harness: end the jobs, keep the report
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    bg = None
    try:
        if w12:
            bg = W12Background(runner, w12)
            bg.start(w12_fraction, wait_s=min(150.0, runner.remaining()))
        min_start = 5.0 if args.quick else 20.0
        for job in jobs:
            if bg:
                bg.maybe_run()
            if runner.remaining() < min_start:
                runner.records.append({"job": job.name, "status": "skipped: budget spent", "rows": job.rows})
                log(f"skip {job.name}: budget spent")
                continue
            weights = job.spec.get("weights")
            if job.kind == "torch" and weights and not (Path(weights) / "meta.json").is_file():
                log(f"{job.name}: no exported weights (the xla job did not write them): random torch weights")
                job.spec["weights"] = None
            runner.run(job, fg_fraction)
            report()
        if bg:
            bg.maybe_run(wait=True)
    except KeyboardInterrupt as e:
        log(f"stopped ({e}): ending the running jobs")
        for proc in list(runner.active):
            kill(proc)
        for rec in runner.records:
            if rec["status"] in ("running", "packing"):
                rec["status"] = f"stopped ({e})"
        runner.records.append({"job": "harness", "status": f"stopped: {e}"})
    _, md = report()
    for job in jobs:  # the exported weights (a temporary folder) are not results
        if job.spec.get("export"):
            shutil.rmtree(job.spec["export"], ignore_errors=True)
    log("")
    log(md)
    log(f"wrote {out / 'roofline.json'}, {out / 'roofline.md'}")
    return 0


def row_rank(name: str) -> int:
    key = "xla_flags" if name.startswith("xla_flags") else name.split("@")[0]
    return ROW_ORDER.index(key) if key in ROW_ORDER else len(ROW_ORDER)


ROW_ORDER = ["xla_forward", "xla_decode_loop", *SKINNY_VARIANTS, *FUSED_NORM_VARIANTS, *SKINNY_FLAG_VARIANTS, "xla_flags",
             *W12_ROWS, "torch_peer_eager",
             "torch_peer_compile", "torch_peer_cudagraphs", "verify_nodes", "verify_loop", *DRAFTER_ROWS]


if __name__ == "__main__":
    sys.exit(main())
