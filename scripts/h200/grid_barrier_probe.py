"""What a phase boundary inside one persistent kernel costs, against a kernel launch: the number that decides whether a
persistent kernel over a decode layer's small ops (add + norm, rope, attention, merge, SwiGLU) can beat the 1.3 us
floor every launch pays (docs/results/2026-12-02-ablation-w12-loop-h200/).

``phased``: one Mosaic GPU kernel of ``--ctas`` blocks (all resident at once) and P phases. In phase p each block reads
the row its neighbour wrote in phase p - 1, adds one and writes its own row. Then every block signals the phase's GMEM
semaphore and waits until all have (a grid barrier: release-ordered signal, acquire-ordered wait). ``launches``: the
same P steps as P launches of a one-phase kernel, each reading its neighbour's row from the last launch's output.
Both are checked against P such steps on the host (``expected``): after P phases, row i holds ``x[(i + P) % ctas]``
plus one, P times. Kernel time by CUPTI, per phase, each kernel name apart: XLA zeroes the semaphores once a call (a
memset of its own).

    PYTHONPATH=$PWD python3 scripts/h200/grid_barrier_probe.py > $OUT/grid_barrier.txt
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from specpilot.costmodel.cupti import kernel_summary, median_kernel_us

WIDTH = 128  # floats a row: one per thread of the block's warpgroup
_PARAMS = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)


def phased(x: jax.Array, phases: int) -> jax.Array:
  """``phases`` neighbour steps in one kernel, a grid barrier between them; returns the last phase's rows."""
  ctas = x.shape[0]

  def grid_phases_body(x_ref, out_ref):  # its name in profiles
    i = lax.axis_index("cta")
    sems = pl.get_global(plgpu.SemaphoreType.REGULAR((phases,)))
    out_ref[0, i, :] = x_ref[(i + 1) % ctas, :] + 1.0
    for p in range(1, phases):
      plgpu.semaphore_signal(sems.at[p - 1], 1, memory_scope="gpu")
      plgpu.semaphore_wait(sems.at[p - 1], ctas, decrement=False, memory_scope="gpu")
      out_ref[p, i, :] = out_ref[p - 1, (i + 1) % ctas, :] + 1.0

  out = plgpu.kernel(grid_phases_body, out_type=jax.ShapeDtypeStruct((phases, ctas, WIDTH), x.dtype),
                     grid=(ctas,), grid_names=("cta",), compiler_params=_PARAMS)(x)
  return out[phases - 1]


def one_phase(x: jax.Array) -> jax.Array:
  """One neighbour step as a kernel of its own: row i = row (i + 1) % ctas of ``x``, plus one."""
  ctas = x.shape[0]

  def launch_phase_body(x_ref, out_ref):  # its name in profiles
    i = lax.axis_index("cta")
    out_ref[i, :] = x_ref[(i + 1) % ctas, :] + 1.0

  return plgpu.kernel(launch_phase_body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(ctas,),
                      grid_names=("cta",), compiler_params=_PARAMS)(x)


def launches(x: jax.Array, phases: int) -> jax.Array:
  for _ in range(phases):
    x = one_phase(x)
  return x


def expected(x: np.ndarray, phases: int) -> np.ndarray:
  """P neighbour steps, each adding one in f32 as the kernels do: ``(x + 1) + 1`` rounds where ``x + 2`` does not (the
  eighteenth session's closed form did, and every run of two or more phases read ``right=False``)."""
  for _ in range(phases):
    x = np.roll(x, -1, axis=0) + np.float32(1)
  return x


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--ctas", type=int, nargs="+", default=[64, 128])
  ap.add_argument("--phases", type=int, nargs="+", default=[1, 2, 8, 36])
  ap.add_argument("--iters", type=int, default=9)
  args = ap.parse_args(argv)
  if jax.devices()[0].platform != "gpu":
    raise SystemExit(f"grid_barrier_probe needs a Hopper GPU; this backend is {jax.devices()[0].platform!r}")
  for ctas in args.ctas:
    x = jnp.asarray(np.random.default_rng(ctas).normal(size=(ctas, WIDTH)), jnp.float32)
    for phases in args.phases:
      for name, fn in (("phased", phased), ("launches", launches)):
        program = jax.jit(lambda x, f=fn, p=phases: f(x, p))
        try:
          got = np.asarray(program(x))
        except Exception as e:  # noqa: BLE001 - report and go on
          print(f"ctas={ctas} phases={phases} {name}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:200]}",
                flush=True)
          continue
        right = bool(np.array_equal(got, expected(np.asarray(x), phases)))
        parts = median_kernel_us(lambda: program(x), args.iters)
        total = sum(parts.values())
        print(f"ctas={ctas} phases={phases} {name}: {total:.2f} us a call, {total / phases:.2f} a phase, "
              f"right={right} ({kernel_summary(parts)})", flush=True)


if __name__ == "__main__":
  main()
