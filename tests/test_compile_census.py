"""scripts/compile_census.py: as a pytest plugin in a real pytest run it records each compile with its test, and its
summary adds them up by file and by program."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_a_run_under_the_plugin_is_counted_by_test_and_program(tmp_path, capsys):
    (tmp_path / "test_two.py").write_text(
        "import jax, jax.numpy as jnp\n"
        "def test_two_programs():\n"
        "    jax.jit(lambda x: x + 1)(jnp.ones(3))\n"
        "    jax.jit(lambda x: x * 2)(jnp.ones(5))\n")
    census_dir = tmp_path / "census"
    env = {**os.environ, "JAX_LOG_COMPILES": "1", "COMPILE_CENSUS_DIR": str(census_dir),
           "PYTHONPATH": str(REPO / "scripts"), "JAX_PLATFORMS": "cpu"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # every program compiled, none a cache hit
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "compile_census", "-p", "no:cacheprovider",
                           "test_two.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    sys.path.insert(0, str(REPO / "scripts"))
    import compile_census

    lines = [line for log in census_dir.glob("*.log") for line in log.read_text().splitlines()]
    res = compile_census.census(lines)
    row = res["files"]["test_two.py"]
    assert row["compiles"] >= 2 and row["seconds"] > 0 and row["hits"] == 0
    assert sum(s for p, s in res["programs"].items() if p.startswith("jit(<lambda>)")) > 0
    assert compile_census.main([str(census_dir)]) == 0
    out = capsys.readouterr().out
    assert "| test_two.py |" in out and "persistent-cache hits" in out
