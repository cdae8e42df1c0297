"""Token forcing: is `engine` lossless against the reference engine on these prompts?

    python scripts/force.py engine=ddtree engine.tree_budget=32 prompt_ids=[[1,2,3],[4,5]] max_new_tokens=64
    python scripts/force.py target.path=DIR drafter.path=DIR engine=tlv forcing.reference=ar

Runs the reference (`forcing.reference`: stock or ar) once, then drives the candidate along the
reference's tokens and compares every token it would commit (specpilot/forcing.py). The JSON report is
the last stdout line; the exit code is 1 on any violation (or unchecked positions), 0 if it passed.
"""

from __future__ import annotations

import json
import logging
import sys

import hydra
from omegaconf import DictConfig

from specpilot.cli import guarded, run_cli


def run(hydra_cfg: DictConfig) -> None:
    from specpilot.config import ConfigError, validate

    for noisy in ("jax", "absl"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    cfg = validate(hydra_cfg)
    if cfg.sampling.temperature != 0:
        raise ConfigError.at("sampling.temperature", "token forcing compares greedy outputs; set it to 0")
    from specpilot.build import check_prompt_source, load_models, make_prompts, sampling_of
    from specpilot.decoding import make_engine
    from specpilot.forcing import force, target_margin_fn

    check_prompt_source(cfg)
    with_drafter = cfg.forcing.reference == "stock" or cfg.engine.name != "ar"
    target_cfg, target_w, drafter_cfg, drafter_w, tokenizer = load_models(cfg, with_drafter)
    prompts = make_prompts(cfg, tokenizer)
    # the candidate decodes prompt + reference prefix + max_new tokens, plus one round's scratch
    context = cfg.context or max(len(p) for p in prompts) + 2 * cfg.max_new_tokens + 2048
    engines = {}
    for role, engine_cfg in (("reference", {"name": cfg.forcing.reference}), ("candidate", cfg.engine.model_dump())):
        engines[role] = make_engine(engine_cfg, target_cfg, target_w, drafter_cfg, drafter_w, sampling_of(cfg), context)
    ref_tokens = engines["reference"].generate(prompts, cfg.max_new_tokens, cfg.seed).tokens
    candidate = engines["candidate"]
    report = force(candidate, ref_tokens, prompts, target_margin_fn(target_w, target_cfg), cfg.forcing.reference,
                   cfg.forcing.tie_tolerance, cfg.forcing.max_restarts, cfg.max_new_tokens)
    out = report.to_json()
    print(f"{candidate.name} vs {cfg.forcing.reference}: {out['positions_checked']} positions, "
          f"{len(report.violations)} violations, {len(report.ties)} ties -> {'PASS' if report.passed else 'FAIL'}",
          file=sys.stderr)
    print(json.dumps(out), flush=True)
    if not report.passed:
        sys.exit(1)


@hydra.main(config_path="../conf", config_name="config", version_base=None)
def main(hydra_cfg: DictConfig) -> None:
    guarded(run, hydra_cfg)


if __name__ == "__main__":
    run_cli(main)
