"""Proposers: given what the search knows, return K candidate deltas, each with a hypothesis.

Every proposer gets the same `ProposalContext` — the gap report of the incumbent, the config space, the
trial history, the matching memory records and the reasons earlier proposals were rejected — and
returns a `ProposalBatch`. The loop checks each delta against the space (a proposer is never trusted to
stay inside it) and feeds the reasons for rejected ones back next round.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from specpilot.agent.space import ConfigSpace


@dataclasses.dataclass
class Proposal:
    delta: dict
    hypothesis: str
    source: str  # "offline:<why>", "memory:<record name>", "gemini"

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class ProposalBatch:
    proposals: list[Proposal]
    notes: list[str] = dataclasses.field(default_factory=list)  # retries, fallbacks: logged and summarised


@dataclasses.dataclass
class ProposalContext:
    round: int
    k: int
    deployment: dict
    space: ConfigSpace
    incumbent: dict  # the incumbent trial: config, speedup, tau, ms_per_token, stage_ms
    gap_report: dict
    history: list[dict]  # finished trials (compact form)
    tried: set[str]  # config keys already measured or rejected
    memory: list[Any]  # matching MemoryRecords, best first
    feedback: list[dict]  # {"round", "delta", "reason"} of rejected proposals
    measured: dict[str, float] = dataclasses.field(default_factory=dict)  # config key -> speedup (baselines too)


API_KEY_ENV = ("GEMINI_API_KEY", "GOOGLE_API_KEY")


def gemini_api_key() -> str | None:
    for name in API_KEY_ENV:
        if os.environ.get(name):
            return os.environ[name]
    return None


def make_proposer(name: str, gemini_settings=None):
    from specpilot.agent.proposers.offline import OfflineProposer

    if name == "offline":
        return OfflineProposer()
    if name == "gemini":
        from specpilot.agent.proposers.gemini import GeminiProposer

        key = gemini_api_key()
        if not key:
            raise MissingKeyError()
        return GeminiProposer(gemini_settings, key, fallback=OfflineProposer())
    raise ValueError(f"unknown proposer {name!r}")


class MissingKeyError(RuntimeError):
    def __init__(self):
        super().__init__("deployment.proposer=gemini needs GEMINI_API_KEY or GOOGLE_API_KEY in the environment "
                         "(or use deployment.proposer=offline)")
