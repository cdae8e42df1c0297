"""What merging a KV-split attention's partials across a thread-block cluster (distributed shared memory) costs,
against the two launches the AR step pays now (the attention kernel writing partials to GMEM, XLA's merge kernel
after it): the number behind the runbook's "partials merged across a cluster" form of the decode attention.

``cluster``: ``--heads`` clusters of ``--splits`` blocks. Each block writes its partial row (a row of ``--widths``
floats of its input: 128 is one decode head's D, 1024 / 8192 what the attention kernel's [8, 128] / [64, 128] f32
tiles hold) into its own shared memory. It then arrives on a cluster barrier, and the cluster's first block adds the
rows it reads from every peer's shared memory (``plgpu.cluster_ref``) and writes the head's row. A second cluster
barrier keeps every block's shared memory alive until that read is done. ``two_launches``: the partials go to GMEM and
a second kernel adds them. ``one_launch``: the partials' kernel alone (the floor both pay). Every output is checked
against numpy. Kernel time by CUPTI, each kernel name apart.

    PYTHONPATH=$PWD python3 scripts/h200/cluster_merge_probe.py > $OUT/cluster_merge.txt
"""

from __future__ import annotations

import argparse
import itertools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from specpilot.costmodel.cupti import kernel_summary, median_kernel_us

_PARAMS = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)


def cluster_merge(x: jax.Array) -> jax.Array:
  """``x`` f32 ``[heads, splits, width]`` -> the sum over splits, merged inside each head's cluster."""
  heads, splits, width = x.shape

  def cluster_merge_body(x_ref, out_ref, part_smem, written, read):  # its name in profiles
    h, s = lax.axis_index("h"), lax.axis_index("c")
    part_smem[...] = x_ref[h, s, :]
    plgpu.barrier_arrive(written)
    plgpu.barrier_wait(written)

    @pl.when(s == 0)
    def _():
      total = part_smem[...]
      for peer in range(1, splits):
        total = total + plgpu.cluster_ref(part_smem, {"c": peer})[...]
      out_ref[h, :] = total

    plgpu.barrier_arrive(read)
    plgpu.barrier_wait(read)

  barrier = plgpu.ClusterBarrier(collective_axes=("c",), num_arrivals=1)
  return plgpu.kernel(cluster_merge_body, out_type=jax.ShapeDtypeStruct((heads, width), x.dtype),
                      grid=(heads,), grid_names=("h",), cluster=(splits,), cluster_names=("c",),
                      scratch_types=(plgpu.SMEM((width,), x.dtype), barrier, barrier),
                      compiler_params=_PARAMS)(x)


def partials(x: jax.Array) -> jax.Array:
  """The partials' kernel: every block copies its row of ``x`` to GMEM (what the attention kernel's store does)."""
  heads, splits, _ = x.shape

  def write_partials_body(x_ref, out_ref):  # its name in profiles
    h, s = lax.axis_index("h"), lax.axis_index("s")
    out_ref[h, s, :] = x_ref[h, s, :]

  return plgpu.kernel(write_partials_body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(heads, splits),
                      grid_names=("h", "s"), compiler_params=_PARAMS)(x)


def two_launches(x: jax.Array) -> jax.Array:
  return jnp.sum(partials(x), axis=1)  # XLA's reduction kernel after ours, as the AR step's merge


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--heads", type=int, default=8)
  ap.add_argument("--splits", type=int, nargs="+", default=[2, 4, 8])
  ap.add_argument("--widths", type=int, nargs="+", default=[128])
  ap.add_argument("--iters", type=int, default=9)
  args = ap.parse_args(argv)
  if jax.devices()[0].platform != "gpu":
    raise SystemExit(f"cluster_merge_probe needs a Hopper GPU; this backend is {jax.devices()[0].platform!r}")
  for splits, width in itertools.product(args.splits, args.widths):
    x = jnp.asarray(np.random.default_rng(splits).normal(size=(args.heads, splits, width)), jnp.float32)
    want = np.asarray(x).sum(axis=1)
    for name, fn in (("cluster", cluster_merge), ("two_launches", two_launches), ("one_launch", partials)):
      program = jax.jit(fn)
      try:
        got = np.asarray(program(x))
      except Exception as e:  # noqa: BLE001 - report and go on
        print(f"splits={splits} width={width} {name}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
        continue
      right = "-" if name == "one_launch" else bool(np.allclose(got, want, rtol=1e-6, atol=1e-5))
      parts = median_kernel_us(lambda: program(x), args.iters)
      print(f"splits={splits} width={width} {name}: {sum(parts.values()):.2f} us a call, right={right} ({kernel_summary(parts)})",
            flush=True)


if __name__ == "__main__":
  main()
