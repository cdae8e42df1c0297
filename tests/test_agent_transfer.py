"""When a search first had its best (`best_found_at_trial`, `best_found_after_s`), the search time budget, and
the memory-transfer comparison (specpilot/agent/transfer.py, scripts/memory_transfer.py) — on the scripted
FakeBackend, in seconds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from specpilot.agent.backend import FakeBackend
from specpilot.agent.loop import Search, SearchSettings
from specpilot.agent.memory import MemoryStore
from specpilot.agent.proposers.offline import OfflineProposer
from specpilot.agent.runner import InProcessRunner
from specpilot.agent.space import config_key
from specpilot.agent.transfer import compare, first_reaching, load_run, markdown

REPO = Path(__file__).resolve().parents[1]


def search(run_dir, backend=None, memory=None, **settings):
    settings = {"rounds": 6, "candidates_per_round": 1, **settings}
    return Search(InProcessRunner(backend or FakeBackend(delay_s=0.005)), OfflineProposer(), run_dir,
                  SearchSettings(**settings), memory=memory).run()


def test_summary_says_when_the_best_was_first_found(tmp_path):
    s = search(tmp_path / "run")
    trials = s["trials"]
    i = s["best_found_at_trial"]
    assert trials[0]["id"] == "baseline/ar" and trials[1]["id"] == "baseline/stock"
    assert 3 <= i <= len(trials) and s["best_speedup"] > s["stock_speedup"]
    found = trials[i - 1]
    assert found["id"] == s["best_found_trial"] and found["status"] == "ok"
    assert config_key(found["config"]) == config_key(s["best_config"])
    # no earlier trial measured the best config (the integration trial re-measures the winning candidate's)
    assert all(config_key(t["config"]) != config_key(s["best_config"]) for t in trials[: i - 1])
    elapsed = [t["elapsed_s"] for t in trials]
    assert elapsed == sorted(elapsed) and elapsed[0] > 0
    assert s["best_found_after_s"] == found["elapsed_s"] <= s["elapsed_s"]
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert on_disk["best_found_at_trial"] == i and on_disk["best_found_after_s"] == s["best_found_after_s"]
    # stock as the final best is trial 2
    flat = search(tmp_path / "flat", rounds=1, candidates_per_round=1, min_gain=10.0)
    if flat["best_trial"] == "baseline/stock":
        assert flat["best_found_at_trial"] == 2


def test_max_seconds_starts_no_round_after_the_budget(tmp_path):
    budget = 0.5
    s = search(tmp_path / "run", backend=FakeBackend(delay_s=0.05), max_seconds=budget, rounds=20, min_gain=0.0)
    assert s["stopped"] == "max_seconds" and s["rounds"] < 20
    assert (tmp_path / "run" / "summary.json").is_file()
    trials = s["trials"]
    for r in range(1, s["rounds"] + 1):  # every round that ran started inside the budget
        first = next(i for i, t in enumerate(trials) if t["round"] == r)
        assert trials[first - 1]["elapsed_s"] < budget
    assert s["elapsed_s"] >= budget  # and it stopped because the budget was spent (not on a trial's timing)
    none = search(tmp_path / "none", backend=FakeBackend(delay_s=0.01), max_seconds=0.001)
    assert none["rounds"] == 0 and none["best_trial"] == "baseline/stock" and none["best_found_at_trial"] == 2


def test_profiling_only_contenders_changes_no_decision(tmp_path):
    full = search(tmp_path / "full", backend=FakeBackend(), memory=MemoryStore(tmp_path / "m_full"),
                  candidates_per_round=3, rounds=4)
    lean = search(tmp_path / "lean", backend=FakeBackend(), memory=MemoryStore(tmp_path / "m_lean"),
                  candidates_per_round=3, rounds=4, profile_all=False)
    assert [(t["id"], t["config"], t.get("speedup")) for t in lean["trials"]] == \
           [(t["id"], t["config"], t.get("speedup")) for t in full["trials"]]
    assert lean["best_config"] == full["best_config"]
    assert [Path(p).name for p in lean["memory"]["written"]] == [Path(p).name for p in full["memory"]["written"]]
    skipped = [t for t in lean["trials"] if "stage_ms" not in t]
    assert skipped and all(t["gain"] < 0 for t in skipped)  # only candidates slower than their incumbent
    assert all("stage_ms" in t for t in full["trials"])


def test_min_rounds_defers_the_min_gain_stop(tmp_path):
    # no round can gain 1000%: the search stops after round 1, or after round min_rounds
    assert search(tmp_path / "one", rounds=5, min_gain=10.0)["rounds"] == 1
    s = search(tmp_path / "three", rounds=5, min_gain=10.0, min_rounds=3)
    assert s["rounds"] == 3 and s["stopped"] == "min_gain"


def test_seeded_search_reaches_its_best_sooner(tmp_path):
    store_a = MemoryStore(tmp_path / "mem_a")
    a = search(tmp_path / "a", backend=FakeBackend(name="fake-a", batch=1, num_prompts=4, delay_s=0.05),
               memory=store_a)
    assert a["memory"]["written"]
    seeded = search(tmp_path / "b_seeded", backend=FakeBackend(name="fake-b", batch=4, num_prompts=4, delay_s=0.05),
                    memory=store_a)
    unseeded = search(tmp_path / "b_unseeded",
                      backend=FakeBackend(name="fake-b", batch=4, num_prompts=4, delay_s=0.05),
                      memory=MemoryStore(tmp_path / "mem_empty"))
    result = compare(load_run(tmp_path / "b_seeded"), load_run(tmp_path / "b_unseeded"))
    v = result["verdict"]
    assert v["seeded_loaded_memory"] and v["unseeded_loaded_no_memory"] and v["seeded_round1_from_memory"] >= 1
    assert result["seeded"]["best_found_at_trial"] == seeded["best_found_at_trial"] == 3  # A's best, tried first
    assert unseeded["best_found_at_trial"] > 3
    assert v["best_found_in_fewer_trials"] and v["best_found_in_fewer_seconds"]
    assert v["target_level_in_fewer_trials"] and v["seeded_reaches_its_best_faster"]
    level = result["target_level"]
    assert level["seeded"]["index"] < level["unseeded"]["index"]
    assert level["speedup"] == 0.98 * max(seeded["best_speedup"], unseeded["best_speedup"])
    md = markdown(result)
    assert "| seeded |" in md and "| unseeded |" in md and "Seeded reaches its best faster: True" in md
    # swapped: the unseeded run is not faster than the seeded one
    assert compare(load_run(tmp_path / "b_unseeded"), load_run(tmp_path / "b_seeded"))["verdict"][
        "seeded_reaches_its_best_faster"] is False


def test_a_run_cut_off_before_its_summary_is_read_from_its_trial_log(tmp_path):
    search(tmp_path / "run", rounds=2)
    (tmp_path / "run" / "summary.json").unlink()
    with open(tmp_path / "run" / "trials.jsonl", "a") as f:
        f.write('{"type": "trial", "id": "torn')  # killed mid-write
    run = load_run(tmp_path / "run")
    assert not run["complete"] and run["best"]["speedup"] > run["stock_speedup"]
    assert first_reaching(run["trials"], run["best"]["speedup"])["id"] == run["best"]["id"]
    assert first_reaching(run["trials"], 1e9) is None


def test_memory_transfer_script_end_to_end(tmp_path):
    """scripts/memory_transfer.py with a stand-in search (tests/fake_search.py on the FakeBackend): A writes
    records, B runs seeded (a copy of A's records) and unseeded (empty), and the comparison says who was first.
    Each fake trial sleeps 0.5 s, so the seeded run's two trials fewer lead by ~1 s of search time: at 0.2 s the
    lead was 0.4 s, which a loaded 2-core machine (the suite on two workers) ate once."""
    work = tmp_path / "work"
    cmd = [sys.executable, str(REPO / "scripts" / "memory_transfer.py"), "--work", str(work),
           "--search-cmd", str(REPO / "tests" / "fake_search.py"), "--", "search.rounds=6",
           "search.candidates_per_round=1", "deployment.name=fake", "fake.delay_s=0.5"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [r["name"] for r in last["runs"]] == ["a", "b_unseeded", "b_seeded"]
    assert last["a"]["records"] > 0 and last["a"]["best_speedup"] > last["a"]["stock_speedup"]
    assert last["b"]["seeded_reaches_its_best_faster"] is True
    result = json.loads((work / "transfer.json").read_text())
    assert result["seed_memory"]["records"] == last["a"]["records"]
    # B seeded searched with a copy of A's records (and wrote its own next to them; A's folder is untouched)
    a_records = {p.name for p in (work / "memory_a" / "records").glob("*.json")}
    assert len(a_records) == last["a"]["records"]
    assert a_records < {p.name for p in (work / "memory_b_seeded" / "records").glob("*.json")}
    assert result["b"]["unseeded"]["memory_loaded"] == []
    assert result["a_overrides"] == ["deployment.batch=1"] and result["b_overrides"] == ["deployment.batch=4"]
    md = (work / "transfer.md").read_text()
    assert "## Deployment A" in md and "Seeded reaches its best faster: True" in md
    assert "[b_unseeded] fake search" in proc.stderr  # each run's stderr is echoed, prefixed

    # B's runs side by side, one per GPU; a search that outlives --run-timeout-s is stopped, and its trials so
    # far still enter the comparison
    cut = subprocess.run([*cmd[:3], str(tmp_path / "cut"), *cmd[4:6], "--phase", "b", "--seed-memory",
                          str(work / "memory_a"), "--parallel-devices", "0,1", "--run-timeout-s", "2.5", "--",
                          *cmd[7:-1], "fake.delay_s=1.0"], capture_output=True, text=True, timeout=120, cwd=REPO)
    last = json.loads(cut.stdout.strip().splitlines()[-1])
    assert [r["timed_out"] for r in last["runs"]] == [True, True]
    assert "[transfer] b_unseeded (CUDA_VISIBLE_DEVICES=0)" in cut.stderr
    assert "[transfer] b_seeded (CUDA_VISIBLE_DEVICES=1)" in cut.stderr
    err = cut.stderr  # at the same time: both started before either was stopped
    assert max(err.index("[transfer] b_unseeded ("), err.index("[transfer] b_seeded (")) < err.index("still running")
    result = json.loads((tmp_path / "cut" / "transfer.json").read_text())
    assert result["b"]["seeded"]["complete"] is False and "(cut off)" in (tmp_path / "cut" / "transfer.md").read_text()


def _run(speedups: list[float], loaded: list[str]) -> dict:
    """A run as load_run gives it: baselines AR and stock (trials 1, 2), then one trial per speedup, 50 s apart;
    each trial its own config."""
    trials = [{"id": "baseline/ar", "status": "ok", "speedup": 1.0, "elapsed_s": 20.0, "config": {"engine": "ar"}}]
    for i, x in enumerate(speedups):
        trials.append({"id": "baseline/stock" if i == 0 else f"r1/c{i}", "status": "ok", "speedup": x,
                       "elapsed_s": 50.0 * (i + 1), "config": {"engine": "ddtree", "tree_budget": 2 ** i},
                       "source": "memory:x" if loaded and i else "offline"})
    best = max(range(len(speedups)), key=lambda i: speedups[i])
    t = trials[best + 1]
    return {"run_dir": "-", "complete": True, "trials": trials,
            "best": {"id": t["id"], "speedup": t["speedup"], "tau": 2.0, "config": t["config"]},
            "found": {"id": t["id"], "index": best + 2, "elapsed_s": t["elapsed_s"]},
            "stock_speedup": speedups[0], "rounds": 1, "stopped": "min_gain", "elapsed_s": 300.0,
            "memory_loaded": loaded, "memory_written": [], "deployment": {}, "round_log": []}


def test_the_verdict_is_time_to_the_higher_best():
    """The three shapes the H200 runs had or could have had (docs/results/2026-11-30-search-h200-ab)."""
    def verdict(seeded, unseeded):
        return compare(_run(seeded, ["rec.json"]), _run(unseeded, []))["verdict"]

    # the unseeded search finds nothing above stock (its "best" is the stock baseline, trial 2); the seeded
    # run's first proposal beats it by 13 %: seeded is faster, though it found its own best later
    v = verdict([1.23, 1.39, 1.16, 1.0, 1.45], [1.25, 0.68, 0.81, 1.17])
    assert v["seeded_reaches_its_best_faster"] and v["best_found_in_fewer_trials"] is False
    # both bests are stock: a tie, not faster
    assert not verdict([1.25, 0.8, 0.9], [1.25, 0.7, 0.6])["seeded_reaches_its_best_faster"]
    # the seeded run settles early for a lower best: the unseeded run reached the higher one, the seeded never did
    v = verdict([1.1, 1.2, 1.2], [1.1, 0.9, 1.0, 1.5])
    assert v["best_found_in_fewer_trials"] and not v["seeded_reaches_its_best_faster"]
    # and nothing counts without the memory difference
    assert not compare(_run([1.2, 1.5], []), _run([1.2, 1.0, 1.5], []))["verdict"]["seeded_reaches_its_best_faster"]


def test_the_committed_h200_transfer_runs_give_the_recorded_verdicts():
    """docs/results/2026-11-30-search-h200-ab: deployment B at batch 2, where A's DDTree records hold, is faster
    seeded; at batch 4, where AR wins, the records cost the seeded run two trials."""
    root = REPO / "docs" / "results" / "2026-11-30-search-h200-ab"
    for batch, faster in (("B_batch2", True), ("B_batch4", False)):
        result = compare(load_run(root / batch / "b_seeded"), load_run(root / batch / "b_unseeded"))
        assert result["verdict"]["seeded_reaches_its_best_faster"] is faster, batch
        recorded = json.loads((root / batch / "transfer.json").read_text())["b"]["verdict"]
        assert recorded["seeded_reaches_its_best_faster"] is faster


def test_compare_mode_recomputes_the_verdict_from_copied_runs(tmp_path):
    """`memory_transfer.py --compare`: runs copied back from a GPU machine are compared again, nothing is run."""
    import shutil

    work = tmp_path / "b"
    shutil.copytree(REPO / "docs" / "results" / "2026-11-30-search-h200-ab" / "B_batch2", work)
    (work / "transfer.json").unlink()
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "memory_transfer.py"), "--work", str(work),
                           "--compare"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["seeded_reaches_its_best_faster"] is True
    assert json.loads((work / "transfer.json").read_text())["b"]["target_level"]["unseeded"] is None  # never
    assert "Seeded reaches its best faster: True" in (work / "transfer.md").read_text()


def test_a_refused_configuration_stops_the_transfer_with_exit_2(tmp_path):
    """A search that refuses its overrides (exit 2) ends the script at once: exit 2, no comparison written."""
    work = tmp_path / "work"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "memory_transfer.py"), "--work", str(work),
                           "--search-cmd", str(REPO / "tests" / "fake_search.py"), "--",
                           "fake.config_error=search.roundz: unknown key"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "[a] config error: search.roundz: unknown key" in proc.stderr
    assert "a: the search refused its configuration" in proc.stderr
    assert not (work / "transfer.md").exists() and proc.stdout == ""
