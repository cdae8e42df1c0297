"""Programmatic dependent launch (PDL) for this package's Mosaic GPU kernels (Hopper).

Why: a decode step runs ~700 kernels back to back, and each launch waits for the previous kernel to finish and
flush before its blocks are even scheduled; every matmul then pays its pipeline's ramp (~4.5 us of ramp and tail
a call on the H200, 0.65 ms over the 145 matmuls of a Qwen3-8B step: docs/results/2026-11-30-ar-tree-attention-h200/).
With PDL a kernel is launched while its predecessor still runs, its blocks get the SMs the predecessor's blocks
leave, and it waits (``griddepcontrol.wait``) only before touching memory.

What a kernel does when ``ENABLED`` (``begin_kernel``, first thing in every warpgroup of every block):
1. ``griddepcontrol_wait()``: returns once every kernel this one depends on has completed and its writes are
   visible. Nothing is read or written before it, so there is no read-after-write or write-after-read hazard, and
   since every kernel here waits unconditionally, completion chains: a kernel that finished implies its
   predecessors finished.
2. ``griddepcontrol_launch_dependents()``: the next kernel in the stream, if launched with PDL (ours are, through
   the ``mosaic_gpu.uses_pdl`` module attribute the wait sets; XLA's own fusions with ``--xla_gpu_enable_pdl``),
   may be scheduled now instead of when this grid exits, so its launch and block setup overlap this kernel's
   work and tail. It triggers only after every block of this grid has run it, so all our blocks are resident
   first: the early dependents cannot starve this grid.

A kernel that follows an XLA kernel launched without PDL behaves as without it (the wait returns at once).
Interpret mode has no grid dependencies: nothing is emitted there. ``ENABLED`` is read at trace time (like
``skinny_matmul.ops.DEFAULT``): set it before the first trace of a program.

Measured on the H200 (docs/results/2026-12-01-pdl-h200/): the AR decode loop 4.695 ms with and without it; in a
chain of 64 dependent 4096 x 4096 matmuls it saved 0.25 us a launch where only our kernels follow each other and
cost 2.8 us a launch with an XLA kernel between. What it does not do yet: issue the weight loads (which do not
depend on the predecessor) before the wait. That needs a hand-written pipeline (``emit_pipeline`` loads weights and
activations together) and is the one form of PDL left to try.
"""

from __future__ import annotations

from jax.experimental.pallas import mosaic_gpu as plgpu

ENABLED = False
"""Off: no gain measured (above). ``bench_roofline.py`` row ``pdl_decode_loop`` and ``--pdl`` turn it on."""


def begin_kernel(interpret) -> None:
  """Call first in a Mosaic GPU kernel body (every thread): waits for the kernels it depends on, then lets its own
  dependents launch. A no-op when ``ENABLED`` is false or the kernel is interpreted."""
  if ENABLED and interpret is None:
    plgpu.griddepcontrol_wait()
    plgpu.griddepcontrol_launch_dependents()
