"""Shared pytest fixtures."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import jax
import pytest

# Tests run tiny models on 2 CPU cores, where XLA compile time dominates: skip the slow optimisation
# passes (numerics are unchanged; timings never come from tests).
jax.config.update("jax_disable_most_optimizations", True)

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
