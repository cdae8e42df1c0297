"""A stand-in for scripts/search.py on the scripted FakeBackend, for tests of scripts/memory_transfer.py.

Takes the same `key=value` overrides the transfer script passes (others are ignored): hydra.run.dir,
search.memory_dir, search.rounds, search.candidates_per_round, search.min_gain, search.min_rounds,
search.max_seconds, deployment.name,
deployment.batch, deployment.temperature, `fake.delay_s` (seconds slept per trial) and `fake.config_error` (exit 2
with that one-line config error, as the real script refuses a bad override). Prints the search's
last-line JSON like the real script.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot.agent.backend import FakeBackend  # noqa: E402
from specpilot.agent.loop import Search, SearchSettings  # noqa: E402
from specpilot.agent.memory import MemoryStore  # noqa: E402
from specpilot.agent.proposers.offline import OfflineProposer  # noqa: E402
from specpilot.agent.runner import InProcessRunner  # noqa: E402


def main(argv: list[str]) -> None:
    kv = dict(a.lstrip("+").split("=", 1) for a in argv if "=" in a)
    if "fake.config_error" in kv:  # as the real script refuses a bad override: one line, exit 2
        print(f"config error: {kv['fake.config_error']}", file=sys.stderr)
        sys.exit(2)
    backend = FakeBackend(name=kv.get("deployment.name", "fake"), batch=int(kv.get("deployment.batch", 1)),
                          num_prompts=4, temperature=float(kv.get("deployment.temperature", 0.0)),
                          delay_s=float(kv.get("fake.delay_s", 0.01)))
    max_s = kv.get("search.max_seconds")
    settings = SearchSettings(rounds=int(kv.get("search.rounds", 4)),
                              candidates_per_round=int(kv.get("search.candidates_per_round", 1)),
                              min_gain=float(kv.get("search.min_gain", 0.01)),
                              min_rounds=int(kv.get("search.min_rounds", 1)),
                              max_seconds=None if max_s in (None, "null") else float(max_s))
    s = Search(InProcessRunner(backend), OfflineProposer(), kv["hydra.run.dir"], settings,
               memory=MemoryStore(kv["search.memory_dir"])).run()
    print(f"fake search: best {s['best_speedup']:.3f}x AR", file=sys.stderr)
    print(json.dumps({"summary": s["summary_path"], "best_speedup": s["best_speedup"],
                      "best_found_at_trial": s["best_found_at_trial"]}))


if __name__ == "__main__":
    main(sys.argv[1:])
