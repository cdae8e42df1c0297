"""The Gemini proposer: google-genai with structured JSON output, validated with pydantic.

The model is sent the gap report, the config space, the trial history, the matching memory records and
the reasons earlier proposals were rejected, and answers `{"candidates": [{"hypothesis", "changes"}]}`
under a response schema with one optional field per available knob. Within a round:

- a malformed answer (not JSON, wrong shape) is retried, the parse error quoted back to the model;
- HTTP 429 / 5xx and timeouts are retried with exponential backoff;
- other HTTP errors (a bad key, a bad request) end the attempts at once;
- when every attempt failed, the round uses the offline proposer instead (logged; the search goes on).

Proposals outside the config space are not Gemini's problem to fix within the round: the loop rejects
them with the reason, and the reason is in the next round's prompt. The API key is read from the
environment by the caller and held only by the client; it is never logged or written.
"""

from __future__ import annotations

import json
import logging
import random
import time
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from specpilot.agent.proposers import Proposal, ProposalBatch, ProposalContext

log = logging.getLogger("specpilot.search")


class _Candidate(BaseModel):
    model_config = ConfigDict(extra="ignore")
    hypothesis: str = Field(min_length=1)
    changes: dict[str, Any]


class _Answer(BaseModel):
    """The loose shape an answer must have; knob values are judged by the config space afterwards."""

    model_config = ConfigDict(extra="ignore")
    candidates: list[_Candidate] = Field(min_length=1)


_PY_TYPES = {"categorical": str, "int": int, "int_list": list[int]}


def response_schema(space) -> type[BaseModel]:
    """The schema Gemini answers under: one optional, typed field per available knob (ranges are checked
    by the space so that an out-of-range answer gets a reason rather than a parse failure)."""
    fields = {k.name: (Optional[_PY_TYPES[k.kind]], None) for k in space.knobs.values() if k.available}
    changes = create_model("Changes", **fields)
    candidate = create_model("Candidate", hypothesis=(str, ...), changes=(changes, ...))
    return create_model("Answer", candidates=(list[candidate], ...))


def parse_answer(text: str | None, k: int) -> list[Proposal]:
    """Proposals from the model's text; ValueError (one line) if the text is not a valid answer."""
    if not text:
        raise ValueError("empty answer")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    try:
        answer = _Answer.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        raise ValueError(f"JSON does not match the schema: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
    out = []
    for c in answer.candidates[:k]:
        delta = {name: value for name, value in c.changes.items() if value is not None}
        out.append(Proposal(delta, c.hypothesis.strip(), "gemini"))
    return out


def build_prompt(ctx: ProposalContext) -> str:
    inc = ctx.incumbent
    payload = {
        "deployment": ctx.deployment,
        "incumbent": {
            "config": inc["config"], "speedup_over_ar": inc.get("speedup"), "tau": inc.get("tau"),
            "ms_per_token": inc.get("ms_per_token"), "stage_ms_per_round": inc.get("stage_ms"),
        },
        "gap_report": ctx.gap_report,
        "config_space": ctx.space.describe(),
        "trial_history": ctx.history[-40:],
        "memory_records": [
            {"name": r.name, "mechanism": r.mechanism, "delta": r.delta, "config": r.config,
             "addresses": r.addresses, "relative_gain": r.gain.relative_gain,
             "speedup_over_ar": r.gain.speedup_over_ar, "deployment": r.deployment.get("name")}
            for r in ctx.memory[:10]
        ],
        "rejected_proposals": ctx.feedback[-20:],
    }
    return (
        "You tune a lossless speculative-decoding engine (a DFlash drafter with chain/tree verification) for "
        "one deployment. Goal: the largest speedup over autoregressive decoding. Every candidate is checked "
        "token by token against the stock engine's output (token forcing) and rejected if any committed token "
        "differs, so only exact mechanisms count.\n"
        f"Round {ctx.round}. Propose exactly {ctx.k} candidates. Each is a set of knob changes relative to the "
        "incumbent config (omit knobs you do not change) plus a one-sentence hypothesis naming the stage it "
        "speeds up and by how much (e.g. 'W12 weights: verify -20%'). Use only knobs and values from "
        "config_space (available ones, inside their ranges, respecting the constraints); do not repeat a "
        "configuration in trial_history; read rejected_proposals for why earlier answers were refused. "
        "Start from the largest gap in gap_report; prefer memory_records that address it.\n"
        "Answer with JSON only: {\"candidates\": [{\"hypothesis\": str, \"changes\": {knob: value}}]}.\n\n"
        + json.dumps(payload, indent=1, default=str)
    )


class GeminiProposer:
    name = "gemini"

    def __init__(self, settings, api_key: str, fallback=None, sleep=time.sleep):
        from google import genai
        from google.genai import types

        self.settings = settings
        self.fallback = fallback
        self.sleep = sleep
        self._types = types
        self._api_key = api_key  # an error message may echo it: `_clean` keeps it out of every log line
        http = types.HttpOptions(  # google-genai reads a timeout of 0 ms as none: at least 1 ms
            base_url=settings.base_url, timeout=max(1, round(settings.timeout_s * 1000)),
            retry_options=types.HttpRetryOptions(attempts=1),  # retries are ours, so each one is logged
        )
        self.client = genai.Client(api_key=api_key, http_options=http)

    def _clean(self, text: str) -> str:
        """`text` with this proposer's key and the environment's secrets redacted (it goes to logs and records)."""
        from specpilot.tracking import scrub

        return scrub(text, also=(self._api_key,))

    def _ask(self, prompt: str, schema) -> str | None:
        config = self._types.GenerateContentConfig(
            response_mime_type="application/json", response_schema=schema, temperature=0.7)
        response = self.client.models.generate_content(model=self.settings.model, contents=prompt, config=config)
        return response.text

    def propose(self, ctx: ProposalContext) -> ProposalBatch:
        from google.genai import errors

        prompt, schema, notes = build_prompt(ctx), response_schema(ctx.space), []
        attempts = self.settings.max_attempts
        for attempt in range(1, attempts + 1):
            retry_after = True
            try:
                text = self._ask(prompt, schema)
                proposals = parse_answer(text, ctx.k)
                return ProposalBatch(proposals, notes)
            except ValueError as e:  # malformed answer: ask again, saying what was wrong
                reason = f"malformed answer: {e}"
                prompt = (build_prompt(ctx) + f"\n\nYour previous answer was rejected ({e}). Answer again with "
                          "JSON matching the schema exactly.")
                retry_after = False
            except errors.APIError as e:
                code = getattr(e, "code", None)
                reason = f"HTTP {code}: {self._clean(' '.join(str(getattr(e, 'message', '') or '').split()))[:120]}"
                if not (code == 429 or (isinstance(code, int) and code >= 500)):
                    notes.append(f"gemini attempt {attempt}/{attempts}: {reason} (not retried)")
                    log.warning("gemini: %s; not retried", reason)
                    break
            except Exception as e:  # timeouts and connection errors from the HTTP client
                reason = f"{type(e).__name__}: {self._clean(' '.join(str(e).split()))[:120]}"  # scrubbed, then cut
            notes.append(f"gemini attempt {attempt}/{attempts}: {reason}")
            log.warning("gemini attempt %d/%d: %s", attempt, attempts, reason)
            if attempt < attempts and retry_after:
                delay = self.settings.backoff_s * 2 ** (attempt - 1)
                self.sleep(delay * (1 + 0.25 * random.random()))
        msg = "gemini gave no usable answer this round; using the offline proposer"
        log.warning(msg)
        notes.append(msg)
        if self.fallback is None:
            return ProposalBatch([], notes)
        batch = self.fallback.propose(ctx)
        return ProposalBatch(batch.proposals, notes + batch.notes)
