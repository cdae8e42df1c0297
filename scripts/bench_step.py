"""Time one decode step and tree-verify passes of a synthetic-shape target against its HBM roofline.

    python scripts/bench_step.py --model qwen3_8b --context 1024 --nodes 1 16 64 256 --out step.json

Runs on the GPU machine with only jax installed (no Hydra): reads the shapes from conf/model/<name>.yaml
with a minimal parser. Random bf16 weights (init_random_target), a KV cache filled to `--context`, random
ancestor-style trees; each variant is jitted, warmed up, then timed as the median of `--iters` calls with
`block_until_ready`. Weights (16 GB for qwen3_8b) are far beyond L2, so nothing is flattered by caching.
The roofline counts weight bytes + KV bytes read ÷ the bandwidth measured by a large device copy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specpilot.models.config import ModelConfig, RopeConfig
from specpilot.models.kv_cache import KVCache, init_cache
from specpilot.models.target import forward
from specpilot.models.weights import count_bytes, init_random_target

REPO = Path(__file__).resolve().parents[1]


def model_config(name: str) -> ModelConfig:
    """conf/model/<name>.yaml → ModelConfig (flat `key: value` lines; nested rope_scaling ignored)."""
    vals = {}
    for line in (REPO / "conf" / "model" / f"{name}.yaml").read_text().splitlines():
        if line and not line.startswith((" ", "#")) and ":" in line:
            k, v = (s.strip() for s in line.split(":", 1))
            if v:
                vals[k] = v
    ints = ["vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
            "max_position_embeddings"]
    return ModelConfig(family=vals["family"], **{k: int(vals[k]) for k in ints},
                       rope=RopeConfig(theta=float(vals["rope_theta"])),
                       tie_word_embeddings=vals["tie_word_embeddings"] == "true")


def timed(fn, *args, iters: int) -> float:
    jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def copy_bandwidth() -> float:
    x = jnp.ones((1 << 30,), jnp.bfloat16)  # 2 GiB
    f = jax.jit(lambda a: a + 1)
    ms = timed(f, x, iters=10)
    return 2 * x.nbytes / (ms * 1e-3)  # read + write


def random_tree_mask(n: int, rng) -> np.ndarray:
    parent = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, n)])
    anc = np.eye(n, dtype=bool)
    for i in range(1, n):
        anc[i] |= anc[parent[i]]
    depth = anc.sum(1) - 1
    return anc, depth


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3_8b")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cfg = model_config(args.model)
    w = init_random_target(cfg, seed=0, dtype=jnp.bfloat16)
    wbytes = count_bytes(w) - w.embed.nbytes + w.embed[0].nbytes  # the step reads one embedding row
    bw = copy_bandwidth()
    capacity = args.context + max(args.nodes) + 8
    empty = init_cache(cfg.num_layers, args.batch, capacity, cfg.num_kv_heads, cfg.head_dim, jnp.bfloat16)
    cache = KVCache(  # never time on zeros
        k=jax.random.normal(jax.random.key(1), empty.k.shape, jnp.bfloat16),
        v=jax.random.normal(jax.random.key(2), empty.v.shape, jnp.bfloat16),
        lengths=jnp.full((args.batch,), args.context, jnp.int32),
    )
    step = jax.jit(lambda w, t, p, c, m: forward(w, cfg, t, p, c, m).logits)
    rng = np.random.default_rng(0)
    rows = []
    for n in args.nodes:
        anc, depth = random_tree_mask(n, rng)
        toks = jnp.asarray(rng.integers(0, cfg.vocab_size, (args.batch, n)), jnp.int32)
        pos = jnp.asarray(np.broadcast_to(args.context + depth, (args.batch, n)), jnp.int32)
        mask = jnp.asarray(np.broadcast_to(anc, (args.batch, n, n)))
        ms = timed(step, w, toks, pos, cache, mask, iters=args.iters)
        kv_bytes = 2 * cfg.num_layers * args.batch * (args.context + n) * cfg.kv_size * 2
        roof = (wbytes + kv_bytes) / bw * 1e3
        rows.append({"nodes": n, "batch": args.batch, "ms": ms, "roofline_ms": roof, "ratio": ms / roof})
        print(f"{args.model} B={args.batch} n={n:4d}: {ms:7.2f} ms  roofline {roof:5.2f} ms  ({ms / roof:.2f}x)",
              flush=True)
    result = {"model": args.model, "context": args.context, "copy_bandwidth_TBps": bw / 1e12,
              "weight_bytes": wbytes, "device": str(jax.devices()[0].device_kind), "rows": rows}
    print(json.dumps(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
