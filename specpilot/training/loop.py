"""One resumable optimisation loop, shared by target and drafter training.

- AdamW (`scale_by_adam` + decoupled weight decay on matrices only) after global-norm clipping; the learning
  rate (linear warmup, then cosine decay to `lr * final_lr_fraction`) is computed on the host and passed to
  the jitted step, so the schedule's length can be fitted to a time budget after warm-up.
- Master weights are float32; the loss function casts them to the compute dtype.
- Batches are a pure function of the step index, and orbax checkpoints (params + optimizer state) are
  written every `checkpoint_every` steps: a run killed at any point and started again in the same folder
  resumes from its last checkpoint and produces the same weights as a run that was never interrupted.
- Frozen inputs (the target, for the drafter) are jit arguments, never constants baked into the program.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specpilot.training.spec import TrainSpec

log = logging.getLogger(__name__)


class Interrupted(RuntimeError):
    """Raised by `train_loop(stop_after=n)`: simulates a run killed after n steps (tests)."""


def lr_at(step: int, total: int, ts: TrainSpec) -> float:
    """Learning rate for update number `step` (0-based) of a `total`-step run."""
    if ts.warmup_steps and step < ts.warmup_steps:
        return ts.lr * (step + 1) / ts.warmup_steps
    span = max(total - ts.warmup_steps, 1)
    progress = min(max(step - ts.warmup_steps, 0) / span, 1.0)
    floor = ts.lr * ts.final_lr_fraction
    return floor + (ts.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(ts: TrainSpec) -> optax.GradientTransformation:
    """AdamW without the learning rate (applied by the step): decay on matrices, not on norms."""
    return optax.chain(
        optax.clip_by_global_norm(ts.grad_clip),
        optax.scale_by_adam(b1=0.9, b2=0.95, eps=1e-8),
        optax.add_decayed_weights(ts.weight_decay, mask=lambda p: jax.tree.map(lambda a: a.ndim >= 2, p)),
    )


@functools.lru_cache(maxsize=16)
def compiled_step(loss_fn: Callable, ts: TrainSpec):
    """The jitted update for a loss and a recipe, cached so repeated runs in one process compile once."""
    tx = make_optimizer(ts)

    def step_fn(params, opt_state, frozen, batch, lr):
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, frozen, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = jax.tree.map(lambda p, u: p - lr * u.astype(p.dtype), params, updates)
        return params, opt_state, {**metrics, "loss": loss, "grad_norm": optax.tree.norm(grads)}

    return tx, jax.jit(step_fn, donate_argnums=(0, 1))


def _progress(total: int, initial: int, desc: str):
    try:
        from tqdm import tqdm

        return tqdm(total=total, initial=initial, desc=desc, file=sys.stderr, disable=None, dynamic_ncols=True)
    except ImportError:
        return None


def train_loop(
    *,
    name: str,
    params: Any,
    loss_fn: Callable,  # (params, frozen, batch) -> (loss, metrics dict of scalars)
    batch_fn: Callable[[int], Any],  # step -> batch (numpy pytree)
    ts: TrainSpec,
    run_dir: str | Path,
    frozen: Any = None,
    tracker=None,
    stop_after: int | None = None,
) -> tuple[Any, dict]:
    """Train `params` for the planned number of steps; returns (params, summary of the run)."""
    import orbax.checkpoint as ocp

    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    tx, step = compiled_step(loss_fn, ts)
    opt_state = tx.init(params)
    mgr = ocp.CheckpointManager(run_dir / "ckpt", options=ocp.CheckpointManagerOptions(max_to_keep=2, create=True))
    plan_file = run_dir / "plan.json"
    plan = json.loads(plan_file.read_text()) if plan_file.is_file() else {"total_steps": ts.steps, "fitted": False}

    start = mgr.latest_step() or 0
    if start:
        restored = mgr.restore(start, args=ocp.args.StandardRestore({"params": params, "opt_state": opt_state}))
        params, opt_state = restored["params"], restored["opt_state"]
        log.info("%s: resumed from the checkpoint at step %d of %d", name, start, plan["total_steps"])

    bar = _progress(plan["total_steps"], start, name)
    history: list[dict] = []
    pending: list[dict] = []
    t_first = t_last_log = None
    calib_steps = 5  # timed steps after the first (compiling) one, before fitting to a time budget
    done = start
    try:
        while done < plan["total_steps"]:
            lr = lr_at(done, plan["total_steps"], ts)
            params, opt_state, metrics = step(params, opt_state, frozen, batch_fn(done), jnp.float32(lr))
            pending.append(metrics)
            done += 1
            if t_first is None:
                jax.block_until_ready(metrics["loss"])
                t_first = t_last_log = time.perf_counter()
                first_done = done
            elif ts.time_budget_s and not plan["fitted"] and done - first_done == calib_steps:
                jax.block_until_ready(metrics["loss"])
                per_step = (time.perf_counter() - t_first) / calib_steps
                fit = done + int((ts.time_budget_s - calib_steps * per_step) / per_step)
                plan = {"total_steps": int(min(max(fit, done + 1, ts.warmup_steps + 1), ts.steps)), "fitted": True,
                        "seconds_per_step": per_step}
                plan_file.write_text(json.dumps(plan))
                log.info("%s: %.3f s/step: %d steps fit the %.0f s budget", name, per_step, plan["total_steps"],
                         ts.time_budget_s)
                if bar is not None:
                    bar.total = plan["total_steps"]
            if bar is not None:
                bar.update(1)
            if done % ts.log_every == 0 or done == plan["total_steps"]:
                host = jax.device_get(pending)
                pending = []
                now = time.perf_counter()
                row = {k: float(np.mean([m[k] for m in host])) for k in host[0]}
                row.update(step=done, lr=lr, steps_per_s=len(host) / max(now - t_last_log, 1e-9))
                t_last_log = now
                history.append(row)
                if tracker is not None:
                    # one W&B run holds both phases: their own step counter is a metric, W&B's step increases
                    tracker.log({f"{name}/{k}": v for k, v in row.items()})
                if bar is not None:
                    bar.set_postfix(loss=f"{row['loss']:.3f}")
                log.info("%s step %d/%d loss %.4f lr %.2e %.1f steps/s", name, done, plan["total_steps"],
                         row["loss"], lr, row["steps_per_s"])
            if done % ts.checkpoint_every == 0 or done == plan["total_steps"]:
                if not plan_file.is_file():
                    plan_file.write_text(json.dumps(plan))
                mgr.save(done, args=ocp.args.StandardSave({"params": params, "opt_state": opt_state}))
            if stop_after is not None and done - start >= stop_after:
                mgr.wait_until_finished()
                raise Interrupted(f"{name}: stopped after {done} steps")
    finally:
        mgr.wait_until_finished()
        if bar is not None:
            bar.close()
    summary = {
        "steps": done,
        "resumed_from": start,
        "final_train_loss": history[-1]["loss"] if history else None,
        "seconds_per_step": (time.perf_counter() - t_first) / max(done - first_done, 1) if t_first else None,
        "history": history,
    }
    return params, summary
