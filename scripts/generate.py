"""Generate from one prompt (or a batch) with one engine; the result is the last stdout line, as JSON.

    python scripts/generate.py                                   # proxy_tiny pair (trained on first use), AR, CPU
    python scripts/generate.py deployment.models=config          # tiny random Qwen3 instead
    python scripts/generate.py engine=ddtree engine.tree_budget=32 prompt_ids=[1,2,3]
    python scripts/generate.py target.path=DIR drafter.path=DIR engine=stock prompt="Hello"

A human summary goes to stderr. A bad config, checkpoint or prompt is one line on stderr and exit code 2.
"""

from __future__ import annotations

import json
import logging
import sys
import time

import hydra
from omegaconf import DictConfig

from specpilot.cli import guarded, run_cli


def _summary(prompts, result, tokenizer, load_s: float, gen_s: float) -> str:
    out = result.to_json()
    lines = [
        f"engine {result.engine}: {len(prompts)} prompt(s), {sum(len(t) for t in result.tokens)} new tokens, "
        f"{result.steps} steps, {result.tokens_per_step:.2f} tokens/step",
        f"load {load_s:.1f} s, generate {gen_s:.1f} s (incl. compile)",
    ]
    if tokenizer is not None:
        for i, toks in enumerate(result.tokens):
            lines.append(f"[{i}] {tokenizer.decode(toks)!r}")
    elif len(result.tokens) == 1:
        lines.append(f"tokens: {out['tokens']}")
    return "\n".join(lines)


def run(hydra_cfg: DictConfig) -> None:
    from specpilot.config import validate

    for noisy in ("jax", "absl"):  # Hydra sets the root logger to INFO; theirs is noise here
        logging.getLogger(noisy).setLevel(logging.WARNING)

    cfg = validate(hydra_cfg)  # before any heavy import: a typo costs no JAX start-up
    from specpilot.build import build_engine, check_prompt_source, load_models, make_prompts

    check_prompt_source(cfg)
    t0 = time.perf_counter()
    target_cfg, target_w, drafter_cfg, drafter_w, tokenizer = load_models(cfg)
    prompts = make_prompts(cfg, tokenizer)
    engine = build_engine(cfg, target_cfg, target_w, drafter_cfg, drafter_w)
    t1 = time.perf_counter()
    result = engine.generate(prompts, cfg.max_new_tokens, cfg.seed)
    t2 = time.perf_counter()
    print(_summary(prompts, result, tokenizer, t1 - t0, t2 - t1), file=sys.stderr, flush=True)
    print(json.dumps(result.to_json()), flush=True)


@hydra.main(config_path="../conf", config_name="config", version_base=None)
def main(hydra_cfg: DictConfig) -> None:
    guarded(run, hydra_cfg)


if __name__ == "__main__":
    run_cli(main)
