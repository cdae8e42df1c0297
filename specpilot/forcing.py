"""Token forcing: the gate every candidate passes before its speed counts.

The reference engine (stock or AR) runs once; its tokens are the truth. The candidate is then driven
along the reference's own path: it decodes from the prompt plus the reference prefix, every token it
would commit is compared with the reference's, and at the first disagreement the position is judged
and the candidate restarts from the reference prefix one token further (so one early error cannot hide
or cascade into later ones). A disagreement where the exact target's top-2 logit margin is below
`tie_tolerance` is a numeric tie (two tokens the target itself barely separates; reported with its
margin); any other disagreement is a violation. Greedy decoding only: that is where "the same output"
is a per-token statement.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specpilot.decoding.common import new_cache, pad_prompts, pow2_at_least
from specpilot.models.target import forward


@dataclasses.dataclass
class ForcingReport:
    candidate: str
    reference: str
    tie_tolerance: float
    positions_checked: int = 0
    violations: list[dict] = dataclasses.field(default_factory=list)
    ties: list[dict] = dataclasses.field(default_factory=list)
    per_prompt: list[dict] = dataclasses.field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.violations and all(p["unchecked"] == 0 for p in self.per_prompt)

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "passed": self.passed}


@functools.partial(jax.jit, static_argnums=(1,))
def _top2_margins(weights, cfg, tokens, lens):
    b, t = tokens.shape
    cache = new_cache(cfg, b, t, weights.embed.dtype)
    logits = forward(weights, cfg, tokens, jnp.broadcast_to(jnp.arange(t), (b, t)), cache).logits
    last = jnp.take_along_axis(logits, (lens - 1)[:, None, None], axis=1)[:, 0]
    top2 = jax.lax.top_k(last, 2)[0]
    return top2[:, 0] - top2[:, 1]


def top2_margins(weights, cfg, sequences: Sequence[Sequence[int]]) -> np.ndarray:
    """The exact target's top-1 minus top-2 logit for the next token after each sequence: one jitted forward, its
    rows and length padded up to powers of two (repeats of the first sequence; right padding, which a causal forward
    read at each row's last token ignores), so the disagreements of a whole forcing run compile a few programs
    rather than every op at every new length."""
    n, longest = len(sequences), max(map(len, sequences))
    rows = list(sequences) + [sequences[0]] * (pow2_at_least(n) - n)
    # no padded position past the model's (a longer sequence keeps its own length)
    length = max(longest, min(max(8, pow2_at_least(longest)), cfg.max_position_embeddings))
    tokens, lens = pad_prompts(rows, length)
    return np.asarray(_top2_margins(weights, cfg, tokens, lens))[:n]


def target_margin_fn(weights, cfg):
    """`margin_fn` for `force`: the exact target's top-2 logit margins."""
    return lambda sequences: top2_margins(weights, cfg, sequences)


def force(
    candidate,
    reference_tokens: Sequence[Sequence[int]],
    prompts: Sequence[Sequence[int]],
    margin_fn,
    reference_name: str = "stock",
    tie_tolerance: float = 1e-3,
    max_restarts: int = 4,
    max_new_tokens: int | None = None,
) -> ForcingReport:
    """Check `candidate` (an Engine, greedy) against `reference_tokens` position by position.

    margin_fn(sequences) -> the exact target's top-1 − top-2 logit after each sequence (used only at
    disagreements; `target_margin_fn(weights, cfg)` for a real target).

    `max_new_tokens` is what the reference was asked for (default: its longest output), and what the candidate is
    asked for on every pass. A reference shorter than that stopped at an EOS, and a candidate that commits anything
    after it is a violation (it went on decoding where the target stops), whatever the logits say.

    Each prompt restarts at most `max_restarts` times; positions after that stay unchecked and the
    report does not pass. The candidate must have room for prompt + 2 × max_new tokens (it always
    decodes max_new tokens so one compiled program serves every restart).
    """
    if not candidate.sampling.greedy:
        raise ValueError("token forcing compares greedy outputs: set sampling.temperature=0")
    report = ForcingReport(candidate=candidate.name, reference=reference_name, tie_tolerance=tie_tolerance)
    max_new = max_new_tokens or max(len(r) for r in reference_tokens)
    stopped = [len(r) < max_new for r in reference_tokens]  # at an EOS
    pad_to = max(len(p) for p in prompts) + max_new
    prefix = [0] * len(prompts)
    restarts = [0] * len(prompts)
    checked = [0] * len(prompts)
    pending = [i for i in range(len(prompts)) if reference_tokens[i]]
    while pending:
        seqs = [list(prompts[i]) + list(reference_tokens[i][: prefix[i]]) for i in pending]
        # same batch shape on every pass (padded with a repeat), so one compiled program serves all
        filler = [seqs[0]] * (len(prompts) - len(seqs))
        got = candidate.generate(seqs + filler, max_new, pad_to=pad_to).tokens[: len(seqs)]
        judge = []
        for i, out in zip(pending, got):
            expected = list(reference_tokens[i][prefix[i] :])
            n = min(len(expected), len(out))
            diff = next((j for j in range(n) if out[j] != expected[j]), None)
            if diff is None and len(out) < len(expected):
                diff = len(out)  # stopped early (e.g. an EOS the reference did not emit)
            if diff is None:
                checked[i] += len(expected)
                prefix[i] = len(reference_tokens[i])
                if stopped[i] and len(out) > len(expected):
                    report.violations.append({"prompt": i, "position": prefix[i], "expected": None,
                                              "got": out[len(expected)], "margin": None})
                continue
            checked[i] += diff + 1
            judge.append((i, prefix[i] + diff, expected[diff], out[diff] if diff < len(out) else None))
        if judge:
            margins = margin_fn([list(prompts[i]) + list(reference_tokens[i][:pos]) for i, pos, _, _ in judge])
            for (i, pos, exp, got_tok), margin in zip(judge, margins):
                entry = {"prompt": i, "position": pos, "expected": exp, "got": got_tok, "margin": float(margin)}
                (report.ties if margin < tie_tolerance else report.violations).append(entry)
                prefix[i] = pos + 1
                restarts[i] += 1
        pending = [i for i in pending if prefix[i] < len(reference_tokens[i]) and restarts[i] <= max_restarts]
    for i in range(len(prompts)):
        report.per_prompt.append(
            {
                "prompt": i,
                "checked": checked[i],
                "unchecked": len(reference_tokens[i]) - prefix[i],
                "violations": sum(v["prompt"] == i for v in report.violations),
                "ties": sum(t["prompt"] == i for t in report.ties),
            }
        )
    report.positions_checked = sum(checked)
    return report
