"""Memory transfer: does a deployment seeded with another deployment's memory records reach its best sooner?

    seeded, unseeded = load_run(DIR_SEEDED), load_run(DIR_UNSEEDED)   # summary.json, or trials.jsonl if cut off
    result = compare(seeded, unseeded, tolerance=0.02)
    print(markdown(result))

Two searches of the same deployment, one loading memory records (e.g. written by a search of another
deployment, `scripts/memory_transfer.py`) and one with an empty memory, are compared on:

- their own best: speedup, and when it was first found (`best_found_at_trial`: 1-based over all trials in
  run order, the AR and stock baselines being trials 1 and 2; `best_found_after_s`: search seconds, model
  loading excluded) — see `specpilot.agent.loop.best_found`;
- a target level, `(1 - tolerance) × the higher of the two bests`: the best this deployment is known to reach,
  less measurement noise. The first trial, and the search seconds, at which each run measured a configuration
  at least that fast; a run that never did comes last. This is time-to-target, the usual race between two
  searches: it cannot be won by a run that settles early for a lower best, nor by one that never searched
  beyond its baselines (the stock baseline is trial 2 of both runs, so when it is the best, they tie).

Verdict `seeded_reaches_its_best_faster`: the seeded run loaded records and the other none, and it reached the
target level in strictly fewer trials and fewer seconds. (Each run's own best and when it found it are reported
too, but do not decide: a run whose search found nothing above stock "found its best" at trial 2.)

Pure functions over the runs' JSON; no JAX.
"""

from __future__ import annotations

import json
from pathlib import Path

from specpilot.agent.space import config_key


def load_run(run_dir: str | Path) -> dict:
    """A search run as {trials, best, summary fields...}: from summary.json, or, for a search that was cut
    off before writing it, from trials.jsonl (then `complete` is False and the best is the fastest measured
    trial)."""
    run_dir = Path(run_dir)
    summary_path = run_dir / "summary.json"
    if summary_path.is_file():
        s = json.loads(summary_path.read_text())
        return {
            "run_dir": str(run_dir), "complete": True, "trials": s["trials"],
            "best": {"id": s["best_trial"], "speedup": s["best_speedup"], "tau": s["best_tau"],
                     "config": s["best_config"]},
            "found": {"id": s.get("best_found_trial"), "index": s.get("best_found_at_trial"),
                      "elapsed_s": s.get("best_found_after_s")},
            "stock_speedup": s["stock_speedup"], "rounds": s["rounds"], "stopped": s["stopped"],
            "elapsed_s": s.get("elapsed_s"), "memory_loaded": s["memory"]["loaded"],
            "memory_written": s["memory"]["written"], "deployment": s.get("deployment", {}),
            "round_log": s.get("round_log", []),
        }
    log = run_dir / "trials.jsonl"
    records = []
    if log.is_file():
        for line in log.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a torn last line
    trials = [r for r in records if r.get("type") == "trial"]
    measured = [t for t in trials if t["status"] == "ok" and t["id"] != "baseline/ar"]
    best = max(measured, key=lambda t: t["speedup"], default=None)
    stock = next((t for t in trials if t["id"] == "baseline/stock" and t["status"] == "ok"), None)
    proposals = [r for r in records if r.get("type") == "proposals"]
    return {
        "run_dir": str(run_dir), "complete": False, "trials": trials,
        "best": None if best is None else {"id": best["id"], "speedup": best["speedup"], "tau": best.get("tau"),
                                           "config": best["config"]},
        "found": None, "stock_speedup": stock["speedup"] if stock else None,
        "rounds": max((p["round"] for p in proposals), default=0), "stopped": "incomplete",
        "elapsed_s": max((t.get("elapsed_s") or 0.0 for t in trials), default=None),
        "memory_loaded": None, "memory_written": None, "deployment": {}, "round_log": [],
    }


def first_reaching(trials: list[dict], threshold: float) -> dict | None:
    """The first measured trial (the AR baseline aside) at least `threshold` times faster than AR."""
    for i, t in enumerate(trials, 1):
        if t["status"] == "ok" and t["id"] != "baseline/ar" and t["speedup"] >= threshold:
            return {"id": t["id"], "index": i, "elapsed_s": t.get("elapsed_s"), "speedup": t["speedup"]}
    return None


def _found(run: dict) -> dict | None:
    if run.get("found") and run["found"].get("index") is not None:
        return run["found"]
    if run["best"] is None:
        return None
    key = config_key(run["best"]["config"])
    for i, t in enumerate(run["trials"], 1):
        if t["status"] == "ok" and t["id"] != "baseline/ar" and config_key(t["config"]) == key:
            return {"id": t["id"], "index": i, "elapsed_s": t.get("elapsed_s")}
    return None


def run_stats(run: dict) -> dict:
    found = _found(run) or {}
    round1 = [t for t in run["trials"] if str(t["id"]).startswith("r1/c")]
    return {
        "run_dir": run["run_dir"],
        "complete": run["complete"],
        "stock_speedup": run["stock_speedup"],
        "best_speedup": None if run["best"] is None else run["best"]["speedup"],
        "best_trial": None if run["best"] is None else run["best"]["id"],
        "best_config": None if run["best"] is None else run["best"]["config"],
        "best_found_trial": found.get("id"),
        "best_found_at_trial": found.get("index"),
        "best_found_after_s": found.get("elapsed_s"),
        "num_trials": len(run["trials"]),
        "elapsed_s": run["elapsed_s"],
        "rounds": run["rounds"],
        "stopped": run["stopped"],
        "memory_loaded": run["memory_loaded"],
        "round1_sources": [t.get("source") for t in round1],
        "round_log": [{"round": r["round"], "speedup": r["speedup"], "gain": r["gain"]} for r in run["round_log"]],
    }


def _sooner(a: dict | None, b: dict | None, key: str) -> bool | None:
    """Whether `a` came strictly before `b` (a run that never got there comes last); None if neither did
    or a value is missing."""
    if a is None and b is None:
        return None
    if b is None:
        return True
    if a is None:
        return False
    if a.get(key) is None or b.get(key) is None:
        return None
    return a[key] < b[key]


def compare(seeded: dict, unseeded: dict, tolerance: float = 0.02) -> dict:
    """The comparison (JSON): each run's stats, the target level and when each run reached it, the verdicts."""
    s, u = run_stats(seeded), run_stats(unseeded)
    out = {"tolerance": tolerance, "seeded": s, "unseeded": u}
    if s["best_speedup"] is None or u["best_speedup"] is None:
        out["verdict"] = {"summary": "incomparable: a run measured nothing"}
        return out
    level = (1.0 - tolerance) * max(s["best_speedup"], u["best_speedup"])
    reach = {"seeded": first_reaching(seeded["trials"], level), "unseeded": first_reaching(unseeded["trials"], level)}
    out["target_level"] = {"speedup": level, **reach}
    best_s = {"index": s["best_found_at_trial"], "elapsed_s": s["best_found_after_s"]}
    best_u = {"index": u["best_found_at_trial"], "elapsed_s": u["best_found_after_s"]}
    verdict = {
        "seeded_loaded_memory": bool(s["memory_loaded"]),
        "seeded_round1_from_memory": sum(str(x).startswith("memory:") for x in s["round1_sources"]),
        "unseeded_loaded_no_memory": not u["memory_loaded"],
        "best_found_in_fewer_trials": _sooner(best_s, best_u, "index"),
        "best_found_in_fewer_seconds": _sooner(best_s, best_u, "elapsed_s"),
        "target_level_in_fewer_trials": _sooner(reach["seeded"], reach["unseeded"], "index"),
        "target_level_in_fewer_seconds": _sooner(reach["seeded"], reach["unseeded"], "elapsed_s"),
        "best_speedup_ratio": s["best_speedup"] / u["best_speedup"],
    }
    fair = verdict["seeded_loaded_memory"] and verdict["unseeded_loaded_no_memory"]
    verdict["seeded_reaches_its_best_faster"] = bool(
        fair and verdict["target_level_in_fewer_trials"] and verdict["target_level_in_fewer_seconds"])
    verdict["summary"] = (
        f"target level {level:.3f}x AR ({100 * tolerance:.0f}% below the higher best) reached at trial "
        f"{_at(reach['seeded'])} seeded vs {_at(reach['unseeded'])} unseeded; own bests: seeded "
        f"{s['best_speedup']:.3f}x AR first found at trial {s['best_found_at_trial']} "
        f"({seconds_text(s['best_found_after_s'])}), unseeded {u['best_speedup']:.3f}x AR at trial "
        f"{u['best_found_at_trial']} ({seconds_text(u['best_found_after_s'])})"
    )
    out["verdict"] = verdict
    return out


def seconds_text(v) -> str:
    return "?" if v is None else f"{v:.1f} s"


def speedup_text(v) -> str:
    return "?" if v is None else f"{v:.3f}"


def _at(r: dict | None) -> str:
    return "never" if r is None else f"{r['index']} ({seconds_text(r['elapsed_s'])})"


def _cfg(cfg: dict | None) -> str:
    from specpilot.agent.space import describe_config

    return "-" if not cfg else describe_config(cfg)


def markdown(result: dict, title: str = "Memory transfer") -> str:
    lines = [f"## {title}", ""]
    v = result["verdict"]
    if "target_level" not in result:
        runs = [f"- {name}{'' if result[name]['complete'] else ' (cut off)'}: {result[name]['num_trials']} trials, "
                f"best {speedup_text(result[name]['best_speedup'])}x AR" for name in ("seeded", "unseeded")]
        return "\n".join(lines + [v["summary"], ""] + runs + [""])
    level = result["target_level"]
    lines += [
        f"Target level: {level['speedup']:.3f}x AR ({100 * result['tolerance']:.0f}% below the higher best).",
        "",
        "| run | memory records loaded | stock (x AR) | best (x AR) | best config | best first found: trial / s "
        "| target level: trial / s | trials | search s | rounds (stopped) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in ("seeded", "unseeded"):
        r = result[name]
        loaded = "?" if r["memory_loaded"] is None else str(len(r["memory_loaded"]))
        found = f"{r['best_found_at_trial']} / {seconds_text(r['best_found_after_s'])}"
        lines.append(
            f"| {name}{'' if r['complete'] else ' (cut off)'} | {loaded} | {speedup_text(r['stock_speedup'])} | "
            f"{speedup_text(r['best_speedup'])} | {_cfg(r['best_config'])} | {found} | {_at(level[name])} | "
            f"{r['num_trials']} | {seconds_text(r['elapsed_s'])} | {r['rounds']} ({r['stopped']}) |")
    lines += [
        "",
        f"- Seeded run's round 1 came from: {', '.join(map(str, result['seeded']['round1_sources'])) or '-'}",
        f"- Best found in fewer trials: {v['best_found_in_fewer_trials']}; in fewer seconds: "
        f"{v['best_found_in_fewer_seconds']}",
        f"- Target level in fewer trials: {v['target_level_in_fewer_trials']}; in fewer seconds: "
        f"{v['target_level_in_fewer_seconds']}",
        f"- Seeded best / unseeded best: {v['best_speedup_ratio']:.3f}",
        f"- **Seeded reaches its best faster: {v['seeded_reaches_its_best_faster']}**",
        "",
    ]
    return "\n".join(lines)
