"""Provenance, markdown tables and plots for the benchmark and reproduction outputs.

matplotlib is imported lazily: where it is missing (the GPU machine), `plot_bench` returns a note and
the plots can be drawn later from the JSON (`scripts/bench.py --replot DIR`).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shlex
import sys
from pathlib import Path

from specpilot.costmodel.cupti import kernel_summary
from specpilot.provenance import git_commit

STAGES = ("draft", "tree", "level1", "verify", "commit")




def provenance(hw=None) -> dict:
    import jax

    dev = jax.devices()[0]
    return {
        "date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "device": str(dev.device_kind),
        "platform": dev.platform,
        "device_count": jax.device_count(),
        "jax": jax.__version__,
        "commit": git_commit(),
        "command": " ".join(shlex.quote(a) for a in ["python", *sys.argv]),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),  # they change what XLA compiles, so what is timed
        **({"hardware": hw.to_json()} if hw is not None else {}),
    }


def provenance_lines(p: dict) -> list[str]:
    lines = [
        f"- Date: {p['date']}. Device: {p['device']} ({p['platform']}, {p['device_count']} device(s)), jax {p['jax']}.",
        f"- Commit: `{p['commit']}`.",
        f"- Command: `{p['command']}`",
    ]
    if p.get("xla_flags"):
        lines.append(f"- XLA_FLAGS: `{p['xla_flags']}`")
    hw = p.get("hardware")
    if hw:
        lines.append(f"- Calibration ({hw.get('measured_at', '')}): read bandwidth "
                     f"{hw['hbm_bytes_per_s'] / 1e12:.3f} TB/s, {hw['matmul_dtype']} matmul "
                     f"{hw['matmul_flops_per_s'] / 1e12:.1f} TFLOP/s.")
    return lines


def md_table(headers: list[str], rows: list[list]) -> str:
    def cell(x):
        if x is None:
            return "–"
        if isinstance(x, float):
            return f"{x:.3f}" if abs(x) < 100 else f"{x:.1f}"
        return str(x)

    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    tmp.replace(path)


# ---- bench --------------------------------------------------------------------------------------------


def gpu_time_lines(rows: list[dict]) -> list[str]:
    """`bench.py --gpu-time`: each stage's kernel time (CUPTI) per round, and what tree build + commit (accept
    and KV compaction) take of it (issue #8's target: <= 3 %); where the rows have `stage_gpu_kernels`, the tree and
    commit stages' kernels one line each."""
    timed = [r for r in rows if r.get("stage_gpu_ms")]
    errors = sorted({r["stage_gpu_error"] for r in rows if r.get("stage_gpu_error")})
    if not timed and not errors:
        return []
    out = ["## GPU time per stage (ms per round: the stage's kernels from CUPTI, no host dispatch, no launch gaps)", ""]
    if timed:
        stages = [s for s in STAGES if any(s in r["stage_gpu_ms"] for r in timed)]
        table = []
        for r in timed:
            g = r["stage_gpu_ms"]
            total = sum(g.values())
            share = (g.get("tree", 0.0) + g.get("commit", 0.0)) / total if total else None
            table.append([r["label"] + (" (calibration)" if r.get("role") == "calibration" else ""), r["batch"],
                          *[g.get(s) for s in stages], total, f"{100 * share:.1f} %" if share is not None else None])
        out += [md_table(["engine", "B", *stages, "sum", "tree + commit"], table), ""]
        split = [(r, s, r["stage_gpu_kernels"][s]) for r in timed for s in ("tree", "commit")
                 if r.get("stage_gpu_kernels", {}).get(s)]
        if split:
            out += ["The tree and commit stages kernel by kernel (µs a round, launches summed, largest first):", ""]
            out += [f"- {r['label']} B={r['batch']} {s}: " + kernel_summary({k: 1e3 * ms for k, ms in kernels.items()})
                    for r, s, kernels in split] + [""]
    out += [f"- not measured: {e}" for e in errors] + ([""] if errors else [])
    return out


def _tree_top_k(rank_max: int) -> str:
    return f"counted up to {rank_max} elements" if rank_max else "sorted"


def bench_markdown(res: dict) -> str:
    dep = res["deployment"]
    rows = res["rows"]
    out = [f"# Step-time benchmark: {dep['name']} on {res['provenance']['device']}", ""]
    # a bench.json written before `provenance` recorded XLA_FLAGS kept them beside it
    out += provenance_lines({"xla_flags": res.get("xla_flags", ""), **res["provenance"]})
    capacity = rows[0]["capacity"] if rows else "–"
    weights = "random (synthetic shapes)" if dep["synthetic"] else "checkpoint"
    out += [f"- Context {res['context']} committed tokens per request (KV capacity {capacity}),"
            f" {res['rounds']} timed rounds after one warm-up; weights: {weights}.",
            "- Stage times: `Engine.profile`: each stage jitted alone, its device time per round (the smaller of a synchronised and a pipelined estimate, host dispatch subtracted), mean over rounds.",
            f"- bf16 linears: {res.get('matmul', 'default')} (`skinny_matmul.ops.DEFAULT`); residual add + RMSNorm: "
            f"{res.get('norm', 'default')} (`add_rms_norm.ops.DEFAULT`); q/k norm + rope: {res.get('rope', 'default')} "
            f"(`qk_norm_rope.ops.DEFAULT`); PDL: {'yes' if res.get('pdl') else 'no'}; "
            f"tree top-k's: {_tree_top_k(res.get('tree_rank_max', 0))} (`tree.RANK_TOP_K_MAX`).",
            ""]
    out += ["## Step time per round (ms)", ""]
    stages = [s for s in STAGES if any(s in r["stage_ms"] for r in rows)]
    table = []
    for r in rows:
        ceil = sum(r["ceilings_ms"].values()) if r.get("ceilings_ms") else None
        table.append([r["label"] + (" (calibration)" if r.get("role") == "calibration" else ""), r["batch"], *[r["stage_ms"].get(s) for s in stages], r["round_ms"], ceil,
                      r["round_ms"] / ceil if ceil else None])
    out += [md_table(["engine", "B", *stages, "round", "ceiling", "× ceiling"], table), ""]
    out += gpu_time_lines(rows)
    out += ["## Components against their ceilings", "",
            "Ceiling = max(bytes ÷ measured bandwidth, FLOPs ÷ measured matmul peak) of the stage's necessary work "
            "(docs/costmodel.md). Ranked within each configuration by the gap's cost per committed token.", ""]
    comp = []
    for r in rows:
        g = r.get("gaps")
        if not g:
            continue
        for c in g["components"]:
            comp.append([r["label"] + (" (calibration)" if r.get("role") == "calibration" else ""), r["batch"], c["stage"], c["measured_ms"], c["ceiling_ms"], c["gap_ms"],
                         c["gap_ms_per_token"], c["ratio"], r["costs"][c["stage"]]["bytes"] / 1e6])
    out += [md_table(["engine", "B", "stage", "measured ms", "ceiling ms", "gap ms", "gap ms/token", "× ceiling",
                      "MB moved"], comp), ""]
    loo = res.get("validation") or []
    if loo:
        out += ["## Cost model: each configuration predicted from the other rows (leave one out)", "",
                "The fit holds every other row, calibration runs included, never the configuration's own.", ""]
        out += [md_table(["engine", "B", "measured ms", "predicted ms", "error"],
                         [[v["label"], v["batch"], v["measured_ms"], v["predicted_ms"],
                           v.get("note") if v["error"] is None else f"{100 * v['error']:+.1f}%"] for v in loo]), ""]
        errs = [abs(v["error"]) for v in loo if v["error"] is not None]
        if errs:
            within = sum(e <= 0.10 for e in errs)
            out += [f"Largest |error| {100 * max(errs):.1f}%, {within}/{len(errs)} within 10%.", ""]
    proj = res.get("projected") or []
    if proj:
        out += [f"## PROJECTED speedup over AR (τ from {res['tau_profile']['source']}; step times measured here)", "",
                "Projected = τ · t_AR / t_step: the step times are this run's, the acceptance is not this model's.",
                ""]
        kernels = any(p.get("t_step_kernels_ms") is not None for p in proj)  # `--gpu-time`: also on kernel time
        out += [md_table(["engine", "B", "τ", "τ from", "t_step ms", "t_AR ms", "projected speedup"]
                         + (["t_step kernels ms", "projected on kernels"] if kernels else []),
                         [[p["label"], p["batch"], p["tau"], p["tau_how"], p["t_step_ms"], p["t_ar_ms"], p["speedup"]]
                          + ([p.get("t_step_kernels_ms"), p.get("model_speedup_kernels")] if kernels else [])
                          for p in proj]), ""]
    real = res.get("generate") or []
    if real:
        out += ["## Measured on the checkpoint pair (fused generation loop)", ""]
        out += [md_table(["engine", "B", "τ", "ms/token", "measured speedup", "lossless"],
                         [[g["label"], g["batch"], g["tau"], g["ms_per_token"], g.get("speedup"), g.get("lossless")]
                          for g in real]), ""]
    if res.get("skipped"):
        out += ["## Skipped", ""] + [f"- {s['label']} B={s['batch']}: {s['reason']}" for s in res["skipped"]] + [""]
    if res.get("plots_note"):
        out += [res["plots_note"], ""]
    return "\n".join(out)


def plot_bench(res: dict, out_dir: Path) -> tuple[list[str], str | None]:
    """step_vs_nodes.png and components.png; ([], note) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], ("Plots not drawn: matplotlib is not installed here. Draw them from the JSON with "
                    f"`python scripts/bench.py --replot {out_dir}`.")
    rows = res["rows"]
    files = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for b in sorted({r["batch"] for r in rows}):
        at_b = [r for r in rows if r["batch"] == b and "verify" in r["stage_ms"]
                and r["points"]["verify"][0] == "target_pass/bf16"]
        by_x: dict[float, list[float]] = {}
        for r in at_b:
            by_x.setdefault(r["points"]["verify"][1], []).append(r["stage_ms"]["verify"])
        if not by_x:
            continue
        xs = sorted(by_x)
        (line,) = ax.plot(xs, [sum(by_x[x]) / len(by_x[x]) for x in xs], "o-", label=f"verify (target pass), B={b}")
        trees = sorted((r["points"]["verify"][1], r["round_ms"]) for r in at_b if r["engine_cfg"]["name"] == "ddtree")
        if trees:
            ax.plot(*zip(*trees), "s--", color=line.get_color(), alpha=0.6, label=f"ddtree whole round, B={b}")
        for r in at_b:
            ax.annotate(r["label"], (r["points"]["verify"][1], r["stage_ms"]["verify"]), fontsize=6, alpha=0.7,
                        xytext=(3, -8), textcoords="offset points")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens verified per request (tree nodes + root)")
    ax.set_ylabel("ms per round")
    ax.set_title(f"{res['deployment']['name']} on {res['provenance']['device']}: step time vs tree size", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "step_vs_nodes.png", dpi=120)
    plt.close(fig)
    files.append("step_vs_nodes.png")

    with_ceil = [r for r in rows if r.get("ceilings_ms")]
    if with_ceil:
        fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(with_ceil) + 2), 4.5))
        colors = dict(zip(STAGES, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
        labelled = set()
        for i, r in enumerate(with_ceil):
            for j, (what, src) in enumerate((("measured", r["stage_ms"]), ("ceiling", r["ceilings_ms"]))):
                bottom = 0.0
                for s in STAGES:
                    if s in src:
                        ax.bar(i + (j - 0.5) * 0.38, src[s], 0.36, bottom=bottom, color=colors[s],
                               alpha=1.0 if what == "measured" else 0.45, hatch=None if what == "measured" else "//",
                               label=None if s in labelled else s)
                        labelled.add(s)
                        bottom += src[s]
        ax.set_xticks(range(len(with_ceil)), [f"{r['label']}\nB={r['batch']}" for r in with_ceil], fontsize=6,
                      rotation=45, ha="right")
        ax.set_ylabel("ms per round (left: measured, right hatched: ceiling)")
        ax.set_title("component time vs ceiling", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(out_dir / "components.png", dpi=120)
        plt.close(fig)
        files.append("components.png")
    return files, None
