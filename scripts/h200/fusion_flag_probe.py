"""XLA's fusion options, one compile each, on the drafter pass (and the AR step): kernels, GPU time, tokens.

The drafter's small kernels (docs/results/2026-12-01-combine-h200/: the residual add + split-K sum, the RMSNorm, the
SwiGLU multiply, the q/k norm) are XLA fusions. Which ones XLA merges depends on options of its GPU pipeline that
jax passes per program (``.compile(compiler_options=...)``, the same names as XLA_FLAGS), so every option set is
compiled from one lowering in one process and timed side by side:
- ``kernels``: fusions and custom calls of the optimised entry computation;
- ``GPU µs``: CUPTI kernel time of one call, the median over ``--cupti-calls`` calls, and its launches;
- ``wall ms``: the median of ``--iters`` synchronised calls;
- ``tokens``: the drafts (AR: the next tokens of 8 steps) equal the first option set's, or not.

    PYTHONPATH=$PWD python3 scripts/h200/fusion_flag_probe.py [--ar] > $OUT/flags.txt
"""

from __future__ import annotations

import argparse
import dataclasses as dc
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from chain_timing import wall_ms
from combine_probe import entry_kernels

OPTION_SETS = {
    "default": {},
    "multi_output": {"xla_gpu_unsupported_enable_triton_multi_output_fusion": True},
    "heroless": {"xla_gpu_experimental_enable_triton_heroless_priority_fusion": True},
    "multi_output+heroless": {"xla_gpu_unsupported_enable_triton_multi_output_fusion": True,
                              "xla_gpu_experimental_enable_triton_heroless_priority_fusion": True},
    "all_triton": {"xla_gpu_experimental_all_fusions_with_triton": True},
    "block_level_rewriter": {"xla_gpu_experimental_enable_fusion_block_level_rewriter": True},
    "same_shape_multi_output": {"xla_gpu_experimental_enable_same_shape_multi_output_fusion": True},
    "fusion_autotuner": {"xla_gpu_experimental_enable_fusion_autotuner": True},
}


def _swiglu_down(gate, up, w_down):
  return jnp.einsum("...k,kn->...n", jax.nn.silu(gate) * up, w_down, preferred_element_type=jnp.float32)


def _dot(x, w):
  return jnp.einsum("...k,kn->...n", x, w, preferred_element_type=jnp.float32).astype(x.dtype)


def _split(x, wgu, wd):
  return _swiglu_down(*jnp.split(_dot(x, wgu), 2, axis=-1), wd)


def _split_f32(x, wgu, wd):
  g, u = jnp.split(_dot(x, wgu).astype(jnp.float32), 2, axis=-1)
  return jnp.einsum("...k,kn->...n", (jax.nn.silu(g) * u).astype(x.dtype), wd, preferred_element_type=jnp.float32)


def _split_exp(x, wgu, wd):
  g, u = jnp.split(_dot(x, wgu), 2, axis=-1)
  return jnp.einsum("...k,kn->...n", g / (1 + jnp.exp(-g)) * u, wd, preferred_element_type=jnp.float32)


def _two_dots(x, wgu, wd):
  return _swiglu_down(_dot(x, wgu[:, : wd.shape[0]]), _dot(x, wgu[:, wd.shape[0]:]), wd)


def _interleaved(x, wgu, wd):
  a = _dot(x, wgu).reshape(*x.shape[:-1], wd.shape[0], 2)
  return _swiglu_down(a[..., 0], a[..., 1], wd)


MLP_FORMS = {"split": _split, "split_f32": _split_f32, "split_exp": _split_exp, "two_dots": _two_dots,
             "interleaved": _interleaved}
"""The MLP block (gate_up, SwiGLU, down) written the ways XLA might fuse the SwiGLU into the down dot. ``two_dots``
slices the weight inside the program (a real deployment would keep two leaves); ``interleaved`` reads gate and up columns alternating (a weight layout, not the checkpoint's): both are only what XLA makes of them."""


def parse_option_set(text: str) -> tuple[str, dict]:
  """``NAME=opt=value,opt=value`` -> (NAME, {opt: value}); values true/false/ints are converted."""
  name, _, rest = text.partition("=")
  opts = {}
  for item in filter(None, rest.split(",")):
    key, _, value = item.partition("=")
    low = value.lower()
    opts[key] = True if low == "true" else False if low == "false" else int(value) if value.lstrip("-").isdigit() \
        else value
  return name, opts


def cupti_us(call, calls: int) -> tuple[float, int, dict]:
  """Median summed kernel µs of ``calls`` calls, launches of one, and µs per kernel name of the median call."""
  from specpilot.costmodel.cupti import kernel_timings

  runs = []
  for _ in range(calls):
    timings = kernel_timings(call)
    by_name: dict[str, float] = {}
    for name, ms in timings:
      by_name[name] = by_name.get(name, 0.0) + 1e3 * ms
    runs.append((sum(by_name.values()), len(timings), by_name))
  runs.sort(key=lambda r: r[0])
  return runs[len(runs) // 2]


def compile_sets(lowered, option_sets: dict, threads: int) -> dict:
  def one(item):
    name, opts = item
    t0 = time.perf_counter()
    try:
      return name, (lowered.compile(compiler_options=opts), time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 (an option this XLA rejects, or a failed compile: reported, the rest go on)
      return name, (e, time.perf_counter() - t0)
  with ThreadPoolExecutor(threads) as pool:
    return dict(pool.map(one, option_sets.items()))


def report(title: str, results: dict, calls: int, iters: int, run, tokens_of, dump: Path | None = None,
           tag: str = "") -> None:
  """One table: a row per option set (compile time, kernels of the optimised entry, CUPTI µs and launches, wall ms,
  tokens against the first set's), then the kernels that moved most per set; ``dump``: each program's optimised
  HLO as ``{tag}_{set}.txt``."""
  print(f"\n## {title}\n\n| options | compile s | kernels | GPU µs | launches | wall ms | tokens |\n|---|---|---|---|---|---|---|",
        flush=True)
  ref_tokens, ref_names = None, None
  details = {}
  for name, (exe, secs) in results.items():
    if isinstance(exe, Exception):
      print(f"| {name} | {secs:.0f} | error: {type(exe).__name__}: {str(exe).splitlines()[0][:150]} | | | | |",
            flush=True)
      continue
    tokens = tokens_of(exe)
    ref_tokens = tokens if ref_tokens is None else ref_tokens
    try:
      us, launches, by_name = cupti_us(lambda exe=exe: run(exe), calls)
    except RuntimeError:  # no CUPTI: a CPU smoke run
      us, launches, by_name = float("nan"), 0, {}
    wall = wall_ms(lambda exe=exe: run(exe), (), iters)
    same = "ref" if tokens is ref_tokens else ("same" if tokens == ref_tokens else f"DIFF {tokens}")
    print(f"| {name} | {secs:.0f} | {entry_kernels(exe.as_text())} | {us:.1f} | {launches} | {wall:.3f} | {same} |",
          flush=True)
    details[name] = by_name
    if dump:
      dump.mkdir(parents=True, exist_ok=True)
      (dump / f"{tag}_{name.replace(' ', '_')}.txt").write_text(exe.as_text())
    ref_names = by_name if ref_names is None else ref_names
  for name, by_name in details.items():
    if by_name is ref_names or not by_name:
      continue
    moved = sorted(set(by_name) | set(ref_names), key=lambda k: -abs(by_name.get(k, 0) - ref_names.get(k, 0)))[:8]
    print(f"\n{name} vs the first set, kernels that moved most (µs): "
          + "; ".join(f"`{k[:40]}` {ref_names.get(k, 0):.1f}->{by_name.get(k, 0):.1f}" for k in moved), flush=True)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--sets", nargs="+", default=list(OPTION_SETS), choices=list(OPTION_SETS), metavar="SET",
                  help=f"option sets to compile: {', '.join(OPTION_SETS)}")
  ap.add_argument("--extra", nargs="*", default=[], help="more sets: NAME=opt=value,opt=value")
  ap.add_argument("--mlp", action="store_true",
                  help="also the MLP block written as each of MLP_FORMS, under the first two option sets")
  ap.add_argument("--ar", action="store_true", help="also the AR step (36 layers, one token; compiles for minutes)")
  ap.add_argument("--ar-sets", nargs="+", default=None, help="the sets for the AR step (default: --sets)")
  ap.add_argument("--matmul", default=None, help="skinny_matmul.ops.DEFAULT for the AR step (xla | mosaic_gpu)")
  ap.add_argument("--norm", default=None, help="add_rms_norm.ops.DEFAULT for the AR step")
  ap.add_argument("--model", default="qwen3_8b")
  ap.add_argument("--context", type=int, default=1024)
  ap.add_argument("--cupti-calls", type=int, default=5)
  ap.add_argument("--iters", type=int, default=30)
  ap.add_argument("--dump", type=Path, default=None, help="write each program's optimised HLO here")
  ap.add_argument("--threads", type=int, default=8)
  args = ap.parse_args(argv)
  option_sets = {n: OPTION_SETS[n] for n in args.sets}
  option_sets.update(dict(parse_option_set(t) for t in args.extra))
  unknown = [n for n in args.ar_sets or () if n not in option_sets]
  if unknown:
    ap.error(f"--ar-sets: {', '.join(unknown)} not among the sets compiled (--sets, --extra): {', '.join(option_sets)}")

  from specpilot.costmodel.measure import model_config
  from specpilot.models.config import synthetic_drafter_config
  from specpilot.models.dflash import draft_logits
  from specpilot.models.kv_cache import KVCache
  from specpilot.models.weights import init_random_drafter, init_random_target

  cfg = model_config(args.model)
  dtype = jnp.bfloat16
  w = jax.block_until_ready(init_random_target(cfg, 0, dtype))

  def cache(layers, capacity, seed):
    shape = (layers, 1, capacity, cfg.num_kv_heads, cfg.head_dim)
    return KVCache(k=jax.random.normal(jax.random.key(seed), shape, dtype),
                   v=jax.random.normal(jax.random.key(seed + 1), shape, dtype),
                   lengths=jnp.full((1,), args.context, jnp.int32))

  dcfg = synthetic_drafter_config(cfg, 5, 16)
  dw = init_random_drafter(dcfg, 1, dtype)
  ctx = cache(dcfg.layers.num_layers, -(-args.context // 128) * 128, 300)
  block = jnp.asarray([[1] + [dcfg.mask_token_id] * (dcfg.block_size - 1)], jnp.int32)

  def draft(dw, embed, lm_head, ctx, block):
    logits = draft_logits(dw, dcfg, embed, lm_head, ctx, block, attention="pallas_tree")[:, 1:]
    return jnp.argmax(logits, axis=-1)

  print(f"# fusion options: jax {jax.__version__}, {jax.devices()[0].device_kind}, {args.model}, context "
        f"{args.context}", flush=True)
  t0 = time.perf_counter()
  lowered = jax.jit(draft).lower(dw, w.embed, w.lm_head, ctx, block)
  results = compile_sets(lowered, option_sets, args.threads)
  print(f"drafter: lowered and compiled {len(results)} sets in {time.perf_counter() - t0:.0f} s", flush=True)
  report("drafter_b16_tree (5 layers, 16 rows, argmax)", results, args.cupti_calls, args.iters,
         lambda exe: exe(dw, w.embed, w.lm_head, ctx, block),
         lambda exe: np.asarray(exe(dw, w.embed, w.lm_head, ctx, block))[0].tolist(), args.dump, "drafter_b16_tree")
  del results

  if args.mlp:
    lw = dw.layers[0]
    for rows in (16, 1):
      x = jax.random.normal(jax.random.key(rows), (1, rows, cfg.hidden_size), dtype)
      results = {}
      for form, fn in MLP_FORMS.items():
        lowered = jax.jit(fn).lower(x, lw.w_gate_up, lw.w_down)
        results.update({f"{form} {name}": r for name, r in
                        compile_sets(lowered, {n: option_sets[n] for n in list(option_sets)[:2]}, 2).items()})
      report(f"MLP block, {rows} rows (gate_up, SwiGLU, down; tokens: output rounded to 3 digits)", results,
             args.cupti_calls, args.iters, lambda exe, x=x: exe(x, lw.w_gate_up, lw.w_down),
             lambda exe, x=x: np.round(np.asarray(exe(x, lw.w_gate_up, lw.w_down), np.float32)[0, :, :4], 3).tolist(),
             args.dump, f"MLP{rows}")

  if not args.ar:
    return
  if args.matmul:
    from pallas_kernels.skinny_matmul import ops as skinny_ops
    skinny_ops.DEFAULT = args.matmul
  if args.norm:
    from pallas_kernels.add_rms_norm import ops as norm_ops
    norm_ops.DEFAULT = args.norm
  from specpilot.models.target import forward

  def ar_step(w, tok, kv):
    out = forward(w, cfg, tok, kv.lengths[:, None], kv, attention="pallas_tree")
    return jnp.argmax(out.logits[:, -1], axis=-1).astype(jnp.int32)[:, None], out.cache

  ar_sets = {n: option_sets[n] for n in (args.ar_sets or option_sets)}
  kv0 = cache(cfg.num_layers, -(-(args.context + 64) // 128) * 128, 100)
  tok0 = jnp.full((1, 1), 1, jnp.int32)
  t0 = time.perf_counter()
  lowered = jax.jit(ar_step, donate_argnums=(2,)).lower(w, tok0, kv0)
  results = compile_sets(lowered, ar_sets, args.threads)
  print(f"AR step: lowered and compiled {len(results)} sets in {time.perf_counter() - t0:.0f} s", flush=True)
  state = {"kv": None}

  def run(exe):  # the cache is donated: thread it through, its length fixed so every call does the same work
    kv = state["kv"] if state["kv"] is not None else jax.tree.map(jnp.copy, kv0)
    tok, kv = exe(w, tok0, kv)
    state["kv"] = dc.replace(kv, lengths=jnp.full((1,), args.context, jnp.int32))
    return tok

  def tokens_of(exe):
    kv, tok, out = jax.tree.map(jnp.copy, kv0), tok0, []
    for _ in range(8):
      tok, kv = exe(w, tok, kv)
      out.append(int(tok[0, 0]))
    return out

  report(f"AR step (pallas_tree attention, matmul {args.matmul or 'default'}, norm {args.norm or 'default'})",
         results, args.cupti_calls, args.iters, run, tokens_of, args.dump, "AR")


if __name__ == "__main__":
  main()
