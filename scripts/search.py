"""The deployment search: find the fastest lossless engine config for one deployment (docs/search.md).

    python scripts/search.py                                   # deployment=cpu: offline proposer, on CPU
    python scripts/search.py deployment=h200 model=qwen3_8b deployment.models=config   # needs GEMINI_API_KEY
    python scripts/search.py +deployment=h100 deployment.proposer=offline              # `+` is accepted too
    python scripts/search.py search.resume=outputs/DATE/TIME   # continue a killed search from its trial log

Baseline (AR, stock) → rounds of gap report → K proposals → token forcing against stock → measurement →
integration, until `search.rounds` or a round gaining less than `search.min_gain`. Every finished trial
is in RUN_DIR/trials.jsonl at once; RUN_DIR/summary.json and RUN_DIR/engine/best.yaml are written at the
end. Progress goes to stderr; the last stdout line is one JSON object whose `summary` is the path of
summary.json. A bad config (or a missing Gemini key with deployment.proposer=gemini) is one line on
stderr and exit code 2, before anything is loaded.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from specpilot.cli import fail, guarded, run_cli


def _run_dir(cfg) -> Path:
    from hydra.core.hydra_config import HydraConfig

    from specpilot.config import ConfigError

    if cfg.search.resume:
        path = Path(cfg.search.resume)
        if not (path / "trials.jsonl").is_file():
            raise ConfigError.at("search.resume", f"no trials.jsonl in {path}")
        return path
    return Path(HydraConfig.get().runtime.output_dir)


def _enable_compile_cache(path: str | None) -> None:
    """XLA's persistent compilation cache: a rerun (or a repeated config) skips compiling. Set through the
    environment so that worker processes inherit it; numerics and timed (warm) runs are unchanged."""
    if not path:
        return
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path(path).expanduser()))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    if "jax" in sys.modules:  # imported already: the environment is read at import, so set it directly too
        import jax

        jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
        jax.config.update("jax_persistent_cache_min_compile_time_secs",
                          float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))


def _identity(cfg) -> dict:
    """The config a resumed search must share with its log."""
    return {
        "deployment": cfg.deployment.model_dump(),
        "model": cfg.model.model_dump(),
        "drafter": cfg.drafter.model_dump(),
        "target": cfg.target.model_dump(exclude={"cache_dir"}),
        "sampling": cfg.sampling.model_dump(),
        "kernels": cfg.kernels.model_dump(),  # which kernels the trials ran on: part of what they measured
        "seed": cfg.seed,
    }


def _seconds(value) -> str:
    return "?" if value is None else f"{value:.1f} s"  # a log written before elapsed_s existed


def _human(summary: dict) -> str:
    rej = summary["rejected_by_token_forcing"]
    lines = [
        f"search finished: {summary['rounds']} round(s), stopped by {summary['stopped']}; {summary['num_trials']} "
        f"trials, {len(rej)} rejected by token forcing, {len(summary['rejected_by_space'])} proposals outside the "
        f"config space, {len(summary['errors'])} errors",
        f"  AR {summary['ar']['ms_per_token']:.3f} ms/token | stock {summary['stock_speedup']:.2f}x AR "
        f"(tau {summary['stock_tau']:.2f}) | best {summary['best_speedup']:.2f}x AR (tau {summary['best_tau']:.2f}, "
        f"{summary['best_speedup'] / summary['stock_speedup']:.2f}x stock)",
        f"  best first found by trial {summary['best_found_trial']} (trial {summary['best_found_at_trial']} of "
        f"{summary['num_trials']}, {_seconds(summary['best_found_after_s'])} into a {_seconds(summary['elapsed_s'])} "
        "search)",
        f"  best config: {summary['best_config_yaml']}",
        f"    use it: python scripts/generate.py --config-dir {Path(summary['best_config_yaml']).parent.parent} "
        "engine=best",
        f"  summary: {summary['summary_path']}",
    ]
    for r in rej:
        lines.append(f"  reward hacking rejected: {r['trial']} ({r['source']}): {r['forcing']['num_violations']} "
                     f"token-forcing violations")
    return "\n".join(lines)


def run(hydra_cfg: DictConfig) -> None:
    from specpilot.config import ConfigError, validate

    for noisy in ("jax", "absl", "httpx", "google_genai", "wandb"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    cfg = validate(hydra_cfg)
    from specpilot.agent.proposers import MissingKeyError, make_proposer

    try:  # a missing key is a start-up error, not a mid-run surprise
        proposer = make_proposer(cfg.deployment.proposer, cfg.search.gemini)
    except MissingKeyError as e:
        raise ConfigError.at("deployment.proposer", str(e).removeprefix("deployment.proposer=")) from None
    run_dir = _run_dir(cfg)
    _enable_compile_cache(cfg.search.compile_cache_dir)

    from specpilot.agent.backend import ModelBackend
    from specpilot.agent.loop import ResumeError, Search, SearchError, SearchSettings
    from specpilot.agent.memory import MemoryStore
    from specpilot.agent.proposers.offline import OfflineProposer
    from specpilot.agent.runner import InProcessRunner, PoolRunner, worker_count
    from specpilot.tracking import Tracker, scrub

    settings = SearchSettings.from_config(cfg)
    memory = MemoryStore(cfg.search.memory_dir)
    if cfg.search.write_memory:
        try:  # a search writes its records after its last round: a folder it cannot write fails now
            memory.check_writable()
        except OSError as e:
            raise ConfigError.at("search.memory_dir", f"cannot write records under {memory.root}: "
                                 f"{e.strerror or e}") from None
    run_id = re.sub(r"[^A-Za-z0-9_-]+", "-", f"{cfg.deployment.name}-{run_dir.parent.name}-{run_dir.name}")[:60]
    search = Search(None, proposer, run_dir, settings, memory=memory,
                    identity=_identity(cfg), run_id=run_id, offline_fallback=OfflineProposer())
    try:
        run_id = search.open()
    except ResumeError as e:
        raise ConfigError(f"config error: {e}") from None
    n_workers = worker_count(cfg.search.workers)
    runner = PoolRunner(("model", cfg.model_dump()), n_workers) if n_workers else InProcessRunner(ModelBackend(cfg))
    search.runner = runner
    search.tracker = Tracker(cfg.search.wandb.mode, cfg.search.wandb.project, run_dir, run_id,
                             scrub(cfg.model_dump(mode="json")), entity=cfg.search.wandb.entity)
    try:
        summary = search.run()
    except SearchError as e:
        fail(f"search error: {e}")
    except ResumeError as e:
        raise ConfigError(f"config error: {e}") from None
    finally:
        runner.close()
        search.tracker.finish()
    print(_human(summary), file=sys.stderr, flush=True)
    last = {
        "summary": summary["summary_path"],
        "best_config": summary["best_config"],
        "best_speedup": summary["best_speedup"],
        "best_tau": summary["best_tau"],
        "stock_speedup": summary["stock_speedup"],
        "rounds": summary["rounds"],
        "trials": summary["num_trials"],
        "best_found_at_trial": summary["best_found_at_trial"],
        "best_found_after_s": summary["best_found_after_s"],
        "elapsed_s": summary["elapsed_s"],
        "rejected_by_token_forcing": [r["trial"] for r in summary["rejected_by_token_forcing"]],
    }
    print(json.dumps(last), flush=True)


@hydra.main(config_path="../conf", config_name="config", version_base=None)
def main(hydra_cfg: DictConfig) -> None:
    guarded(run, hydra_cfg)


if __name__ == "__main__":
    # `deployment` has a default (cpu), so Hydra's `+deployment=X` ("add a group") would be an error;
    # the search treats it as the override `deployment=X` that it means.
    sys.argv = [a[1:] if a.startswith("+deployment=") else a for a in sys.argv]
    run_cli(main)
