"""The gemini proposer with the real google-genai client, over real HTTP, against a local fake server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fake_gemini import FakeGemini, Reply
from specpilot.agent.backend import FakeBackend
from specpilot.agent.loop import Search, SearchSettings
from specpilot.agent.proposers.gemini import GeminiProposer
from specpilot.agent.proposers.offline import OfflineProposer
from specpilot.agent.runner import InProcessRunner
from specpilot.config import GeminiGroup

REPO = Path(__file__).resolve().parents[1]
KEY = "test-gemini-key-7f3a9c"


def answer(*candidates) -> Reply:
    return Reply.json({"candidates": [{"hypothesis": h, "changes": c} for h, c in candidates]})


def run_search(tmp_path, server, rounds=2, max_attempts=5):
    settings = GeminiGroup(model="gemini-test", base_url=server.base_url, timeout_s=0.5, max_attempts=max_attempts,
                           backoff_s=0.01)
    proposer = GeminiProposer(settings, KEY, fallback=OfflineProposer())
    return Search(InProcessRunner(FakeBackend()), proposer, tmp_path / "run",
                  SearchSettings(rounds=rounds, candidates_per_round=3, min_gain=0.0),
                  offline_fallback=OfflineProposer()).run()


def test_retries_rejections_feedback_and_the_token_forcing_gate(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    script = [
        Reply.error(429),
        Reply.error(500),
        Reply(text='{"candidates": [ {"hypothesis": "half an answer"'),  # malformed JSON
        Reply.hang(3.0),  # longer than the 0.5 s client timeout
        answer(("W12 weights: verify -20%", {"weight_format": "w12"}),
               ("a huge tree: tau up", {"engine": "ddtree", "tree_budget": 5000}),
               ("skip most of verification: 10x", {"engine": "ddtree", "tree_budget": 13})),
        answer(("cost-aware budget on top of W12: verify -30%", {"engine": "specpilot"})),
    ]
    with FakeGemini(script) as server:
        s = run_search(tmp_path, server)
    reqs = server.requests
    assert len(reqs) == 6
    assert all(r.api_key == KEY and r.path.endswith("/models/gemini-test:generateContent") for r in reqs)
    gen = reqs[0].body["generationConfig"]
    assert gen["responseMimeType"] == "application/json" and "candidates" in json.dumps(gen["responseSchema"])
    # every failure was retried and logged with its reason
    notes = " | ".join(s["proposer_notes"])
    for expected in ("HTTP 429", "HTTP 500", "malformed answer: not valid JSON", "Timeout"):
        assert expected in notes, notes
    assert "Your previous answer was rejected" in reqs[3].prompt  # the parse error went back to the model
    # the valid proposal ran; the out-of-space one was refused with a reason that round 2 was told
    first = next(t for t in s["trials"] if t["id"] == "r1/c0")
    assert first["source"] == "gemini" and first["config"]["weight_format"] == "w12" and first["status"] == "ok"
    [refused] = s["rejected_by_space"]
    assert refused["delta"] == {"engine": "ddtree", "tree_budget": 5000}
    assert "5000 outside [1, 256]" in refused["reason"]
    assert "5000 outside [1, 256]" in reqs[5].prompt and "5000 outside" not in reqs[4].prompt
    # the cheat got through the space (its values are legal) but not through token forcing
    assert [r["trial"] for r in s["rejected_by_token_forcing"]] == ["r1/c1"]
    assert any(t["id"] == "r2/c0" and t["config"]["name"] == "specpilot" for t in s["trials"])
    # the key went over HTTP only: nothing written in the run directory contains it
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            assert KEY not in path.read_text(errors="ignore"), path


def test_a_refused_key_is_not_retried_and_the_search_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    with FakeGemini([Reply.error(403)]) as server:
        s = run_search(tmp_path, server, rounds=1)
    assert len(server.requests) == 1
    assert any("HTTP 403" in n and "not retried" in n for n in s["proposer_notes"])
    assert any("using the offline proposer" in n for n in s["proposer_notes"])
    round1 = [t for t in s["trials"] if t["id"].startswith("r1/c")]
    assert round1 and all(t["source"].startswith("offline:") for t in round1)


def test_a_key_the_server_echoes_is_never_logged_or_written(tmp_path, monkeypatch, caplog):
    """Given to the proposer directly (not in the environment), the key in a server's error message is redacted in
    the log lines, the proposer's notes and every file of the run."""
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    with FakeGemini([Reply.error(400, "API key {api_key} not valid"), Reply.error(500, "retry {api_key}")]) as server:
        s = run_search(tmp_path, server, rounds=1, max_attempts=1)
    assert server.requests[0].api_key == KEY
    assert any("API key <redacted> not valid" in n for n in s["proposer_notes"]), s["proposer_notes"]
    assert KEY not in caplog.text and KEY not in json.dumps(s)
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            assert KEY not in path.read_text(errors="ignore"), path


def test_missing_key_is_a_one_line_start_up_error(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("GEMINI_API_KEY", "GOOGLE_API_KEY")}
    for args in (["deployment.proposer=gemini"], ["+deployment=h100"], ["deployment=h200"]):
        proc = subprocess.run([sys.executable, str(REPO / "scripts" / "search.py"), *args, f"hydra.run.dir={tmp_path}"],
                              capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().splitlines() == [
            "config error: deployment.proposer: gemini needs GEMINI_API_KEY or GOOGLE_API_KEY in the environment "
            "(or use deployment.proposer=offline)"
        ]
        assert proc.stdout == ""
