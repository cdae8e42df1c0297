"""Train the proxy target: a Qwen3-architecture model, next-token cross-entropy on the corpus token stream.

The model is the project's own `specpilot.models.target.forward`, run over a whole training window with an
empty KV cache whose capacity is the window length (so the cache is just causal attention's K/V buffer):
no second copy of the model math exists for training.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specpilot.models.config import ModelConfig, RopeConfig
from specpilot.models.kv_cache import init_cache
from specpilot.models.target import StepOutput, forward
from specpilot.models.weights import TargetWeights, cast_floats, init_random_target
from specpilot.training.loop import train_loop
from specpilot.training.spec import ProxySpec
from specpilot.training.tokenizer import EOS_ID

log = logging.getLogger(__name__)

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def target_config(spec: ProxySpec) -> ModelConfig:
    t = spec.target
    return ModelConfig(
        family="qwen3",
        vocab_size=spec.tokenizer.vocab_size,
        hidden_size=t.hidden_size,
        intermediate_size=t.intermediate_size,
        num_layers=t.num_layers,
        num_heads=t.num_heads,
        num_kv_heads=t.num_kv_heads,
        head_dim=t.head_dim,
        rms_norm_eps=1e-6,
        rope=RopeConfig(theta=t.rope_theta),
        tie_word_embeddings=False,
        max_position_embeddings=t.max_position_embeddings,
        eos_token_ids=(EOS_ID,),
    )


def unit_norms(tree):
    """Training starts from unit RMSNorm gains (`init_random_*` jitters them for parity tests)."""

    def fix(layer):
        out = dataclasses.replace(layer, attn_norm=jnp.ones_like(layer.attn_norm), mlp_norm=jnp.ones_like(layer.mlp_norm))
        if layer.q_norm is not None:
            out = dataclasses.replace(out, q_norm=jnp.ones_like(layer.q_norm), k_norm=jnp.ones_like(layer.k_norm))
        return out

    tree = dataclasses.replace(tree, layers=[fix(lw) for lw in tree.layers], final_norm=jnp.ones_like(tree.final_norm))
    if hasattr(tree, "hidden_norm"):
        tree = dataclasses.replace(tree, hidden_norm=jnp.ones_like(tree.hidden_norm))
    return tree


def init_target(cfg: ModelConfig, seed: int) -> TargetWeights:
    return unit_norms(init_random_target(cfg, seed, jnp.float32))


def full_forward(weights, cfg: ModelConfig, tokens: jax.Array, hidden_layer_ids: tuple[int, ...] = ()) -> StepOutput:
    """The target over whole windows [B, T] from position 0, computing in the weights' dtype."""
    b, t = tokens.shape
    cache = init_cache(cfg.num_layers, b, t, cfg.num_kv_heads, cfg.head_dim, weights.embed.dtype)
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    return forward(weights, cfg, tokens, positions, cache, None, hidden_layer_ids)


def token_stream(files_ids: list[list[int]]) -> np.ndarray:
    """Every file's tokens followed by EOS, concatenated."""
    parts = [np.asarray(ids + [EOS_ID], np.int32) for ids in files_ids]
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


def random_windows(stream: np.ndarray, seed: int, step: int, batch: int, length: int) -> np.ndarray:
    """[batch, length] windows at offsets drawn from (seed, step): the same batch for the same step, always."""
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(stream) - length + 1, size=batch)
    return np.stack([stream[s : s + length] for s in starts])


def even_windows(stream: np.ndarray, count: int, length: int) -> np.ndarray:
    """`count` windows spread evenly over the stream (held-out evaluation)."""
    starts = np.linspace(0, len(stream) - length, count).astype(np.int64)
    return np.stack([stream[s : s + length] for s in starts])


@functools.lru_cache(maxsize=8)
def make_loss(cfg: ModelConfig, dtype):
    def loss_fn(params, frozen, batch):
        tokens = batch[:, :-1]
        logits = full_forward(cast_floats(params, dtype), cfg, tokens).logits
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:])
        return ce.mean(), {}

    return loss_fn


@functools.lru_cache(maxsize=8)
def _jitted_loss(cfg: ModelConfig, dtype):
    return jax.jit(make_loss(cfg, dtype))


def held_out_loss(params, cfg: ModelConfig, windows: np.ndarray, batch: int, dtype) -> float:
    """Mean next-token cross-entropy (nats/token) over held-out windows [N, T + 1]."""
    loss_fn = _jitted_loss(cfg, dtype)
    n = (len(windows) // batch) * batch
    losses = [float(loss_fn(params, None, jnp.asarray(windows[i : i + batch]))[0]) for i in range(0, n, batch)]
    return float(np.mean(losses))


def train_target(spec: ProxySpec, train_stream: np.ndarray, held_stream: np.ndarray, run_dir: str | Path,
                 tracker=None, stop_after: int | None = None) -> tuple[ModelConfig, TargetWeights, dict]:
    """(config, float32 weights, report) after training (or resuming) in `run_dir`."""
    ts = spec.target_train
    cfg = target_config(spec)
    dtype = DTYPES[ts.dtype]
    length = ts.seq_len + 1
    if len(train_stream) <= length or len(held_stream) <= length:
        raise RuntimeError(f"token streams too short for windows of {length} tokens")
    params, run = train_loop(
        name="target",
        params=init_target(cfg, spec.seed),
        loss_fn=make_loss(cfg, dtype),
        batch_fn=lambda step: random_windows(train_stream, spec.seed, step, ts.batch_size, length),
        ts=ts,
        run_dir=run_dir,
        tracker=tracker,
        stop_after=stop_after,
    )
    held = held_out_loss(params, cfg, even_windows(held_stream, ts.eval_batches * ts.batch_size, length),
                         ts.batch_size, dtype)
    train_eval = held_out_loss(params, cfg, even_windows(train_stream, ts.eval_batches * ts.batch_size, length),
                               ts.batch_size, dtype)
    report = {
        "params": int(sum(np.prod(a.shape) for a in jax.tree.leaves(params))),
        "steps": run["steps"],
        "resumed_from": run["resumed_from"],
        "tokens_seen": run["steps"] * ts.batch_size * ts.seq_len,
        "seconds_per_step": run["seconds_per_step"],
        "train_loss_last_log": run["final_train_loss"],
        "train_loss": train_eval,
        "held_out_loss": held,
        "history": run["history"],
    }
    log.info("target: held-out loss %.4f nats/token (train %.4f), %d params", held, train_eval, report["params"])
    if tracker is not None:
        tracker.summary({"target/held_out_loss": held, "target/train_loss": train_eval})
    return cfg, params, report
