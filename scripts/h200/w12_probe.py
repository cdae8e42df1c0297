"""One W12 matmul on the GPU, taken apart: CUPTI time per kernel of the jitted call (the fused
kernel, and the XLA ops around it: x padding/permutation, split-K sum, escape patch), and, with
MOSAIC_GPU_DUMP_PTXAS=1, ptxas's register and spill report (issue #4; for the SASS and per-instruction stall
samples see w12_sass_profile.sh). With ``--copies N`` each timed call runs over N copies of the weight in turn
(beyond L2), and ``--bf16`` times the skinny bf16 kernel and XLA's dot on bf16 copies of the same weight beside it.
``--ablate-decode`` runs the W12 kernels with a stand-in word decode of 3 instructions (wrong values, the same loads):
what the kernel's pipeline streams when the decode costs next to nothing.

    MOSAIC_GPU_DUMP_PTXAS=1 PYTHONPATH=$PWD \\
      python3 scripts/h200/w12_probe.py --k 12288 --n 4096 --m 1 --config decode=registers,blocks_per_sm=4 > $OUT/probe.txt
"""

import argparse
import contextlib
import statistics

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.mosaic.gpu import profiler

from pallas_kernels import skinny_matmul, w12
from pallas_kernels.config_fields import parse_fields
from pallas_kernels.w12 import mosaic_gpu, register_decode


def parse_config(text: str, config_type=w12.TuningConfig, flag="--config"):
  try:
    return config_type(**parse_fields(text, config_type))
  except ValueError as e:
    raise SystemExit(f"{flag}: {e}") from e


def stand_in_decode_word(ops, byte_word, nibble_word, base_word, high_nibbles):
  """3 instructions in place of ``register_decode.decode_word``'s 9-10: wrong values, but every loaded word (both
  planes' and the bases) still feeds wgmma, so no load is dead code."""
  del high_nibbles
  mixed = ops.xor(nibble_word, base_word)
  return ops.prmt(byte_word, mixed, 0x5140), ops.prmt(byte_word, mixed, 0x7362)


@contextlib.contextmanager
def stand_in_decode():
  """The W12 kernels traced inside this use ``stand_in_decode_word`` (``decode_chunk`` looks the word decode up at
  trace time)."""
  real = register_decode.decode_word
  register_decode.decode_word = stand_in_decode_word
  try:
    yield
  finally:
    register_decode.decode_word = real


@contextlib.contextmanager
def recorded_forms():
  """Yields a list that gets one line a W12 register-decode kernel traced inside this (its split, step, depth, output
  form and whether it corrects the escapes itself), so a probe's output says what ``default`` ran."""
  forms, real = [], mosaic_gpu._register_decode_call

  def record(*args, **kw):
    escapes = "none" if kw.get("escape_lists") is None else "in the kernel"
    forms.append(f"split {kw['split_k']}, {kw['tile_k']} a step, {kw['max_concurrent_steps']} deep, "
                 f"{'f32 halves' if kw['halves'] == 2 else 'bf16'}, escapes {escapes}")
    return real(*args, **kw)

  mosaic_gpu._register_decode_call = record
  try:
    yield forms
  finally:
    mosaic_gpu._register_decode_call = real


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--k", type=int, default=12288)
  ap.add_argument("--n", type=int, default=4096)
  ap.add_argument("--m", type=int, nargs="+", default=[1])
  ap.add_argument("--config", nargs="+", default=["decode=registers"],
                  help="TuningConfig fields, k=v,k=v; 'default': what w12_matmul runs without a config")
  ap.add_argument("--copies", type=int, default=1, help="weight copies a timed call runs over in turn (beyond L2)")
  ap.add_argument("--bf16", action="store_true", help="also time the skinny bf16 kernel and XLA's dot")
  ap.add_argument("--bf16-config", nargs="+", default=[],
                  help="with --bf16, also the skinny kernel with these skinny_matmul.TuningConfig fields, k=v,k=v")
  ap.add_argument("--ablate-decode", action="store_true",
                  help="W12 kernels with a 3-instruction stand-in decode (wrong values, the same loads)")
  ap.add_argument("--plain", action="store_true",
                  help="no CUPTI: just run each call a few times (for Nsight Compute, which needs CUPTI itself)")
  args = ap.parse_args()
  with stand_in_decode() if args.ablate_decode else contextlib.nullcontext():
    run(args)


def run(args):
  rng = np.random.default_rng(0)
  w = (rng.normal(0, 0.02, (args.k, args.n)) * np.exp(rng.uniform(-1.4, 1.4, args.n))).astype(jnp.bfloat16)
  packed = jax.device_put(w12.pack(w))
  copies = [packed] + [jax.tree.map(jnp.copy, packed) for _ in range(args.copies - 1)]
  w_bf16 = [jnp.asarray(w) for _ in range(args.copies)] if args.bf16 else []
  print(f"K x N {args.k}x{args.n}, escapes {packed.num_escapes}, {args.copies} weight copies"
        + (" (partly L2-resident: --copies)" if args.copies * packed.sign_mantissa.size * 1.5 < 100e6 else "")
        + (" (stand-in decode: W12 errors are meaningless)" if args.ablate_decode else ""),
        flush=True)
  for m in args.m:
    x = jnp.asarray(rng.normal(size=(m, args.k)), jnp.bfloat16)
    ref = w12.matmul(x, packed, implementation="reference").astype(jnp.float32)
    runs = [(text, jax.jit(lambda x, ps, config=None if text == "default" else parse_config(text):
                           [mosaic_gpu.w12_matmul(x, p, config=config) for p in ps]), copies)
            for text in args.config]
    if args.bf16:
      runs += [(f"bf16 {impl}", jax.jit(lambda x, ws, impl=impl: [skinny_matmul.matmul(x, w, implementation=impl)
                                                                   for w in ws]), w_bf16)
               for impl in ("mosaic_gpu", "xla")]
      runs += [(f"bf16 skinny {text}",
                jax.jit(lambda x, ws, config=parse_config(text, skinny_matmul.TuningConfig, "--bf16-config"):
                        [skinny_matmul.matmul(x, w, implementation="mosaic_gpu", config=config) for w in ws]), w_bf16)
               for text in args.bf16_config]
    for text, fn, weights in runs:
      with recorded_forms() as forms:
        y = fn(x, weights)[0].astype(jnp.float32)
      form = f" [{forms[0]}]" if forms else ""
      err = float(jnp.abs(y - ref).max() / jnp.abs(ref).max())
      if args.plain:
        for _ in range(3):
          jax.block_until_ready(fn(x, weights))
        print(f"M={m} {text}{form}: rel err {err:.1e}", flush=True)
        continue
      _, timed = profiler.measure(fn, aggregate=False, iterations=9)(x, weights)
      per_kernel = {}  # kernel name -> its times over the copies and iterations
      for run in timed:
        for name, ms in run:
          per_kernel.setdefault(name, []).append(ms * 1e3)
      total = sum(statistics.median(v) * len(v) for v in per_kernel.values()) / (len(timed) * len(weights))
      print(f"M={m} {text}{form}: rel err {err:.1e}, device {total:.1f} us a call = "
            + " + ".join(f"{name[:40]} {statistics.median(v):.1f} (x{len(v) / (len(timed) * len(weights)):.2g})"
                         for name, v in per_kernel.items()), flush=True)


if __name__ == "__main__":
  main()
