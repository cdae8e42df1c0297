"""One trial: token forcing against stock's outputs, then measurement; and the trial log that keeps them.

A trial is a job dict — `{"id", "role", "engine", ...}` with role `ar` (measured only), `reference`
(stock: its greedy outputs become the forcing reference, then measured) or `candidate` (forced, and
measured only if it passes) — turned into a result dict by `evaluate`. Results are plain JSON. With
`ar_config` in the job, AR is timed back to back with the engine on every repeat (`ar_ms_per_token`):
speedups then come from paired measurements.

The trial log (`trials.jsonl` in the run directory) gets one line per finished trial, flushed and
fsync'd before the search moves on, so a killed search loses at most the trial in flight; a resumed
search reads it back and re-runs nothing it holds.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

from specpilot.agent.space import config_key
from specpilot.tracking import scrub

MAX_LISTED = 20  # violations / ties kept per forcing report in the log


def forcing_summary(reports: list, offsets: list[int]) -> dict:
    """Merge per-batch ForcingReports into one JSON summary (prompt indices made global)."""
    violations, ties, unchecked, checked = [], [], 0, 0
    for rep, off in zip(reports, offsets):
        violations += [{**v, "prompt": v["prompt"] + off} for v in rep.violations]
        ties += [{**t, "prompt": t["prompt"] + off} for t in rep.ties]
        unchecked += sum(p["unchecked"] for p in rep.per_prompt)
        checked += rep.positions_checked
    return {
        "passed": all(r.passed for r in reports),
        "reference": reports[0].reference if reports else "stock",
        "tie_tolerance": reports[0].tie_tolerance if reports else None,
        "positions_checked": checked,
        "unchecked": unchecked,
        "num_violations": len(violations),
        "num_ties": len(ties),
        "violations": violations[:MAX_LISTED],
        "ties": ties[:MAX_LISTED],
    }


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"


def evaluate(backend, job: dict) -> dict:
    """Run one trial on `backend`; never raises (an engine failure is a trial with status "error")."""
    t0 = time.perf_counter()
    out = {"id": job["id"], "role": job["role"], "config": job["engine"], "status": "ok"}
    try:
        if hasattr(backend, "started"):
            backend.started(job)
        _evaluate(backend, job, out)
    except Exception as e:
        out["status"] = "error"
        out["error"] = _one_line(e)
    out["wall_s"] = time.perf_counter() - t0
    return out


def _evaluate(backend, job: dict, out: dict) -> None:
    from specpilot.forcing import force

    cfg, groups, max_new = job["engine"], backend.prompt_groups, backend.max_new
    ref, first_tie = None, {}  # for a greedy candidate: what every timed run must reproduce
    if job["role"] == "reference":
        greedy = backend.engine(cfg, greedy=True)
        out["reference_tokens"] = [t for g in groups for t in backend.timed_generate(greedy, g)[0].tokens]
    if job["role"] == "candidate":
        greedy = backend.engine(cfg, greedy=True)
        ref = job["reference_tokens"]
        reports, offsets, i = [], [], 0
        for g in groups:
            reports.append(force(greedy, ref[i : i + len(g)], g, backend.margin_fn(), "stock",
                                 job["tie_tolerance"], job["max_restarts"], max_new))
            offsets.append(i)
            i += len(g)
        out["forcing"] = forcing_summary(reports, offsets)
        if not out["forcing"]["passed"]:
            out["status"] = "rejected_token_forcing"
            return
        for rep, off in zip(reports, offsets):
            for tie in rep.ties:
                p = off + tie["prompt"]
                first_tie[p] = min(first_tie.get(p, tie["position"]), tie["position"])
    engine = backend.engine(cfg)
    if not (job["role"] == "candidate" and engine.sampling.greedy):
        ref = None
    # AR runs back to back with the candidate (paired), so a machine that slows down or speeds up
    # between trials moves both numbers alike and the speedup stays comparable
    # (AR as the candidate is its own pair: speedup 1 by definition, not two noisy samples of one engine)
    same = bool(job.get("ar_config")) and config_key(job["ar_config"]) == config_key(cfg)
    ar = backend.engine(job["ar_config"]) if job.get("ar_config") and not same else None
    total_s, ar_s, tokens, ar_tokens, committed, rounds = 0.0, 0.0, 0, 0, 0, 0
    offset = 0
    for g in groups:
        backend.timed_generate(engine, g)  # warm-up: compiles here when forcing did not
        if ar is not None:
            backend.timed_generate(ar, g)
        times, ar_times = [], []
        for _ in range(job["measure_repeats"]):
            if ar is not None:
                ar_result, seconds = backend.timed_generate(ar, g)
                ar_times.append(seconds)
            result, seconds = backend.timed_generate(engine, g)
            times.append(seconds)
            mismatch = ref is not None and _timed_mismatch(result.tokens, ref, offset, first_tie)
            if mismatch:  # forced right, timed wrong (a stateful engine): what is timed must be what was forced
                out["status"] = "rejected_token_forcing"
                out["forcing"].update(passed=False, num_violations=out["forcing"]["num_violations"] + 1,
                                      timed_mismatch=mismatch)
                return
        offset += len(g)
        total_s += statistics.median(times)
        tokens += sum(len(t) for t in result.tokens)
        committed += sum(sum(a) for a in result.acceptance_lengths)
        rounds += sum(len(a) for a in result.acceptance_lengths)
        if ar is not None:
            ar_s += statistics.median(ar_times)
            ar_tokens += sum(len(t) for t in ar_result.tokens)
    if ar is not None:
        out["ar_ms_per_token"] = 1e3 * ar_s / max(ar_tokens, 1)
    elif same:
        out["ar_ms_per_token"] = 1e3 * total_s / max(tokens, 1)
    out.update(
        ms_per_token=1e3 * total_s / max(tokens, 1),
        tokens_per_s=tokens / max(total_s, 1e-12),
        tau=committed / max(rounds, 1),
    )
    # `profile_above` (search.profile_all=false): a candidate slower than the incumbent is not profiled stage by
    # stage — it can become neither the incumbent nor a memory record — which saves compiling every stage alone
    if job.get("profile_above") is not None and out.get("ar_ms_per_token") and out["ms_per_token"] > 0:
        if out["ar_ms_per_token"] / out["ms_per_token"] < job["profile_above"]:
            out["profiled"] = False
            return
    profile = engine.profile(groups[0], max_new, rounds=job["profile_rounds"])
    ceilings, source = backend.ceilings(cfg, profile)
    out.update(
        stage_ms=dict(profile["stage_ms"]),
        round_ms=profile["round_ms"],
        tokens_per_round=profile["tokens_per_round"],
        ceilings_ms=ceilings,
        ceilings_source=source,
    )


def _timed_mismatch(tokens: list[list[int]], ref: list[list[int]], offset: int, first_tie: dict) -> dict | None:
    """The first place where a timed greedy output leaves the reference, before any tie forcing found in that
    prompt (past a tie an honest engine may follow the other token), else None."""
    for j, got in enumerate(tokens):
        want = ref[offset + j][: first_tie.get(offset + j, len(ref[offset + j]))]
        if got[: len(want)] != want or (offset + j not in first_tie and len(got) != len(want)):
            pos = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            return {"prompt": offset + j, "position": pos}
    return None


class TrialLog:
    """Append-only JSONL; every append is flushed and fsync'd before it returns."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def load(self) -> list[dict]:
        """Every complete record; a torn last line (killed mid-write) is cut off the file."""
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            with open(self.path, "r+b") as f:
                f.truncate(end)
                f.flush()
                os.fsync(f.fileno())
        records = []
        for line in data[:end].splitlines():
            if line.strip():
                try:
                    record = json.loads(line)
                except ValueError:  # bad JSON or not UTF-8
                    continue  # a corrupt line is skipped, not fatal: its trial will simply run again
                if isinstance(record, dict):  # valid JSON that is not a record is skipped the same way
                    records.append(record)
        return records

    def append(self, record: dict) -> None:
        line = json.dumps(scrub(record), sort_keys=False) + "\n"
        new = not self.path.exists()
        with open(self.path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        if new:  # make the file's directory entry durable too
            fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
