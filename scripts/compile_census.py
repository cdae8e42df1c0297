"""Where the CPU test suite's time goes: every XLA compile, by test file and by program name.

As a pytest plugin it appends one line per compile (and per persistent-cache hit) that jax logs, with the test that
ran it, to ``$COMPILE_CENSUS_DIR/<pid>.log`` (in-process only: the scripts tests start are not counted):

    rm -rf /tmp/census; JAX_LOG_COMPILES=1 COMPILE_CENSUS_DIR=/tmp/census PYTHONPATH=scripts \\
      .venv/bin/python -m pytest -q -n 2 --dist loadfile -p compile_census tests
    .venv/bin/python scripts/compile_census.py /tmp/census

The second command prints the totals, the files with the most compile time and the programs that took it
(docs/h200_runbook.md, fifty-eighth session: 520 s of ~1000 s of in-process test time).
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import re
import sys
from pathlib import Path

COMPILED = re.compile(r"Finished XLA compilation of (\S+) in ([\d.e-]+) sec")


class _Census(logging.Handler):
    def __init__(self, folder: Path):
        super().__init__(logging.DEBUG)
        self.folder = folder

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if COMPILED.search(msg) or "cache hit" in msg.lower():
            test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
            with open(self.folder / f"{os.getpid()}.log", "a") as f:
                f.write(f"{test}\t{msg}\n")


def pytest_configure(config) -> None:
    folder = Path(os.environ.get("COMPILE_CENSUS_DIR", "/tmp/compile_census"))
    folder.mkdir(parents=True, exist_ok=True)
    logging.getLogger("jax").addHandler(_Census(folder))


def census(lines) -> dict:
    """Per test file: seconds compiling, compiles, seconds in compiles under 0.1 s, cache hits; and per program."""
    files = collections.defaultdict(lambda: {"seconds": 0.0, "compiles": 0, "small_seconds": 0.0, "hits": 0})
    programs = collections.Counter()
    for line in lines:
        test, _, msg = line.rstrip("\n").partition("\t")
        row = files[test.split("::")[0]]
        m = COMPILED.search(msg)
        if m:
            seconds = float(m.group(2))
            row["seconds"] += seconds
            row["compiles"] += 1
            row["small_seconds"] += seconds if seconds < 0.1 else 0.0
            programs[m.group(1)] += seconds
        elif "cache hit" in msg.lower():
            row["hits"] += 1
    return {"files": dict(files), "programs": dict(programs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="COMPILE_CENSUS_DIR of a run")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    logs = sorted(args.folder.glob("*.log"))
    if not logs:
        ap.error(f"{args.folder}: no *.log files (run pytest with -p compile_census and JAX_LOG_COMPILES=1 first)")
    res = census(line for log in logs for line in log.read_text().splitlines())
    files, programs = res["files"], res["programs"]
    total = {k: sum(f[k] for f in files.values()) for k in ("seconds", "compiles", "small_seconds", "hits")}
    print(f"{total['compiles']} compiles, {total['seconds']:.0f} s ({total['small_seconds']:.0f} s in compiles under "
          f"0.1 s), {total['hits']} persistent-cache hits")
    print("\n| file | compile s | compiles | under 0.1 s | cache hits |\n|---|---|---|---|---|")
    for name, f in sorted(files.items(), key=lambda kv: -kv[1]["seconds"])[:args.top]:
        print(f"| {name} | {f['seconds']:.1f} | {f['compiles']} | {f['small_seconds']:.1f} | {f['hits']} |")
    print("\n| program | compile s |\n|---|---|")
    for name, seconds in sorted(programs.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"| {name} | {seconds:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
