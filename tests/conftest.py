"""Shared pytest fixtures."""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

# The run's caches live in one folder of its own, made by the run's first process (xdist's controller) and deleted at
# its exit; the workers and every subprocess inherit it through the environment. So a run starts as cold as CI's fresh
# machine and never writes to ~/.cache/specpilot:
# - SPECPILOT_CACHE (hardware calibrations, W12 weights, trained proxies, the search's compile cache);
# - XLA's compilation cache, which jax reads from the environment at import: tests and the scripts they start build
#   the same tiny models' programs (random weights, forwards, loops) over and over, each in a fresh process or a
#   fresh jit. A hit returns the executable the compile would have built.
if "SPECPILOT_TEST_RUN_DIR" not in os.environ:
    os.environ["SPECPILOT_TEST_RUN_DIR"] = tempfile.mkdtemp(prefix="specpilot-test-run-")
    atexit.register(shutil.rmtree, os.environ["SPECPILOT_TEST_RUN_DIR"], ignore_errors=True)
os.environ["SPECPILOT_CACHE"] = os.path.join(os.environ["SPECPILOT_TEST_RUN_DIR"], "cache")
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(os.environ["SPECPILOT_TEST_RUN_DIR"], "jit")
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
# Tests run tiny models on 2 CPU cores, where compiling is most of their time: skip XLA's slow optimisation passes
# (numerics are unchanged; timings never come from tests). Set in the environment, so the scripts the tests start
# (benches, the search, probes) compile the same way: it took ~35 % off compiling two engines' loops, interleaved
# runs 4.1-5.8 s against 5.9-7.6 s (docs/h200_runbook.md, forty-seventh session).
os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "true"

import jax  # noqa: E402  (after the cache's and the compiler's environment)
import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MAKE_REFERENCE = REPO / "tests" / "hf_reference" / "make_reference.py"


def _reference_key(ref_python: Path) -> str:
    """The script's bytes and the reference venv's torch/transformers versions: change either, rebuild."""
    h = hashlib.sha256(MAKE_REFERENCE.read_bytes())
    venv = ref_python.parent.parent
    for dist in sorted(venv.glob("lib/python*/site-packages/*.dist-info")):
        if dist.name.split("-")[0].lower() in {"torch", "transformers", "safetensors", "numpy"}:
            h.update(dist.name.encode())
    return h.hexdigest()[:16]


@pytest.fixture(scope="session")
def hf_reference() -> Path:
    """Folder of tiny HF checkpoints + torch reference outputs (see tests/hf_reference/make_reference.py).

    Built once by the torch reference venv and cached under `.cache/hf_reference/<key>/`.
    """
    ref_python = Path(os.environ.get("SPECPILOT_REF_PYTHON", REPO / ".venv-ref" / "bin" / "python"))
    if not ref_python.exists():
        pytest.fail(
            f"reference python {ref_python} not found: the HF parity tests need the torch reference venv. "
            "Run `make test` (it creates .venv-ref), or point SPECPILOT_REF_PYTHON at a python with "
            "torch + transformers + safetensors + numpy.",
            pytrace=False,
        )
    out = REPO / ".cache" / "hf_reference" / _reference_key(ref_python)
    if (out / "manifest.json").is_file():
        return out
    # Build beside the final folder and rename, so an interrupted run never leaves a half-written cache.
    tmp = out.with_name(f"{out.name}.tmp-{uuid.uuid4().hex[:8]}")
    proc = subprocess.run(
        [str(ref_python), str(MAKE_REFERENCE), str(tmp)], capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        pytest.fail(f"{MAKE_REFERENCE.name} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}", pytrace=False)
    try:
        tmp.rename(out)
    except OSError:  # another session finished first; its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)
    return out
