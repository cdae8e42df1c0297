"""Which implementation each swappable op of the models runs, set in one place for the whole process.

Each op's public entry point reads its module's ``DEFAULT`` when a model is traced:
- ``"xla"``: XLA's own ops (the jnp reference; the plain-XLA path every kernel is checked against);
- ``"mosaic_gpu"``: the op's Hopper kernel, which falls back to XLA, with a warning, on any other backend or for a
  shape it does not tile. So a choice is safe on every machine: on a CPU it changes nothing.

The config's ``kernels`` group (``conf/kernels/``: ``xla``, ``hopper``) and the benchmarks' ``--matmul``, ``--norm``,
``--rope``, ``--swiglu``, ``--swiglu-matmul``, ``--qkv-rope-matmul`` and ``--pdl`` flags all go through ``use``. The
choice is process-wide because programs read it when they are traced: set it before the first trace
(``specpilot.build.load_models`` does).
Weight formats (``engine.weight_format``) and attention (``engine.attention``) are engine knobs instead: they are
arguments of the traced functions, so one process can run several.
"""

from __future__ import annotations

import importlib

OPS = {
    "matmul": "pallas_kernels.skinny_matmul.ops",  # bf16 linears with few token rows
    "norm": "pallas_kernels.add_rms_norm.ops",  # residual add + RMSNorm (sums the o / down projections' K splits)
    "rope": "pallas_kernels.qk_norm_rope.ops",  # q/k norm + rope after each q|k|v projection
    "swiglu": "pallas_kernels.swiglu.ops",  # the MLP's activation
    "swiglu_matmul": "pallas_kernels.swiglu_matmul.ops",  # gate|up with SwiGLU in the matmul's epilogue
    "qkv_rope_matmul": "pallas_kernels.qkv_rope_matmul.ops",  # q|k|v with the q/k norm + rope in its epilogue
}


def _module(op: str):
    return importlib.import_module(OPS[op])


def current() -> dict:
    """Every op's implementation and whether PDL is on, as ``use`` takes them."""
    from pallas_kernels import pdl

    return {**{op: _module(op).DEFAULT for op in OPS}, "pdl": pdl.ENABLED}


def use(*, pdl: bool | None = None, **implementations: str | None) -> dict:
    """Set the named ops' implementations (``None`` leaves one as it is) and PDL (``pallas_kernels.pdl``: every
    Mosaic GPU kernel launched with programmatic dependent launch); returns the settings before, for restoring.
    An unknown op or implementation (the op module's own ``_IMPLEMENTATIONS``) is a ``ValueError`` naming it, raised
    before anything is set."""
    for op, impl in implementations.items():
        if op not in OPS:
            raise ValueError(f"kernels: unknown op {op!r}; expected one of {', '.join(OPS)}")
        known = _module(op)._IMPLEMENTATIONS
        if impl is not None and impl not in known:
            raise ValueError(f"kernels.{op}: unknown implementation {impl!r}; expected one of {known}")
    before = current()
    for op, impl in implementations.items():
        if impl is not None:
            _module(op).DEFAULT = impl
    if pdl is not None:
        from pallas_kernels import pdl as pdl_module

        pdl_module.ENABLED = bool(pdl)
    return before
