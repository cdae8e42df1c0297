"""How fast a TMA pipeline streams a weight laid out one way or another, with nothing computed (issue #4).

Each kernel is the split-K matmuls' grid (a block per 64 output channels and K split) running ``emit_pipeline``
over its K steps with an empty body: a step's slot is refilled as soon as its copies land. So a layout's time here is
what its access pattern lets HBM deliver, the ceiling for any kernel that reads the weight that way. Layouts:

- ``w12_rows``: the W12 planes as ``pack`` stores them, ``[N, Kp]`` bytes and ``[N, Kp / 2]`` nibbles; a step reads
  ``[64, tile_k]`` and ``[64, tile_k / 2]`` boxes, 64 runs of ``tile_k`` (and ``tile_k / 2``) contiguous bytes.
- ``w12_tiles``: the same bytes stored tile-major, each block's ``[64, 128]`` K tile contiguous (``[N / 64 * Kp / 128
  * 64, 128]`` and ``[.., 64]``): a step reads one contiguous run of ``64 * tile_k`` (and half that) bytes.
- ``bf16_kn``: the bf16 weight as the model stores it, ``[K, N]``, ``[tile_k, 64]`` boxes (the skinny kernel's).

Every form also loads the ``[8, tile_k]`` activation tile a step, as the kernels do. Prints kernel us a call and the
weight bytes a second. (A ``--work`` option that held each step's slot for a chain of integer multiply-adds was tried
at commit ``f41876a`` and removed: 4096 dependent multiply-adds a step added only ~1.3 us a call, so the compiler had
folded the chain, docs/results/2026-12-04-w12-ablate-sweep-h200/.)

    PYTHONPATH=$PWD python3 scripts/h200/stream_probe.py --k 4096 --n 24576 --split 2 --tile-k 256 128 --depth 2 4
"""

import argparse
import statistics

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.mosaic.gpu import profiler
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.split_k import smem_transforms

ROWS = 64
TILE = 128  # the tile-major layout's K a tile
LAYOUTS = ("w12_rows", "w12_tiles", "bf16_kn")


def stream_call(layout: str, k: int, n: int, split: int, tile_k: int, depth: int, interpret=None):
  """A jitted ``f(weights, x)`` streaming ``weights`` (the layout's arrays) and ``x`` ``[8, K]`` bf16 once. Each block
  writes an ``[8, 64]`` zero tile of the ``[split, 8, N]`` output, so the call has a result XLA keeps."""
  steps = k // tile_k // split
  depth = min(depth, steps)
  per_tile = tile_k // TILE
  if layout == "w12_tiles" and tile_k % TILE:
    raise ValueError(f"w12_tiles reads whole {TILE}-wide tiles, not tile_k={tile_k}")

  if layout == "w12_rows":
    specs = [((ROWS, tile_k), lambda nb, s: lambda i: (nb, s * steps + i), (tile_k, jnp.uint8)),
             ((ROWS, tile_k // 2), lambda nb, s: lambda i: (nb, s * steps + i), (tile_k // 2, jnp.uint8))]
  elif layout == "w12_tiles":
    tiles_per_row = k // TILE

    def tile_index(nb, s):
      return lambda i: (nb * (tiles_per_row // per_tile) + s * steps + i, 0)

    specs = [((ROWS * per_tile, TILE), tile_index, (TILE, jnp.uint8)),
             ((ROWS * per_tile, TILE // 2), tile_index, (TILE // 2, jnp.uint8))]
  elif layout == "bf16_kn":
    specs = [((tile_k, ROWS), lambda nb, s: lambda i: (s * steps + i, nb), (ROWS, jnp.bfloat16))]
  else:
    raise ValueError(f"unknown layout {layout!r}: one of {', '.join(LAYOUTS)}")
  specs.append(((8, tile_k), lambda nb, s: lambda i: (0, s * steps + i), (min(tile_k, 64), jnp.bfloat16)))

  def stream_body(*refs):  # profile name
    *gmem, out_gmem, out_smem = refs
    nb, s = lax.axis_index("n"), lax.axis_index("s")
    in_specs = [plgpu.BlockSpec(shape, index(nb, s), transforms=smem_transforms(*minor))
                for shape, index, minor in specs]  # (block shape, index map of the block's indices, SMEM minor dim)

    def step(idx, *smem):
      del idx, smem

    plgpu.emit_pipeline(step, grid=(steps,), in_specs=in_specs, max_concurrent_steps=depth)(*gmem)
    out_smem[...] = jnp.zeros((8, ROWS), jnp.bfloat16)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(out_smem, out_gmem.at[s, :, pl.ds(nb * ROWS, ROWS)])
    plgpu.wait_smem_to_gmem(0)

  call = plgpu.kernel(stream_body, out_type=jax.ShapeDtypeStruct((split, 8, n), jnp.bfloat16),
                      grid=(n // ROWS, split), grid_names=("n", "s"),
                      scratch_types=[plgpu.SMEM((8, ROWS), jnp.bfloat16)],
                      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup,
                                                          unsafe_no_auto_barriers=True),
                      interpret=interpret)
  return jax.jit(lambda ws, x: [call(*w, x) for w in ws])


def arrays(layout: str, k: int, n: int, key):
  """Random bits in ``layout``'s arrays for a ``K x N`` weight (what ``stream_call`` reads)."""
  if layout == "w12_rows":
    shapes = [((n, k), jnp.uint8), ((n, k // 2), jnp.uint8)]
  elif layout == "w12_tiles":
    rows = n // ROWS * (k // TILE) * ROWS
    shapes = [((rows, TILE), jnp.uint8), ((rows, TILE // 2), jnp.uint8)]
  else:
    shapes = [((k, n), jnp.bfloat16)]
  keys = jax.random.split(key, len(shapes))
  return [jax.random.bits(kk, shape, jnp.uint8 if dtype == jnp.uint8 else jnp.uint16).view(dtype)
          for kk, (shape, dtype) in zip(keys, shapes)]


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--k", type=int, default=4096)
  ap.add_argument("--n", type=int, default=24576)
  ap.add_argument("--split", type=int, nargs="+", default=[2], help="K splits (the W12 auto split: 2 on gate|up)")
  ap.add_argument("--tile-k", type=int, nargs="+", default=[256, 128])
  ap.add_argument("--depth", type=int, nargs="+", default=[2, 4])
  ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=LAYOUTS)
  ap.add_argument("--copies", type=int, default=1, help="weight copies a timed call runs over in turn (beyond L2)")
  args = ap.parse_args()
  x = jnp.zeros((8, args.k), jnp.bfloat16)
  print(f"K x N {args.k}x{args.n}, {args.copies} copies", flush=True)
  for layout in args.layouts:
    weights = [arrays(layout, args.k, args.n, jax.random.key(c)) for c in range(args.copies)]
    nbytes = sum(a.nbytes for a in weights[0])
    for split in args.split:
      for tile_k in args.tile_k:
        for depth in args.depth:
          name = f"{layout} split={split} tile_k={tile_k} depth={depth}"
          try:
            fn = stream_call(layout, args.k, args.n, split, tile_k, depth)
            _, timed = profiler.measure(fn, aggregate=False, iterations=9)(weights, x)
          except Exception as e:  # one shape's lowering error must not end the sweep
            print(f"{name}: failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
            continue
          us = statistics.median(ms * 1e3 for run in timed for _, ms in run)
          print(f"{name}: {us:.1f} us, {nbytes / us / 1e6:.2f} TB/s of {nbytes / 1e6:.1f} MB", flush=True)


if __name__ == "__main__":
  main()
