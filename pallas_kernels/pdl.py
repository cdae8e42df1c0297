"""Programmatic dependent launch (PDL) for this package's Mosaic GPU kernels (Hopper).

Why: a decode step runs ~700 kernels back to back, and each launch waits for the previous kernel to finish and
flush before its blocks are even scheduled; every matmul then pays its pipeline's ramp (~4.5 us of ramp and tail
a call on the H200, 0.65 ms over the 145 matmuls of a Qwen3-8B step: docs/results/2026-11-30-ar-tree-attention-h200/).
With PDL a kernel is launched while its predecessor still runs, its blocks get the SMs the predecessor's blocks
leave, and it waits (``griddepcontrol.wait``) only before touching memory.

What a kernel does when ``ENABLED`` (``begin_kernel``, in every warpgroup of every block):
1. ``griddepcontrol_wait()``: returns once every kernel this one depends on has completed and its writes are
   visible. Nothing its predecessor wrote is read before it, and nothing is written before it.
2. ``griddepcontrol_launch_dependents()``: the next kernel in the stream, if launched with PDL (ours are, through
   the ``mosaic_gpu.uses_pdl`` module attribute the wait sets; XLA's own fusions with ``--xla_gpu_enable_pdl``),
   may be scheduled now instead of when this grid exits, so its launch and block setup overlap this kernel's
   work and tail. It triggers only after every block of this grid has run it, so all our blocks are resident
   first: the early dependents cannot starve this grid.
A small kernel between two big ones (the norms, the rope, SwiGLU, the attention merge) calls it with
``release_first``: the trigger, then the wait. Its successor (a matmul, or the attention after the rope) then starts
while the kernel before the small one is still running, and issues its first weight (or cache) loads into the SMs
that kernel's tail leaves idle. The trigger still fires only once every block of the small kernel has run it, so
its own blocks are never crowded out.

Loads before the wait. A kernel may read, before its wait, what no kernel of the last few launches wrote: the skinny
matmul its first weight tiles (no kernel writes a weight), the tree-attention kernel its cache prefix when the
caller says the prefix is settled (``cache_settled``: the models' forward writes the new K/V after its last layer).
How far back "the last few" reaches: a kernel starts at the earliest when its predecessor has triggered, and a
predecessor that releases first triggers as it starts, so a kernel that follows a small one may start while the
kernel before that one still runs; since two small kernels never follow each other in the models, two launches back
is as far as it reaches, and a weight or a settled prefix is older than that. Two assumptions make that hold: a
weight enters the program as an input (not computed in it right before its matmul), and no kernel of another origin
releases its successor before its own wait (XLA's fusions, launched as dependents when command buffers are off, might;
the models' early loads then still read only program inputs and a cache written at the previous step's end).

A kernel that follows an XLA kernel launched without PDL behaves as without it (the wait returns at once).
Interpret mode has no grid dependencies: nothing is emitted there. ``ENABLED`` is read at trace time (like
``skinny_matmul.ops.DEFAULT``): set it before the first trace of a program.

Measured on the H200 (docs/results/2026-12-01-pdl-h200/): the AR decode loop 4.695 ms with and without it; in a
chain of 64 dependent 4096 x 4096 matmuls it saved 0.25 us a launch where only our kernels follow each other and
cost 2.8 us a launch with an XLA kernel between. Then every kernel waited first thing; the loads before the wait and
the small kernels' early release (above, fourteenth session) were built after, with SwiGLU and the attention merge
on kernels of their own so that no XLA kernel breaks a layer's chain (``bench_roofline.py`` rows
``pdl_rope_decode_loop``, ``pdl_chain_decode_loop``).
"""

from __future__ import annotations

from jax.experimental.pallas import mosaic_gpu as plgpu

ENABLED = False
"""Off: no gain measured. Inside XLA's command buffers (the default for a loop body's kernels) nothing overlaps at all:
the kernel times of a step sum to less than its wall time (4.434 against 4.397 ms without PDL). Without command
buffers the kernels overlap and the launch gaps go (4.820 -> 4.374 ms), which only matches the command buffers
(docs/results/2026-12-01-pdl-early-loads-h200/). ``bench_roofline.py`` rows ``pdl_rope_decode_loop``,
``pdl_chain_decode_loop`` and ``--pdl`` turn it on; ``XLA_FLAGS=--xla_gpu_enable_command_buffer=`` turns the
graphs off."""


def begin_kernel(interpret, *, release_first: bool = False) -> None:
  """Call in a Mosaic GPU kernel body (every thread) before it reads anything its predecessor may have written, and
  before it writes anything: waits for the kernels it depends on, then lets its own dependents launch
  (``release_first``: the other way round, for a small kernel between two big ones; module docstring).
  A no-op when ``ENABLED`` is false or the kernel is interpreted."""
  if ENABLED and interpret is None:
    if release_first:
      plgpu.griddepcontrol_launch_dependents()
    plgpu.griddepcontrol_wait()
    if not release_first:
      plgpu.griddepcontrol_launch_dependents()
