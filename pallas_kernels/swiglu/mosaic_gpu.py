"""SwiGLU in one Mosaic GPU kernel (Hopper; runs in GPU interpret mode too).

Why a kernel for one elementwise op: XLA already makes it one kernel (``loop_convert_fusion``, ~1.4 us a layer of a
Qwen3-8B decode step on the H200); this one was built so that, under ``pallas_kernels.pdl``, a layer's chain is all the
package's kernels (the down projection after it starting its weight loads while it runs). It reads the gate|up
projection's output as the skinny kernel wrote it (``SplitKPartials``: the padded result, or its unsummed K splits),
so no XLA slice or sum runs between the two.

Measured on the H200 (docs/results/2026-12-01-pdl-early-loads-h200/): 1.5 us a call in a Qwen3-8B decode step, 0.1
us more than XLA's fusion. PDL, the reason for it, overlaps nothing inside XLA's command buffers, and without them XLA
launches its own fusions as programmatic dependents too.

One block of 128 threads per (token row, 1024 output channels): each thread reads 8 gate and the 8 matching up
values, computes ``silu(gate) * up`` in f32 (``gate / (1 + exp(-gate)) * up``) and rounds once, as
``reference.swiglu_reference`` does; only the f32 exponential's last bit may differ from XLA's.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import pdl
from pallas_kernels.lowering import lowered_once
from pallas_kernels.split_k import SplitKPartials, load_row

_SUPPORTED_DTYPES = (jnp.bfloat16, jnp.float16)
CHUNK = 1024
"""Output channels per block: 128 threads x 8-element vectors. The intermediate size must be a multiple of it."""


def check_supported(gate_up: jax.Array | SplitKPartials) -> None:
  """ValueError for inconsistent inputs; NotImplementedError (the caller falls back) for what the kernel does not
  tile."""
  n = gate_up.shape[-1]
  if n % 2:
    raise ValueError(f"swiglu: the fused gate|up projection has an odd width {n}")
  if jnp.dtype(gate_up.dtype) not in map(jnp.dtype, _SUPPORTED_DTYPES):
    raise NotImplementedError(f"the swiglu kernel takes 16-bit activations, got {gate_up.dtype}")
  if (n // 2) % CHUNK:
    raise NotImplementedError(f"intermediate size {n // 2} is not a multiple of {CHUNK}")
  if not math.prod(gate_up.shape[:-1]):
    raise NotImplementedError("no rows: a kernel of an empty grid")


@lowered_once("interpret")
def swiglu(gate_up: jax.Array | SplitKPartials, *, interpret: plgpu.InterpretGPUParams | None = None) -> jax.Array:
  """``reference.swiglu_reference`` in one kernel: ``[..., I]`` from the fused projection ``[..., 2 I]``."""
  check_supported(gate_up)
  lead, n = tuple(gate_up.shape[:-1]), gate_up.shape[-1]
  inter, m = n // 2, math.prod(gate_up.shape[:-1])
  dtype = jnp.dtype(gate_up.dtype)
  if isinstance(gate_up, SplitKPartials):
    x_arg = lax.bitcast_convert_type(gate_up.halves, jnp.uint16)  # a bitcast: no kernel
  else:
    x_arg = gate_up.reshape(m, n)

  def swiglu_body(x_ref, o_ref):  # the body's name is the kernel's name in profiles
    pdl.begin_kernel(interpret, release_first=True)  # a small kernel: its successor may start now
    row, chunk = lax.axis_index("row"), lax.axis_index("chunk")
    gate = load_row(x_ref, row, dtype, pl.ds(chunk * CHUNK, CHUNK)).astype(jnp.float32)
    up = load_row(x_ref, row, dtype, pl.ds(inter + chunk * CHUNK, CHUNK)).astype(jnp.float32)
    o_ref[row, pl.ds(chunk * CHUNK, CHUNK)] = (gate / (1.0 + jnp.exp(-gate)) * up).astype(dtype)

  call = plgpu.kernel(swiglu_body, out_type=jax.ShapeDtypeStruct((m, inter), dtype), grid=(m, inter // CHUNK),
                      grid_names=("row", "chunk"), interpret=interpret,
                      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup))
  return call(x_arg).reshape(*lead, inter)
