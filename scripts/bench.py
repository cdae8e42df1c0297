"""Step-time benchmark: every engine's stage times against the hardware ceilings, on synthetic shapes or a
real checkpoint pair, plus the cost model's check: every configuration predicted from the other rows
(calibration runs of the curves' anchor points included, never its own). Writes into --out:

    bench.json          everything (provenance, calibration, rows with stage times, byte counts, ceilings and
                        gap reports, fitted curves, validation, skipped configs); rewritten after every row
    bench.md            the tables: step time per stage, components vs ceilings, prediction errors
    step_vs_nodes.png   verify / round time vs tokens verified, one line per batch     (needs matplotlib)
    components.png      measured vs ceiling per stage, per configuration              (needs matplotlib)
    tau_profile.json    real checkpoints only: measured τ per engine, usable as --tau-profile elsewhere

    python scripts/bench.py --out OUT                                    # qwen3_8b shapes, the default sweep
    python scripts/bench.py --out OUT --model tiny --batches 1 4         # CPU smoke run
    python scripts/bench.py --out OUT --target T --drafter D             # real pair: also τ and measured speedups
    python scripts/bench.py --out OUT --tau-profile tau_profile.json     # + PROJECTED speedups for these shapes
    python scripts/bench.py --replot OUT                                 # draw the plots from OUT/bench.json
    python scripts/bench.py --replot OUT --refit                         # ... fitted and checked by today's model

Plain argparse, not Hydra: the GPU machine has jax and numpy but no hydra, omegaconf or pydantic, and this
script must run there with one command and nothing carried. It never imports `specpilot.config`. W&B
(`--wandb`) and matplotlib are imported only when used.

Random weights make acceptance meaningless, so synthetic runs report step times only; speedups there are
PROJECTED from a τ profile measured on a real pair (--tau-profile), and labelled so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot.argtypes import non_negative_int, positive_int  # noqa: E402
from specpilot.decoding.engine import COMMAND_BUFFER_FLAGS, use_command_buffers  # noqa: E402

ENGINES = ("ar", "stock", "ddtree", "tlv", "specpilot")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="output folder (created; default outputs/bench/<date>_<time>_<pid>)")
    ap.add_argument("--replot", metavar="DIR", help="only draw the plots (and rewrite bench.md) from DIR/bench.json")
    ap.add_argument("--refit", action="store_true",
                    help="with --replot: fit and check the rows again with the current cost model (the run's own "
                         "check is kept as validation_as_run)")
    ap.add_argument("--model", default="qwen3_8b", help="synthetic target shapes: conf/model/<name>.yaml")
    ap.add_argument("--target", help="HF target checkpoint folder (real weights; needs --drafter)")
    ap.add_argument("--drafter", help="z-lab DFlash drafter folder")
    ap.add_argument("--dtype", default=None, choices=("bfloat16", "float32"),
                    help="default: bfloat16 on GPU, float32 on CPU")
    ap.add_argument("--drafter-layers", type=positive_int, default=5, help="synthetic drafter depth (DFlash-b16: 5)")
    ap.add_argument("--block-size", type=positive_int, default=16, help="synthetic drafter block size")
    ap.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    ap.add_argument("--budgets", nargs="+", type=positive_int, default=[64, 256], help="DDTree tree budgets")
    ap.add_argument("--specpilot-candidates", nargs="+", type=positive_int, default=None,
                    help="the specpilot engine's budget candidates (default: --budgets)")
    ap.add_argument("--tlv-budget", type=positive_int, default=128, help="TLV level-1 tree size")
    ap.add_argument("--level1-format", default="int8", choices=("int8", "fp8"))
    ap.add_argument("--formats", nargs="+", default=["bf16"], choices=("bf16", "w12"), help="weight formats")
    ap.add_argument("--attentions", nargs="+", default=["xla"], choices=("xla", "pallas_tree"),
                    help="attention implementations of every engine's decode-time passes, AR's step included "
                         "(pallas_tree: the tree-attention kernel on Hopper)")
    ap.add_argument("--matmul", choices=("xla", "mosaic_gpu"), default=None,
                    help="bf16 linears with at most skinny_matmul.ops.MAX_TOKENS rows: XLA's dot or the skinny_matmul "
                         "Mosaic GPU kernel (sets skinny_matmul.ops.DEFAULT; default: as it is)")
    ap.add_argument("--norm", choices=("xla", "mosaic_gpu"), default=None,
                    help="the target's residual add + RMSNorm: XLA's or the add_rms_norm Mosaic GPU kernel (sets "
                         "add_rms_norm.ops.DEFAULT; default: as it is)")
    ap.add_argument("--rope", choices=("xla", "mosaic_gpu"), default=None,
                    help="the target's and drafter's q/k norm + rope after each q|k|v projection: XLA's or the "
                         "qk_norm_rope Mosaic GPU kernel (sets qk_norm_rope.ops.DEFAULT; default: as it is)")
    ap.add_argument("--swiglu-matmul", choices=("xla", "mosaic_gpu"), default=None,
                    help="the gate|up projection + SwiGLU of the target and drafter at few rows: two kernels or the "
                         "swiglu_matmul Mosaic GPU kernel (sets swiglu_matmul.ops.DEFAULT; default: as it is)")
    ap.add_argument("--qkv-rope-matmul", choices=("xla", "mosaic_gpu"), default=None,
                    help="the target's q|k|v projection + q/k norm + rope at few rows: two kernels or the "
                         "qkv_rope_matmul Mosaic GPU kernel (sets qkv_rope_matmul.ops.DEFAULT; default: as it is)")
    ap.add_argument("--pdl", action="store_true",
                    help="launch every Mosaic GPU kernel with programmatic dependent launch (pallas_kernels.pdl)")
    ap.add_argument("--tree-rank-max", type=non_negative_int, default=None,
                    help="best-first trees' small top-k's count ranks up to this row length instead of sorting, at "
                         "batches up to tree.RANK_TOP_K_MAX_BATCH (sets specpilot.decoding.tree.RANK_TOP_K_MAX; 0: "
                         "always sort; default: as it is)")
    ap.add_argument("--command-buffers", action="store_true",
                    help=f"add {COMMAND_BUFFER_FLAGS!r} to XLA_FLAGS before the backend starts: the fused decode loop "
                         "went 5.87 -> 5.29 ms on the H200 (docs/results/2026-11-30-skinny-matmul-h200/)")
    ap.add_argument("--gpu-time", action="store_true",
                    help="also time each stage's kernels with CUPTI (stage_gpu_ms: no host dispatch, no launch gaps); "
                         "with --tau-profile the projections are also made on that kernel time")
    ap.add_argument("--batches", nargs="+", type=positive_int, default=[1, 8])
    ap.add_argument("--context", type=positive_int, default=1024, help="committed tokens per request")
    ap.add_argument("--rounds", type=positive_int, default=6,
                    help="timed rounds per configuration (6 = the reproduction scripts' default: same shapes, so "
                         "their programs come from the compilation cache)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop starting configurations once this many seconds of measuring are spent")
    ap.add_argument("--calibration", choices=("on", "off"), default="on",
                    help="also measure the cost model's curves on a grid in separate runs (role 'calibration': "
                         "fitted, never checked): AR, stock, DDTree and TLV at the --calibration-*-budgets")
    ap.add_argument("--calibration-ddtree-budgets", nargs="*", type=positive_int, default=[16, 64, 256],
                    help="the verify curve's grid (tree budgets), when a tree engine runs")
    ap.add_argument("--calibration-tlv-budgets", nargs="*", type=positive_int, default=[64, 256],
                    help="the level-1 curve's grid, when tlv runs")
    ap.add_argument("--calibration-specpilot-candidates", nargs="*", type=positive_int, default=[16, 64],
                    help="a specpilot run of its own (other candidates than the configuration's), when specpilot "
                         "runs: it measures what verifying through lax.switch adds (the switch overhead)")
    ap.add_argument("--compile-workers", type=positive_int, default=None,
                    help="threads compiling a batch's configs (stages; real pairs: then generation loops) before "
                         "the timed pass (default 4 on an accelerator, else 1)")
    ap.add_argument("--compile-cache", default=".cache/jax-compile",
                    help="jax persistent compilation cache folder ('none' = off)")
    ap.add_argument("--eager-prefill", choices=("auto", "on", "off"), default="auto",
                    help="run the untimed prefill op by op (auto: on an accelerator) to skip compiling it")
    ap.add_argument("--tau-profile", help="JSON τ profile (tau_profile.json of a real-pair run) for projections")
    ap.add_argument("--max-new", type=positive_int, default=48, help="real pairs: tokens generated per prompt for τ")
    ap.add_argument("--num-prompts", type=positive_int, default=8,
                    help="real pairs without their own prompts: random ones")
    ap.add_argument("--prompts", help="real pairs: JSON list of token-id prompts (default: the pair's own, else "
                                      "random)")
    ap.add_argument("--refresh-calibration", action="store_true")
    ap.add_argument("--wandb", action="store_true", help="log rows to W&B (offline unless configured)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.replot and not (Path(args.replot) / "bench.json").is_file():
        ap.error(f"--replot: no bench.json in {args.replot}")
    for flag, path in (("--tau-profile", args.tau_profile), ("--prompts", args.prompts)):
        if path and not Path(path).is_file():
            ap.error(f"{flag}: no such file: {path}")
    for flag, path in (("--target", args.target), ("--drafter", args.drafter)):
        if path and not Path(path).is_dir():
            ap.error(f"{flag}: checkpoint folder not found: {path}")
    if not args.replot and not args.target:
        from specpilot.costmodel.measure import model_config

        try:
            model_config(args.model)  # the synthetic shapes exist before anything is built
        except ValueError as e:
            ap.error(f"--model: {e}")
    return args


def engine_configs(args) -> list[dict]:
    cands = sorted(set(args.specpilot_candidates or args.budgets))
    out = []
    for fmt, attention in [(f, a) for f in args.formats for a in args.attentions]:
        for name in args.engines:
            base = {"name": name, "weight_format": fmt, **({"attention": attention} if attention != "xla" else {})}
            if name == "ddtree":
                out += [{**base, "tree_budget": n} for n in args.budgets]
            elif name == "tlv":
                out.append({**base, "tree_budget": args.tlv_budget, "level1_format": args.level1_format})
            elif name == "specpilot":
                out.append({**base, "tree_budget": max(cands), "budget_candidates": cands})
            else:
                out.append(base)
    return sorted(out, key=lambda c: c["name"] == "specpilot")  # specpilot last: its table is fitted first


def calibration_configs(args) -> list[dict]:
    """Separate runs at the curves' anchor points, so every configuration — AR and stock included, the only
    ones with their commit / chain-tree stages — is predicted from measurements other than its own."""
    if args.calibration == "off":
        return []
    out = []
    for fmt, attention in [(f, a) for f in args.formats for a in args.attentions]:
        base = {"weight_format": fmt, **({"attention": attention} if attention != "xla" else {})}
        out += [{"name": n, **base} for n in ("ar", "stock") if n in args.engines]
        if {"ddtree", "specpilot", "tlv"} & set(args.engines):
            out += [{"name": "ddtree", **base, "tree_budget": n} for n in args.calibration_ddtree_budgets]
        if "tlv" in args.engines:
            out += [{"name": "tlv", **base, "tree_budget": n, "level1_format": args.level1_format}
                    for n in args.calibration_tlv_budgets]
        cands = sorted(set(args.calibration_specpilot_candidates))
        if "specpilot" in args.engines and cands:
            out.append({"name": "specpilot", **base, "tree_budget": max(cands), "budget_candidates": cands})
    return out


def log(msg: str) -> None:
    print(msg, flush=True)


def finish(res: dict, out: Path) -> list[str]:
    from specpilot.costmodel.report import bench_markdown, plot_bench, write_json

    files, note = plot_bench(res, out) if res["rows"] else ([], None)
    res["plots_note"] = note
    write_json(out / "bench.json", res)
    (out / "bench.md").write_text(bench_markdown(res))
    return ["bench.json", "bench.md", *files]


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.replot:
        out = Path(args.replot)
        res = json.loads((out / "bench.json").read_text())
        if res["rows"] and (args.refit or not res.get("validation")):  # else a run cut short: check it
            from specpilot.costmodel import leave_one_out
            from specpilot.costmodel.predict import StepTimeModel

            if res.get("validation") and "validation_as_run" not in res:
                res["validation_as_run"] = res["validation"]
            res["fit"] = StepTimeModel.fit(res["rows"]).to_json()
            res["validation"] = leave_one_out(res["rows"], res["deployment"]["drafter"]["block_size"])
        log("wrote " + ", ".join(finish(res, out)))
        return 0
    if not args.out:  # a W&B sweep agent passes only the swept arguments
        args.out = str(Path("outputs") / "bench" / time.strftime(f"%Y-%m-%d_%H-%M-%S_{os.getpid()}"))
    if bool(args.target) != bool(args.drafter):
        print("bench.py: --target and --drafter go together", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    if args.command_buffers:  # read when the backend starts, i.e. at the first jax.devices() below
        use_command_buffers()
    import jax

    from pallas_kernels import choices

    choices.use(matmul=args.matmul, norm=args.norm, rope=args.rope, swiglu_matmul=args.swiglu_matmul,
                qkv_rope_matmul=args.qkv_rope_matmul, pdl=args.pdl or None)
    from specpilot.decoding import tree as trees

    if args.tree_rank_max is not None:
        trees.RANK_TOP_K_MAX = args.tree_rank_max
    from specpilot.costmodel import leave_one_out, load_or_calibrate
    from specpilot.costmodel import measure as M
    from specpilot.costmodel.predict import StepTimeModel, TauProfile, with_kernel_projections
    from specpilot.costmodel.report import provenance, write_json

    if args.compile_cache.lower() != "none":
        M.enable_compile_cache(args.compile_cache)
    accel = jax.devices()[0].platform != "cpu"
    dtype = args.dtype or ("bfloat16" if accel else "float32")
    log(f"device {jax.devices()[0].device_kind}; calibrating ...")
    hw = load_or_calibrate(refresh=args.refresh_calibration)
    log(f"  read {hw.hbm_bytes_per_s / 1e12:.3f} TB/s, matmul {hw.matmul_flops_per_s / 1e12:.1f} TFLOP/s "
        f"[{time.perf_counter() - t_start:.1f}s]")
    if args.target:
        from specpilot.cli import one_line
        from specpilot.models.config import CheckpointError

        try:
            dep = M.checkpoint_deployment(args.target, args.drafter, dtype)
        except CheckpointError as e:
            print(one_line(f"checkpoint error: {e}"), file=sys.stderr, flush=True)
            return 2
    else:
        dep = M.synthetic_deployment(args.model, dtype, args.seed, args.drafter_layers, args.block_size)
    log(f"deployment {dep.name}: {dep.target_cfg.num_layers} target layers, drafter "
        f"{dep.drafter_cfg.layers.num_layers} layers, block {dep.block} [{time.perf_counter() - t_start:.1f}s]")
    configs = engine_configs(args)
    res = {"provenance": provenance(hw), "deployment": dep.describe(), "context": args.context, "rounds": args.rounds,
           "configs": configs, "rows": [], "skipped": [],
           "matmul": args.matmul or "default", "norm": args.norm or "default", "rope": args.rope or "default",
           "swiglu_matmul": args.swiglu_matmul or "default", "qkv_rope_matmul": args.qkv_rope_matmul or "default",
           "pdl": args.pdl, "tree_rank_max": trees.RANK_TOP_K_MAX}

    def save(rows, skipped):
        res["rows"], res["skipped"] = rows, skipped
        write_json(out / "bench.json", res)

    eager = {"auto": None, "on": True, "off": False}[args.eager_prefill]
    budget = None if args.budget_s is None else args.budget_s - (time.perf_counter() - t_start)
    workers = args.compile_workers or (4 if accel else 1)
    rows, skipped = M.sweep(dep, configs, args.batches, args.context, args.rounds, hw, budget, log, args.seed,
                            eager, on_row=save, calibration=calibration_configs(args), compile_workers=workers,
                            gpu_time=args.gpu_time)
    res["rows"], res["skipped"] = rows, skipped
    res["fit"] = StepTimeModel.fit(rows).to_json() if rows else {}
    res["validation"] = leave_one_out(rows, dep.block) if len(rows) > 1 else []

    tau = None
    if not dep.synthetic:
        given = json.loads(Path(args.prompts).read_text()) if args.prompts else dep.prompts
        prompts = [list(map(int, p)) for p in given] if given else M.random_prompts(
            args.num_prompts, 16, dep.target_cfg.vocab_size, args.seed, exclude=(dep.drafter_cfg.mask_token_id,))
        by_batch = {b: [r["engine_cfg"] for r in rows if r["batch"] == b and r.get("role") != "calibration"]
                    for b in args.batches}
        res["generate"] = M.generation_rows(dep, {b: c for b, c in by_batch.items() if c}, prompts, args.max_new,
                                            args.seed, log, compile_workers=workers)
        source = f"{dep.name} ({len(prompts)} prompts × {args.max_new} tokens, greedy)"
        tau = M.tau_profile_from(res["generate"], source)
        write_json(out / "tau_profile.json", tau.to_json())
    elif args.tau_profile:
        tau = TauProfile.from_json(json.loads(Path(args.tau_profile).read_text()))
    if tau is not None and rows:
        res["tau_profile"] = tau.to_json()
        res["projected"] = with_kernel_projections(rows, tau, dep.block) if dep.synthetic else []

    files = finish(res, out)
    if args.wandb:
        log_wandb(res, args)
    log(f"done in {time.perf_counter() - t_start:.1f}s; wrote {', '.join(files)} to {out}")
    print(json.dumps({"out": str(out), "rows": len(rows), "skipped": len(skipped)}))
    return 0


def log_wandb(res: dict, args) -> None:
    try:
        import wandb
    except ImportError:
        log("W&B not installed: --wandb ignored")
        return
    run = wandb.init(project="specpilot", job_type="bench", config={k: v for k, v in vars(args).items()})
    cols = ["engine", "batch", "stage", "measured_ms", "ceiling_ms"]
    data = [[r["label"], r["batch"], s, ms, r["ceilings_ms"].get(s)]
            for r in res["rows"] for s, ms in r["stage_ms"].items()]
    run.log({"stages": wandb.Table(columns=cols, data=data)})
    for r in res["rows"]:
        if r.get("role") != "calibration":
            run.summary[f"round_ms/{r['label']}/B{r['batch']}"] = r["round_ms"]
    errors = [abs(v["error"]) for v in res.get("validation") or [] if v.get("error") is not None]
    if errors:  # the metric conf/sweeps/*.yaml minimise: the cost model's worst prediction error
        run.summary["costmodel_max_abs_error"] = max(errors)
    if res["rows"]:
        run.summary["round_ms_min"] = min(r["round_ms"] for r in res["rows"])
    run.finish()


if __name__ == "__main__":
    sys.exit(main())
