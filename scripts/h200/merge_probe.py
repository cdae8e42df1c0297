"""Does the tree-attention kernel with its in-kernel merge (``MERGE_IN_KERNEL``) hang, and where?

Its GPU tests pass (one call each); the drafter benchmark (many calls, five a program) ran past its job timeouts
(docs/results/2026-12-02-drafter-qkv-merge-h200/).

Runs the packed kernel at the DFlash-b16 drafter's shape (B = 1, 16 nodes, Hq 32 + 2 x 8 KV heads, D 128, cache 1024,
8 splits) with the merge in the kernel: one call checked against the reference, then, for one jitted call and for a
program of five chained calls (like the drafter's layers), its trace + lowering and compile times and ``--calls``
calls, each step printed as it ends, so a hang shows where it begins and slow tracing shows as such (run it under
``timeout``).

    timeout 60 python3 scripts/h200/merge_probe.py
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

from pallas_kernels import tree_attention as ta
from pallas_kernels.tree_attention import mosaic_gpu as ta_mosaic_gpu
from pallas_kernels.tree_attention import ops as ta_ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--nodes", type=int, default=16)
    args = ap.parse_args()
    if not ta_ops._on_hopper():
        raise SystemExit("merge_probe.py: needs an H100/H200 (the merge in the kernel does not run in interpret mode)")
    ta_mosaic_gpu.MERGE_IN_KERNEL = True
    n, keys = args.nodes, jax.random.split(jax.random.key(0), 3)
    qkv = jax.random.normal(keys[0], (1, n, 48, 128), jnp.bfloat16)
    k_cache, v_cache = (jax.random.normal(k, (1, 1024, 8, 128), jnp.bfloat16) for k in keys[1:])
    lengths = jnp.array([1000], jnp.int32)
    bits = ta.parents_to_ancestor_bits(jnp.arange(n, dtype=jnp.int32)[None] - 1)
    one = jax.jit(lambda qkv: ta.tree_attention_packed(qkv, k_cache, v_cache, lengths, bits, implementation="pallas"))
    ref = ta.tree_attention_packed(qkv, k_cache, v_cache, lengths, bits, implementation="reference")
    err = float(jnp.abs(one(qkv).astype(jnp.float32) - ref.astype(jnp.float32)).max())
    print(f"one call: max |err| {err:.3g}", flush=True)

    def chain(qkv):
        for _ in range(5):  # each call's output feeds the next one's q (the layers' serial chain)
            out = ta.tree_attention_packed(qkv, k_cache, v_cache, lengths, bits, implementation="pallas")
            qkv = qkv.at[:, :, :32].set(out)
        return qkv

    for name, fn in (("one call", one), ("five chained calls", jax.jit(chain))):
        t0 = time.perf_counter()
        lowered = fn.trace(qkv).lower()
        t1 = time.perf_counter()
        fn = lowered.compile()
        print(f"{name}: traced and lowered in {t1 - t0:.1f}s, compiled in {time.perf_counter() - t1:.1f}s", flush=True)
        fn(qkv).block_until_ready()
        t0 = time.perf_counter()
        for i in range(args.calls):
            fn(qkv).block_until_ready()
            if i in (0, 1, 9) or i == args.calls - 1:
                print(f"{name}: {i + 1} done, {time.perf_counter() - t0:.2f}s", flush=True)


if __name__ == "__main__":
    main()
