"""What the search writes down: the fsync'd trial log, memory records, W&B runs — and never a secret."""

from __future__ import annotations

import json

import pytest

from specpilot.agent.memory import SCHEMA_VERSION, Evidence, MemoryRecord, MemoryStore, preconditions_for
from specpilot.agent.trials import TrialLog
from specpilot.tracking import REDACTED, Tracker, scrub

SECRET = "sk-test-secret-0042aa"


def test_scrub_redacts_secret_keys_and_secret_values(monkeypatch):
    monkeypatch.setenv("GOOGLE_API_KEY", SECRET)
    out = scrub({"api_key": "x", "nested": [{"note": f"key={SECRET}"}], "tokens_per_round": 3, "password": 1})
    assert out == {"api_key": REDACTED, "nested": [{"note": f"key={REDACTED}"}], "tokens_per_round": 3,
                   "password": REDACTED}


def test_trial_log_survives_a_torn_last_line(tmp_path):
    log = TrialLog(tmp_path / "trials.jsonl")
    log.append({"type": "trial", "id": "a"})
    log.append({"type": "trial", "id": "b"})
    with open(log.path, "a") as f:
        f.write('{"type": "trial", "id": "c", "sta')  # killed mid-write
    assert [r["id"] for r in log.load()] == ["a", "b"]
    log.append({"type": "trial", "id": "c"})
    with open(log.path, "a") as f:
        f.write("[1, 2]\nnull\n")  # JSON, but no record: skipped like a corrupt line
    assert [r["id"] for r in log.load()] == ["a", "b", "c"]


def _record(name="cpu", tau=2.0, run_id="run1", trial="r1/c0", gain=0.2, temperature=0.0):
    deployment = {"name": name, "gpu": "none", "platform": "cpu", "batch": 1, "temperature": temperature,
                  "stock_tau": tau, "max_tree_budget": 64, "target": {"dtype": "float32"}, "drafter": {"block_size": 8}}
    config = {"name": "ddtree", "block_size": None, "tree_budget": 32, "weight_format": "bf16", "attention": "xla"}
    ev = Evidence(run_id=run_id, trial_id=trial, run_dir="/tmp/x", date="2026-01-01T00:00:00Z", speedup_over_ar=1.2,
                  base_speedup_over_ar=1.0, relative_gain=gain, tau=3.0, ms_per_token=1.0,
                  forcing={"passed": True, "reference": "stock", "positions_checked": 32, "num_violations": 0,
                           "num_ties": 0, "unchecked": 0})
    return MemoryRecord(name="engine=ddtree+tree_budget=32", mechanism="stock -> ddtree tree_budget=32: tau up",
                        delta={"engine": "ddtree", "tree_budget": 32}, base_config={"name": "stock"}, config=config,
                        addresses="tau", deployment=deployment,
                        preconditions=preconditions_for(deployment, config, tau), gain=ev)


def test_memory_records_round_trip_match_and_keep_history(tmp_path):
    store = MemoryStore(tmp_path)
    path = store.write(_record())
    data = json.loads(path.read_text())
    assert data["schema_version"] == SCHEMA_VERSION and data["gain"]["forcing"]["passed"]
    assert path.read_text().startswith("{\n  ")  # indented, for people
    here = {"name": "cpu2", "gpu": "none", "platform": "cpu", "batch": 1, "temperature": 0.0, "stock_tau": 2.5,
            "max_tree_budget": 64}
    assert [r.name for r in store.matching(here)] == ["engine=ddtree+tree_budget=32"]
    assert store.matching({**here, "stock_tau": 6.0}) == []  # a far better drafter: the gain may not carry over
    assert store.matching({**here, "max_tree_budget": 16}) == []  # the config does not fit this deployment
    assert store.matching({**here, "temperature": 1.0}) == []
    assert store.matching({**here, "platform": "gpu"}) == []
    # the same evidence again (a resumed search replaying its round) changes nothing; new evidence is kept
    store.write(_record())
    assert json.loads(path.read_text())["history"] == []
    store.write(_record(run_id="run2", gain=0.25))
    again = json.loads(path.read_text())
    assert again["gain"]["run_id"] == "run2" and [h["run_id"] for h in again["history"]] == ["run1"]


def test_memory_skips_other_schema_versions_and_broken_files(tmp_path):
    store = MemoryStore(tmp_path)
    path = store.write(_record())
    (path.parent / "future.json").write_text(json.dumps({**json.loads(path.read_text()), "schema_version": 99}))
    (path.parent / "broken.json").write_text("{not json")
    (path.parent / "binary.json").write_bytes(b"\xff\xfe\x00")  # not UTF-8
    for name, value in (("list", []), ("null", None), ("number", 42)):  # JSON, but not a record
        (path.parent / f"{name}.json").write_text(json.dumps(value))
    data = json.loads(path.read_text())
    for name, forcing, gain in (("failed", {"passed": False, "num_violations": 3}, 0.2),  # never validated
                                ("loss", data["gain"]["forcing"], -0.5)):
        bad = {**data, "name": name, "gain": {**data["gain"], "forcing": forcing, "relative_gain": gain}}
        (path.parent / f"{name}.json").write_text(json.dumps(bad))
    assert [p.name for p, _ in store.load_all()] == [path.name]
    here = {"name": "cpu", "gpu": "none", "platform": "cpu", "batch": 1, "temperature": 0.0, "stock_tau": 2.0,
            "max_tree_budget": 64}
    (path.parent / "odd_precondition.json").write_text(
        json.dumps({**data, "name": "odd", "preconditions": {**data["preconditions"], "batch": {"min": "one"}}}))
    assert [r.name for r in store.matching(here)] == [data["name"]]  # the odd one skipped, not a crash
    with pytest.raises(ValueError, match="token forcing did not pass"):
        Evidence(**{**data["gain"], "forcing": {"passed": False, "num_violations": 1}})


def test_tracker_disabled_is_a_no_op(tmp_path):
    t = Tracker("disabled", "specpilot", tmp_path, "run-x", {"a": 1})
    t.log({"x": 1})
    t.table("trials", ["id"], [["a"]])
    t.summary({"y": 2})
    t.finish()
    assert not t.active and not (tmp_path / "wandb").exists()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_tracker_offline_run_keeps_tables_and_no_secret(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("GEMINI_API_KEY", SECRET)
    t = Tracker("offline", "specpilot", tmp_path, "run-x", {"deployment": {"proposer": "gemini"}, "note": SECRET})
    assert t.active
    t.log({"trial/speedup": 1.5, "trial/rejected_by_token_forcing": 1})
    t.table("trials", ["id", "status"], [["r1/c0", "rejected_token_forcing"]])
    t.summary({"rejected_by_token_forcing": 1})
    t.finish()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    tables = list(runs[0].rglob("trials_*.table.json"))
    assert tables and "rejected_token_forcing" in tables[0].read_text()
    for path in runs[0].rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
