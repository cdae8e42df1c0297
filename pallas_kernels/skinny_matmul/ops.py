"""The public few-token bf16 matmul: one entry point, the implementation picked per backend and size.

What runs when (``implementation=None``):
- ``DEFAULT == "mosaic_gpu"``, a Hopper GPU, at most ``MAX_TOKENS`` token rows, bf16 ``x`` and ``w``,
  ``N`` a multiple of 64 and ``K`` of ``tile_k``: the Mosaic GPU kernel (``mosaic_gpu.py``);
- anything else (CPU, prefill-sized M, f32, odd shapes): XLA's dot (``reference.py``); on a Hopper an
  unsupported shape logs a warning at trace time, so a fallback is never silent.
Naming an implementation disables the fallback, which is what tests and benchmarks want.
"""

from __future__ import annotations

import logging
import math
from typing import Literal

import jax
import jax.numpy as jnp

from pallas_kernels.add_rms_norm.reference import rms_norm
from pallas_kernels.device import on_hopper as _on_hopper  # a module name tests can patch
from pallas_kernels.skinny_matmul.config import TuningConfig
from pallas_kernels.skinny_matmul.reference import skinny_matmul_reference

_log = logging.getLogger(__name__)

Implementation = Literal["xla", "mosaic_gpu"]
_IMPLEMENTATIONS = ("xla", "mosaic_gpu")
DEFAULT: Implementation = "xla"
"""``"xla"``, measured (docs/results/2026-11-30-skinny-matmul-h200/). Alone the kernel leaves the fused decode loop
where it was (5.85 against 5.87 ms a step); with XLA command buffers it gave 5.03 against 5.29. With attention on the
tree-attention kernel (``attention=pallas_tree``) its loop is the best AR step so far, 4.69-4.87 ms against XLA's
5.12-5.57, command buffers or not (docs/results/2026-11-30-ar-tree-attention-h200/). A 36-layer forward then compiles
in 45 s instead of 7 (Mosaic GPU compiles each of its ~145 call sites), which the search loop would pay per
candidate. Benchmarks and deployments that want it set it
(``bench.py --matmul mosaic_gpu --command-buffers``, ``bench_roofline.py --matmul mosaic_gpu``)."""
MAX_TOKENS = 8
"""Above this many token rows, XLA's dot: on the H200 the kernel beats it at M = 1 (Qwen3-8B's five layer shapes,
4.06 against 4.30 ms per step of matmuls) and only ties at M = 16 and 64
(docs/results/2026-11-30-skinny-matmul-h200/); at 256 a verify pass is compute-bound and this kernel (one
warpgroup, 64-row wgmmas, waited each step) is built for streaming, not for peak FLOPs."""


FUSE_NORM = False
"""Whether the target model hands the RMSNorm before a linear layer to this kernel (``norm=``, its prologue) where
the kernel serves the layer (``fuses_norm``), instead of normalising in a kernel of its own (``add_rms_norm``).
Off until the H200 times it (``bench_roofline.py`` row ``norm_matmul_decode_loop``; written in the eighth session
after its last device call)."""
FUSE_SWIGLU = False
"""The same for the MLP's ``silu(gate) * up`` before the down projection (``swiglu=``; ``fuses_swiglu``); row
``prologue_decode_loop`` times both prologues together."""


def _kernel_chosen(x: jax.Array) -> bool:
  """``DEFAULT`` asks for the kernel, ``x`` has at most ``MAX_TOKENS`` token rows and the device is a Hopper."""
  return DEFAULT == "mosaic_gpu" and math.prod(x.shape[:-1]) <= MAX_TOKENS and _on_hopper()


def _kernel_serves(x: jax.Array, w) -> bool:
  """``_kernel_chosen`` and the kernel takes the operands as they are: bf16 ``x`` and a plain bf16 weight."""
  return (_kernel_chosen(x) and isinstance(w, jax.Array) and w.dtype == jnp.bfloat16
          and x.dtype == jnp.bfloat16)


def fuses_norm(x: jax.Array, w) -> bool:
  """Whether ``matmul(x, w, norm=...)`` runs the norm inside the Mosaic GPU kernel: ``FUSE_NORM``, the kernel on,
  a Hopper, at most ``MAX_TOKENS`` bf16 token rows and a plain bf16 weight."""
  return FUSE_NORM and _kernel_serves(x, w)


def fuses_swiglu(gate_up: jax.Array, w) -> bool:
  """Whether ``matmul(gate_up, w, swiglu=True)`` runs the SwiGLU inside the kernel (``FUSE_SWIGLU``, as above)."""
  return FUSE_SWIGLU and _kernel_serves(gate_up, w)


def _mosaic_gpu(x, w, config, norm, swiglu):
  from pallas_kernels.skinny_matmul import mosaic_gpu  # lazy: needs a Mosaic GPU capable jaxlib

  return mosaic_gpu.skinny_matmul(x, w, norm=norm, swiglu=swiglu, config=config)


def _reference(x, w, norm, swiglu):
  if norm is not None:
    x = rms_norm(x, norm[0], norm[1])
  if swiglu:
    gate, up = jnp.split(x, 2, axis=-1)
    x = jax.nn.silu(gate) * up
  return skinny_matmul_reference(x, w)


def matmul(x: jax.Array, w: jax.Array, *, norm: tuple[jax.Array, float] | None = None, swiglu: bool = False,
           implementation: Implementation | None = None, config: TuningConfig | None = None) -> jax.Array:
  """``x @ w`` for ``x`` ``[..., K]`` and ``w`` ``[K, N]``, f32 accumulation, returned in ``x.dtype``; with
  ``norm=(g, eps)``, ``rms_norm(x, g, eps) @ w``; with ``swiglu``, ``x = [gate | up]`` and
  ``(silu(gate) * up) @ w``."""
  if implementation not in (None, *_IMPLEMENTATIONS):
    raise ValueError(f"unknown skinny_matmul implementation {implementation!r}; expected one of {_IMPLEMENTATIONS}")
  if implementation == "mosaic_gpu":
    return _mosaic_gpu(x, w, config, norm, swiglu)
  if implementation == "xla" or not _kernel_chosen(x):
    return _reference(x, w, norm, swiglu)
  try:
    return _mosaic_gpu(x, w, config, norm, swiglu)
  except (NotImplementedError, ImportError) as e:
    _log.warning("skinny matmul falls back to XLA for x%s %s, W%s %s: %s", x.shape, x.dtype, w.shape, w.dtype, e)
    return _reference(x, w, norm, swiglu)
