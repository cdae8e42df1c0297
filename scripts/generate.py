"""Generate from one prompt (or a batch) with one engine; the result is the last stdout line, as JSON.

    python scripts/generate.py                                   # tiny random Qwen3, AR, on CPU
    python scripts/generate.py engine=ddtree engine.tree_budget=32 prompt_ids=[1,2,3]
    python scripts/generate.py target.path=DIR drafter.path=DIR engine=stock prompt="Hello"

A human summary goes to stderr. A bad config, checkpoint or prompt is one line on stderr and exit code 2.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

import hydra
from omegaconf import DictConfig

# Hydra prints its own errors (a bad override, a missing group option) over several lines and exits 1;
# with HYDRA_FULL_ERROR it raises them instead, and `_cli` turns them into one line and exit 2. A user who
# set HYDRA_FULL_ERROR themselves gets Hydra's traceback as asked.
_USER_FULL_ERROR = "HYDRA_FULL_ERROR" in os.environ
os.environ.setdefault("HYDRA_FULL_ERROR", "1")

EXIT_USER_ERROR = 2


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).strip().splitlines() if part.strip())


def _fail(message: str) -> None:
    print(_one_line(message), file=sys.stderr, flush=True)
    sys.exit(EXIT_USER_ERROR)


def _user_error(e: Exception) -> str | None:
    """The one-line message for an error the user can fix, else None (a bug: keep the traceback)."""
    from specpilot.config import ConfigError
    from specpilot.models.config import CheckpointError

    if isinstance(e, ConfigError):
        return str(e)
    if isinstance(e, CheckpointError):
        return f"checkpoint error: {e}"
    common = sys.modules.get("specpilot.decoding.common")  # loaded by then if a PromptError can exist
    if common is not None and isinstance(e, common.PromptError):
        return f"prompt error: {e}"
    return None


def _hydra_error(e: Exception) -> str:
    from hydra.errors import MissingConfigException, OverrideParseException

    from specpilot.config import is_known_key

    if isinstance(e, MissingConfigException) and e.missing_cfg_file and e.options:
        group, _, option = e.missing_cfg_file.rpartition("/")
        return f"config error: {group or option}: no option {option!r} (available: {', '.join(e.options)})"
    if isinstance(e, OverrideParseException):
        return f"config error: cannot parse override {e.override!r}: {_one_line(e.message)}"
    key = getattr(e.__cause__, "full_key", None)
    if key and "not in struct" in str(e.__cause__):
        if is_known_key(key):
            return f"config error: {key}: not set in conf/; add it with +{key}=VALUE"
        return f"config error: {key}: unknown key"
    return f"config error: {_one_line(e)}"


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
    try:
        run(hydra_cfg)
    except Exception as e:
        message = _user_error(e)
        if message is None:
            raise
        _fail(message)


def _cli() -> None:
    from hydra.errors import HydraException

    try:
        main()
    except HydraException as e:
        if _USER_FULL_ERROR:
            raise
        _fail(_hydra_error(e))


if __name__ == "__main__":
    _cli()
