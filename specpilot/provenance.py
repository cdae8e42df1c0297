"""Which code produced a result: the commit every JSON, markdown table, trial log and memory record names."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def git_commit() -> str:
    """$SPECPILOT_COMMIT when set (the device tool's copy of a checkout carries a stale .git: its HEAD is the
    session's first commit), else HEAD's short hash (+ '-dirty' when tracked files differ), else 'unknown'."""
    if os.environ.get("SPECPILOT_COMMIT"):
        return os.environ["SPECPILOT_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10)
        if head.returncode == 0:
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            return head.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown (no git checkout; set SPECPILOT_COMMIT)"
