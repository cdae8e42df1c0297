"""A scripted engine for fast tests of the layers above the engines (token forcing, cost model, agent).

No model runs: the "target" is a fixed rule over the sequence so far, so decoding from any prefix of a
reference output continues it exactly (teacher forcing works as with a real target); acceptance lengths
follow a given cycle and stage times are given, so a cost model or a search reading them can be checked
for exact answers. `corrupt_every=k` makes it emit a wrong token at every k-th position — a cheat that
token forcing must flag.
"""

from __future__ import annotations

import itertools
from typing import Sequence

from specpilot.decoding.common import GenerateResult
from specpilot.decoding.sampling import Sampling


def next_token(seq: Sequence[int], vocab: int) -> int:
    return (31 * seq[-1] + 7 * len(seq) + 3) % vocab


class FakeEngine:
    def __init__(self, name: str = "fake", vocab: int = 97, acceptance: Sequence[int] = (1,),
                 stage_ms: dict | None = None, corrupt_every: int = 0):
        if not acceptance or min(acceptance) < 1:
            raise ValueError("acceptance: a non-empty cycle of tokens committed per round, each >= 1")
        self.name, self.vocab, self.acceptance = name, vocab, tuple(acceptance)
        self.stage_ms = dict(stage_ms or {"verify": 1.0})
        self.corrupt_every = corrupt_every
        self.sampling = Sampling()

    def _tokens(self, prompt: Sequence[int], n: int) -> list[int]:
        seq, out = list(prompt), []
        for _ in range(n):
            t = next_token(seq, self.vocab)
            if self.corrupt_every and (len(seq) + 1) % self.corrupt_every == 0:
                t = (t + 1) % self.vocab
            seq.append(t)
            out.append(t)
        return out

    def _rounds(self, n: int) -> list[int]:
        rounds, total = [], 1  # the prefill commits the first token
        for a in itertools.cycle(self.acceptance):
            if total >= n:
                return rounds
            rounds.append(a)
            total += a

    def generate(self, prompts, max_new_tokens: int, seed: int = 0, pad_to: int | None = None) -> GenerateResult:
        return GenerateResult(
            engine=self.name,
            tokens=[self._tokens(p, max_new_tokens) for p in prompts],
            acceptance_lengths=[self._rounds(max_new_tokens) for _ in prompts],
            stats={"tau": sum(self.acceptance) / len(self.acceptance)},
        )

    def profile(self, prompts, max_new_tokens: int, rounds: int = 8, seed: int = 0) -> dict:
        return {
            "engine": self.name,
            "batch": len(prompts),
            "rounds": rounds,
            "stage_ms": dict(self.stage_ms),
            "round_ms": sum(self.stage_ms.values()),
            "tokens_per_round": len(prompts) * sum(self.acceptance) / len(self.acceptance),
        }
