"""Does an L2 prefetch of the next weight, issued before the small kernels between two matmuls, shorten the matmul?

Why: in a decode step the HBM idles while the small kernels between two matmuls run (norms, rope, attention's
merge, split-K sums: ~0.6 ms of a 4.6 ms Qwen3-8B step), and every matmul then pays ~4.5 us of ramp
(docs/h200_runbook.md). A TMA prefetch into L2 (``plgpu.async_prefetch``: ``cp.async.bulk.prefetch.tensor.L2``)
needs no SMEM, no barrier and no completion: issued as soon as the previous matmul is done, the next weight's first
bytes stream into L2 while the small kernels run, and the next matmul's first pipeline steps hit L2.

The chain (batch 1, Qwen3-8B layer shapes, ``--layers`` layers, weights beyond L2): qkv -> slice + RMSNorm -> o ->
RMSNorm -> gate_up -> SwiGLU -> down -> RMSNorm -> next layer's qkv, every matmul on ``skinny_matmul``'s kernel
(split-K partial sums added by XLA). Variants: ``--prefetch-mb`` MB of the next weight (0: none) prefetched by a
kernel of its own right after each matmul's sum, split like the next matmul's blocks walk it: the first rows of
every K split. Reported: wall µs per layer (synchronised chain), CUPTI µs per layer of the matmul kernels, of the
prefetch kernels and of the rest.

Measured on the H200 (docs/results/2026-12-01-fusion-prefetch-h200/): no gain. The separate prefetch kernel never
showed in CUPTI's kernel list, whether its result entered the chain multiplied by zero (commit 7c9505c) or through
``lax.optimization_barrier`` (now), while the chain's wall time grew: why is not known, so those rows decide nothing;
with the prefetches issued by the matmul kernel itself (commit 5cb4baa, at its end or its
start) the matmuls got slower by up to 9 and 21 µs a layer, and the next matmuls no faster. The skinny kernel's
``prefetch=`` was removed after it.

    PYTHONPATH=$PWD python3 scripts/h200/prefetch_probe.py > $OUT/prefetch.txt
"""

from __future__ import annotations

import argparse
import math

import jax
import jax.numpy as jnp
from chain_timing import wall_ms
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.add_rms_norm.reference import rms_norm
from pallas_kernels.skinny_matmul.mosaic_gpu import DEFAULT_CONFIG, skinny_matmul
from pallas_kernels.split_k import auto_split_k, num_sms, token_tile

SHAPES = ((4096, 6144), (4096, 4096), (4096, 24576), (12288, 4096))  # qkv, o, gate_up, down
BOX = (64, 256)  # rows x columns of one prefetch instruction (TMA boxes are at most 256 a side)


def next_split(k: int, n: int, m: int = 1) -> int:
  """The K splits ``skinny_matmul`` gives W[k, n] at m tokens (its blocks' walk)."""
  tile_m = token_tile(DEFAULT_CONFIG.tile_m, m)
  return auto_split_k((n // 64) * (-(-m // tile_m)), k // DEFAULT_CONFIG.tile_k, num_sms(),
                      DEFAULT_CONFIG.blocks_per_sm)


def prefetch_rows(k: int, n: int, mbytes: float, m: int = 1) -> int:
  """Rows prefetched at the start of each K split of W[k, n] for about ``mbytes`` MB (at least one box)."""
  split = next_split(k, n, m)
  return min(k // split, max(BOX[0], int(mbytes * 2**20 / (2 * n * split)) // BOX[0] * BOX[0]))


def l2_prefetch(w: jax.Array, after: jax.Array, mbytes: float, m: int = 1) -> jax.Array:
  """Prefetches about ``mbytes`` MB of ``w`` [K, N] into L2: the first rows of each of its K splits, one block per
  (256-column chunk, split). Takes ``after`` (orders the kernel after it) and returns the kernel's [1] int32 output,
  never written, for the caller to pass through ``lax.optimization_barrier`` with what must come after the
  prefetch (a value XLA cannot fold away, unlike a product with zero)."""
  k, n = w.shape
  split = next_split(k, n, m)
  rows = prefetch_rows(k, n, mbytes, m)
  chunks = n // BOX[1]

  def l2_prefetch_blocks(w_gmem, after_gmem, out_gmem):  # the CUPTI name: l2_prefetch_blocks_mosaic_gpu_kernel
    del after_gmem, out_gmem
    first = jax.lax.axis_index("s") * (k // split)
    col = jax.lax.axis_index("c") * BOX[1]
    for r in range(0, rows, BOX[0]):
      plgpu.async_prefetch(w_gmem.at[pl.ds(first + r, BOX[0]), pl.ds(col, BOX[1])])

  call = plgpu.kernel(l2_prefetch_blocks, out_type=jax.ShapeDtypeStruct((1,), jnp.int32), grid=(chunks, split),
                      grid_names=("c", "s"))
  return call(w, after)


def chain(layers: int, mbytes: float):
  def run(x, ws):
    for i in range(layers):
      for j, w in enumerate(ws[i]):
        y = skinny_matmul(x, w)
        nxt = ws[i][j + 1] if j + 1 < len(SHAPES) else ws[(i + 1) % layers][0]
        if mbytes:  # the prefetch right after the matmul, the small kernels after the prefetch
          y, _ = jax.lax.optimization_barrier((y, l2_prefetch(nxt, y, mbytes, x.shape[0])))
        if j == 0:
          x = rms_norm(y[..., :4096], jnp.ones(4096, y.dtype), 1e-6)
        elif j == 2:
          gate, up = jnp.split(y, 2, axis=-1)
          x = jax.nn.silu(gate) * up
        else:
          x = rms_norm(y, jnp.ones(y.shape[-1], y.dtype), 1e-6)
    return x
  return jax.jit(run)


def cupti_split(fn, args) -> tuple[float, float, float]:
  """µs per call of the matmul kernels, the prefetch kernels and the rest (CUPTI, one call)."""
  from specpilot.costmodel.cupti import kernel_timings

  mm = pf = rest = 0.0
  for name, ms in kernel_timings(lambda: fn(*args)):
    if "prefetch" in name or "kernel_l2" in name:
      pf += ms
    elif "mosaic" in name:
      mm += ms
    else:
      rest += ms
  return mm * 1e3, pf * 1e3, rest * 1e3


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--layers", type=int, default=8)
  ap.add_argument("--prefetch-mb", type=float, nargs="+", default=[0, 4, 8, 16, 32])
  ap.add_argument("--tokens", type=int, default=1, help="token rows (the drafter: 16)")
  ap.add_argument("--iters", type=int, default=30)
  args = ap.parse_args(argv)
  keys = iter(jax.random.split(jax.random.key(0), 4 * args.layers + 1))
  ws = [[jax.random.normal(next(keys), s, jnp.bfloat16) * 0.02 for s in SHAPES] for _ in range(args.layers)]
  x = jax.random.normal(next(keys), (args.tokens, 4096), jnp.bfloat16)
  gb = sum(math.prod(s) * 2 for s in SHAPES) * args.layers / 1e9
  print(f"# L2 prefetch probe: {jax.devices()[0].device_kind}, {args.layers} layers ({gb:.2f} GB of weights), "
        f"{args.tokens} token rows\n\n| prefetch MB | wall µs / layer | matmul kernels µs / layer | prefetch kernels µs / layer | "
        f"other kernels µs / layer | output equal to none |\n|---|---|---|---|---|---|", flush=True)
  for mb in args.prefetch_mb:
    if mb:
      print(f"<!-- {mb} MB asked: " + ", ".join(
          f"{k}x{n} {prefetch_rows(k, n, mb, args.tokens) * n * 2 * next_split(k, n, args.tokens) / 2**20:.1f} MB" for k, n in SHAPES)
          + " -->", flush=True)
  ref = None
  for mb in args.prefetch_mb:
    fn = chain(args.layers, mb)
    try:
      out = jax.block_until_ready(fn(x, ws))
    except Exception as e:  # noqa: BLE001 (a prefetch size this TMA rejects: reported, the rest go on)
      print(f"| {mb} | error: {type(e).__name__}: {str(e).splitlines()[0][:200]} | | | | |", flush=True)
      continue
    ref = out if ref is None else ref
    wall = wall_ms(fn, (x, ws), args.iters) * 1e3 / args.layers
    try:
      mm, pf, rest = (v / args.layers for v in cupti_split(fn, (x, ws)))
    except RuntimeError:  # no CUPTI (a CPU run)
      mm = pf = rest = float("nan")
    print(f"| {mb} | {wall:.1f} | {mm:.1f} | {pf:.1f} | {rest:.1f} | {bool(jnp.array_equal(out, ref))} |",
          flush=True)


if __name__ == "__main__":
  main()
