"""The search loop: baseline, then rounds of gap report → proposals → trials → integration.

Baseline: AR and stock on the deployment's prompts; stock's greedy outputs become the token-forcing
reference; speedup is always AR ms/token ÷ candidate ms/token, with AR timed back to back with the
candidate in the same trial (paired), so load on the machine between trials does not bias it. Stock is
the first incumbent.

A round: the incumbent's measured stages against their ceilings give the gap report; the proposer
returns K deltas; each inside the config space becomes a candidate trial (token forcing, then
measurement); a delta outside it is rejected with its reason, which the proposer sees next round.
Candidates that beat the incumbent are combined (the best one, plus every other compatible delta),
and the combination is token-forced and measured again; the better of it and the best single
candidate becomes the new incumbent. The search stops after `rounds` rounds, when a round (from round
`min_rounds` on) gains less than `min_gain`, or before a round once `max_seconds` of search have passed.

Every trial record carries `elapsed_s` (search seconds when it finished), and the summary says when the
final best was first found (`best_found_at_trial`, `best_found_after_s`; `best_found`).

Every decision but the `max_seconds` stop is a function of the logged trial results, so a resumed search
replays the log to the point where it was killed and re-runs nothing it finds there (proposals are logged
too, so a non-deterministic proposer replays the same candidates).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from pathlib import Path
from typing import Any

from specpilot.agent import memory as mem
from specpilot.agent.proposers import Proposal, ProposalContext
from specpilot.agent.space import ConfigSpace, SpaceError, config_key, describe_config, normalize
from specpilot.agent.trials import TrialLog
from specpilot.costmodel.gaps import gap_report
from specpilot.provenance import git_commit
from specpilot.tracking import scrub

log = logging.getLogger("specpilot.search")

LOG_SCHEMA_VERSION = 2  # 2: the header's identity includes the kernels group


class ResumeError(ValueError):
    """The run directory's trial log was written by a different search; the message says what differs."""


class SearchError(RuntimeError):
    """The search cannot go on (e.g. the baseline failed)."""


@dataclasses.dataclass(frozen=True)
class SearchSettings:
    rounds: int = 3
    candidates_per_round: int = 3
    min_gain: float = 0.01
    min_rounds: int = 1  # the min_gain stop applies from this round on
    measure_repeats: int = 3
    profile_rounds: int = 4
    tie_tolerance: float = 1e-3
    max_restarts: int = 8
    write_memory: bool = True
    max_seconds: float | None = None  # no round starts after this many seconds of search (None = no limit)
    profile_all: bool = True  # False: a candidate slower than the incumbent is not profiled stage by stage

    @classmethod
    def from_config(cls, cfg) -> "SearchSettings":
        s = cfg.search
        return cls(rounds=s.rounds, candidates_per_round=s.candidates_per_round, min_gain=s.min_gain,
                   min_rounds=s.min_rounds,
                   measure_repeats=s.measure_repeats, profile_rounds=s.profile_rounds,
                   tie_tolerance=cfg.forcing.tie_tolerance, max_restarts=cfg.forcing.max_restarts,
                   write_memory=s.write_memory, max_seconds=s.max_seconds,
                   profile_all=s.profile_all)

    def identity(self) -> dict:
        """What a resumed search must share with the log (the stopping rules may change)."""
        return {k: v for k, v in dataclasses.asdict(self).items()
                if k not in ("rounds", "min_gain", "min_rounds", "write_memory", "max_seconds", "profile_all")}


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _fmt_delta(delta: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in delta.items()) or "(no change)"


class Search:
    def __init__(self, runner, proposer, run_dir: str | Path, settings: SearchSettings,
                 memory: mem.MemoryStore | None = None, tracker=None, identity: dict | None = None,
                 run_id: str | None = None, offline_fallback=None):
        self.runner, self.proposer, self.settings = runner, proposer, settings
        self.run_dir = Path(run_dir)
        self.memory, self.tracker = memory, tracker
        self.identity = {**(identity or {}), "settings": settings.identity()}
        self.run_id = run_id or self.run_dir.name
        self.offline_fallback = offline_fallback
        self.trial_log = TrialLog(self.run_dir / "trials.jsonl")
        self.commit = git_commit()
        # filled while running
        self.done: dict[str, dict] = {}
        self.trials: list[dict] = []
        self.rejected_by_space: list[dict] = []
        self.notes: list[str] = []
        self.memory_written: list[str] = []
        self.reused = 0
        self.ar_ms = None
        self.ar_config: dict | None = None
        self.resumed = False
        self._logged_proposals: dict | None = None
        # search time: seconds since run() started, plus what a resumed log had already spent (the time the
        # search was not running is not counted); every trial record keeps it as `elapsed_s`
        self._t0: float | None = None
        self._elapsed_before = 0.0

    # ---- the log ----------------------------------------------------------------------------------

    def _open_log(self) -> dict[int, dict]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        records = self.trial_log.load()
        headers = [r for r in records if r.get("type") == "header"]
        if headers:
            h = headers[0]
            if h.get("schema_version") != LOG_SCHEMA_VERSION:
                raise ResumeError(f"search.resume: {self.trial_log.path} has log schema {h.get('schema_version')}, "
                                  f"this code writes {LOG_SCHEMA_VERSION}")
            diff = _first_difference(h.get("identity", {}), scrub(self.identity))
            if diff:
                raise ResumeError(f"search.resume: {self.trial_log.path} was written by a different search ({diff})")
            self.run_id = h["run_id"]
            self.resumed = True
            log.info("resuming run %s from %s (%d finished trials)", self.run_id, self.trial_log.path,
                     sum(r.get("type") == "trial" for r in records))
        elif self.trial_log.path.exists() and self.trial_log.path.stat().st_size:  # lines, none of them a header
            raise ResumeError(f"search.resume: {self.trial_log.path} has no readable header line, so nothing says "
                              "which search wrote it; start a new run folder")
        else:
            self.resumed = False
            self.trial_log.append({"type": "header", "schema_version": LOG_SCHEMA_VERSION, "run_id": self.run_id,
                                   "identity": self.identity, "started_at": _now(), "commit": self.commit})
        for r in records:  # JSON turned int mapping keys (verify_cost_ms) into strings: turn them back
            if r.get("type") == "trial":
                r["config"] = normalize(r["config"])
                self.done[r["id"]] = r
                self._elapsed_before = max(self._elapsed_before, float(r.get("elapsed_s") or 0.0))
            elif r.get("type") == "proposals":
                for c in r["candidates"]:
                    c["config"] = normalize(c["config"])
        return {r["round"]: r for r in records if r.get("type") == "proposals"}

    def elapsed(self) -> float:
        """Seconds of search so far (from the start of `run`, plus the time a resumed log had spent)."""
        if self._t0 is None:
            return self._elapsed_before
        return self._elapsed_before + time.perf_counter() - self._t0

    # ---- trials -----------------------------------------------------------------------------------

    def _job(self, trial_id: str, role: str, cfg: dict, reference=None, incumbent: dict | None = None) -> dict:
        s = self.settings
        job = {"id": trial_id, "role": role, "engine": cfg, "measure_repeats": s.measure_repeats,
               "profile_rounds": s.profile_rounds, "tie_tolerance": s.tie_tolerance, "max_restarts": s.max_restarts}
        if not s.profile_all and incumbent is not None:
            # only a candidate that may become the incumbent (or a memory record) needs its stage times
            job["profile_above"] = incumbent["speedup"]
        if role != "ar" and self.ar_config is not None:
            job["ar_config"] = self.ar_config
        if reference is not None:
            job["reference_tokens"] = reference
        return job

    def _run_trials(self, specs: list[tuple[dict, dict]], round_no: int, base_speedup: float | None) -> list[dict]:
        """specs: (job, annotations). Trials already in the log are taken from it; the rest run, and each
        is logged the moment it finishes."""
        out: dict[str, dict] = {}
        todo = []
        for job, notes in specs:
            logged = self.done.get(job["id"])
            if logged is not None:
                if logged["config_key"] != config_key(job["engine"]):
                    raise ResumeError(f"search.resume: trial {job['id']} in the log measured "
                                      f"{describe_config(logged['config'])}, the replay asks for "
                                      f"{describe_config(job['engine'])}")
                out[job["id"]] = logged
                self.reused += 1
                self._show(logged, replayed=True)
            else:
                todo.append((job, notes))
        annotations = {job["id"]: notes for job, notes in todo}

        def finished(result: dict) -> None:
            rec = self._record(result, annotations[result["id"]], round_no, base_speedup)
            self.trial_log.append(rec)
            self.done[rec["id"]] = rec
            out[rec["id"]] = rec
            self._show(rec)
            self._track_trial(rec)

        if todo:
            self.runner.run([j for j, _ in todo], on_result=finished)
        results = [out[job["id"]] for job, _ in specs]
        self.trials += [r for r in results if r["id"] not in {t["id"] for t in self.trials}]
        return results

    def _record(self, result: dict, notes: dict, round_no: int, base_speedup: float | None) -> dict:
        rec = {"type": "trial", "round": round_no, **notes, **result, "config_key": config_key(result["config"]),
               "finished_at": _now(), "elapsed_s": round(self.elapsed(), 3)}
        if result["status"] == "ok":
            # paired AR time when the trial measured one; the AR baseline itself is 1.0 by definition
            ar_ms = result.get("ar_ms_per_token") or self.ar_ms or result["ms_per_token"]
            rec["speedup"] = ar_ms / result["ms_per_token"]
            if base_speedup:
                rec["gain"] = rec["speedup"] / base_speedup - 1.0
        return rec

    def _show(self, t: dict, replayed: bool = False) -> None:
        what = describe_config(t["config"])
        tag = " (from the log)" if replayed else ""
        if t["status"] == "rejected_token_forcing":
            f = t["forcing"]
            first = f["violations"][0] if f["violations"] else {}
            log.info("  %-12s %s: REJECTED by token forcing (reward hacking): %d violations in %d positions, "
                     "first at prompt %s position %s%s", t["id"], what, f["num_violations"], f["positions_checked"],
                     first.get("prompt"), first.get("position"), tag)
        elif t["status"] == "error":
            log.info("  %-12s %s: ERROR %s%s", t["id"], what, t.get("error"), tag)
        else:
            forced = t.get("forcing")
            gate = f"forcing PASS ({forced['positions_checked']} positions), " if forced else ""
            gain = f", {100 * t['gain']:+.1f}% vs incumbent" if "gain" in t else ""
            log.info("  %-12s %s: %s%.2fx AR, tau %.2f, %.3f ms/token%s%s", t["id"], what, gate, t["speedup"],
                     t["tau"], t["ms_per_token"], gain, tag)

    def _track_trial(self, t: dict) -> None:
        if self.tracker is None:
            return
        metrics = {"trial/round": t["round"], "trial/status": t["status"],
                   "trial/rejected_by_token_forcing": int(t["status"] == "rejected_token_forcing")}
        if t["status"] == "ok":
            metrics.update({"trial/speedup": t["speedup"], "trial/tau": t["tau"],
                            "trial/ms_per_token": t["ms_per_token"], "trial/tokens_per_s": t["tokens_per_s"]})
            metrics.update({f"trial/stage_ms/{k}": v for k, v in t.get("stage_ms", {}).items()})
        self.tracker.log(metrics)

    # ---- proposals --------------------------------------------------------------------------------

    def _history(self) -> list[dict]:
        out = []
        for t in self.trials:
            row = {"id": t["id"], "config": t["config"], "status": t["status"]}
            if "delta" in t:
                row["delta"] = t["delta"]
                row["hypothesis"] = t.get("hypothesis")
            if t.get("forcing") or t.get("role") == "reference":  # stock, the reference, passes by definition
                row["forcing"] = {"passed": t["forcing"]["passed"] if t.get("forcing") else True}
            if t["status"] == "ok":
                row.update(speedup=round(t["speedup"], 4), tau=round(t["tau"], 3),
                           ms_per_token=round(t["ms_per_token"], 4))
            elif t["status"] == "rejected_token_forcing":
                row["reason"] = f"token forcing: {t['forcing']['num_violations']} violations"
            else:
                row["reason"] = t.get("error")
            out.append(row)
        return out

    def _proposals(self, round_no: int, space: ConfigSpace, inc: dict, gaps: dict, memory: list,
                   feedback: list[dict], logged: dict | None) -> list[dict]:
        """The round's candidates [{id, delta, config, hypothesis, source}], from the log when it has them."""
        if logged is not None:
            self.rejected_by_space += logged["rejected"]
            self.notes += logged.get("notes", [])
            return logged["candidates"]
        # The AR baseline was measured but not token-forced: `engine=ar` stays proposable as a candidate.
        tried = {t["config_key"] for t in self.trials if t["id"] != "baseline/ar"}
        measured: dict[str, float] = {}
        for t in self.trials:
            if t["status"] == "ok":
                measured[t["config_key"]] = max(measured.get(t["config_key"], 0.0), t["speedup"])
        ctx = ProposalContext(round=round_no, k=self.settings.candidates_per_round, deployment=self.deployment,
                              space=space, incumbent=inc, gap_report=gaps, history=self._history(), tried=tried,
                              memory=memory, feedback=feedback, measured=measured)
        batch = self.proposer.propose(ctx)
        candidates, rejected = self._screen(batch.proposals, space, inc, tried, round_no)
        notes = list(batch.notes)
        if not candidates and self.offline_fallback is not None and \
                getattr(self.proposer, "name", None) != self.offline_fallback.name:
            notes.append(f"round {round_no}: no proposal inside the config space; using the offline proposer")
            log.warning(notes[-1])
            extra = self.offline_fallback.propose(ctx)
            candidates, more = self._screen(extra.proposals, space, inc, tried, round_no)
            rejected += more
        for i, c in enumerate(candidates):
            c["id"] = f"r{round_no}/c{i}"
        self.trial_log.append({"type": "proposals", "round": round_no, "proposer": getattr(self.proposer, "name", "?"),
                               "candidates": candidates, "rejected": rejected, "notes": notes})
        self.rejected_by_space += rejected
        self.notes += notes
        return candidates

    def _with_fitted_costs(self, cfg: dict) -> dict:
        """A specpilot config with its verify-cost table and per-round cost fitted (the cost model's
        `StepTimeModel.specpilot_config`) from the stage times this search has measured; unchanged until
        the trials cover the curves it needs (a tree engine profiled), and for other engines. A function of
        the logged trials, so a resumed search fits the same table."""
        if cfg["name"] != "specpilot":
            return cfg
        from specpilot.costmodel.predict import StepTimeModel, measured_row

        block = self.deployment["drafter"]["block_size"]
        rows = [measured_row({"batch": self.deployment["batch"], "stage_ms": t["stage_ms"],
                              "round_ms": sum(t["stage_ms"].values()), "tokens_per_round": t.get("tokens_per_round", 0)},
                             t["config"], block)
                for t in self.trials if t["status"] == "ok" and t.get("stage_ms")]
        try:
            return StepTimeModel.fit(rows).specpilot_config(cfg, self.deployment["batch"], block)
        except (KeyError, ValueError):  # no tree engine profiled yet: keep the engine's own table
            return cfg

    def _screen(self, proposals: list[Proposal], space: ConfigSpace, inc: dict, tried: set[str],
                round_no: int) -> tuple[list[dict], list[dict]]:
        ok, rejected, seen = [], [], set()
        for p in proposals:
            try:
                cfg = space.apply(inc["config"], p.delta)
                key = config_key(cfg)
                if key == config_key(inc["config"]):
                    raise SpaceError("no change: that is the incumbent's config")
                if key in tried:
                    prev = next(t for t in self.trials if t["config_key"] == key)
                    raise SpaceError(f"already measured as trial {prev['id']} ({prev['status']}"
                                     + (f", {prev['speedup']:.2f}x AR" if "speedup" in prev else "") + ")")
                if key in seen:
                    raise SpaceError("duplicate of another candidate this round")
            except SpaceError as e:
                rejected.append({"round": round_no, "delta": p.delta, "hypothesis": p.hypothesis,
                                 "source": p.source, "reason": str(e)})
                log.info("  proposal %s (%s) rejected: %s", _fmt_delta(p.delta), p.source, e)
                continue
            seen.add(key)
            ok.append({"delta": space.diff(inc["config"], cfg), "config": self._with_fitted_costs(cfg),
                       "hypothesis": p.hypothesis, "source": p.source})
        return ok, rejected

    # ---- integration ------------------------------------------------------------------------------

    def _combine(self, space: ConfigSpace, inc: dict, improving: list[dict]) -> tuple[dict, list[dict]]:
        """The best candidate's config plus every other improving delta that applies without conflict."""
        best = improving[0]
        combined, used = dict(best["config"]), [best]
        changed = space.diff(inc["config"], combined)
        for t in improving[1:]:
            d = space.diff(inc["config"], t["config"])
            if any(k in changed and changed[k] != v for k, v in d.items()):
                continue
            try:
                rest = {k: v for k, v in d.items() if k not in changed} or {"engine": combined["name"]}
                nxt = space.apply(combined, rest)
            except SpaceError:
                continue
            if config_key(nxt) != config_key(combined):
                combined, used = nxt, used + [t]
                changed = space.diff(inc["config"], combined)
        return self._with_fitted_costs(combined), used

    def _write_memory(self, space: ConfigSpace, inc: dict, t: dict, stock: dict) -> None:
        if self.memory is None or not self.settings.write_memory:
            return
        delta = space.diff(inc["config"], t["config"])
        before = {s: ms / max(inc["tokens_per_round"], 1e-9) for s, ms in inc["stage_ms"].items()}
        after = {s: ms / max(t["tokens_per_round"], 1e-9) for s, ms in t["stage_ms"].items()}
        cuts = {s: before[s] - after.get(s, 0.0) for s in before}
        addresses = max(cuts, key=cuts.get) if cuts else "tau"
        if t["tau"] > inc["tau"] * 1.05 and (not cuts or cuts[addresses] <= 0 or t["tau"] - inc["tau"] > 0.5):
            addresses = "tau"
        evidence = mem.Evidence(
            run_id=self.run_id, trial_id=t["id"], run_dir=str(self.run_dir), commit=self.commit, date=_now(),
            speedup_over_ar=t["speedup"], base_speedup_over_ar=inc["speedup"],
            relative_gain=t["speedup"] / inc["speedup"] - 1.0, tau=t["tau"], ms_per_token=t["ms_per_token"],
            forcing={k: t["forcing"][k] for k in ("passed", "reference", "positions_checked", "num_violations",
                                                  "num_ties", "unchecked")},
        )
        record = mem.MemoryRecord(
            name=mem.delta_name(delta),
            mechanism=f"{describe_config(inc['config'])} -> {describe_config(t['config'])}: "
                      f"{t.get('hypothesis') or 'integration of this round’s improving deltas'}",
            delta=delta, base_config=inc["config"], config=t["config"], addresses=addresses,
            deployment=self.deployment,
            preconditions=mem.preconditions_for(self.deployment, t["config"], stock["tau"]),
            gain=evidence,
        )
        path = self.memory.write(record)
        if str(path) not in self.memory_written:
            self.memory_written.append(str(path))
            log.info("  memory: %s (%+.1f%%) -> %s", record.name, 100 * evidence.relative_gain, path)

    # ---- the whole search -------------------------------------------------------------------------

    def open(self) -> str:
        """Create or resume the trial log; returns the run id (a resumed run keeps its id)."""
        if self._logged_proposals is None:
            self._logged_proposals = self._open_log()
        return self.run_id

    def run(self) -> dict:
        s = self.settings
        self._t0 = time.perf_counter()
        self.open()
        logged_proposals = self._logged_proposals
        descriptor = self.runner.describe()
        space = ConfigSpace(descriptor["drafter"]["block_size"], descriptor["max_tree_budget"],
                            descriptor["target"]["dtype"], platform=descriptor.get("platform", "gpu"))
        self.deployment = dict(descriptor)

        log.info("baseline: AR and stock on %d prompts x %d new tokens", descriptor["num_prompts"],
                 descriptor["max_new_tokens"])
        ar_cfg, stock_cfg = space.engine_defaults["ar"], space.switched(space.engine_defaults["ar"], "stock")
        ar = self._run_trials([(self._job("baseline/ar", "ar", ar_cfg), {"phase": "baseline"})], 0, None)[0]
        if ar["status"] != "ok":
            raise SearchError(f"baseline {ar['id']} failed: {ar.get('error')}")
        self.ar_ms, self.ar_config = ar["ms_per_token"], ar_cfg
        stock = self._run_trials([(self._job("baseline/stock", "reference", stock_cfg), {"phase": "baseline"})],
                                 0, None)[0]
        if stock["status"] != "ok":
            raise SearchError(f"baseline {stock['id']} failed: {stock.get('error')}")
        reference = stock["reference_tokens"]
        self.deployment["stock_tau"] = round(stock["tau"], 4)

        # as loaded before round 1: a resumed search leaves out what its own earlier rounds wrote
        memory = self.memory.matching(self.deployment, exclude_run=self.run_id) if self.memory is not None else []
        if memory:
            log.info("memory: %d matching records: %s", len(memory), ", ".join(r.name for r in memory[:8]))
        ceilings = stock.get("ceilings_source", "none")
        inc, rounds_run, stopped, feedback = stock, 0, "rounds", []
        self.round_log: list[dict] = []

        for r in range(1, s.rounds + 1):
            # a round the log holds was started inside the budget: it is replayed, whatever the time is now
            if s.max_seconds is not None and r not in logged_proposals and self.elapsed() >= s.max_seconds:
                stopped = "max_seconds"
                log.info("%.0f s of search >= max_seconds %.0f: no round %d", self.elapsed(), s.max_seconds, r)
                break
            gaps = gap_report({"engine": inc["config"]["name"], "stage_ms": inc["stage_ms"],
                               "tokens_per_round": inc["tokens_per_round"]}, inc["ceilings_ms"])
            top = gaps["components"][0] if gaps["components"] else {"stage": "-", "gap_ms_per_token": 0.0}
            log.info("round %d/%d: incumbent %s %.2fx AR (tau %.2f); largest gap %s %.3f ms/token",
                     r, s.rounds, describe_config(inc["config"]), inc["speedup"], inc["tau"], top["stage"],
                     top["gap_ms_per_token"])
            if self.tracker is not None:
                cols = ["stage", "measured_ms", "ceiling_ms", "gap_ms", "gap_ms_per_token"]
                self.tracker.table(f"gaps/round_{r}", cols,
                                   [[c["stage"], c["measured_ms"], c["ceiling_ms"], c["gap_ms"], c["gap_ms_per_token"]]
                                    for c in gaps["components"]])
            candidates = self._proposals(r, space, inc, gaps, memory, feedback, logged_proposals.get(r))
            feedback = [x for x in self.rejected_by_space]
            specs = [(self._job(c["id"], "candidate", c["config"], reference, inc),
                      {"phase": "candidate", "delta": c["delta"], "hypothesis": c["hypothesis"], "source": c["source"]})
                     for c in candidates]
            results = self._run_trials(specs, r, inc["speedup"])
            improving = sorted((t for t in results if t["status"] == "ok" and t["speedup"] > inc["speedup"]
                                and "stage_ms" in t), key=lambda t: -t["speedup"])
            new_inc = inc
            if improving:
                combined, used = self._combine(space, inc, improving)
                note = {"phase": "integration", "delta": space.diff(inc["config"], combined),
                        "hypothesis": "integration: " + "; ".join(_fmt_delta(t["delta"]) for t in used),
                        "source": "integration", "combines": [t["id"] for t in used]}
                integ = self._run_trials([(self._job(f"r{r}/integrate", "candidate", combined, reference, inc),
                                           note)],
                                         r, inc["speedup"])[0]
                pick = [t for t in (integ,) if t["status"] == "ok" and "stage_ms" in t]
                if len(used) > 1:
                    pick.append(improving[0])  # the combination must beat the best single delta to win
                pick.sort(key=lambda t: -t["speedup"])
                if pick and pick[0]["speedup"] > inc["speedup"]:
                    new_inc = pick[0]
            gain = new_inc["speedup"] / inc["speedup"] - 1.0
            if new_inc is not inc:
                for t in improving + ([new_inc] if new_inc["id"].endswith("/integrate") and len(used) > 1 else []):
                    if t["speedup"] >= inc["speedup"] * (1 + s.min_gain):
                        self._write_memory(space, inc, t, stock)
            rounds_run = r
            log.info("round %d: incumbent %s %.2fx AR (%+.1f%%)", r, describe_config(new_inc["config"]),
                     new_inc["speedup"], 100 * gain)
            self.round_log.append({"round": r, "incumbent": new_inc["id"], "speedup": new_inc["speedup"], "gain": gain,
                                   "largest_gap": top["stage"]})
            if self.tracker is not None:
                self.tracker.log({"round": r, "incumbent/speedup": new_inc["speedup"], "incumbent/tau": new_inc["tau"],
                                  "round/gain": gain})
            inc = new_inc
            if gain < s.min_gain and r >= s.min_rounds:
                stopped = "min_gain"
                log.info("round %d gained %.1f%% < min_gain %.1f%%: stopping", r, 100 * gain, 100 * s.min_gain)
                break
        return self._finish(inc, ar, stock, rounds_run, stopped, memory, ceilings)

    def _finish(self, inc, ar, stock, rounds_run, stopped, memory, ceilings) -> dict:
        best_yaml = self.run_dir / "engine" / "best.yaml"
        write_best_yaml(best_yaml, inc, self.run_dir)
        forcing_rejects = [
            {"trial": t["id"], "config": t["config"], "delta": t.get("delta"), "hypothesis": t.get("hypothesis"),
             "source": t.get("source"),
             "forcing": {k: t["forcing"][k] for k in ("positions_checked", "num_violations", "num_ties", "unchecked")}
             | {"violations": t["forcing"]["violations"][:5]}}
            for t in self.trials if t["status"] == "rejected_token_forcing"
        ]
        found = best_found(self.trials, inc)
        summary = {
            "schema_version": 1,
            "run_id": self.run_id,
            "run_dir": str(self.run_dir),
            "commit": self.commit,
            "finished_at": _now(),
            "deployment": self.deployment,
            "proposer": getattr(self.proposer, "name", "?"),
            "ar": {"ms_per_token": ar["ms_per_token"], "tokens_per_s": ar["tokens_per_s"]},
            "stock_speedup": stock["speedup"],
            "stock_tau": stock["tau"],
            "best_speedup": inc["speedup"],
            "best_tau": inc["tau"],
            "best_ms_per_token": inc["ms_per_token"],
            "best_config": inc["config"],
            "best_trial": inc["id"],
            "best_config_yaml": str(best_yaml),
            "best_forcing": {k: v for k, v in (inc.get("forcing") or {}).items() if k not in ("violations", "ties")},
            "best_found_trial": found["id"],
            "best_found_at_trial": found["index"],
            "best_found_after_s": found["elapsed_s"],
            "elapsed_s": round(self.elapsed(), 3),
            "rounds": rounds_run,
            "round_log": self.round_log,
            "stopped": stopped,
            "trials": [_compact(t) for t in self.trials],
            "num_trials": len(self.trials),
            "rejected_by_token_forcing": forcing_rejects,
            "rejected_by_space": self.rejected_by_space,
            "errors": [{"trial": t["id"], "error": t.get("error")} for t in self.trials if t["status"] == "error"],
            "proposer_notes": self.notes,
            "memory": {"dir": str(self.memory.root) if self.memory else None,
                       "loaded": [r.name for r in memory], "written": self.memory_written},
            "ceilings": ceilings,
            "resumed": self.resumed,
            "trials_from_log": self.reused,
        }
        summary = scrub(summary)
        path = self.run_dir / "summary.json"
        mem.atomic_write(path, json_dumps(summary))
        summary["summary_path"] = str(path)
        if self.tracker is not None:
            cols = ["id", "round", "status", "config", "delta", "source", "speedup", "tau", "ms_per_token",
                    "violations"]
            self.tracker.table("trials", cols, [[t["id"], t["round"], t["status"], describe_config(t["config"]),
                                                 _fmt_delta(t.get("delta") or {}), t.get("source", ""),
                                                 t.get("speedup"), t.get("tau"), t.get("ms_per_token"),
                                                 (t.get("forcing") or {}).get("num_violations")] for t in self.trials])
            self.tracker.summary({k: summary[k] for k in ("stock_speedup", "best_speedup", "best_tau", "best_config",
                                                           "rounds", "num_trials", "stopped")}
                                 | {"rejected_by_token_forcing": len(forcing_rejects),
                                    "rejected_by_token_forcing_trials": [x["trial"] for x in forcing_rejects]})
            self.tracker.artifact("best-config", "config", [best_yaml, path])
            if self.memory_written:
                self.tracker.artifact("memory-records", "memory", self.memory_written)
        return summary


def best_found(trials: list[dict], best: dict) -> dict:
    """When the search first had its final best: the first measured trial of the best trial's config (the
    integration trial that ends a round often re-measures a config a candidate found earlier that round).
    `index` is 1-based over all trials in run order, baselines included (AR is trial 1, stock trial 2);
    the AR baseline itself never counts (it is the reference: AR is only adopted as a proposed candidate).
    `elapsed_s` is the search time at the end of that trial."""
    key = config_key(best["config"])
    for i, t in enumerate(trials, 1):
        if t["status"] == "ok" and t["id"] != "baseline/ar" and config_key(t["config"]) == key:
            return {"id": t["id"], "index": i, "elapsed_s": t.get("elapsed_s")}
    idx = next((i for i, t in enumerate(trials, 1) if t["id"] == best["id"]), None)
    return {"id": best["id"], "index": idx, "elapsed_s": best.get("elapsed_s")}


def _compact(t: dict) -> dict:
    row = {"id": t["id"], "round": t["round"], "status": t["status"], "config": t["config"]}
    for k in ("delta", "hypothesis", "source", "speedup", "gain", "tau", "ms_per_token", "stage_ms", "error",
              "elapsed_s"):
        if k in t:
            row[k] = t[k]
    if t.get("forcing"):
        row["forcing"] = {k: t["forcing"][k] for k in ("passed", "positions_checked", "num_violations", "num_ties")}
    return row


def _first_difference(a: Any, b: Any, path: str = "") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            d = _first_difference(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))
            if d:
                return d
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            d = _first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path}: log has {a!r}, now {b!r}"


def json_dumps(obj) -> str:
    import json

    return json.dumps(obj, indent=2, default=str) + "\n"


def write_best_yaml(path: Path, inc: dict, run_dir: Path) -> None:
    """The incumbent as a Hydra `engine` group option: `--config-dir RUN_DIR engine=best`."""
    from omegaconf import OmegaConf

    cfg = dict(inc["config"])
    body = OmegaConf.to_yaml(OmegaConf.create(cfg))
    forcing = inc.get("forcing")
    gate = (f"passed token forcing against stock ({forcing['positions_checked']} positions, "
            f"{forcing['num_ties']} ties)" if forcing else "the stock reference itself")
    head = (f"# Best engine config of search run {run_dir.name} (trial {inc['id']}): {inc['speedup']:.3f}x AR, "
            f"tau {inc['tau']:.2f}; {gate}.\n"
            f"# Use: python scripts/generate.py --config-dir {run_dir} engine=best (with the same target/drafter)\n")
    mem.atomic_write(path, head + body)
