"""W12 x bf16 matmul left to XLA: decode written as elementwise ops on the two planes, then one dot.

The reference (`unpack`, then a dot) scatters the escapes into the weight, and a scatter is a fusion
barrier: XLA materialises the bf16 weight and reads it again, so a W12 step took 5.8x a bf16 one on the H200
(docs/results/2026-11-30-roofline-h200/). Here the weight is never scattered. Planes -> bits -> bf16 is
pure elementwise, broadcast and reshape work, which XLA's GPU GEMM fusion may pull into the dot's operand
load (reading 12 bits per weight, not 16). The escapes decode to +0.0 and are added afterwards as a
f32 correction (`add_escapes`, as after the Mosaic GPU kernel).

Whether XLA fuses the decode on Hopper is an experiment, not a promise. `scripts/bench_kernels.py` and
`scripts/bench_roofline.py` time it as `xla_decode` next to the bf16 dot. Off the GPU it is simply another
correct path, tested against the reference.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.w12.format import W12Array, add_escapes, unpack_transposed_bits


def w12_matmul_xla_decode(x: jax.Array, packed: W12Array) -> jax.Array:
  """``x @ W`` for ``x`` ``[..., K]``: f32 accumulation, the escape patch, result in ``x.dtype``."""
  k, n = packed.shape
  if x.shape[-1] != k:
    raise ValueError(f"w12 matmul: x has {x.shape[-1]} features, the weight expects {k}")
  lead = x.shape[:-1]
  x2 = x.reshape(-1, k)
  w_t = jax.lax.bitcast_convert_type(unpack_transposed_bits(packed)[:, :k], jnp.bfloat16)  # [N, K]
  # bf16 x bf16 with f32 accumulation is exact products at any precision, so bf16 activations take the default
  # one, as the int8 reference's dot does (XLA fuses that one's dequantisation into its GEMM on the H200;
  # HIGHEST, as run on 2026-11-30, was not fused: docs/results/2026-11-30-kernels-h200-splitk). Wider
  # activations keep HIGHEST, which stops their rounding to bf16.
  precision = jax.lax.Precision.DEFAULT if x2.dtype == jnp.bfloat16 else jax.lax.Precision.HIGHEST
  y = jax.lax.dot_general(x2, w_t, (((1,), (1,)), ((), ())), precision=precision,
                          preferred_element_type=jnp.float32)
  if packed.has_side_table:
    y = add_escapes(y, x2, packed)
  return y.astype(x.dtype).reshape(*lead, n)
