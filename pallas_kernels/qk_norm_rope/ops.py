"""The public q/k norm + rope: one entry point, the implementation picked per backend.

``DEFAULT == "xla"``: the jnp reference (what XLA fuses itself). ``"mosaic_gpu"`` on an H100/H200 with 16-bit
activations and a head size the kernel tiles runs ``mosaic_gpu.qk_norm_rope``; anything else falls back to the
reference, with a warning on a Hopper, so a fallback is never silent. Naming an implementation disables the
fallback, which is what tests and benchmarks want.
"""

from __future__ import annotations

import logging
from typing import Literal

import jax

from pallas_kernels.device import on_hopper as _on_hopper  # a module name tests can patch
from pallas_kernels.qk_norm_rope.reference import qk_norm_rope_reference
from pallas_kernels.split_k import SplitKPartials
from pallas_kernels.tree_attention.ops import unpack_heads

_log = logging.getLogger(__name__)

Implementation = Literal["xla", "mosaic_gpu"]
_IMPLEMENTATIONS = ("xla", "mosaic_gpu")
DEFAULT: Implementation = "xla"
"""``"xla"``, opt-in as the add + norm kernel is: on the H200 it took the AR step 4.442 -> 4.332 ms, tokens
identical (docs/results/2026-12-01-rope-swiglu-h200/). The config's ``kernels.rope`` (``kernels=hopper``) or the
benchmarks' ``--rope`` set it (``pallas_kernels.choices``)."""


def _mosaic_gpu(*args, **kwargs):
  from pallas_kernels.qk_norm_rope import mosaic_gpu  # lazy: needs a Mosaic GPU capable jaxlib

  return mosaic_gpu.qk_norm_rope(*args, **kwargs)


def _reference(qkv, q_norm, k_norm, cos, sin, *, num_kv_heads, eps, split):
  heads = qk_norm_rope_reference(qkv, q_norm, k_norm, cos, sin, num_kv_heads=num_kv_heads, eps=eps)
  return unpack_heads(heads, num_kv_heads) if split else heads


def qk_norm_rope(qkv: jax.Array | SplitKPartials, q_norm: jax.Array | None, k_norm: jax.Array | None,
                 cos: jax.Array, sin: jax.Array, *, num_kv_heads: int, eps: float, split: bool = False,
                 implementation: Implementation | None = None):
  """The heads ``[B, T, Hq + 2 Hkv, D]`` of a fused projection ``qkv`` ``[B, T, (Hq + 2 Hkv) D]`` (or its unsummed K
  splits): q's and k's RMS-normed per head with ``q_norm`` / ``k_norm`` (None, None: no norm) and rotated by
  ``cos`` / ``sin`` ``[B, T, D]`` (HF's half-rotation layout), v's as projected. ``split=True``: ``(q, k, v)``."""
  if implementation not in (None, *_IMPLEMENTATIONS):
    raise ValueError(f"unknown qk_norm_rope implementation {implementation!r}; expected one of {_IMPLEMENTATIONS}")
  args = (qkv, q_norm, k_norm, cos, sin)
  kwargs = {"num_kv_heads": num_kv_heads, "eps": eps, "split": split}
  if implementation == "mosaic_gpu":
    return _mosaic_gpu(*args, **kwargs)
  if implementation == "xla" or DEFAULT == "xla" or not _on_hopper():
    return _reference(*args, **kwargs)
  try:
    return _mosaic_gpu(*args, **kwargs)
  except (NotImplementedError, ImportError) as e:
    _log.warning("qk_norm_rope falls back to XLA for qkv%s %s: %s", tuple(qkv.shape), qkv.dtype, e)
    return _reference(*args, **kwargs)
