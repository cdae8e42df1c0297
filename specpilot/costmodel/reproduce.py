"""Shared machinery of the paper-reproduction scripts (scripts/reproduce_*.py).

Each script regenerates its table from fresh runs on this device, for every deployment it is given:
- a **real** pair (HF target + DFlash drafter; default: `shared/oracle_pair` beside the repository when
  present; `--proxy NAME`: the proxy pair trained here, prompted with held-out snippets of its corpus): τ and the
  speedup over AR are MEASURED — wall time of the fused generation loop, AR against the engine, same prompts, same
  tokens (checked: `lossless`). `--target-passthrough-layers N` deepens its target with N layers that change no
  output (`weights.add_passthrough_layers`): a launch-bound proxy then costs a step what a deeper model's does, with
  the same tokens and τ (the search's deployments do the same, `docs/search.md`);
- **synthetic** shapes (`--models`, random weights): step times are measured here, acceptance is not
  meaningful, so speedups are PROJECTED = τ · t_AR / t_step with τ from a real pair measured in the same
  run (or `--tau-profile`). Every projected number is labelled so.

No Hydra, no pydantic: these scripts run on the GPU machine as `python3 scripts/reproduce_*.py --out DIR`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from specpilot.argtypes import (existing_dir, existing_file, model_name, non_negative_int, positive_int,
                                proxy_recipe)
from specpilot.costmodel.predict import TauProfile, config_label, speedup, with_kernel_projections


def base_parser(doc: str, batches: list[int]) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder (created)")
    ap.add_argument("--target", type=existing_dir,
                    help="HF target folder of a real pair (default: shared/oracle_pair when present)")
    ap.add_argument("--drafter", type=existing_dir, help="DFlash drafter folder of that pair")
    ap.add_argument("--no-real", action="store_true", help="skip the real pair")
    ap.add_argument("--proxy", type=proxy_recipe,
                    help="the real pair is this proxy recipe's trained pair (conf/proxy/NAME.yaml or a path; trained "
                         "on first use, cached under SPECPILOT_CACHE), prompted with held-out snippets of its corpus")
    ap.add_argument("--prompt-len", type=positive_int, default=64, help="--proxy: tokens of each held-out prompt")
    ap.add_argument("--target-passthrough-layers", type=non_negative_int, default=0,
                    help="real pair: N more target layers that change no output (a deeper model's step cost)")
    ap.add_argument("--models", nargs="*", default=None, type=model_name,
                    help="synthetic target shapes (conf/model/*.yaml); default: tiny on CPU, qwen3_8b on GPU")
    ap.add_argument("--tau-profile", type=existing_file,
                    help="τ profile JSON for the projections when no real pair runs here")
    ap.add_argument("--batches", nargs="+", type=positive_int, default=batches)
    ap.add_argument("--context", type=positive_int, default=None,
                    help="synthetic: committed tokens (default 64 CPU, 1024 GPU)")
    ap.add_argument("--rounds", type=positive_int, default=6, help="timed rounds per step-time measurement")
    ap.add_argument("--max-new", type=positive_int, default=48, help="real pair: tokens generated per prompt")
    ap.add_argument("--num-prompts", type=positive_int, default=8, help="real pair: prompts used (its own first)")
    ap.add_argument("--prompts", type=existing_file,
                    help="real pair: JSON list of token-id prompts (default: the pair's oracle.json/prompts.json, "
                         "topped up with random tokens)")
    ap.add_argument("--specpilot-candidates", nargs="+", type=positive_int, default=[16, 64, 256])
    ap.add_argument("--tlv-budgets", nargs="*", type=positive_int, default=[128])
    ap.add_argument("--configs", type=existing_file,
                    help="JSON list of extra SpecPilot engine configs (e.g. the search's best)")
    ap.add_argument("--budget-s", type=float, default=None, help="time budget per synthetic deployment's sweep")
    ap.add_argument("--compile-cache", default=".cache/jax-compile")
    ap.add_argument("--compile-workers", type=positive_int, default=None,
                    help="threads compiling a batch's configs (stages, then generation loops) before timing "
                         "(default 4 on an accelerator, else 1)")
    ap.add_argument("--dtype", default=None, choices=("bfloat16", "float32"),
                    help="synthetic weights (default: bfloat16 on GPU, float32 on CPU)")
    ap.add_argument("--gpu-time", action="store_true",
                    help="also profile each stage's kernels under CUPTI: measured rows get the model on kernel time, "
                         "projected rows the projection on it (profiled rounds' wall is largely the host's: "
                         "docs/results/2026-12-07-profile-vs-loop-stages-h100/)")
    ap.add_argument("--command-buffers", action="store_true",
                    help="run every engine with while loops and conditionals in XLA's command buffers "
                         "(specpilot.decoding.engine.COMMAND_BUFFER_FLAGS, recorded in the provenance's XLA_FLAGS)")
    ap.add_argument("--seed", type=int, default=0)
    return ap


def specpilot_configs(args) -> list[dict]:
    """The 'SpecPilot' configurations a table chooses its best from (until the search writes one)."""
    cands = sorted(set(args.specpilot_candidates))
    out = [{"name": "specpilot", "tree_budget": max(cands), "budget_candidates": cands}]
    out += [{"name": "tlv", "tree_budget": n, "level1_format": "int8"} for n in args.tlv_budgets]
    if args.configs:
        extra = json.loads(Path(args.configs).read_text())
        out += extra if isinstance(extra, list) else [extra]
    return out


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def proxy_pair(spec_or_name, num_prompts: int, prompt_len: int, root=None) -> tuple[Path, Path, list[list[int]]]:
    """(target_dir, drafter_dir, prompts) of a proxy recipe's trained pair (trained here on first use): the
    prompts are held-out snippets of its corpus, `prompt_len` tokens each (fewer than `num_prompts` when the
    held-out files run out)."""
    from specpilot.training import tokenizer as tk
    from specpilot.training.acceptance import eval_prompts
    from specpilot.training.corpus import load_corpus
    from specpilot.training.proxy import ensure_proxy
    from specpilot.training.spec import load_spec

    spec = load_spec(spec_or_name) if isinstance(spec_or_name, (str, Path)) else spec_or_name
    target, drafter = ensure_proxy(spec, root)
    tokenizer = tk.load_tokenizer(target.parent / "tokenizer")
    return target, drafter, eval_prompts("heldout", tokenizer, load_corpus(spec.corpus), num_prompts, prompt_len)


def _real_pair(args) -> tuple[Path, Path, list[list[int]] | None] | None:
    """(target, drafter, prompts or None) of the real pair the arguments name, or None."""
    from specpilot.costmodel.measure import ORACLE_PAIR

    if args.no_real:
        return None
    if args.proxy:
        return proxy_pair(args.proxy, args.num_prompts, args.prompt_len)
    if args.target:
        return Path(args.target), Path(args.drafter), None
    if (ORACLE_PAIR / "target").is_dir() and (ORACLE_PAIR / "drafter").is_dir():
        return ORACLE_PAIR / "target", ORACLE_PAIR / "drafter", None
    return None


def check_pair_args(args) -> None:
    """The real-pair flags that contradict each other, as one-line exits before any work."""
    if bool(args.target) != bool(args.drafter):
        raise SystemExit("--target and --drafter go together")
    if args.proxy and args.target:
        raise SystemExit("--proxy is the real pair: give it or --target/--drafter, not both")
    if args.no_real and (args.proxy or args.target or args.target_passthrough_layers):
        raise SystemExit("--no-real skips the real pair: drop it, or --proxy, --target/--drafter and "
                         "--target-passthrough-layers")


def run(args, configs: list[dict], script: str) -> dict:
    """Measure `configs` (AR is added) on every deployment; returns {"provenance", "deployments",
    "entries"}: one entry per (deployment, config, batch) with τ, speedup and kind (measured/projected)."""
    check_pair_args(args)
    if args.command_buffers:
        from specpilot.decoding.engine import use_command_buffers

        use_command_buffers()  # before the backend starts: jax.devices() below
    import jax

    from specpilot.costmodel import load_or_calibrate
    from specpilot.costmodel import measure as M
    from specpilot.costmodel.report import provenance

    if args.compile_cache and args.compile_cache.lower() != "none":
        M.enable_compile_cache(args.compile_cache)
    accel = jax.devices()[0].platform != "cpu"
    workers = args.compile_workers or (4 if accel else 1)
    hw = load_or_calibrate()
    configs = [{"name": "ar"}] + [c for c in configs if c["name"] != "ar"]
    configs = sorted(configs, key=lambda c: c["name"] == "specpilot")  # specpilot fitted from the rest
    res = {"provenance": provenance(hw), "script": script, "deployments": [], "entries": []}
    tau = TauProfile.from_json(json.loads(Path(args.tau_profile).read_text())) if args.tau_profile else None

    pair = _real_pair(args)
    if pair:
        t0 = time.perf_counter()
        target, drafter, pair_prompts = pair
        dep = M.checkpoint_deployment(target, drafter, dtype="float32")
        if pair_prompts is not None:
            dep.prompts = pair_prompts
        if args.target_passthrough_layers:
            from specpilot.models.weights import add_passthrough_layers

            dep.target_cfg, dep.target_w = add_passthrough_layers(dep.target_cfg, dep.target_w,
                                                                  args.target_passthrough_layers)
            dep.name += f"+{args.target_passthrough_layers} passthrough"
        given = json.loads(Path(args.prompts).read_text()) if args.prompts else dep.prompts
        prompts = [list(map(int, p)) for p in (given or [])][: args.num_prompts]
        if len(prompts) < args.num_prompts:
            log(f"{dep.name}: {len(prompts)} prompts of its own; {args.num_prompts - len(prompts)} random ones added")
            prompts += M.random_prompts(args.num_prompts - len(prompts), 12, dep.target_cfg.vocab_size, args.seed,
                                        exclude=(dep.drafter_cfg.mask_token_id,))
        context = max(len(p) for p in prompts)
        rows, _ = M.sweep(dep, configs, args.batches, context, args.rounds, hw, log=log, seed=args.seed,
                          compile_workers=workers, gpu_time=args.gpu_time)
        by_batch = {b: [r["engine_cfg"] for r in rows if r["batch"] == b] for b in args.batches}
        gens = M.generation_rows(dep, by_batch, prompts, args.max_new, args.seed, log, compile_workers=workers)
        ar_round = {r["batch"]: r["round_ms"] for r in rows if r["label"] == "ar"}
        ar_kernels = {r["batch"]: kernel_round_ms(r) for r in rows if r["label"] == "ar"}
        ar_lockstep = {g["batch"]: g["lockstep_tau"] for g in gens if g["label"] == "ar"}
        for g in gens:
            row = next(r for r in rows if r["batch"] == g["batch"] and r["label"] == g["label"])
            kernels, lockstep = kernel_round_ms(row), g["lockstep_tau"] / ar_lockstep[g["batch"]]
            res["entries"].append({
                "deployment": dep.name, "kind": "measured", "label": g["label"], "engine_cfg": row["engine_cfg"],
                "batch": g["batch"], "tau": g["tau"], "speedup": g["speedup"], "lossless": g["lossless"],
                "ms_per_token": g["ms_per_token"], "loop_step_ms": g["loop_step_ms"], "t_step_ms": row["round_ms"],
                "t_ar_ms": ar_round[g["batch"]],
                "model_speedup": speedup(g["tau"], ar_round[g["batch"]], row["round_ms"]),
                "lockstep_tau": g["lockstep_tau"],
                # the rows run in lockstep: τ as the loop delivers it, relative to AR's (1 without EOS)
                "model_speedup_lockstep": speedup(lockstep, ar_round[g["batch"]], row["round_ms"]),
                # --gpu-time: the same on the profiled stages' kernel time, which the host does not enter
                "t_step_kernels_ms": kernels,
                "model_speedup_kernels": (speedup(lockstep, ar_kernels[g["batch"]], kernels)
                                          if kernels and ar_kernels[g["batch"]] else None),
                # the profiled round stage by stage: wall, and with --gpu-time kernel time and launches
                **{k: row[k] for k in ("stage_ms", "stage_gpu_ms", "stage_gpu_launches") if k in row},
            })
        if tau is None:
            source = f"{dep.name} measured in this run ({len(prompts)} prompts × {args.max_new} tokens)"
            tau = M.tau_profile_from(gens, source)
        res["deployments"].append({**dep.describe(), "kind": "measured", "prompts": len(prompts),
                                   "max_new": args.max_new, "wall_s": time.perf_counter() - t0})
    models = args.models if args.models is not None else (["qwen3_8b"] if accel else ["tiny"])
    if models and tau is None:
        raise SystemExit("synthetic deployments need a τ profile: give --tau-profile, or a real pair "
                         "(--target/--drafter)")
    for model in models:
        t0 = time.perf_counter()
        dep = M.synthetic_deployment(model, args.dtype or ("bfloat16" if accel else "float32"), args.seed)
        context = args.context or (1024 if accel else 64)
        rows, skipped = M.sweep(dep, configs, args.batches, context, args.rounds, hw, args.budget_s, log, args.seed,
                                compile_workers=workers, gpu_time=args.gpu_time)
        ar_round = {r["batch"]: r["round_ms"] for r in rows if r["label"] == "ar"}
        for p in with_kernel_projections(rows, tau, dep.block):
            base = p["label"].split(" (budget")[0]
            row = next(r for r in rows if r["batch"] == p["batch"] and r["label"] == base)
            res["entries"].append({"deployment": dep.name, "kind": "projected", "engine_cfg": row["engine_cfg"],
                                   "t_ar_ms": ar_round.get(p["batch"]), **p})
        res["deployments"].append({**dep.describe(), "kind": "projected", "context": context,
                                   "tau_profile": tau.to_json(), "skipped": skipped,
                                   "wall_s": time.perf_counter() - t0})
    return res


def kernel_round_ms(row: dict) -> float | None:
    """A profiled row's round as its stages' CUPTI kernel time (ms), or None without it (no `--gpu-time`, no GPU)."""
    return sum(row["stage_gpu_ms"].values()) if row.get("stage_gpu_ms") else None


def fmt_speedup(e: dict | None) -> str:
    if e is None:
        return "–"
    tag = "" if e["kind"] == "measured" else " (projected)"
    loss = "" if e.get("lossless", True) else " NOT LOSSLESS"
    return f"{e['speedup']:.2f}× (τ {e['tau']:.2f}){tag}{loss}"


def groups(res: dict, batches):
    """(deployment, batch, its entries) for every deployment × batch that has measurements."""
    for d in res["deployments"]:
        for b in batches:
            es = [e for e in res["entries"] if e["deployment"] == d["name"] and e["batch"] == b]
            if es:
                yield d, b, es


def best(entries: list[dict], pred) -> dict | None:
    pool = [e for e in entries if pred(e)]
    return max(pool, key=lambda e: e["speedup"]) if pool else None


def configurations_table(res: dict) -> list[str]:
    """The tables' "all configurations" list as markdown lines: every configuration, and AR where it was measured
    (its loop's step beside its profiled round). `loop ms / step`, lockstep τ and the two wall-time model speedups only
    for measured rows, the kernel-time columns where `--gpu-time` gave them (a projected row's: its projection on
    kernel time), `lossless` only for real pairs."""
    from specpilot.costmodel.report import md_table  # None prints as "–"

    rows = [[e["deployment"], e["label"], e["batch"], e["kind"], e["tau"], e["speedup"], e["t_step_ms"],
             e.get("t_ar_ms"), e.get("loop_step_ms"), e.get("lockstep_tau"), e.get("model_speedup"),
             e.get("model_speedup_lockstep"), e.get("t_step_kernels_ms"), e.get("model_speedup_kernels"),
             e.get("lossless", "n/a (random weights)")]
            for e in res["entries"] if e["label"] != "ar" or e["kind"] == "measured"]
    return [md_table(["deployment", "config", "batch", "kind", "τ", "speedup", "t_step ms", "t_AR ms",
                      "loop ms / step", "lockstep τ", "model", "model (lockstep)", "t_step kernels ms",
                      "model (lockstep, kernels)", "lossless"], rows), ""]


def header(res: dict, title: str) -> list[str]:
    from specpilot.costmodel.report import provenance_lines

    lines = [f"# {title}", ""] + provenance_lines(res["provenance"])
    for d in res["deployments"]:
        if d["kind"] == "measured":
            lines.append(f"- **{d['name']}** (real checkpoints): MEASURED — wall time of the fused generation loop "
                         f"over {d['prompts']} prompts × {d['max_new']} greedy tokens, AR vs engine; "
                         "τ = tokens per round; t_step = a round profiled stage by stage (the cost model's input), "
                         "loop ms / step = the fused loop's wall time per iteration (its rows in lockstep); "
                         "lockstep τ = tokens a row commits per loop iteration (the slowest row sets the "
                         "iterations); model = τ · t_AR / t_step, model (lockstep) the same with lockstep τ ÷ "
                         "AR's; t_step kernels = the profiled stages' CUPTI kernel time, and the lockstep model on "
                         "it (`--gpu-time`, GPU only).")
        else:
            lines.append(f"- **{d['name']}** (random weights, context {d['context']}): PROJECTED — "
                         f"τ · t_AR / t_step with step times measured here and τ from {d['tau_profile']['source']}"
                         + (" (× the share of τ its loop delivered in lockstep, at the batches it was measured: "
                            + ", ".join(f"{b}: {v:.2f}" for b, v in d["tau_profile"]["lockstep"].items()) + ")"
                            if d["tau_profile"].get("lockstep") else "") + "; with `--gpu-time` also the same "
                         "projection on the profiled stages' CUPTI kernel time (t_step kernels, model (lockstep, "
                         "kernels)), which the host does not enter.")
    return lines + [""]


def save(res: dict, out: Path, stem: str, markdown: str) -> None:
    from specpilot.costmodel.report import write_json

    out.mkdir(parents=True, exist_ok=True)
    write_json(out / f"{stem}.json", res)
    (out / f"{stem}.md").write_text(markdown)
    print(markdown)


def label_is(name: str):
    return lambda e: e["engine_cfg"]["name"] == name


def is_specpilot_config(e: dict) -> bool:
    return e["engine_cfg"]["name"] in ("specpilot", "tlv") or e["engine_cfg"].get("weight_format", "bf16") != "bf16"


__all__ = ["base_parser", "best", "config_label", "fmt_speedup", "header", "is_specpilot_config", "label_is", "log",
           "run", "save", "specpilot_configs"]
