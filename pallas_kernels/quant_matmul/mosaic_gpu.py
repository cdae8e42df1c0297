"""int8 x bf16 matmul on Hopper: a wrapper around jax's ``hopper_mixed_type_matmul_mgpu``.

jax 0.11.2 ships ``jax.experimental.pallas.ops.gpu.hopper_mixed_type_matmul_mgpu``: a
warp-specialised Mosaic GPU kernel (one TMA warpgroup, two compute warpgroups, a
persistent grid over all SMs) computing ``(a.astype(b.dtype) @ b)`` for an int8 ``a``
``[M, K]`` and a bf16/f16 ``b`` ``[K, N]``. The int8 operand must be the LHS: each
step loads the int8 tile from SMEM into registers, converts it there and feeds wgmma
from registers, so the weight crosses HBM as int8 and is never written back as bf16.
On one H200 it read 2.56 TB/s of int8 weight bytes at 64 tokens against 2.44 TB/s of
bf16 bytes for XLA's bf16 dot (/work/shared/GPU.md), i.e. about half the time of the
bf16 matmul for the same weight.

Shape of the call. ``y.T = q_t @ x.T``: the quantized weight, stored output-major as
``q_t`` ``[N, K]`` (``QuantArray``'s layout, chosen for this kernel; transposing an
int8 ``[K, N]`` weight per call would cost a full extra int8 read and write), is the
kernel's ``a``; the activations, transposed and padded to a multiple of
``tile_tokens``, are its ``b`` (tokens on wgmma N, small, so the copy is cheap). The
kernel writes f32 ``[N, tokens]``; the per-channel scale is applied after it, exactly
as the reference does, so the two differ only in f32 accumulation order.

Not testable on CPU: the kernel takes its wgmma LHS from registers, which Pallas'
GPU-interpret mode does not support (``InterpretGPUParams`` fails in its wgmma
callback), and it does not expose ``interpret=`` either. Its correctness here rests on
the GPU-only test in ``tests/test_quant_matmul.py``.

fp8 weights are not dispatched: the kernel raises NotImplementedError for any
combination but int8 x bf16/f16 ("unbenchmarked").
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from pallas_kernels.quant_matmul.config import TuningConfig

_ACTIVATION_DTYPES = (jnp.bfloat16, jnp.float16)


def _round_up(a: int, b: int) -> int:
    return -(-a // b) * b


def check_supported(x: jax.Array, q_t: jax.Array, config: TuningConfig) -> None:
    """Raises NotImplementedError (the caller falls back) for what the kernel does not tile."""
    n, k = q_t.shape
    if x.shape[-1] != k:
        raise ValueError(f"quant matmul: x has {x.shape[-1]} features, the weight expects {k}")
    if q_t.dtype != jnp.int8:
        raise NotImplementedError(f"the Hopper kernel takes int8 weights, got {q_t.dtype}")
    if x.dtype not in _ACTIVATION_DTYPES:
        raise NotImplementedError(f"the Hopper kernel takes bf16/f16 activations, got {x.dtype}")
    if n % config.block_out:
        raise NotImplementedError(f"N={n} is not a multiple of 2 * tile_out = {config.block_out}")
    if k % config.tile_k:
        raise NotImplementedError(f"K={k} is not a multiple of tile_k={config.tile_k}")


def padded_tokens(m: int, config: TuningConfig) -> int:
    """Token rows after padding to the kernel's token tile (at least one tile)."""
    return _round_up(max(m, 1), config.tile_tokens)


def _jax_config(config: TuningConfig):
    from jax.experimental.pallas.ops.gpu import hopper_mixed_type_matmul_mgpu as mixed

    return mixed.TuningConfig(
        tile_m=config.tile_out,
        tile_n=config.tile_tokens,
        tile_k=config.tile_k,
        max_concurrent_steps=config.max_concurrent_steps,
        epi_tile_m=64,
        epi_tile_n=64,
        grid_minor_dim=mixed.MatmulDimension.N,  # neighbouring blocks share a weight tile (L2)
        grid_tile_width=config.grid_tile_width,
        wg_dimension=mixed.MatmulDimension.M,  # warpgroups split channels, not the few tokens
        cluster_dimension=None,
    )


def quant_matmul(x: jax.Array, q_t: jax.Array, scale: jax.Array, *, config: TuningConfig | None = None) -> jax.Array:
    """``(x @ q_t.T) * scale`` for bf16/f16 ``x`` ``[..., K]`` and int8 ``q_t`` ``[N, K]``.

    Unsupported inputs raise NotImplementedError (at trace time) so ``quant_matmul.matmul``
    can fall back loudly.
    """
    from jax.experimental.pallas.ops.gpu import hopper_mixed_type_matmul_mgpu as mixed

    config = config or TuningConfig()
    check_supported(x, q_t, config)
    n, k = q_t.shape
    lead = x.shape[:-1]
    m = math.prod(lead)
    mp = padded_tokens(m, config)
    x_t = jnp.pad(x.reshape(m, k), ((0, mp - m), (0, 0))).T  # [K, Mp]
    y_t = mixed.mixed_matmul_kernel(q_t, x_t, out_dtype=jnp.float32, config=_jax_config(config))
    y = y_t[:, :m].T * scale
    return y.astype(x.dtype).reshape(*lead, n)
