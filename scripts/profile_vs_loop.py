"""A round profiled stage by stage against a step of the fused generation loop, per engine, on one deployment.

The cost model reads `Engine.profile` (each stage jitted alone, synchronised or pipelined). On the 36-layer proxy at
batch 8 (H100, docs/results/2026-12-07-batched-order-proxy-h100/) AR's profiled round took 3.81 ms and its loop's
step 2.30: the cost model then over-predicted every speculative engine. This script tells where the difference
lives, for each engine at one batch:
- `profiled round ms`: the profile's round (wall, per stage as the cost model reads it);
- `profiled kernels ms`: the same stages' kernel time under CUPTI (launch gaps and host time excluded);
- `profiled issue ms`: the host's time to issue the stages' calls (`Engine.profile`'s `stage_issue_ms`, summed): near
  the profiled round, the profile timed the host, not the GPU;
- `loop step ms`: the fused loop's wall time per iteration, (wall of a whole generation − wall of one that stops
  after the prefill) ÷ the loop's iterations, so the prefill and the host's set-up are not in it;
- `loop kernels ms`: the same difference under CUPTI, per iteration, and the kernel launches per iteration;
- `round ms, same buffers`: the whole round as one jitted program (`Engine.round`, what the loop's body runs), called
  back to back on the same input buffers (its outputs freed), so every call's buffers can sit where the last call's
  did; `round ms, fresh buffers`: the same program with its state donated and a fresh copy of the state a call, as
  the profile feeds its stages; `round kernels ms`: one call's kernel time under CUPTI on a fresh donated copy, so
  without copies of what the round updates (before `5c6016f` it was timed on the same buffers, copies included).
- `… loop layouts`: the same profile and one-program round with the state held in the layouts XLA gives the round's
  carry (`Engine.profile(loop_layouts=True)`, `specpilot.decoding.layouts`), against the default row-major ones in
  which a lone program on a GPU transposes whole caches at entry and exit (H100, docs/results/
  2026-12-07-profile-vs-loop-rounds-h100/: four `wrapped_transpose` kernels, ~0.4 ms a round, never in the loop);
  `pinned_kernels` in the JSON is its kernel table, `round_kernels` the one-program round's per kernel name in both.
- per stage (GPU only): the profiled stage, the host's time to issue it, its kernels, and the stage's kernels inside
  the loop program (`loop_stage_kernels_ms`: the loop's CUPTI launches given to stages by
  `specpilot.costmodel.attribution`).
`--loop-only` measures the loop's step and kernels alone (OUT/loop_only.json, .md), to compare XLA_FLAGS settings one
process each (`scripts/h200/loop_graphs_ab.sh`); on a GPU each row keeps its kernels a step by name
(`loop_kernel_names`) and each engine after the first prints the kernel kinds its loop differs from the first's by.
Profiled kernels ≈ loop kernels with profiled wall ≫ loop wall: the lone stages pay launch gaps or host time the
loop hides. Profiled kernels ≫ loop kernels: the lone programs run different (slower) kernels than the loop's body.
The round columns split the first case: one program on the same buffers near the loop's step says the profile's
stage split or its fresh buffers cost the difference (fresh ≫ same: a call whose buffers moved pays for it, e.g.
XLA updating its command buffers to the new addresses before it launches); all three near the profiled round say
any lone call pays it. `kernels` in the JSON lists, per kernel name, the profile's and the loop's ms a round (the
largest differences first).

Random weights at a conf/model shape (conf/model/proxy_h200_deep.yaml: the proxy pair's target deepened to 36
layers, as `scripts/h200/batched_order.sh` measures it): every pass costs what the trained pair's costs; only the
speculative engines' acceptance (how many rounds a generation takes) differs, and the loop step is per iteration.
Writes OUT/profile_vs_loop.json and .md after each engine.

    python3 scripts/profile_vs_loop.py --out $OUT --batch 8              # GPU (JAX_DEFAULT_MATMUL_PRECISION=highest)
    python scripts/profile_vs_loop.py --out /tmp/pvl --model tiny --batch 2 --max-new 8   # CPU: no kernel columns
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot.argtypes import positive_int  # noqa: E402

ENGINES = {"ar": {"name": "ar"}, "stock": {"name": "stock"}}


def engine_cfg(label: str) -> dict:
    """ar, stock, ddtree@BUDGET or specpilot@B1,B2,... → an engine config; anything else is a one-line error.
    specpilot's verify cost table is left flat, so a round picks its largest candidate (or, where the last nodes'
    probabilities underflow to a tie, the smaller): `specpilot@63,64` runs ddtree@64's tree and a 64- or 65-token
    verify through a two-branch `lax.switch`, so its loop step less ddtree@64's is what the switch costs
    (docs/results/2026-12-07-switch-cost-h100/)."""
    if label in ENGINES:
        return ENGINES[label]
    name, _, budgets = label.partition("@")
    sizes = budgets.split(",")
    if all(b.isdigit() and int(b) > 0 for b in sizes):
        if name == "ddtree" and len(sizes) == 1:
            return {"name": "ddtree", "tree_budget": int(budgets)}
        if name == "specpilot":
            cands = sorted({int(b) for b in sizes})
            return {"name": "specpilot", "tree_budget": cands[-1], "budget_candidates": cands}
    raise argparse.ArgumentTypeError(
        f"engine {label!r}: expected ar, stock, ddtree@BUDGET or specpilot@B1,B2 (e.g. ddtree@64, specpilot@63,64)")


def loop_measure(engine, prompts, max_new: int, cupti: bool) -> dict:
    """The fused loop's cost per iteration: a whole generation minus one that stops after the prefill (both
    compiled and run once before timing, then the fastest of three runs each; a difference within the host's noise,
    as the CPU's tiny models give, can come out at or below zero); with `cupti`, its kernel time and launches the same
    way."""
    from specpilot.costmodel.cupti import kernel_timings
    from specpilot.costmodel.measure import loop_iterations

    def wall(n: int, repeats: int = 3) -> float:  # the fastest of a few: host noise only ever adds time
        engine.generate(prompts, n)  # compile / warm
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            again = engine.generate(prompts, n)
            best = min(best, time.perf_counter() - t0)
            if n == max_new and again.tokens != res.tokens:  # a program that races gives other tokens some runs
                raise SystemExit(f"{engine.name}: a rerun of the loop gave other tokens than its first run")
        return best

    res = engine.generate(prompts, max_new)
    steps = loop_iterations(res)
    rounds = [a for row in res.acceptance_lengths for a in row]
    out = {"loop_steps": steps, "tau": sum(rounds) / max(len(rounds), 1), "tokens": res.tokens}
    out["loop_step_ms"] = 1e3 * (wall(max_new) - wall(1)) / steps
    if cupti:
        full, prefill = (kernel_timings(lambda n=n: engine.generate(prompts, n)) for n in (max_new, 1))
        out["loop_kernels_ms"] = (sum(ms for _, ms in full) - sum(ms for _, ms in prefill)) / steps
        out["loop_launches"] = (len(full) - len(prefill)) / steps
        out["launch_lists"] = (full, prefill)
    return out


def prefilled(engine, prompts, max_new: int):
    """The loop's state after the prefill (no round run yet), as `generate` starts it."""
    import jax

    from specpilot.decoding.common import pad_prompts

    tokens, lens = pad_prompts(prompts)
    return engine._prefill(engine.params, tokens, lens, max_new, jax.random.key(0))


def loop_stages(engine, prompts, max_new: int) -> dict:
    """The loop program alone, on a prefilled state, under CUPTI (GPU only), its kernels given to the round's stages
    (`specpilot.costmodel.attribution`): `loop_stage_kernels_ms`, ms an iteration per stage and unattributed, and the
    iterations it ran."""
    import jax
    import numpy as np

    from specpilot.costmodel.attribution import kernel_stages, stage_kernel_ms
    from specpilot.costmodel.cupti import kernel_timings
    from specpilot.decoding.layouts import fresh_copies

    state = prefilled(engine, prompts, max_new)
    names = [name for name, _ in engine.stages()]
    loop = engine._run.lower(engine.params, state, 0).compile()  # every row to the end: no pause to shrink the batch
    stage_of = kernel_stages(loop.as_text(), names)
    jax.block_until_ready(loop(engine.params, fresh_copies(state)))  # warm
    copy, done = fresh_copies(state), []
    launches = kernel_timings(lambda: done.append(loop(engine.params, copy)) or done[-1])
    iterations = max(int(np.max(np.asarray(done[-1].n_rounds))), 1)
    per_stage = stage_kernel_ms(launches, stage_of, names)
    return {"loop_stage_kernels_ms": {k: ms / iterations for k, ms in per_stage.items()},
            "loop_stage_iterations": iterations}


def round_measure(engine, prompts, max_new: int, cupti: bool, calls: int = 10) -> dict:
    """The round as one program on the prefilled state (no round of it committed): ms a call issued back to back on
    the same buffers and on fresh donated copies (the fastest of three bursts of `calls` each), and with `cupti` one
    call's kernel time and launches (a round holding a conditional, SpecPilot's, from a compile without command
    buffers: `engine.cupti_program`)."""
    import jax

    from specpilot.costmodel.cupti import kernel_timings
    from specpilot.decoding import layouts
    from specpilot.decoding.engine import cupti_compiled, cupti_program

    state = prefilled(engine, prompts, max_new)
    same, donated = jax.jit(engine.round), jax.jit(engine.round, donate_argnums=(1,))

    def burst(fn, inputs) -> float:  # inputs() -> the states of `calls` calls
        jax.block_until_ready(fn(engine.params, inputs()[0]))  # compile / warm
        best = float("inf")
        for _ in range(3):
            args = inputs()
            t0 = time.perf_counter()
            for a in args:
                out = fn(engine.params, a)  # the previous call's output is freed as soon as it is replaced
            jax.block_until_ready(out)
            best = min(best, (time.perf_counter() - t0) / calls)
            del out, args
        return 1e3 * best

    formats = layouts.loop_formats(engine.round, engine.params, state)
    pinned_state = jax.device_put(state, formats)
    pinned_lowered = [jax.jit(engine.round, in_shardings=(None, formats), out_shardings=formats,
                              donate_argnums=donate).lower(engine.params, pinned_state) for donate in ((), (1,))]
    pinned, pinned_donated = (lowered.compile() for lowered in pinned_lowered)
    out = {"round_same_ms": burst(same, lambda: [state] * calls),
           "round_fresh_ms": burst(donated, lambda: [layouts.fresh_copies(state) for _ in range(calls)]),
           "round_pinned_ms": burst(pinned, lambda: [pinned_state] * calls)}
    if cupti:
        copy = layouts.fresh_copies(state)
        timed = cupti_program(donated, (engine.params, copy))
        launches = kernel_timings(lambda: timed(engine.params, copy))
        out["round_kernels_ms"] = sum(ms for _, ms in launches)
        out["round_launches"] = len(launches)
        copy = layouts.fresh_copies(pinned_state)
        timed = cupti_compiled(pinned_lowered[1], pinned_donated)
        pinned_launches = kernel_timings(lambda: timed(engine.params, copy))
        out["round_pinned_kernels_ms"] = sum(ms for _, ms in pinned_launches)
        # per kernel name, one call's ms in default and in loop layouts (a table as `kernel_table`'s)
        out["round_kernels"] = {}
        for key, call_launches in (("default", launches), ("loop_layouts", pinned_launches)):
            for name, ms in call_launches:
                row = out["round_kernels"].setdefault(name, {"default": 0.0, "loop_layouts": 0.0})
                row[key] += ms
    return out


def kernel_table(profiled: dict, full: list, prefill: list, steps: int, top: int = 25) -> dict:
    """Per kernel name: the profile's ms a round (its stages' launches summed) and the loop's (a whole generation's
    launches minus the prefill-only one's, ÷ iterations); the `top` largest differences, largest first."""
    names: dict[str, dict[str, float]] = {}
    for stage in profiled.values():
        for name, ms in stage.items():
            names.setdefault(name, {"profiled": 0.0, "loop": 0.0})["profiled"] += ms
    for name, (_, ms) in kernels_by_name(full, prefill, steps).items():
        names.setdefault(name, {"profiled": 0.0, "loop": 0.0})["loop"] += ms
    ranked = sorted(names.items(), key=lambda kv: -abs(kv[1]["profiled"] - kv[1]["loop"]))
    return dict(ranked[:top])


def save(out: Path, stem: str, title: str, args, dep, rows: list, body: list[str]) -> None:
    """OUT/<stem>.json (provenance, deployment, arguments, rows) and OUT/<stem>.md: `title`, the provenance, the
    shapes, then `body` (markdown lines)."""
    from specpilot.costmodel.report import provenance, provenance_lines, write_json

    res = {"provenance": provenance(), "deployment": dep.describe(), "args": {
        k: v for k, v in vars(args).items() if k != "engines"}, "rows": rows}
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / f"{stem}.json", res)
    lines = [f"# {title}", ""] + provenance_lines(res["provenance"]) + [
        f"- {dep.name}, {args.dtype}, batch {args.batch}, prompts of {args.prompt_len} tokens, {args.max_new} new", "",
        *body]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")


def write(out: Path, args, dep, rows: list, no_kernels) -> None:
    """profile_vs_loop.json and .md in `out` for the engines measured so far."""
    from specpilot.costmodel.report import md_table

    table = [[r["label"], r["batch"], r["profiled_round_ms"], r["profiled_kernels_ms"], r["profiled_issue_ms"],
              r["loop_step_ms"],
              r.get("loop_kernels_ms"), r.get("loop_launches"), r["round_same_ms"], r["round_fresh_ms"],
              r.get("round_kernels_ms"), r["profile_over_loop"], r["pinned_round_ms"], r["pinned_kernels_ms"],
              r["round_pinned_ms"], r.get("round_pinned_kernels_ms"), r["tau"]] for r in rows]
    lines = [md_table(["engine", "batch", "profiled round ms", "profiled kernels ms", "profiled issue ms",
                       "loop step ms", "loop kernels ms",
                       "loop launches / step", "round ms, same buffers", "round ms, fresh buffers", "round kernels ms",
                       "profiled ÷ loop", "profiled round ms, loop layouts", "its kernels ms",
                       "round ms, loop layouts (same buffers)", "its kernels ms", "τ (random weights)"], table), ""]
    if no_kernels:
        lines.append(f"- kernel columns: {no_kernels}")
    staged = [[r["label"], stage, r["stage_ms"].get(stage), r["profiled_stage_issue_ms"].get(stage),
               r["profiled_stage_kernels_ms"].get(stage), ms]
              for r in rows if "loop_stage_kernels_ms" in r for stage, ms in r["loop_stage_kernels_ms"].items()]
    if staged:
        lines += ["", "Per stage (ms a round; the loop's kernels attributed by `specpilot.costmodel.attribution`):", "",
                  md_table(["engine", "stage", "profiled ms", "profiled issue ms", "profiled kernels ms",
                            "loop kernels ms"], staged), ""]
    lines += [f"- {r['label']}, profile in loop layouts: {r['pinned_error']}" for r in rows if "pinned_error" in r]
    save(out, "profile_vs_loop", "A profiled round against the fused loop's step", args, dep, rows, lines)


def kernels_by_name(full, prefill, steps: int) -> dict[str, list[float]]:
    """A loop's kernels a step by name, [launches, ms]: a whole generation's (name, ms) launches less the
    prefill-only generation's, over its loop steps."""
    out: dict[str, list[float]] = {}
    for launches, sign in ((full, 1), (prefill, -1)):
        for name, ms in launches:
            entry = out.setdefault(name, [0.0, 0.0])
            entry[0] += sign / steps
            entry[1] += sign * ms / steps
    return out


def kernel_kinds(by_name: dict[str, list[float]]) -> dict[str, list[float]]:
    """`kernels_by_name` summed over names that differ only in a trailing number: XLA numbers its fusions per
    program, so one loop's `gemm_fusion_dot_955` is another's `gemm_fusion_dot_236`."""
    out: dict[str, list[float]] = {}
    for name, (launches, ms) in by_name.items():
        entry = out.setdefault(re.sub(r"[._]?\d+$", "", name), [0.0, 0.0])
        entry[0] += launches
        entry[1] += ms
    return out


def print_kernel_diff(base: dict, row: dict, top: int = 12) -> None:
    """The kernel kinds (`kernel_kinds`) whose time a step differs most between two loops (`loop_kernel_names`),
    with their launches."""
    a, b = kernel_kinds(base["loop_kernel_names"]), kernel_kinds(row["loop_kernel_names"])
    diff = sorted(((b.get(n, [0, 0])[1] - a.get(n, [0, 0])[1], b.get(n, [0, 0])[0] - a.get(n, [0, 0])[0], n)
                   for n in set(a) | set(b)), key=lambda d: -abs(d[0]))
    print(f"  {row['label']} less {base['label']}, by kernel kind (ms a step, launches a step):")
    for ms, n_launch, name in diff[:top]:
        print(f"  {ms:+.4f} ms {n_launch:+.1f} launches  {name[:90]}")


def loop_only(args, dep, prompts, capacity) -> int:
    """`--loop-only`: per engine the fused loop's step, its kernels and the rest (the step's wall beyond its kernels:
    launch gaps and the host's part), under this process's XLA_FLAGS (in the provenance)."""
    import jax

    from specpilot.costmodel import measure as M
    from specpilot.costmodel.predict import config_label
    from specpilot.costmodel.report import md_table

    cupti = jax.default_backend() == "gpu"
    rows, first = [], None
    for cfg in args.engines:
        row = {"label": config_label(cfg), "batch": args.batch,
               **loop_measure(M.build_engine(dep, cfg, capacity), prompts, args.max_new, cupti)}
        lists = row.pop("launch_lists", None)
        tokens = row.pop("tokens")
        first = tokens if first is None else first  # greedy: every engine's tokens are AR's
        row["same_tokens_as_first"] = tokens == first
        row["beyond_kernels_ms"] = row["loop_step_ms"] - row["loop_kernels_ms"] if cupti else None
        if lists:
            row["loop_kernel_names"] = kernels_by_name(*lists, row["loop_steps"])
        rows.append(row)
        kernels = f", kernels {row['loop_kernels_ms']:.3f}, beyond them {row['beyond_kernels_ms']:.3f}" if cupti else ""
        same = "" if len(rows) == 1 else f", tokens {'the same as' if row['same_tokens_as_first'] else 'OTHER than'} " \
            f"{rows[0]['label']}'s"
        print(f"{row['label']}: loop step {row['loop_step_ms']:.3f} ms{kernels}{same}", flush=True)
        if lists and len(rows) > 1:
            print_kernel_diff(rows[0], row)
    table = [[r["label"], r["batch"], r["loop_step_ms"], r.get("loop_kernels_ms"), r.get("beyond_kernels_ms"),
              r.get("loop_launches"), r["loop_steps"]] for r in rows]
    save(Path(args.out), "loop_only", "The fused loop's step", args, dep, rows,
         [md_table(["engine", "batch", "loop step ms", "loop kernels ms", "beyond kernels ms", "launches / step",
                    "loop steps"], table)])
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output folder (created)")
    ap.add_argument("--model", default="proxy_h200_deep", help="conf/model/<name>.yaml (random weights)")
    ap.add_argument("--dtype", default="float32", choices=("bfloat16", "float32"))
    ap.add_argument("--drafter-layers", type=positive_int, default=2, help="the proxy pair's drafter: 2")
    ap.add_argument("--engines", nargs="+", type=engine_cfg, default=[ENGINES["ar"], ENGINES["stock"]],
                    metavar="ENGINE", help="ar, stock, ddtree@BUDGET, specpilot@B1,B2 (default: ar stock)")
    ap.add_argument("--batch", type=positive_int, default=8)
    ap.add_argument("--prompt-len", type=positive_int, default=64)
    ap.add_argument("--max-new", type=positive_int, default=64)
    ap.add_argument("--rounds", type=positive_int, default=6, help="profiled rounds after one warm-up round")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--loop-only", action="store_true",
                    help="only the fused loop's step and kernels (OUT/loop_only.json, .md): one process per XLA_FLAGS "
                         "setting to compare (scripts/h200/loop_graphs_ab.sh)")
    args = ap.parse_args(argv)
    if args.max_new < 2:
        ap.error("--max-new must be at least 2: the loop's step is a generation minus one of a single token")

    from specpilot.costmodel import measure as M
    from specpilot.costmodel.predict import config_label
    dep = M.synthetic_deployment(args.model, args.dtype, args.seed, drafter_layers=args.drafter_layers)
    prompts = M.random_prompts(args.batch, args.prompt_len, dep.target_cfg.vocab_size, args.seed,
                               exclude=(dep.drafter_cfg.mask_token_id,))
    capacity = M.kv_capacity(args.prompt_len, max(args.rounds, -(-args.max_new // dep.block)), dep.block,
                             args.engines)
    if args.loop_only:
        return loop_only(args, dep, prompts, capacity)
    rows, no_kernels = [], None
    for cfg in args.engines:
        label = config_label(cfg)
        engine = M.build_engine(dep, cfg, capacity)
        prof = M.profile_engine(engine, prompts, args.max_new, args.rounds, args.seed, gpu_time=True)
        try:
            pinned = M.profile_engine(engine, prompts, args.max_new, args.rounds, args.seed, gpu_time=True,
                                      loop_layouts=True)
        except (AssertionError, RuntimeError, ValueError) as e:  # a stage XLA would not compile for the layouts
            pinned = {"round_ms": None, "stage_ms": {}, "error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
        cupti = "stage_gpu_ms" in prof  # else `stage_gpu_error` says why (no NVIDIA GPU, or no CUPTI)
        no_kernels = no_kernels or prof.get("stage_gpu_error")
        row = {"label": label, "batch": args.batch, "profiled_round_ms": prof["round_ms"],
               "stage_ms": prof["stage_ms"],
               "profiled_kernels_ms": sum(prof["stage_gpu_ms"].values()) if cupti else None,
               "profiled_issue_ms": sum(prof["stage_issue_ms"].values()),
               "profiled_stage_issue_ms": prof["stage_issue_ms"],
               "pinned_round_ms": pinned["round_ms"], "pinned_stage_ms": pinned["stage_ms"],
               "pinned_kernels_ms": sum(pinned["stage_gpu_ms"].values()) if "stage_gpu_ms" in pinned else None,
               **({"pinned_error": pinned["error"]} if "error" in pinned else {}),
               **loop_measure(engine, prompts, args.max_new, cupti),
               **round_measure(engine, prompts, args.max_new, cupti),
               **({"profiled_stage_kernels_ms": prof["stage_gpu_ms"], **loop_stages(engine, prompts, args.max_new)}
                  if cupti else {})}
        if cupti:
            if "stage_gpu_kernels" in pinned:
                row["pinned_kernels"] = kernel_table(pinned["stage_gpu_kernels"], *row["launch_lists"],
                                                     row["loop_steps"])
            row["kernels"] = kernel_table(prof["stage_gpu_kernels"], *row.pop("launch_lists"), row["loop_steps"])
        # None where the loop's step is within the timing noise (at or below zero)
        row["profile_over_loop"] = row["profiled_round_ms"] / row["loop_step_ms"] if row["loop_step_ms"] > 0 else None
        rows.append(row)
        kernels = (f"; kernels {row['profiled_kernels_ms']:.3f} against {row['loop_kernels_ms']:.3f} ms, "
                   f"{row['loop_launches']:.1f} launches a loop step" if cupti else "")
        print(f"{label}: profiled round {row['profiled_round_ms']:.3f} ms (issued in {row['profiled_issue_ms']:.3f}), "
              f"loop step {row['loop_step_ms']:.3f} ms "
              f"({row['profile_over_loop'] or float('nan'):.2f}×){kernels}; one-program round "
              f"{row['round_same_ms']:.3f} ms (same buffers), {row['round_fresh_ms']:.3f} (fresh); loop layouts: "
              + (f"profiled round {row['pinned_round_ms']:.3f} ms" if "pinned_error" not in row
                 else f"profile failed ({row['pinned_error']})")
              + (f" (kernels {row['pinned_kernels_ms']:.3f})" if row["pinned_kernels_ms"] is not None else "")
              + f", one-program round {row['round_pinned_ms']:.3f} ms"
              + (f" (kernels {row['round_pinned_kernels_ms']:.3f})" if cupti else ""), flush=True)
        del engine
        write(Path(args.out), args, dep, rows, no_kernels)  # after each engine: a cut call keeps the finished ones
    print((Path(args.out) / "profile_vs_loop.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
