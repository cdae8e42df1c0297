"""The search loop on the scripted FakeEngine deployment: rounds, integration, the token-forcing gate,
memory across searches, kill -9 and resume, and parallel workers — in seconds, with exact numbers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from specpilot.agent.backend import FakeBackend
from specpilot.agent.loop import Search, SearchSettings
from specpilot.agent.memory import MemoryStore
from specpilot.agent.proposers import Proposal, ProposalBatch
from specpilot.agent.proposers.offline import OfflineProposer
from specpilot.agent.runner import InProcessRunner, PoolRunner
from specpilot.agent.space import config_key
from specpilot.config import _ENGINE_CLASSES

REPO = Path(__file__).resolve().parents[1]


class ScriptedProposer:
    """Returns fixed deltas per round (an injected proposer: how a cheating idea would arrive)."""

    name = "scripted"

    def __init__(self, rounds: list[list[dict]]):
        self.rounds = rounds
        self.contexts = []

    def propose(self, ctx):
        self.contexts.append(ctx)
        deltas = self.rounds[ctx.round - 1] if ctx.round <= len(self.rounds) else []
        return ProposalBatch([Proposal(d, f"scripted {d}", "scripted") for d in deltas])


class RecordingTracker:
    """Stands in for the W&B wrapper (same methods) and keeps what the search sent it."""

    def __init__(self):
        self.logged, self.summaries, self.tables, self.artifacts = [], {}, {}, []

    def log(self, metrics, step=None):
        self.logged.append(metrics)

    def summary(self, values):
        self.summaries.update(values)

    def table(self, name, columns, rows, step=None):
        self.tables[name] = (columns, rows)

    def artifact(self, name, kind, paths):
        self.artifacts.append((name, [str(p) for p in paths]))


def search(run_dir, proposer=None, backend=None, memory=None, tracker=None, fallback=None, **settings):
    settings = {"rounds": 4, "candidates_per_round": 3, **settings}
    return Search(InProcessRunner(backend or FakeBackend()), proposer or OfflineProposer(), run_dir,
                  SearchSettings(**settings), memory=memory, tracker=tracker, offline_fallback=fallback).run()


def log_lines(run_dir) -> list[dict]:
    return [json.loads(x) for x in (Path(run_dir) / "trials.jsonl").read_text().splitlines()]


def test_search_improves_on_stock_and_writes_its_outputs(tmp_path):
    s = search(tmp_path / "run", memory=MemoryStore(tmp_path / "mem"))
    assert s["best_speedup"] > 1.3 * s["stock_speedup"] > 1.0
    assert s["rounds"] >= 2 and s["stopped"] in ("min_gain", "rounds")
    assert s["best_forcing"]["passed"] and s["best_forcing"]["num_violations"] == 0
    # every trial once in the log, each a full record; the summary agrees with the log
    trials = [r for r in log_lines(tmp_path / "run") if r["type"] == "trial"]
    assert len({t["id"] for t in trials}) == len(trials) == s["num_trials"]
    assert all(t["status"] == "ok" and t["speedup"] > 0 for t in trials)
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    for key in ("stock_speedup", "best_speedup", "best_config", "rounds", "trials", "rejected_by_token_forcing"):
        assert key in on_disk
    # the best config is a ready-to-use engine group option
    best = OmegaConf.to_container(OmegaConf.load(tmp_path / "run" / "engine" / "best.yaml"))
    assert _ENGINE_CLASSES[best["name"]].model_validate(best).name == s["best_config"]["name"]
    # a round's incumbent is measured: integration trials exist and the best is one of them (or stock)
    assert s["best_trial"].endswith("/integrate") or s["best_trial"] == "baseline/stock"


def test_planted_cheat_is_rejected_as_reward_hacking(tmp_path):
    """tree_budget=13 is scripted to be 10x faster and to corrupt every 3rd token: forcing must stop it."""
    tracker = RecordingTracker()
    proposer = ScriptedProposer([[{"engine": "ddtree", "tree_budget": 13}, {"engine": "ddtree", "tree_budget": 64}]])
    s = search(tmp_path / "run", proposer=proposer, tracker=tracker, rounds=1)
    rejected = s["rejected_by_token_forcing"]
    assert [r["trial"] for r in rejected] == ["r1/c0"]
    assert rejected[0]["forcing"]["num_violations"] > 0 and rejected[0]["forcing"]["violations"]
    assert s["best_config"].get("tree_budget") == 64
    cheat = next(t for t in s["trials"] if t["id"] == "r1/c0")
    assert cheat["status"] == "rejected_token_forcing" and "speedup" not in cheat  # never measured, never counted
    # W&B gets it as a metric, in the trials table and in the run summary
    assert any(m.get("trial/rejected_by_token_forcing") == 1 for m in tracker.logged)
    cols, rows = tracker.tables["trials"]
    assert [r[cols.index("status")] for r in rows if r[0] == "r1/c0"] == ["rejected_token_forcing"]
    assert tracker.summaries["rejected_by_token_forcing"] == 1
    assert tracker.summaries["rejected_by_token_forcing_trials"] == ["r1/c0"]


def test_out_of_space_proposals_are_rejected_and_fed_back(tmp_path):
    proposer = ScriptedProposer([[{"tree_budget": 64}, {"engine": "ddtree", "tree_budget": 9999}],
                                 [{"engine": "tlv"}]])
    s = search(tmp_path / "run", proposer=proposer, rounds=2, min_gain=0.0, fallback=OfflineProposer())
    reasons = [r["reason"] for r in s["rejected_by_space"]]
    assert any("applies to ddtree, specpilot, tlv, not stock" in r for r in reasons)
    assert any("9999 outside" in r for r in reasons)
    assert [f["reason"] for f in proposer.contexts[1].feedback] == reasons  # round 2 sees why
    # nothing valid in round 1: the offline proposer filled in (logged), and the search went on
    assert any("no proposal inside the config space" in n for n in s["proposer_notes"])
    round1 = [t for t in s["trials"] if t["id"].startswith("r1/c")]
    assert round1 and all(t["source"].startswith("offline:") for t in round1)
    assert any(t["id"] == "r2/c0" and t["config"]["name"] == "tlv" for t in s["trials"])


def test_memory_is_written_and_seeds_the_next_deployment(tmp_path):
    store = MemoryStore(tmp_path / "mem")
    # one candidate per round, so that finding the best takes the first search several rounds
    first = search(tmp_path / "a", backend=FakeBackend(name="fake-a"), memory=store, rounds=8, candidates_per_round=1)
    written = first["memory"]["written"]
    assert written
    rec = json.loads(Path(written[0]).read_text())
    assert rec["schema_version"] == 1 and rec["gain"]["forcing"]["passed"] and rec["gain"]["run_id"]
    assert rec["deployment"]["name"] == "fake-a" and rec["preconditions"]["greedy"] is True
    assert not list((tmp_path / "mem" / "records").glob(".*tmp*"))  # atomic writes leave no temporaries

    second = search(tmp_path / "b", backend=FakeBackend(name="fake-b"), memory=store, rounds=8, candidates_per_round=1)
    assert second["memory"]["loaded"]
    round1 = [t for t in second["trials"] if t["id"].startswith("r1/c")]
    assert round1 and all(t["source"].startswith("memory:") for t in round1)

    def rounds_to(s, target):
        return next(r["round"] for r in s["round_log"] if r["speedup"] >= target)

    target = 0.99 * first["best_speedup"]
    assert second["best_speedup"] >= target
    assert rounds_to(second, target) == 1 < rounds_to(first, target)
    # a deployment the records do not fit (sampling at T > 0) does not load them
    other = search(tmp_path / "c", backend=FakeBackend(name="fake-c", temperature=0.7), memory=store, rounds=1)
    assert other["memory"]["loaded"] == []


KILLABLE = textwrap.dedent("""
    import sys
    from specpilot.agent.backend import FakeBackend
    from specpilot.agent.loop import Search, SearchSettings
    from specpilot.agent.proposers.offline import OfflineProposer
    from specpilot.agent.runner import InProcessRunner
    run_dir, delay, eval_log = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    backend = FakeBackend(delay_s=delay, eval_log=eval_log)
    Search(InProcessRunner(backend), OfflineProposer(), run_dir, SearchSettings(rounds=3, candidates_per_round=3)).run()
""")


def test_kill_9_mid_round_then_resume_loses_and_repeats_nothing(tmp_path):
    script = tmp_path / "killable.py"
    script.write_text(KILLABLE)
    run_dir, evals = tmp_path / "run", tmp_path / "evals.txt"
    log = run_dir / "trials.jsonl"
    proc = subprocess.Popen([sys.executable, str(script), str(run_dir), "0.4", str(evals)], cwd=REPO)
    deadline = time.time() + 60
    while time.time() < deadline:  # kill once round 1 has finished some candidates but not all
        if log.exists() and sum('"type": "trial"' in x for x in log.read_text().splitlines()) >= 4:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = [r["id"] for r in log_lines(run_dir) if r["type"] == "trial"]
    assert len(before) >= 4 and "r1/integrate" not in before

    subprocess.run([sys.executable, str(script), str(run_dir), "0", str(evals)], cwd=REPO, check=True, timeout=60)
    after = [r["id"] for r in log_lines(run_dir) if r["type"] == "trial"]
    assert after[: len(before)] == before and len(after) == len(set(after))  # nothing lost, nothing twice
    started = evals.read_text().split()
    for trial in before:  # a finished trial was never started again
        assert started.count(trial) == 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed"] and summary["trials_from_log"] >= len(before)
    # the resumed search ends where an uninterrupted one does
    clean = search(tmp_path / "clean", rounds=3, candidates_per_round=3)
    assert [t["id"] for t in summary["trials"]] == [t["id"] for t in clean["trials"]]
    assert config_key(summary["best_config"]) == config_key(clean["best_config"])  # (summary.json: str keys)


def test_parallel_workers_give_the_same_search(tmp_path):
    """Two worker processes (one per GPU on a GPU host; plain processes here) run a round's candidates."""
    seq = search(tmp_path / "seq", rounds=2)
    runner = PoolRunner(FakeBackend().spec(), 2, envs=[{}, {}])
    try:
        settings = SearchSettings(rounds=2, candidates_per_round=3)
        par = Search(runner, OfflineProposer(), tmp_path / "par", settings).run()
    finally:
        runner.close()
    assert [(t["id"], t["config"], t.get("speedup")) for t in par["trials"]] == \
           [(t["id"], t["config"], t.get("speedup")) for t in seq["trials"]]
    assert all(not p.is_alive() for p in runner.procs.values())


def dies_on_budget_32(cfg: dict) -> dict:
    """A fake model whose worker process dies (as on a GPU out of memory) when it builds a DDTree of 32 nodes."""
    from specpilot.agent.backend import scripted_fake_model

    if cfg["name"] == "ddtree" and cfg.get("tree_budget") == 32:
        os._exit(3)
    return scripted_fake_model(cfg)


class TwoDDTrees:
    name = "scripted"

    def propose(self, ctx):
        return ProposalBatch([Proposal({"engine": "ddtree", "tree_budget": b}, "h", "s") for b in (32, 64)])


@pytest.mark.parametrize("workers", [1, 2])
def test_a_worker_that_dies_costs_its_trial_only(tmp_path, workers):
    """The dying worker's trial is an error in the log; with a worker left the other trial runs, with none it is an
    error too (not a hang, not a lost trial)."""
    runner = PoolRunner(FakeBackend(model_fn=dies_on_budget_32).spec(), workers, envs=[{}] * workers)
    try:
        summary = Search(runner, TwoDDTrees(), tmp_path / "run", SearchSettings(rounds=1, candidates_per_round=2)).run()
    finally:
        runner.close()
    errors = {e["trial"]: e["error"] for e in summary["errors"]}
    assert "exited with code 3" in errors["r1/c0"]
    assert ("r1/c1" in errors) == (workers == 1)
    logged = [json.loads(line) for line in (tmp_path / "run" / "trials.jsonl").read_text().splitlines()]
    assert {"r1/c0", "r1/c1"} <= {t.get("id") for t in logged}


def test_a_worker_that_died_idle_gets_no_trial(tmp_path):
    """Killed between two runs: the live worker runs every trial; none is charged to the dead one."""
    runner = PoolRunner(FakeBackend().spec(), 2, envs=[{}, {}])
    try:
        victim = runner.procs[0]
        victim.kill()
        victim.join(timeout=10)
        jobs = [{"id": f"t{i}", "role": "reference", "engine": {"name": "stock"}, "measure_repeats": 1,
                 "profile_rounds": 1} for i in range(2)]
        results = runner.run(jobs)
    finally:
        runner.close()
    assert [(r["status"], r.get("error")) for r in results] == [("ok", None), ("ok", None)]


def test_a_candidate_forced_right_but_timed_wrong_is_rejected(tmp_path):
    """An engine honest while token forcing drives it and lossy when it is timed (state kept between calls) is caught
    by the timed runs' own comparison with the reference: what is timed must be what was forced."""
    from specpilot.agent.backend import scripted_fake_model
    from specpilot.decoding.fake import FakeEngine

    class TurnsLossy(FakeEngine):
        def generate(self, prompts, n, seed=0, pad_to=None):
            self.calls = getattr(self, "calls", 0) + 1
            if self.calls > 2:  # forcing's calls done: fast and wrong from here on
                self.corrupt_every, self.acceptance = 3, (12,)
            return super().generate(prompts, n, seed, pad_to)

    class OneEngineAConfig(FakeBackend):  # the greedy deployment's forced engine is the timed one, as in ModelBackend
        engines: dict = {}

        def engine(self, cfg, greedy=False):
            key = config_key(cfg)
            if key not in self.engines:
                cls = TurnsLossy if cfg.get("tree_budget") == 40 else FakeEngine
                self.engines[key] = cls(name=cfg["name"], **scripted_fake_model(cfg))
            return self.engines[key]

    class Proposes40:
        name = "scripted"

        def propose(self, ctx):
            return ProposalBatch([Proposal({"engine": "ddtree", "tree_budget": 40}, "h", "s")])

    summary = Search(InProcessRunner(OneEngineAConfig()), Proposes40(), tmp_path / "run",
                     SearchSettings(rounds=1, candidates_per_round=1)).run()
    logged = [json.loads(line) for line in (tmp_path / "run" / "trials.jsonl").read_text().splitlines()]
    [trial] = [t for t in logged if t.get("id") == "r1/c0"]
    assert trial["status"] == "rejected_token_forcing" and trial["forcing"]["timed_mismatch"]["prompt"] == 0
    assert [r["trial"] for r in summary["rejected_by_token_forcing"]] == ["r1/c0"]
    assert summary["best_config"].get("tree_budget") != 40


def test_timed_outputs_may_leave_the_reference_only_after_a_tie():
    from specpilot.agent.trials import _timed_mismatch

    ref = [[5, 6, 7, 8], [1, 2, 3, 4]]
    assert _timed_mismatch([[1, 2, 3, 4]], ref, 1, {}) is None
    assert _timed_mismatch([[1, 2, 9, 9]], ref, 1, {}) == {"prompt": 1, "position": 2}
    assert _timed_mismatch([[1, 2, 9, 9]], ref, 1, {1: 2}) is None  # forcing found a tie at position 2
    assert _timed_mismatch([[1, 9, 9, 9]], ref, 1, {1: 2}) == {"prompt": 1, "position": 1}
    assert _timed_mismatch([[5, 6, 7]], ref, 0, {}) == {"prompt": 0, "position": 3}  # stopped short


def test_resume_with_a_different_deployment_is_refused(tmp_path):
    search(tmp_path / "run", rounds=1)
    from specpilot.agent.loop import ResumeError

    s = Search(InProcessRunner(FakeBackend()), OfflineProposer(), tmp_path / "run",
               SearchSettings(rounds=1, measure_repeats=5))
    with pytest.raises(ResumeError, match="measure_repeats"):
        s.run()


@pytest.mark.parametrize("damage", ["flipped_header_byte", "garbage_only"])
def test_a_log_without_a_readable_header_is_not_resumed(tmp_path, damage):
    """Nothing would say which search wrote the trials: refused, and the file is left as it was."""
    from specpilot.agent.loop import ResumeError

    log_path = tmp_path / "run" / "trials.jsonl"
    if damage == "garbage_only":
        log_path.parent.mkdir()
        log_path.write_text("hello\n")
    else:
        search(tmp_path / "run", rounds=1)
        lines = log_path.read_text().splitlines()
        lines[0] = lines[0][:40] + "#" + lines[0][41:]
        log_path.write_text("\n".join(lines) + "\n")
    before = log_path.read_text()
    s = Search(InProcessRunner(FakeBackend()), OfflineProposer(), tmp_path / "run", SearchSettings(rounds=1))
    with pytest.raises(ResumeError, match="no readable header"):
        s.run()
    assert log_path.read_text() == before


def test_specpilot_candidates_get_a_cost_table_fitted_from_the_trials(tmp_path):
    """Once DDTree trials are profiled, a specpilot candidate's verify-cost table is the cost model's fit of
    them (at x = budget + 1 a DDTree trial of that budget is exact), not the YAML default, and the table
    does not make it a different candidate (config_key leaves derived keys out)."""
    from specpilot.agent.space import load_engine_defaults

    proposer = ScriptedProposer([[{"engine": "ddtree", "tree_budget": 16}, {"engine": "ddtree", "tree_budget": 64}],
                                 [{"engine": "specpilot", "tree_budget": 64, "budget_candidates": [16, 64]}]])
    s = search(tmp_path / "run", proposer=proposer, rounds=2, min_gain=0.0)
    sp = next(t for t in s["trials"] if t["config"]["name"] == "specpilot" and t["id"].startswith("r2/c"))
    ddtree = {t["config"]["tree_budget"]: t for t in s["trials"]
              if t["config"]["name"] == "ddtree" and t["id"].startswith("r1/c") and t["status"] == "ok"}
    table = {int(k): v for k, v in sp["config"]["verify_cost_ms"].items()}
    assert table == {n: pytest.approx(ddtree[n]["stage_ms"]["verify"], abs=1e-4) for n in (16, 64)}
    yaml_table = {int(k): v for k, v in load_engine_defaults()["specpilot"]["verify_cost_ms"].items()}
    assert table != {k: v for k, v in yaml_table.items() if k in table}
    assert sp["config"]["draft_cost_ms"] > 0
    assert config_key(sp["config"]) == config_key({**sp["config"], "verify_cost_ms": yaml_table})


def test_a_resumed_search_past_max_seconds_replays_its_logged_rounds(tmp_path):
    """The time budget starts no new round, but the rounds the log holds were started inside it: a resume (or a
    rerun of a finished search) past the budget replays them rather than ending with stock as the best."""
    first = search(tmp_path / "run", rounds=2, candidates_per_round=1, min_gain=0.0)
    assert first["best_speedup"] > first["stock_speedup"]
    again = search(tmp_path / "run", rounds=3, candidates_per_round=1, min_gain=0.0, max_seconds=1e-6)
    assert again["resumed"] and again["stopped"] == "max_seconds" and again["rounds"] == 2
    assert [t["id"] for t in again["trials"]] == [t["id"] for t in first["trials"]]
    assert again["best_trial"] == first["best_trial"] and again["best_speedup"] == first["best_speedup"]


def test_a_resumed_search_does_not_load_the_records_it_wrote_itself(tmp_path):
    """An uninterrupted search loads memory once, before its first round: a resumed one must not also read the
    records its own earlier rounds wrote (they steer its proposals, and a memory-transfer run would count as
    seeded). Records of other runs it updated keep their earlier evidence."""
    store = MemoryStore(tmp_path / "mem")
    search(tmp_path / "run", memory=store, rounds=1, min_gain=0.0)
    written = {json.loads(p.read_text())["name"] for p in (tmp_path / "mem" / "records").glob("*.json")}
    assert written
    resumed = search(tmp_path / "run", memory=store, rounds=4, min_gain=0.0)
    clean = search(tmp_path / "clean", memory=MemoryStore(tmp_path / "mem2"), rounds=4, min_gain=0.0)
    assert resumed["resumed"] and resumed["memory"]["loaded"] == clean["memory"]["loaded"] == []
    assert [(t["id"], config_key(t["config"])) for t in resumed["trials"]] == \
           [(t["id"], config_key(t["config"])) for t in clean["trials"]]
    # a record this run updated (measured before by another run) is loaded with the other run's evidence
    other = MemoryStore(tmp_path / "mem3")
    search(tmp_path / "other", memory=other, rounds=1, min_gain=0.0)
    before = {r.name: r.gain.run_id for r in other.matching(FakeBackend().descriptor | {"stock_tau": 3.0})}
    search(tmp_path / "run3", memory=other, rounds=1, min_gain=0.0)
    updated = [r for _, r in other.load_all() if r.gain.run_id == "run3" and r.history]
    assert updated and {r.history[0].run_id for r in updated} == {"other"}
    again = Search(InProcessRunner(FakeBackend()), OfflineProposer(), tmp_path / "run3",
                   SearchSettings(rounds=1, candidates_per_round=3, min_gain=0.0), memory=other)
    again.open()
    seen = {r.name: r.gain.run_id for r in other.matching(FakeBackend().descriptor | {"stock_tau": 3.0},
                                                          exclude_run=again.run_id)}
    assert seen == before and set(seen.values()) == {"other"}


def test_offline_proposer_moves_from_runners_up_in_a_real_search(tmp_path):
    """AR fastest: once AR's few moves (engine kinds, weight format) are measured, the next round takes the
    single-knob moves of the best token-forced runner-up instead of running empty (the H200 search's rounds 2-3)."""
    from specpilot.agent.backend import scripted_fake_model

    def ar_wins(cfg):
        m = scripted_fake_model(cfg)
        return {**m, "stage_ms": {"verify": 1.0, "commit": 0.1}} if cfg["name"] == "ar" else m

    s = search(tmp_path / "run", backend=FakeBackend(model_fn=ar_wins), rounds=3, min_rounds=3)
    assert s["best_config"]["name"] == "ar"
    round3 = [t for t in s["trials"] if t["id"].startswith("r3/c")]
    assert len(round3) == 3 and all(t["source"].startswith("offline:runner-up:") for t in round3)


def test_the_history_proposers_read_keeps_each_trials_hypothesis_and_forcing(tmp_path):
    """Every proposed trial's row carries the hypothesis it was proposed under (what Gemini reads back) and whether
    it passed token forcing (what the offline proposer's runner-up moves need); stock, the reference, passes."""
    seen = []

    class Recording(OfflineProposer):
        def propose(self, ctx):
            seen.append(ctx.history)
            return super().propose(ctx)

    search(tmp_path / "run", proposer=Recording(), rounds=2, min_rounds=2)
    rows = seen[-1]
    proposed = [r for r in rows if "delta" in r]
    assert proposed and all(r.get("hypothesis") for r in proposed)
    assert all("forcing" in r for r in proposed)
    stock = next(r for r in rows if r["id"] == "baseline/stock")
    assert stock["forcing"] == {"passed": True} and "hypothesis" not in stock  # a baseline was proposed by no one
