"""One command that trains (or loads) a proxy pair and measures it: the GPU machine's entry point, where
Hydra, pydantic and W&B are not installed.

    PYTHONPATH=$PWD python3 -m specpilot.training.proxy --size proxy_gpu --work /tmp/proxy_gpu --out $OUT \\
        --acceptance --temperatures 0 1 --deadline-s 570

`--out` gets results.json and summary.md, rewritten after training and after every acceptance measurement,
so a run killed at its time limit still leaves what it measured. Measurements run stock and ddtree at every
temperature first, then the other engines; with `--deadline-s`, one that might not finish in time (judged by
the slowest so far) is skipped and listed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from specpilot.argtypes import non_negative_float
from specpilot.provenance import git_commit
from specpilot.training.acceptance import CONF_ENGINE
from specpilot.training.proxy import _locked, _write_json, build, proxy_dir
from specpilot.training.spec import ProxySpec, SpecError, load_spec

log = logging.getLogger(__name__)

MUST_MEASURE = ("stock", "ddtree")  # the acceptance report's required engines, measured before the others


def run_acceptance(spec: ProxySpec, work: Path, temperatures, engines, prompts_source: str, dtype: str,
                   deadline: float | None = None, on_result=None) -> dict:
    """{"prompts": ..., f"T={t}": {engine: {...}}} on the recipe's evaluation prompts.

    With a `deadline` (perf_counter time), a measurement that might not finish before it is recorded as
    skipped. `on_result(partial)` after each measurement."""
    import jax.numpy as jnp

    from specpilot.models import hf
    from specpilot.training.acceptance import eval_prompts, measure
    from specpilot.training.corpus import load_corpus
    from specpilot.training.tokenizer import load_tokenizer

    corpus = load_corpus(spec.corpus)
    tok = load_tokenizer(work / "tokenizer")
    e = spec.eval
    prompts = eval_prompts(prompts_source, tok, corpus, e.num_prompts, e.prompt_tokens)
    jdtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[dtype]
    tcfg, tw = hf.load_target(work / "target", jdtype)
    dcfg, dw = hf.load_drafter(work / "drafter", jdtype)
    out: dict = {"prompts": {"source": prompts_source, "count": len(prompts), "prompt_tokens": e.prompt_tokens,
                             "max_new_tokens": e.max_new_tokens, "dtype": dtype}}
    for t in temperatures:
        out[f"T={t:g}"] = {}
    # stock and ddtree at every temperature first (what the report must show), then the others
    order = [(n, t) for n in engines if n in MUST_MEASURE for t in temperatures]
    order.sort(key=lambda p: temperatures.index(p[1]))
    order += [(n, t) for n in engines if n not in MUST_MEASURE for t in temperatures]
    longest = 0.0  # the slowest measurement so far (compile included): the next one may take as long
    for name, t in order:
        key = f"T={t:g}"
        if deadline is not None and time.perf_counter() + longest > deadline:
            out.setdefault("skipped", []).append(f"{name}@{key}")
            log.warning("deadline: skipping %s at %s", name, key)
            continue
        t0 = time.perf_counter()
        out[key].update(measure(None, None, prompts, [name], t, e.max_new_tokens, e.batch_size, dtype, spec.seed,
                                weights=(tcfg, tw, dcfg, dw)))
        longest = max(longest, time.perf_counter() - t0)
        if on_result is not None:
            on_result(out)
    return out


def summary_markdown(report: dict, acceptance: dict | None, command: str) -> str:
    t, d = report["target"], report["drafter"]
    lines = [
        f"# Proxy pair `{report['name']}`",
        "",
        f"- Command: `{command}`",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; commit: `{git_commit()}`; cache key `{report['key']}`",
        f"- Corpus: {report['corpus']['train_files']} train / {report['corpus']['held_out_files']} held-out files, "
        f"{report['tokenizer']['train_tokens']:,} train tokens (vocab {report['tokenizer']['vocab_size']}, "
        f"{report['tokenizer']['bytes_per_token']:.2f} bytes/token)",
        f"- Target: {t['params']:,} params, {t['steps']} steps ({t['tokens_seen']:,} tokens), "
        f"held-out loss **{t['held_out_loss']:.3f}** nats/token (train {t['train_loss']:.3f})",
        f"- Drafter: {d['params']:,} params, {d['steps']} steps, held-out loss **{d['held_out_loss']:.3f}**, "
        f"held-out simulated stock τ {d['held_out']['stock_tau_simulated']:.2f}, "
        f"row accuracy {d['held_out']['row_accuracy']}",
        "- Time: " + ", ".join(f"{k} {v:.0f} s" for k, v in report["timings"].items()),
    ]
    if acceptance:
        p = acceptance["prompts"]
        lines += ["", f"Acceptance on {p['count']} {p['source']} prompts, {p['max_new_tokens']} new tokens each:", "",
                  "| T | engine | τ | histogram (rounds committing 1, 2, … tokens) |", "|---|---|---|---|"]
        for key, res in acceptance.items():
            if key.startswith("T="):
                for name, r in res.items():
                    lines.append(f"| {key[2:]} | {name} | {r['tau']:.3f} | {r['histogram']} |")
        if acceptance.get("skipped"):
            lines += ["", f"Skipped (deadline): {', '.join(acceptance['skipped'])}"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    t_start = time.perf_counter()
    ap = argparse.ArgumentParser(description="Train (or load from cache) a proxy target/drafter pair.")
    ap.add_argument("--size", default="proxy_tiny", help="recipe in conf/proxy/ (proxy_tiny, proxy_gpu, ...)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a recipe key")
    ap.add_argument("--work", help="folder for checkpoints and the trained pair (default: the proxy cache)")
    ap.add_argument("--out", help="write results.json and summary.md here (updated after every phase)")
    ap.add_argument("--acceptance", action="store_true", help="measure tau for the engines after training")
    ap.add_argument("--temperatures", type=non_negative_float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--engines", nargs="+", default=["stock", "ddtree", "specpilot"],
                    choices=sorted(p.stem for p in CONF_ENGINE.glob("*.yaml")))
    ap.add_argument("--prompts", default="heldout", choices=["heldout", "humaneval", "both"])
    ap.add_argument("--dtype", default=None, choices=("float32", "bfloat16"),
                    help="engine dtype for acceptance (default: the target's train dtype)")
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="wall-time budget of the whole command: an acceptance measurement that might not finish "
                         "before it (judged by the slowest one so far) is skipped")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("jax", "absl", "orbax"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        spec = load_spec(args.size, args.set)
    except SpecError as e:
        print(e, file=sys.stderr)
        return 2
    command = "python -m specpilot.training.proxy " + " ".join(argv if argv is not None else sys.argv[1:])
    out = Path(args.out) if args.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work) if args.work else proxy_dir(spec)

    def write(report: dict | None, acceptance: dict | None) -> str:
        result = {"command": command, "commit": git_commit(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                  "target_dir": str(work / "target"), "drafter_dir": str(work / "drafter"),
                  "elapsed_s": time.perf_counter() - t_start, "acceptance": acceptance,
                  "report": None if report is None else {k: v for k, v in report.items() if k != "recipe"},
                  "recipe": spec.to_dict()}
        md = summary_markdown(report, acceptance, command) if report is not None else ""
        if out is not None:
            _write_json(out / "results.json", result)
            (out / "summary.md").write_text(md)
        return md

    if (work / "report.json").is_file():
        report = json.loads((work / "report.json").read_text())
        log.info("%s: cached pair in %s", spec.name, work)
    else:
        with _locked(work.with_name(work.name + ".lock")):
            report = build(spec, work)
    write(report, None)
    acceptance = None
    if args.acceptance:
        deadline = t_start + args.deadline_s if args.deadline_s else None
        acceptance = run_acceptance(spec, work, args.temperatures, args.engines, args.prompts,
                                    args.dtype or spec.target_train.dtype, deadline,
                                    on_result=lambda partial: write(report, partial))
    md = write(report, acceptance)
    print(md, file=sys.stderr)
    compact = {"target_held_out_loss": report["target"]["held_out_loss"],
               "drafter_held_out_loss": report["drafter"]["held_out_loss"], "target_dir": str(work / "target"),
               "drafter_dir": str(work / "drafter")}
    if acceptance:
        compact["acceptance"] = {k: {e: {"tau": r["tau"], "histogram": r["histogram"]} for e, r in v.items()}
                                 for k, v in acceptance.items() if k.startswith("T=")}
    print(json.dumps(compact), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
