"""scripts/generate.py end to end, as a user runs it (a few subprocesses: each starts JAX)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "generate.py"


def run_generate(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        # deployment.models=config: the tiny random model of the `model` group, not the trained proxy pair
        # (which trains for minutes on first use; tests/test_training.py covers that path)
        [sys.executable, str(SCRIPT), f"hydra.run.dir={tmp_path}", "deployment.models=config", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )


def test_defaults_run_the_tiny_random_model(tmp_path):
    proc = run_generate(tmp_path, "max_new_tokens=8")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"tokens", "engine", "steps", "tokens_per_step", "acceptance_lengths"} <= set(result)
    assert result["engine"] == "ar" and len(result["tokens"]) == 8
    assert "Traceback" not in proc.stderr


def test_unknown_key_is_one_line_and_exit_2(tmp_path):
    proc = run_generate(tmp_path, "+engine.foo=1")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("config error: engine.foo: unknown key")
    assert proc.stdout == ""


def test_typo_without_plus_is_one_line_and_exit_2(tmp_path):
    proc = run_generate(tmp_path, "engine.tree_budgt=3")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["config error: engine.tree_budgt: unknown key"]


def test_token_id_outside_vocabulary_is_one_line_and_exit_2(tmp_path):
    proc = run_generate(tmp_path, "prompt_ids=[1,2,99999]")
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert "99999" in last and last.startswith("prompt error: ")
    assert "Traceback" not in proc.stderr


def test_force_script_passes_an_honest_engine(tmp_path):
    """scripts/force.py: JSON report as the last line, exit 0 when the candidate matches the reference."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, str(repo / "scripts" / "force.py"), "engine=ddtree", "engine.tree_budget=8",
         "prompt_ids=[[1,2,3],[5,6,7,8]]", "max_new_tokens=12", f"hydra.run.dir={tmp_path}", "deployment.models=config"],
        capture_output=True, text=True, cwd=repo, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["passed"] and report["positions_checked"] == 24 and report["violations"] == []


def test_unquoted_text_prompt_names_the_quoting_that_works(tmp_path):
    """The shell strips `prompt="def fib(n):"`'s quotes, and Hydra cannot parse the bare parentheses: the one-line
    error says how to quote it for Hydra."""
    proc = run_generate(tmp_path, "prompt=def fib(n):")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("config error: cannot parse override 'prompt=def fib(n):'")
    assert lines[0].endswith("""quote the value inside the argument: 'prompt="def fib(n):"'""")
