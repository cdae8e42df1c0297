"""How XLA fuses the tree-attention kernel's split merge, per way of writing it: kernels and wall time.

The merge (``tree_attention.mosaic_gpu._combine``) runs after every split attention call: 5 a drafter pass, 36 an AR
step. Written split by split over an lse that is one value per row, XLA on the H200 made it two kernels (the rows'
max in one, the weighted sum in the other: docs/results/2026-12-01-combine-h200/). This probe compiles each candidate
form at the drafter's, the AR step's and a 64-node verify's shapes, counts the kernels of the optimised HLO, and times
a jitted chain of ``--links`` merges (each link's output feeds the next link's partials, so nothing is hoisted).

Forms (the lse operand each takes is what the kernel would write):
- ``row``: lse ``[..., 32]`` (a row's value in every lane), read as ``[..., :1]``, ``-inf`` for an empty row;
- ``row_finite``: the same with a finite empty-row sentinel, so no ``isfinite`` select;
- ``lanes``: lse ``[..., 32]`` broadcast over ``D / 32`` groups of lanes (4x reuse, not 128x);
- ``full``: lse ``[..., D]``, one value per output element (no broadcast at all);
- ``online``: ``row``'s operand merged as online softmax does, split after split.

    PYTHONPATH=$PWD python3 scripts/h200/combine_probe.py > $OUT/combine.txt
"""

from __future__ import annotations

import argparse
import re

import jax
import jax.numpy as jnp
import numpy as np
from chain_timing import wall_ms

EMPTY = -1e30  # the finite sentinel of ``row_finite``: 2^(EMPTY - m) is 0 for any finite m


def _top(lse):
  """The largest lse of each element, split by split."""
  top = lse[0]
  for part in lse[1:]:
    top = jnp.maximum(top, part)
  return top


def row(out_parts, lse):
  lse = [lse[s, ..., :1] for s in range(lse.shape[0])]
  top = _top(lse)
  base = jnp.where(jnp.isfinite(top), top, 0.0)
  total = acc = 0.0
  for s, part in enumerate(lse):
    w = jnp.exp2(part - base)
    total, acc = total + w, acc + w * out_parts[s]
  return acc / jnp.where(total > 0, total, 1.0)


def row_finite(out_parts, lse):
  lse = [lse[s, ..., :1] for s in range(lse.shape[0])]
  top = _top(lse)
  total = acc = 0.0
  for s, part in enumerate(lse):
    w = jnp.exp2(part - top)
    total, acc = total + w, acc + w * out_parts[s]
  return acc / total


def lanes(out_parts, lse):
  shape = out_parts.shape
  grouped = out_parts.reshape(*shape[:-1], shape[-1] // lse.shape[-1], lse.shape[-1])
  lse = [lse[s, ..., None, :] for s in range(lse.shape[0])]
  top = _top(lse)
  total = acc = 0.0
  for s, part in enumerate(lse):
    w = jnp.exp2(part - top)
    total, acc = total + w, acc + w * grouped[s]
  return (acc / total).reshape(shape[1:])


def full(out_parts, lse):
  return row_finite(out_parts[..., None], lse[..., None])[..., 0]


def online(out_parts, lse):
  m, acc, total = lse[0, ..., :1], out_parts[0], 1.0
  for s in range(1, lse.shape[0]):
    part = lse[s, ..., :1]
    new = jnp.maximum(m, part)
    a, b = jnp.exp2(m - new), jnp.exp2(part - new)
    acc, total, m = acc * a + out_parts[s] * b, total * a + b, new
  return acc / total


FORMS = {"row": (row, 32, -np.inf), "row_finite": (row_finite, 32, EMPTY), "lanes": (lanes, 32, EMPTY),
         "full": (full, None, EMPTY), "online": (online, 32, EMPTY)}
SHAPES = {"drafter": (8, 1, 16, 8, 4, 128), "ar": (16, 1, 1, 8, 4, 128), "verify64": (4, 1, 64, 8, 4, 128)}


def entry_kernels(hlo: str) -> int:
  """Kernels the optimised module launches: fusions and custom calls of its entry computation."""
  entry = hlo[hlo.index("\nENTRY"):]
  return len(re.findall(r"= [^=]*? (?:fusion|custom-call)\(", entry))


def inputs(shape, lanes_, empty, seed=0):
  rng = np.random.default_rng(seed)
  out_parts = rng.normal(size=shape).astype(np.float32)
  lse = rng.normal(scale=4.0, size=shape[:-1] + (1,)).astype(np.float32)
  empty_rows = rng.random(lse.shape) < 0.2
  lse[empty_rows] = empty
  out_parts[np.broadcast_to(empty_rows, shape)] = 0.0  # the kernel writes zeros for a row with no visible key
  lse = np.broadcast_to(lse, shape[:-1] + (lanes_ or shape[-1],))
  return jnp.asarray(out_parts), jnp.asarray(lse)


def chain(form, links):
  def run(out_parts, lse):
    for _ in range(links):
      merged = form(out_parts, lse)
      out_parts = out_parts + merged.astype(jnp.bfloat16).astype(jnp.float32) * 1e-3  # the next link depends on it
    return out_parts
  return run


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--links", type=int, default=16)
  ap.add_argument("--iters", type=int, default=50)
  ap.add_argument("--forms", nargs="+", default=list(FORMS))
  args = ap.parse_args(argv)
  want = {name: row(*inputs(shape, 32, -np.inf)) for name, shape in SHAPES.items()}
  print("| form | shape | kernels (one merge) | us / link | max abs diff vs row |\n|---|---|---|---|---|")
  for form_name in args.forms:
    form, lanes_, empty = FORMS[form_name]
    for name, shape in SHAPES.items():
      out_parts, lse = inputs(shape, lanes_, empty)
      one = jax.jit(form)
      kernels = entry_kernels(one.lower(out_parts, lse).compile().as_text())
      diff = float(jnp.max(jnp.abs(one(out_parts, lse) - want[name])))
      us = wall_ms(jax.jit(chain(form, args.links)), (out_parts, lse), args.iters) * 1e3 / args.links
      print(f"| {form_name} | {name} {shape} | {kernels} | {us:.2f} | {diff:.1e} |", flush=True)


if __name__ == "__main__":
  main()
