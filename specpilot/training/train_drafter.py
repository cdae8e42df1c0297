"""Train a DFlash drafter against the frozen proxy target.

Data: the target's own greedy continuations of corpus prompts (generated with the project's AR engine), so
the drafter learns exactly what verification will accept. Per training sequence, random anchor positions
`a` (inside the generated part); for each, the block [token a, mask × (B−1)] at positions a .. a+B−1 sees
the target's features at `target_layer_ids` of positions < a — the committed context at inference — and row
k is trained to predict the target's greedy token at position a+k: cross-entropy weighted exp(−(k−1)/γ)
(DFlash's position decay: early rows decide how much of the block survives).

The drafter math is `specpilot.models.dflash` itself: the whole sequence's features are `ingest`ed once, the
context cache is repeated per anchor with its length set to the anchor, and `draft_logits` runs every block
in one batch. Inference does the same computation one round at a time.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specpilot.models import dflash
from specpilot.models.config import DrafterConfig, ModelConfig
from specpilot.models.kv_cache import KVCache
from specpilot.models.weights import DrafterWeights, TargetWeights, cast_floats, init_random_drafter
from specpilot.training.loop import train_loop
from specpilot.training.spec import ProxySpec
from specpilot.training.tokenizer import MASK_ID
from specpilot.training.train_target import DTYPES, full_forward, unit_norms

log = logging.getLogger(__name__)


def drafter_config(spec: ProxySpec, target: ModelConfig) -> DrafterConfig:
    d = spec.drafter
    ids = d.target_layer_ids
    if ids is None:
        from specpilot.models.config import default_target_layer_ids

        ids = default_target_layer_ids(d.num_layers, target.num_layers)
    layers = target.replace(intermediate_size=d.intermediate_size, num_layers=d.num_layers, eos_token_ids=())
    return DrafterConfig(layers=layers, block_size=d.block_size, mask_token_id=MASK_ID,
                         target_layer_ids=tuple(ids), num_target_layers=target.num_layers)


def init_drafter(cfg: DrafterConfig, seed: int) -> DrafterWeights:
    return unit_norms(init_random_drafter(cfg, seed, jnp.float32))


# ---- data: the target's greedy continuations -----------------------------------------------------------


def prompt_windows(stream: np.ndarray, count: int, length: int, seed: int) -> np.ndarray:
    """`count` prompts of `length` tokens at stable random offsets of a token stream."""
    rng = np.random.default_rng([seed, 7919])
    starts = rng.integers(0, len(stream) - length + 1, size=count)
    return np.stack([stream[s : s + length] for s in starts])


def greedy_sequences(cfg: ModelConfig, weights: TargetWeights, prompts: np.ndarray, new_tokens: int,
                     batch: int) -> np.ndarray:
    """[N, P + new_tokens]: each prompt followed by the target's greedy continuation (EOS does not stop it)."""
    from specpilot.decoding.ar import AREngine

    p = prompts.shape[1]
    engine = AREngine(cfg.replace(eos_token_ids=()), weights, context=p + new_tokens + 1)
    out = []
    for i in range(0, len(prompts), batch):
        chunk = prompts[i : i + batch]
        rows = [list(map(int, r)) for r in chunk]
        rows += [rows[-1]] * (batch - len(rows))  # one compiled shape for every chunk
        res = engine.generate(rows, new_tokens)
        out.append(np.concatenate([chunk, np.asarray(res.tokens[: len(chunk)], np.int32)], axis=1))
    return np.concatenate(out)


def sample_anchors(seed: int, step: int, n_seq: int, k: int, lo: int, hi: int) -> np.ndarray:
    """[n_seq, k] anchor positions in [lo, hi], drawn from (seed, step)."""
    rng = np.random.default_rng([seed, step, 104729])
    return rng.integers(lo, hi + 1, size=(n_seq, k)).astype(np.int32)


# ---- the loss ------------------------------------------------------------------------------------------


def block_logits(dw: DrafterWeights, dcfg: DrafterConfig, tw: TargetWeights, tcfg: ModelConfig,
                 seqs: jax.Array, anchors: jax.Array):
    """(drafter logits [B·K, block, V] for the block at each anchor, target greedy labels [B·K, block−1]).

    `tw` is the frozen target, already in the compute dtype; `dw` too.
    """
    b, t = seqs.shape
    k = anchors.shape[1]
    blk = dcfg.block_size
    out = full_forward(tw, tcfg, seqs, dcfg.target_layer_ids)
    feats = jax.lax.stop_gradient(out.hidden)
    greedy = jnp.argmax(out.logits, axis=-1).astype(jnp.int32)  # greedy[p] = the target's token at p + 1
    dtype = tw.embed.dtype
    ctx = dflash.ingest(dw, dcfg, dflash.init_context(dcfg, b, t, dtype), feats, jnp.full((b,), t, jnp.int32))
    # one context per block: the whole sequence's K/V, visible up to (not including) the anchor
    ctx = KVCache(k=jnp.repeat(ctx.k, k, axis=1), v=jnp.repeat(ctx.v, k, axis=1), lengths=anchors.reshape(-1))
    first = jnp.take_along_axis(seqs, anchors, axis=1).reshape(-1)
    block = jnp.concatenate([first[:, None], jnp.full((b * k, blk - 1), dcfg.mask_token_id, jnp.int32)], axis=1)
    logits = dflash.draft_logits(dw, dcfg, tw.embed, tw.lm_head, ctx, block)
    idx = anchors[:, :, None] + jnp.arange(blk - 1)[None, None, :]  # row r (1-based) predicts greedy[a + r − 1]
    labels = jnp.take_along_axis(greedy[:, None, :], idx, axis=2).reshape(b * k, blk - 1)
    return logits, labels


def row_weights(block_size: int, decay: float) -> jax.Array:
    w = jnp.exp(-jnp.arange(block_size - 1, dtype=jnp.float32) / decay)
    return w / w.sum()


@functools.lru_cache(maxsize=8)
def make_loss(dcfg: DrafterConfig, tcfg: ModelConfig, dtype, decay: float):
    weights = row_weights(dcfg.block_size, decay)

    def loss_fn(params, frozen, batch):
        logits, labels = block_logits(cast_floats(params, dtype), dcfg, frozen, tcfg, batch["seqs"], batch["anchors"])
        ce = optax.softmax_cross_entropy_with_integer_labels(logits[:, 1:], labels)  # [B·K, block−1]
        hit = jnp.argmax(logits[:, 1:], axis=-1) == labels
        return jnp.mean(ce @ weights), {"acc_row1": hit[:, 0].mean(), "accepted": _accepted(hit).mean()}

    return loss_fn


def _accepted(hit: jax.Array) -> jax.Array:
    """Tokens a chain round would commit per block: leading correct drafts + the target's bonus token."""
    return jnp.sum(jnp.cumprod(hit.astype(jnp.int32), axis=1), axis=1).astype(jnp.float32) + 1.0


@functools.lru_cache(maxsize=8)
def _metrics_fn(dcfg: DrafterConfig, tcfg: ModelConfig, dtype, decay: float):
    weights = row_weights(dcfg.block_size, decay)

    @jax.jit
    def metrics(dp, tw, s, a):
        logits, labels = block_logits(cast_floats(dp, dtype), dcfg, tw, tcfg, s, a)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits[:, 1:], labels)
        hit = jnp.argmax(logits[:, 1:], axis=-1) == labels
        return ce @ weights, hit, _accepted(hit)

    return metrics


def simulated_stock_tau(hit: np.ndarray) -> float:
    """Greedy stock τ replayed offline. hit[b, i, r]: whether the block anchored at the i-th position drafts row
    r + 1 right (on the target's greedy sequence). A round at anchor i commits n + 1 tokens (n leading hits)
    and the next round anchors n + 1 positions later, exactly as the decoding loop does."""
    rounds = committed = 0
    for h in hit:
        i = 0
        while i < len(h):
            n = int(np.cumprod(h[i]).sum())
            rounds, committed, i = rounds + 1, committed + n + 1, i + n + 1
    return committed / max(rounds, 1)


def evaluate(dparams, dcfg, tw, tcfg, seqs: np.ndarray, lo: int, batch: int, dtype, decay: float) -> dict:
    """Held-out drafter metrics on greedy sequences, with a block at every anchor position lo .. len − block:
    weighted CE, per-row accuracy, and the stock τ a greedy decode of these sequences would reach."""
    hi = seqs.shape[1] - dcfg.block_size
    anchors = np.broadcast_to(np.arange(lo, hi + 1, dtype=np.int32), (batch, hi - lo + 1))
    metrics = _metrics_fn(dcfg, tcfg, dtype, decay)
    ces, hits = [], []
    n = (len(seqs) // batch) * batch
    for i in range(0, n, batch):
        c, h, _ = jax.device_get(metrics(dparams, tw, jnp.asarray(seqs[i : i + batch]), jnp.asarray(anchors)))
        ces.append(c), hits.append(h.reshape(batch, anchors.shape[1], -1))
    hit = np.concatenate(hits)
    return {
        "loss": float(np.mean(np.concatenate(ces))),
        "row_accuracy": np.round(hit.reshape(-1, hit.shape[-1]).mean(axis=0), 4).tolist(),
        "stock_tau_simulated": simulated_stock_tau(hit),
    }


def train_drafter(spec: ProxySpec, tcfg: ModelConfig, tparams: TargetWeights, train_prompts: np.ndarray,
                  held_prompts: np.ndarray, run_dir: str | Path, tracker=None,
                  stop_after: int | None = None) -> tuple[DrafterConfig, DrafterWeights, dict]:
    """(config, float32 weights, report). Prompts: [N, prompt_tokens] token windows (train / held-out)."""
    import time

    ds = spec.drafter_train
    dtype = DTYPES[ds.dtype]
    dcfg = drafter_config(spec, tcfg)
    tw = cast_floats(tparams, dtype)
    run_dir = Path(run_dir)
    data_file = run_dir / "greedy_sequences.npz"
    t0 = time.perf_counter()
    if data_file.is_file():  # generated once; a resumed run reuses it
        with np.load(data_file) as z:
            seqs, held = z["train"], z["held_out"]
    else:
        both = greedy_sequences(tcfg, tw, np.concatenate([train_prompts, held_prompts]), ds.generate_tokens,
                                ds.generate_batch)
        seqs, held = both[: len(train_prompts)], both[len(train_prompts) :]
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = run_dir / "greedy_sequences.tmp.npz"
        np.savez(tmp, train=seqs, held_out=held)
        tmp.replace(data_file)
    gen_s = time.perf_counter() - t0
    log.info("drafter: %d training / %d held-out greedy sequences of %d tokens (%.1f s)", len(seqs), len(held),
             seqs.shape[1], gen_s)
    lo, hi = ds.prompt_tokens, seqs.shape[1] - dcfg.block_size

    def batch_fn(step):
        rng = np.random.default_rng([spec.seed, step, 15485863])
        rows = rng.integers(0, len(seqs), size=ds.batch_size)
        return {"seqs": seqs[rows], "anchors": sample_anchors(spec.seed, step, ds.batch_size,
                                                              ds.anchors_per_sequence, lo, hi)}

    params, run = train_loop(
        name="drafter",
        params=init_drafter(dcfg, spec.seed + 1),
        loss_fn=make_loss(dcfg, tcfg, dtype, ds.loss_decay),
        batch_fn=batch_fn,
        ts=ds,
        run_dir=run_dir,
        frozen=tw,
        tracker=tracker,
        stop_after=stop_after,
    )
    eval_batch = max(1, min(ds.batch_size, 8))  # a block at every position: keep the batch small
    n_eval = ds.eval_batches * ds.batch_size
    held_metrics = evaluate(params, dcfg, tw, tcfg, held[:n_eval], lo, eval_batch, dtype, ds.loss_decay)
    train_metrics = evaluate(params, dcfg, tw, tcfg, seqs[:n_eval], lo, eval_batch, dtype, ds.loss_decay)
    report = {
        "params": int(sum(np.prod(a.shape) for a in jax.tree.leaves(params))),
        "greedy_sequences": {"train": int(len(seqs)), "held_out": int(len(held)), "length": int(seqs.shape[1]),
                             "seconds": gen_s},
        "steps": run["steps"],
        "resumed_from": run["resumed_from"],
        "seconds_per_step": run["seconds_per_step"],
        "train_loss_last_log": run["final_train_loss"],
        "train": train_metrics,
        "held_out": held_metrics,
        "held_out_loss": held_metrics["loss"],
        "history": run["history"],
    }
    log.info("drafter: held-out loss %.4f, simulated stock tau %.2f, row accuracy %s", held_metrics["loss"],
             held_metrics["stock_tau_simulated"], held_metrics["row_accuracy"])
    if tracker is not None:
        tracker.summary({"drafter/held_out_loss": held_metrics["loss"],
                         "drafter/held_out_stock_tau_simulated": held_metrics["stock_tau_simulated"]})
    return dcfg, params, report
