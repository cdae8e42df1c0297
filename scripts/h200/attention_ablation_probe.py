"""Where the AR step's ~6.8 us a call of tree attention goes: the kernel at a Qwen3-8B AR step's shapes (one node,
Hq=32, Hkv=8, D=128, a 1k prefix) with parts left out (``mosaic_gpu.ABLATE``), a few split configs, and a floor (a
Mosaic GPU kernel that copies 64 rows). Kernel time by CUPTI, per call, each name apart (the kernel, XLA's merge).

Each program is one call site in a loop of ``--calls`` iterations; between calls a reduction over a buffer twice the
L2 cold-starts the cache as the step's 400 MB of weights between two layers' attention do, and q is rewritten from
the previous output (L2-hot, as the rope kernel leaves it). Prints one line per program as it goes.

    PYTHONPATH=$PWD python3 scripts/h200/attention_ablation_probe.py > $OUT/attention_ablation.txt
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.tree_attention import mosaic_gpu, ops
from pallas_kernels.tree_attention.config import TuningConfig
from pallas_kernels.tree_attention.reference import tree_attention_reference
from specpilot.costmodel.cupti import kernel_summary, median_kernel_us

HQ, HKV, D = 32, 8, 128
FLUSH_BYTES = 128 * 2**20
ATTENTION_NAME, FLOOR_NAME = "tree_attention_body", "floor_body"

ONE_BLOCK = dict(min_blocks_per_split=1)
ONE_STAGE = dict(min_blocks_per_split=1, max_concurrent_steps=1)
SHARED_LSE = {"lse_shared": True}
VARIANTS = {
    "base": ({}, TuningConfig()),
    "splits16": ({}, TuningConfig(num_splits=16, **ONE_BLOCK)),
    "splits4": ({}, TuningConfig(min_blocks_per_split=4)),
    "steps2": ({}, TuningConfig(max_concurrent_steps=2)),
    "splits17": ({}, TuningConfig(num_splits=17, **ONE_BLOCK)),
    "splits17_steps1": (SHARED_LSE, TuningConfig(num_splits=17, **ONE_STAGE)),
    "splits18_steps1": (SHARED_LSE, TuningConfig(num_splits=18, **ONE_STAGE)),
    "splits24_steps1": (SHARED_LSE, TuningConfig(num_splits=24, **ONE_STAGE)),
    "kv128_splits9": ({}, TuningConfig(block_kv=128, num_splits=9, max_concurrent_steps=2, **ONE_BLOCK)),
    "kv128_splits9_steps1": (SHARED_LSE, TuningConfig(block_kv=128, num_splits=9, **ONE_STAGE)),
    "kv128_splits10_steps1": (SHARED_LSE, TuningConfig(block_kv=128, num_splits=10, **ONE_STAGE)),
    "const_length": ({"length": 1024}, TuningConfig()),
    "no_q": ({"no_q": True}, TuningConfig()),
    "no_compute": ({"no_compute": True}, TuningConfig()),
    "no_lse": ({"no_lse": True}, TuningConfig()),
    "no_store": ({"no_store": True}, TuningConfig()),
    "no_prefix": ({"length": 0}, TuningConfig()),
    "bare": ({"length": 0, "no_q": True, "no_compute": True, "no_store": True}, TuningConfig()),
}
"""name -> (mosaic_gpu.ABLATE, TuningConfig). ``no_prefix`` reads only the one-node tree's block. ``splitsN``: N - 1
prefix splits and the tree's, so at a 1024 prefix (16 blocks of 64) 17 gives every CTA one block; ``steps1`` halves
the CTA's shared memory (one K/V stage; with ``lse_shared``, the lse tile reusing the output's), so two CTAs fit an
SM and more than 132 CTAs still make one wave."""


def copy_rows_kernel(x):
  """The floor: a Mosaic GPU kernel of 64 blocks, each copying one 128-float row."""

  def floor_body(x_ref, o_ref):  # its name in profiles
    r = lax.axis_index("r")
    o_ref[r, :] = x_ref[r, :]

  return plgpu.kernel(floor_body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0],),
                      grid_names=("r",),
                      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup))(x)


def looped(step, calls):
  """``calls`` iterations of ``q = step(q)``, an L2 flush between them feeding the next q (so nothing reorders)."""

  def run(q, flush):
    def body(_, q):
      # reads FLUSH_BYTES, so the cache and K/V leave L2; scaled by q so it is not hoisted out of the loop
      spill = jnp.sum(flush * q.reshape(-1)[0].astype(jnp.float32))
      return (step(q).astype(jnp.float32) + spill * 0.0).astype(q.dtype)

    return lax.fori_loop(0, calls, body, q)

  return jax.jit(run)


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--prefix", type=int, default=1024)
  ap.add_argument("--capacity", type=int, default=2048)
  ap.add_argument("--calls", type=int, default=36)
  ap.add_argument("--iters", type=int, default=7)
  ap.add_argument("--only", nargs="*", default=None, help="variant names (default: all, then the floor)")
  args = ap.parse_args(argv)
  if jax.devices()[0].platform != "gpu":
    raise SystemExit(f"attention_ablation_probe needs a Hopper GPU; this backend is {jax.devices()[0].platform!r}")
  rng = np.random.default_rng(0)
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape, np.float32), jnp.bfloat16)
  q = normal(1, 1, HQ, D)
  k_cache, v_cache = normal(1, args.capacity, HKV, D), normal(1, args.capacity, HKV, D)
  k_tree, v_tree = normal(1, 1, HKV, D), normal(1, 1, HKV, D)
  lengths = jnp.array([args.prefix], jnp.int32)
  bits = jnp.ones((1, 1, 1), jnp.uint32)
  flush = jnp.ones((FLUSH_BYTES // 4,), jnp.float32)
  want = np.asarray(tree_attention_reference(q, k_cache, v_cache, lengths, k_tree, v_tree, bits), np.float32)

  names = args.only if args.only is not None else [*VARIANTS, "floor"]
  for name in names:
    if name == "floor":
      x0 = jnp.zeros((64, 128), jnp.float32)
      program, x, check = looped(copy_rows_kernel, args.calls), x0, False
    else:
      ablate, config = VARIANTS[name]
      mosaic_gpu.ABLATE.clear()
      mosaic_gpu.ABLATE.update(ablate)
      attend = lambda qq, c=config: ops.tree_attention(qq, k_cache, v_cache, lengths, k_tree, v_tree, bits,
                                                        implementation="pallas", config=c)
      program, x, check = looped(attend, args.calls), q, not set(ablate) - {"lse_shared"}
      try:
        program = program.lower(x, flush).compile()  # ABLATE is read here, at trace time
        if check:
          got = np.asarray(jax.jit(attend)(q), np.float32)
          err = float(np.max(np.abs(got - want)))
      except Exception as e:  # noqa: BLE001 - report and go on to the next variant
        print(f"{name}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
        continue
      finally:
        mosaic_gpu.ABLATE.clear()
    parts = median_kernel_us(lambda: program(x, flush), args.iters, per=args.calls)
    ours = sum(us for k, us in parts.items() if FLOOR_NAME in k or ATTENTION_NAME in k)
    print(f"{name}: {ours:.2f} us a call in the kernel ({kernel_summary(parts, 48)})"
          + (f"; max |err| {err:.3g}" if check else ""), flush=True)


if __name__ == "__main__":
  main()
