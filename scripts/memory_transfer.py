"""Memory transfer: deployment A's search writes memory records; deployment B is then searched twice, seeded
with those records and with an empty memory. Does the seeded search reach its best sooner? (docs/search.md)

    python scripts/memory_transfer.py --work DIR -- deployment=cpu search.wandb.mode=disabled   # A, then B twice
    python scripts/memory_transfer.py --work DIR --phase a -- +deployment=h200 deployment.proposer=offline ...
    python scripts/memory_transfer.py --work DIR --phase b -- +deployment=h200 ...   # seeded from memory_store/
    python scripts/memory_transfer.py --work DIR --compare          # only compare DIR/b_seeded, DIR/b_unseeded again

Every search is `scripts/search.py` with the overrides after `--` (common to all runs), then the phase's own
(`--a`, default `deployment.batch=1`; `--b`, default `deployment.batch=4`: same pair, hardware and sampling, so
A's records meet B's preconditions — see memory_store/README.md), then the run's folders:

    DIR/a/                run directory of A (summary.json, trials.jsonl)   DIR/memory_a/records/   A's records
    DIR/b_seeded/         B seeded: its memory is a copy of --seed-memory (default: DIR/memory_a with
                          --phase all, else the repository's memory_store/) in DIR/memory_b_seeded/
    DIR/b_unseeded/       B with an empty memory (DIR/memory_b_unseeded/)
    DIR/<run>.log         each search's stderr (also echoed here, prefixed)
    DIR/transfer.json     A's rounds and records; B: each run's best, when it was first found (trial, search
    DIR/transfer.md       seconds), when each reached the target level (specpilot/agent/transfer.py), verdict

Each run gets its own XLA compilation cache (DIR/jax_<run>) unless `--shared-compile-cache`: a run must not
compile faster because the other one compiled the same programs first. B's unseeded run goes first
(`--order`), or both run at once, one per GPU, with `--parallel-devices 0,1`. `--run-timeout-s` kills a search
that runs too long; its trials so far (trials.jsonl) still enter the comparison, marked cut off (the searches'
own `search.max_seconds` is the gentler limit: no round starts after it). Searches that find a run directory
with a trial log resume it. The last stdout line is one JSON object; the exit code is 1 if a search failed, 2 (and
no comparison written, no JSON line) if one refused its configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from specpilot.agent.transfer import (  # noqa: E402
    compare, load_run, markdown, run_stats, seconds_text, speedup_text)

OWN_KEYS = ("hydra.run.dir", "search.memory_dir", "search.resume")


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def run_search(name: str, work: Path, overrides: list[str], memory_dir: Path, search_cmd: list[str],
               timeout_s: float | None, shared_cache: bool, device: str | None = None) -> dict:
    """One `scripts/search.py` run into work/<name>; returns {name, returncode, timed_out, seconds, last}.
    `device`: the GPU it alone may use (CUDA_VISIBLE_DEVICES)."""
    args = list(overrides) + [f"hydra.run.dir={work / name}", f"search.memory_dir={memory_dir}"]
    if not shared_cache and not any(_key(o) == "search.compile_cache_dir" for o in overrides):
        args.append(f"search.compile_cache_dir={work / ('jax_' + name)}")
    cmd = search_cmd + args
    log_path = work / f"{name}.log"
    env = dict(os.environ)
    if not shared_cache:
        env.pop("JAX_COMPILATION_CACHE_DIR", None)  # it would win over the run's own search.compile_cache_dir
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
    where = f" (CUDA_VISIBLE_DEVICES={device})" if device is not None else ""
    print(f"[transfer] {name}{where}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env)
    out_lines: list[str] = []

    def pump_err():
        with open(log_path, "a") as f:
            for line in proc.stderr:
                f.write(line)
                f.flush()
                sys.stderr.write(f"[{name}] {line}")
                sys.stderr.flush()

    def pump_out():
        for line in proc.stdout:
            out_lines.append(line)

    threads = [threading.Thread(target=pump_err, daemon=True), threading.Thread(target=pump_out, daemon=True)]
    for t in threads:
        t.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        print(f"[transfer] {name}: still running after {timeout_s:.0f} s: stopped (its trial log is kept)",
              file=sys.stderr, flush=True)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the search and anything it started (its own session)
        except ProcessLookupError:
            pass
        proc.wait()
    for t in threads:
        t.join(timeout=10)
    last = None
    for line in reversed(out_lines):
        try:
            last = json.loads(line)
            break
        except json.JSONDecodeError:
            continue
    return {"name": name, "returncode": proc.returncode, "timed_out": timed_out,
            "seconds": round(time.perf_counter() - t0, 1), "last": last}


def refused(run: dict) -> bool:
    """Whether the search refused its configuration (exit 2: the one-line error it printed, echoed above); said once
    here, since nothing after it can be compared."""
    if run["returncode"] != 2 or run["timed_out"]:
        return False
    print(f"[transfer] {run['name']}: the search refused its configuration (exit 2, above): no comparison written",
          file=sys.stderr, flush=True)
    return True


def a_report(run_dir: Path, memory_dir: Path) -> dict:
    """A's rounds against stock and the records it wrote (the "≥ 3 rounds improve on stock" evidence); the
    records are listed from its memory folder, so a search cut off before its summary still shows them."""
    run = load_run(run_dir)
    stats = run_stats(run)
    stock = run["stock_speedup"] or 0.0
    rounds = run["round_log"]
    records = sorted((memory_dir / "records").glob("*.json"))
    return {
        **{k: stats[k] for k in ("run_dir", "complete", "stock_speedup", "best_speedup", "best_trial", "best_config",
                                 "best_found_trial", "best_found_at_trial", "best_found_after_s", "num_trials",
                                 "elapsed_s", "rounds", "stopped")},
        "round_log": stats["round_log"],
        "rounds_above_stock": sum(r["speedup"] > stock for r in rounds),
        "rounds_improving": sum(r["gain"] > 0 for r in rounds),
        "records_written": [Path(p).name for p in records],
    }


def a_markdown(rep: dict) -> str:
    lines = ["## Deployment A", "",
             f"- {rep['rounds']} round(s) (stopped by {rep['stopped']}), {rep['num_trials']} trials, "
             f"{seconds_text(rep['elapsed_s'])} of search",
             f"- stock {speedup_text(rep['stock_speedup'])}x AR -> best {speedup_text(rep['best_speedup'])}x AR "
             f"({rep['best_trial']}); rounds above stock: {rep['rounds_above_stock']}, rounds that improved the "
             f"incumbent: {rep['rounds_improving']}",
             "- per round: " + ", ".join(f"r{r['round']} {r['speedup']:.3f}x ({100 * r['gain']:+.1f}%)"
                                         for r in rep["round_log"]),
             f"- memory records written ({len(rep['records_written'])}): " + (", ".join(rep["records_written"]) or "-"),
             ""]
    return "\n".join(lines)


def copy_records(src: Path, dst: Path) -> int:
    """Copy src/records/*.json into dst/records (once: a resumed transfer keeps what its search saw)."""
    if (dst / "records").is_dir():
        return len(list((dst / "records").glob("*.json")))
    (dst / "records").mkdir(parents=True)
    n = 0
    for f in sorted((src / "records").glob("*.json")) if (src / "records").is_dir() else []:
        shutil.copy2(f, dst / "records" / f.name)
        n += 1
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True, help="folder for every run, memory copy, log and the comparison")
    ap.add_argument("--phase", default="all", choices=["all", "a", "b"])
    ap.add_argument("--a", action="append", default=None, metavar="OVERRIDE",
                    help="deployment A's own overrides (default: deployment.batch=1)")
    ap.add_argument("--b", action="append", default=None, metavar="OVERRIDE",
                    help="deployment B's own overrides (default: deployment.batch=4)")
    ap.add_argument("--seed-memory", help="memory folder (with records/) that seeds B; default: DIR/memory_a with "
                                          "--phase all, else the repository's memory_store/")
    ap.add_argument("--order", default="unseeded,seeded", choices=["unseeded,seeded", "seeded,unseeded"],
                    help="which B run goes first (default unseeded: should a hard time limit cut the second run "
                         "short, that hurts the seeded run, not the baseline it is compared with)")
    ap.add_argument("--parallel-devices", metavar="GPU,GPU", default=None,
                    help="run B's two searches at once, one per GPU (e.g. 0,1 on a two-GPU host); default: one "
                         "after the other on whatever the searches see")
    ap.add_argument("--run-timeout-s", type=float, default=None, help="kill a search running longer than this")
    ap.add_argument("--tolerance", type=float, default=0.02, help="target level = (1 - this) x the higher best")
    ap.add_argument("--shared-compile-cache", action="store_true",
                    help="let the runs share search.compile_cache_dir (faster, but the later run compiles less)")
    ap.add_argument("--compare", action="store_true",
                    help="run nothing: compare the B runs already in --work (e.g. copied back from a GPU machine) "
                         "and write DIR/transfer.json and DIR/transfer.md")
    ap.add_argument("--search-cmd", default=None, help=argparse.SUPPRESS)  # tests: a stand-in for search.py
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every search (after --)")
    args = ap.parse_args(argv)
    a_over = args.a if args.a is not None else ["deployment.batch=1"]
    b_over = args.b if args.b is not None else ["deployment.batch=4"]
    for o in args.overrides + a_over + b_over:
        if _key(o) in OWN_KEYS:
            ap.error(f"{_key(o)} is set per run by this script")
    search_cmd = [sys.executable, args.search_cmd or str(REPO / "scripts" / "search.py")]
    work = Path(args.work).resolve()
    if args.compare:
        result = compare(load_run(work / "b_seeded"), load_run(work / "b_unseeded"), args.tolerance)
        md = markdown(result, "Deployment B: seeded with A's records vs empty memory")
        (work / "transfer.json").write_text(json.dumps({"b": result}, indent=2, default=str) + "\n")
        (work / "transfer.md").write_text(md)
        print(md, file=sys.stderr, flush=True)
        print(json.dumps({k: v for k, v in result["verdict"].items() if k != "summary"}), flush=True)
        return 0
    work.mkdir(parents=True, exist_ok=True)
    runs, result = [], {"work": str(work), "common_overrides": args.overrides}

    if args.phase in ("all", "a"):
        (work / "memory_a" / "records").mkdir(parents=True, exist_ok=True)
        runs.append(run_search("a", work, args.overrides + a_over, work / "memory_a", search_cmd,
                               args.run_timeout_s, args.shared_compile_cache))
        if refused(runs[-1]):
            return 2
        result["a_overrides"] = a_over
        result["a"] = a_report(work / "a", work / "memory_a")

    if args.phase in ("all", "b"):
        seed = Path(args.seed_memory) if args.seed_memory else (
            work / "memory_a" if args.phase == "all" else REPO / "memory_store")
        n = copy_records(seed, work / "memory_b_seeded")
        (work / "memory_b_unseeded" / "records").mkdir(parents=True, exist_ok=True)
        print(f"[transfer] B seeded with {n} record(s) from {seed}", file=sys.stderr, flush=True)
        memories = {"b_seeded": work / "memory_b_seeded", "b_unseeded": work / "memory_b_unseeded"}
        names = [f"b_{which}" for which in args.order.split(",")]
        if args.parallel_devices:
            devices = args.parallel_devices.split(",")
            if len(devices) != 2:
                ap.error("--parallel-devices: give two GPUs, e.g. 0,1")
            done: dict[str, dict] = {}
            threads = [threading.Thread(target=lambda n=n, d=d: done.__setitem__(n, run_search(
                n, work, args.overrides + b_over, memories[n], search_cmd, args.run_timeout_s,
                args.shared_compile_cache, d))) for n, d in zip(names, devices)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            runs += [done[n] for n in names]
            if any(refused(r) for r in runs):
                return 2
        else:
            for name in names:
                runs.append(run_search(name, work, args.overrides + b_over, memories[name], search_cmd,
                                       args.run_timeout_s, args.shared_compile_cache))
                if refused(runs[-1]):
                    return 2
        result["b_overrides"] = b_over
        result["seed_memory"] = {"from": str(seed), "records": n}
        result["b"] = compare(load_run(work / "b_seeded"), load_run(work / "b_unseeded"), args.tolerance)

    result["runs"] = [{k: r[k] for k in ("name", "returncode", "timed_out", "seconds")} for r in runs]
    md = [f"# Memory transfer ({work})", "", "Runs: " + ", ".join(
        f"{r['name']} {r['seconds']:.0f} s (exit {r['returncode']}{', timed out' if r['timed_out'] else ''})"
        for r in runs), ""]
    if "a" in result:
        md.append(a_markdown(result["a"]))
    if "b" in result:
        md.append(markdown(result["b"], "Deployment B: seeded with A's records vs empty memory"))
    (work / "transfer.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (work / "transfer.md").write_text("\n".join(md))
    print("\n".join(md), file=sys.stderr, flush=True)
    last = {"transfer": str(work / "transfer.json"), "runs": result["runs"]}
    if "a" in result:
        last["a"] = {k: result["a"][k] for k in ("rounds", "stock_speedup", "best_speedup", "rounds_above_stock",
                                                 "rounds_improving")} | {"records": len(result["a"]["records_written"])}
    if "b" in result:
        last["b"] = {k: v for k, v in result["b"]["verdict"].items() if k != "summary"}
    print(json.dumps(last, default=str), flush=True)
    failed = [r for r in runs if r["returncode"] != 0 and not r["timed_out"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
