"""scripts/search.py end to end on the CPU deployment (random tiny model, tiny settings), as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = [
    "deployment.models=config", "deployment.max_new_tokens=4", "deployment.prompt_len=4", "deployment.num_prompts=2",
    "deployment.max_tree_budget=8", "search.rounds=1", "search.candidates_per_round=2", "search.measure_repeats=1",
    "search.profile_rounds=1", "search.wandb.mode=disabled",
]


def run_search(tmp_path, *args):
    env = {**os.environ, "JAX_DISABLE_MOST_OPTIMIZATIONS": "1"}  # compile time dominates here; numerics unchanged
    env.pop("GEMINI_API_KEY", None)
    env.pop("GOOGLE_API_KEY", None)
    return subprocess.run([sys.executable, str(REPO / "scripts" / "search.py"), *TINY,
                           f"search.memory_dir={tmp_path / 'memory'}", *args],
                          capture_output=True, text=True, timeout=300, cwd=REPO, env=env)


def test_search_runs_end_to_end_and_resumes_from_its_log(tmp_path):
    """One search, then the same again from its log. The first also takes `deployment.target_passthrough_layers`
    from the command line: it deepens the target the search measures (conf/model/tiny.yaml: 2 layers) and is
    recorded in the deployment it describes."""
    run_dir = tmp_path / "run"
    proc = run_search(tmp_path, f"hydra.run.dir={run_dir}", "deployment.target_passthrough_layers=3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    summary = json.loads(Path(last["summary"]).read_text())
    assert summary["deployment"]["target"]["num_layers"] == 5
    assert Path(last["summary"]) == run_dir / "summary.json"
    for key in ("stock_speedup", "best_speedup", "best_config", "rounds", "trials", "rejected_by_token_forcing"):
        assert key in summary
    assert last["best_config"] == summary["best_config"] and summary["rounds"] == 1
    assert summary["best_speedup"] >= summary["stock_speedup"]
    if summary["best_trial"] != "baseline/stock":  # a new incumbent passed token forcing
        assert summary["best_forcing"]["passed"] and summary["best_forcing"]["num_violations"] == 0
    assert "search finished" in proc.stderr and "baseline/stock" in proc.stderr
    assert (run_dir / "engine" / "best.yaml").is_file()
    trials = [json.loads(x) for x in (run_dir / "trials.jsonl").read_text().splitlines()]
    ids = [t["id"] for t in trials if t["type"] == "trial"]
    assert ids[:2] == ["baseline/ar", "baseline/stock"] and len(ids) == len(set(ids)) == summary["num_trials"]

    # the same run again: everything comes from the log, nothing is measured twice
    again = run_search(tmp_path, f"search.resume={run_dir}", f"hydra.run.dir={tmp_path / 'other'}",
                       "deployment.target_passthrough_layers=3")
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = json.loads((run_dir / "summary.json").read_text())
    assert resumed["resumed"] and resumed["trials_from_log"] == len(ids)
    assert [t["id"] for t in resumed["trials"]] == [t["id"] for t in summary["trials"]]
    assert len([x for x in (run_dir / "trials.jsonl").read_text().splitlines() if '"type": "trial"' in x]) == len(ids)
    # trials measured on XLA's kernels are not resumed as if they had run on ours
    other = run_search(tmp_path, f"search.resume={run_dir}", f"hydra.run.dir={tmp_path / 'other2'}",
                       "deployment.target_passthrough_layers=3", "kernels=hopper")
    assert other.returncode == 2 and "different search (kernels." in other.stderr, other.stderr[-2000:]


def test_a_negative_passthrough_count_is_refused(tmp_path):
    bad = run_search(tmp_path, f"hydra.run.dir={tmp_path / 'bad'}", "deployment.target_passthrough_layers=-1")
    assert bad.returncode != 0 and "target_passthrough_layers" in bad.stderr


def test_a_memory_folder_it_cannot_write_fails_before_the_first_trial(tmp_path):
    """Records are written after the last round; a `search.memory_dir` that cannot hold them is a one-line config
    error at start, with no trial run (here its parent is a file, which no user, root included, can make a folder
    under)."""
    (tmp_path / "a_file").write_text("")
    run_dir = tmp_path / "run"
    bad = run_search(tmp_path, f"hydra.run.dir={run_dir}", f"search.memory_dir={tmp_path / 'a_file' / 'memory'}")
    assert bad.returncode == 2, bad.stderr[-2000:]
    assert bad.stderr.strip().splitlines()[-1].startswith(
        f"config error: search.memory_dir: cannot write records under {tmp_path / 'a_file' / 'memory'}: ")
    assert not (run_dir / "trials.jsonl").exists()


def test_a_key_given_as_an_override_leaves_no_trace_in_the_run_folder(tmp_path):
    """Hydra saves the overrides under .hydra/ before the config check refuses the key: they are scrubbed."""
    secret = "AIzaSECRET-KEY-0001x"
    run_dir = tmp_path / "k"
    proc = run_search(tmp_path, f"hydra.run.dir={run_dir}", f"+search.gemini.api_key={secret}")
    assert proc.returncode == 2 and secret not in proc.stderr + proc.stdout
    saved = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.name == "overrides.yaml" for p in saved)
    for p in saved:
        assert secret not in p.read_text(errors="ignore"), p
