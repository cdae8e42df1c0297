"""How long one target forward on the fast kernels takes to trace and lower for the GPU, on any machine.

    PYTHONPATH=$PWD python3 scripts/lowering_time.py                       # Qwen3-8B shapes, 36 layers, 1 token
    PYTHONPATH=$PWD python3 scripts/lowering_time.py --tokens 64 --layers 2

The forward (``specpilot.models.target.forward``, ``attention=pallas_tree``) with ``conf/kernels/hopper.yaml``'s
kernels chosen (bf16 linears, add + norm, q/k norm + rope, gate|up + SwiGLU, q|k|v + norm + rope) as if on a Hopper,
traced and lowered for ``cuda`` (no GPU needed: what jax does before XLA compiles). Prints one JSON line: trace and
lowering seconds, the Mosaic GPU kernels in the lowered module, its size. Why it exists: jax lowered every kernel
call site apart until ``pallas_kernels.lowering`` (docs/results/2026-12-06-lowering-time-cpu/).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import yaml  # noqa: E402

from pallas_kernels import choices  # noqa: E402
from specpilot.argtypes import positive_int  # noqa: E402
from specpilot.costmodel.measure import model_config  # noqa: E402
from specpilot.models.kv_cache import init_cache  # noqa: E402
from specpilot.models.target import forward  # noqa: E402
from specpilot.models.weights import init_random_target  # noqa: E402

OPS_MODULES = ("tree_attention", "qk_norm_rope", "add_rms_norm", "skinny_matmul", "swiglu", "swiglu_matmul",
               "qkv_rope_matmul")
"""The ``pallas_kernels.<op>.ops`` modules whose device check (``_on_hopper``) the forward's kernels go through."""
HOPPER = Path(__file__).resolve().parents[1] / "conf" / "kernels" / "hopper.yaml"


@contextlib.contextmanager
def fast_kernels_as_if_on_hopper():
    """``HOPPER``'s kernel choices and each ops module told it runs on a Hopper; all restored after."""
    modules = [importlib.import_module(f"pallas_kernels.{op}.ops") for op in OPS_MODULES]
    saved = [m._on_hopper for m in modules]
    before = choices.use(**yaml.safe_load(HOPPER.read_text()))
    try:
        for m in modules:
            m._on_hopper = lambda: True
        yield
    finally:
        for m, on_hopper in zip(modules, saved):
            m._on_hopper = on_hopper
        choices.use(**before)


def kernels_in(text: str) -> int:
    """Mosaic GPU kernels a lowered module holds (a kernel called from several sites is one function)."""
    return len(re.findall(r"custom_call @mosaic_gpu", text))


def lower_forward(model: str, layers: int | None, tokens: int, capacity: int = 2048) -> dict:
    """Trace and lower the forward for ``cuda`` (call inside ``fast_kernels_as_if_on_hopper``); its times, kernel
    count and lowered text."""
    cfg = model_config(model)
    cfg = cfg.replace(num_layers=layers) if layers else cfg
    w = jax.eval_shape(lambda: init_random_target(cfg, 0, jnp.bfloat16))
    cache = jax.eval_shape(lambda: init_cache(cfg.num_layers, 1, capacity, cfg.num_kv_heads, cfg.head_dim,
                                              jnp.bfloat16))
    ids = jax.ShapeDtypeStruct((1, tokens), jnp.int32)
    step = lambda w, t, p, c: forward(w, cfg, t, p, c, attention="pallas_tree").logits  # noqa: E731  fresh each call
    t0 = time.perf_counter()
    traced = jax.jit(step).trace(w, ids, ids, cache)
    t1 = time.perf_counter()
    text = traced.lower(lowering_platforms=("cuda",)).as_text()
    t2 = time.perf_counter()
    return {"model": model, "layers": cfg.num_layers, "tokens": tokens, "trace_s": round(t1 - t0, 2),
            "lower_s": round(t2 - t1, 2), "kernels": kernels_in(text), "text_mb": round(len(text) / 1e6, 2),
            "text": text}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3_8b", help="conf/model/<name>.yaml (default qwen3_8b)")
    ap.add_argument("--layers", type=positive_int, default=None, help="layers (default: the model's)")
    ap.add_argument("--tokens", type=positive_int, default=1, help="token rows (1: a decode step; 64: a verify)")
    args = ap.parse_args(argv)
    with fast_kernels_as_if_on_hopper():
        res = lower_forward(args.model, args.layers, args.tokens)
    res.pop("text")
    print(json.dumps(res), flush=True)
    return res


if __name__ == "__main__":
    main()
