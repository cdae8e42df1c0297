"""One lowering per distinct kernel in a program (``lowered_once``).

Why: jax lowers a Mosaic GPU kernel call (its body traced, layouts inferred, the Mosaic GPU dialect lowered: ~0.2 s
a kernel on this repository's 2-core machine) once per call site, and a 36-layer Qwen3-8B decode step on the fast
kernels has ~290 call sites of ten distinct kernels. Tracing and lowering that one step for ``cuda`` took 64.2 s
here (3.0 s wrapped; ``scripts/lowering_time.py``, docs/results/2026-12-06-lowering-time-cpu/), and a ``bench.py``
run of AR + DDTree on the fast path spent 245.6 s compiling on the H200 before its first round
(docs/results/2026-12-06-tree-probe-h200/; 32.4 s wrapped, on an H100:
docs/results/2026-12-06-lowered-once-bench-h100/).

A kernel entry wrapped in ``jax.jit`` with its static parameters traces, at every call site with equal shapes and
parameters, to the one jaxpr of jit's trace cache; jax's lowering cache then emits it once, as a function the other
sites call, and XLA inlines those calls before it optimises, so the program it compiles is the one it compiled
before.

What a kernel body reads from module state at trace time is part of the key: ``pdl.ENABLED``, which every kernel's
``pdl.begin_kernel`` reads. A wrapped entry must take every other setting it depends on as an argument (the tree
attention kernel takes ``early_cache`` and ``lse_apart`` so), or a later trace with the setting changed would get the
kernel traced before.

In Pallas interpret mode (``interpret`` set: the CPU tests) the entry runs as it is, unwrapped: there is no GPU
lowering to save, and an eager model forward whose interpreted kernels each ran as a jitted call of their own hung
once in the test suite (an interpreter callback waiting inside XLA's CPU runtime), where unwrapped it never has.
"""

from __future__ import annotations

import functools
import inspect

import jax

from pallas_kernels import pdl


def lowered_once(*static_argnames: str):
  """Decorator: ``fn`` under ``jax.jit`` with the parameters ``static_argnames`` static (hashable: ints, tuples,
  frozen configs, dtypes, ``InterpretGPUParams``) and every other one traced, keyed on ``pdl.ENABLED`` as well.
  Arguments may be passed by position or by name (they are bound to ``fn``'s signature first)."""

  def wrap(fn):
    signature = inspect.signature(fn)
    unknown = set(static_argnames) - set(signature.parameters)
    if unknown:
      raise TypeError(f"lowered_once({fn.__name__}): no parameter named {', '.join(sorted(unknown))}")

    def keyed(_pdl_enabled, **arguments):
      del _pdl_enabled  # a key only: the body reads pdl.ENABLED itself
      return fn(**arguments)

    jitted = jax.jit(keyed, static_argnames=(*static_argnames, "_pdl_enabled"))

    @functools.wraps(fn)
    def call(*args, **kwargs):
      bound = signature.bind(*args, **kwargs)
      bound.apply_defaults()
      if bound.arguments.get("interpret") is not None:  # interpret mode: nothing to lower for a GPU
        return fn(**bound.arguments)
      return jitted(_pdl_enabled=pdl.ENABLED, **bound.arguments)

    return call

  return wrap
