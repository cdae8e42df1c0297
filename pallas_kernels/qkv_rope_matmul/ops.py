"""The public q|k|v projection + q/k norm + rope: one entry point, the implementation picked per backend and size.

What runs when (``implementation=None``):
- ``DEFAULT == "mosaic_gpu"``, a Hopper GPU, at most ``mosaic_gpu.MAX_ROWS`` token rows, bf16 ``x`` and ``w_qkv``,
  head size 128 and ``K`` a multiple of ``tile_k x splits``: the fused kernel (``mosaic_gpu.py``);
- anything else: what the models ran before it, ``qk_norm_rope(skinny_matmul.matmul(x, w_qkv, reduce=False))`` (each
  of the two on its own kernel or XLA's, as their own ``DEFAULT`` says); on a Hopper an unsupported shape logs a
  warning at trace time, so a fallback is never silent.
Naming an implementation disables the fallback, which is what tests and benchmarks want (``"xla"``: the jnp
reference).
"""

from __future__ import annotations

import logging
import math
from typing import Literal

import jax

from pallas_kernels import skinny_matmul
from pallas_kernels.device import on_hopper as _on_hopper  # a module name tests can patch
from pallas_kernels.qk_norm_rope import qk_norm_rope
from pallas_kernels.qkv_rope_matmul.reference import qkv_rope_matmul_reference
from pallas_kernels.tree_attention.ops import unpack_heads

_log = logging.getLogger(__name__)

Implementation = Literal["xla", "mosaic_gpu"]
_IMPLEMENTATIONS = ("xla", "mosaic_gpu")
DEFAULT: Implementation = "xla"
"""``"xla"`` (the unfused path), as every kernel's default here (the library assumes no GPU); ``conf/kernels/
hopper.yaml``, ``bench_roofline.FAST_KERNELS`` and ``bench_roofline.py --qkv-rope-matmul mosaic_gpu`` turn it on.
Measured in the AR step on an H100: -17 to -40 us a step against the skinny kernel + the rope kernel (5.695-5.705
against 5.715-5.739 ms, two rounds, three configs; the first form, one block an SM, had cost +46 us;
docs/results/2026-12-06-fusion-ab-h100/). Read at trace time."""


def _kernel_chosen(x: jax.Array) -> bool:
  from pallas_kernels.qkv_rope_matmul.mosaic_gpu import MAX_ROWS  # a constant; the module imports Mosaic GPU

  return DEFAULT == "mosaic_gpu" and math.prod(x.shape[:-1]) <= MAX_ROWS and _on_hopper()


def _mosaic_gpu(*args, **kwargs):
  from pallas_kernels.qkv_rope_matmul import mosaic_gpu  # lazy: needs a Mosaic GPU capable jaxlib

  return mosaic_gpu.qkv_rope_matmul(*args, **kwargs)


def _unfused(x, w_qkv, q_norm, k_norm, cos, sin, **kwargs):
  return qk_norm_rope(skinny_matmul.matmul(x, w_qkv, reduce=False), q_norm, k_norm, cos, sin, **kwargs)


def _reference(x, w_qkv, q_norm, k_norm, cos, sin, *, num_kv_heads, eps, split):
  heads = qkv_rope_matmul_reference(x, w_qkv, q_norm, k_norm, cos, sin, num_kv_heads=num_kv_heads, eps=eps)
  return unpack_heads(heads, num_kv_heads) if split else heads


def qkv_rope_matmul(x: jax.Array, w_qkv: jax.Array, q_norm: jax.Array | None, k_norm: jax.Array | None,
                    cos: jax.Array, sin: jax.Array, *, num_kv_heads: int, eps: float, split: bool = False,
                    implementation: Implementation | None = None):
  """The heads ``[B, T, Hq + 2 Hkv, D]`` of ``x @ w_qkv`` (``x`` ``[B, T, K]``) with q's and k's RMS-normed per head
  and rotated, v's as projected (``qk_norm_rope``'s contract); ``split=True``: ``(q, k, v)``. Like
  ``skinny_matmul.matmul``, the kernel loads its first weight tiles before the PDL wait: ``w_qkv`` must not be written
  by the kernel just before it."""
  if implementation not in (None, *_IMPLEMENTATIONS):
    raise ValueError(f"unknown qkv_rope_matmul implementation {implementation!r}; expected one of {_IMPLEMENTATIONS}")
  args = (x, w_qkv, q_norm, k_norm, cos, sin)
  kwargs = {"num_kv_heads": num_kv_heads, "eps": eps, "split": split}
  if implementation == "mosaic_gpu":
    return _mosaic_gpu(*args, **kwargs)
  if implementation == "xla":
    return _reference(*args, **kwargs)
  if not _kernel_chosen(x):
    return _unfused(*args, **kwargs)
  try:
    return _mosaic_gpu(*args, **kwargs)
  except (NotImplementedError, ImportError) as e:
    _log.warning("qkv_rope_matmul falls back to two kernels for x%s %s, W%s %s: %s", x.shape, x.dtype, w_qkv.shape,
                 w_qkv.dtype, e)
    return _unfused(*args, **kwargs)
