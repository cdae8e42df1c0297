"""What every engine shares: prompt validation, batched ragged prefill, output buffers, results."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specpilot.models.config import ModelConfig
from specpilot.models.kv_cache import KVCache, advance, init_cache
from specpilot.models.target import forward


class PromptError(ValueError):
    """A prompt cannot be decoded as given (empty, too long, token id out of range)."""


def check_prompts(prompts: Sequence[Sequence[int]], cfg: ModelConfig, max_new_tokens: int, context: int,
                  reserved: int = 0) -> None:
    """PromptError (one line) for a prompt the engine cannot decode: none, empty, a token id outside the vocabulary,
    or too long for `context` cache slots once `reserved` more are kept for the scratch slots a round writes past
    the committed text (an engine's `slack`: its tree or block)."""
    if not prompts:
        raise PromptError("no prompts given")
    if max_new_tokens < 1:
        raise PromptError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise PromptError(f"prompt {i} is empty")
        bad = [t for t in p if not 0 <= int(t) < cfg.vocab_size]
        if bad:
            raise PromptError(f"prompt {i}: token id {bad[0]} outside the vocabulary [0, {cfg.vocab_size})")
        need = len(p) + max_new_tokens
        if need + reserved > context:
            scratch = f", plus the {reserved} scratch slots a round writes past them," if reserved else ""
            raise PromptError(f"prompt {i}: {len(p)} prompt tokens + max_new_tokens {max_new_tokens}{scratch} "
                              f"exceed the context of {context}")


def pow2_at_least(n: int) -> int:
    """The smallest power of two ≥ n (1 for n ≤ 1): padded shapes that keep the compiled programs few."""
    return 1 << max(n - 1, 0).bit_length()


def pad_prompts(prompts: Sequence[Sequence[int]], pad_to: int | None = None) -> tuple[jax.Array, jax.Array]:
    """Right-padded [B, T] token ids and [B] lengths; T = pad_to (a fixed shape reuses one compiled
    program across calls) or the longest prompt."""
    lens = np.array([len(p) for p in prompts], np.int32)
    toks = np.zeros((len(prompts), max(int(lens.max()), pad_to or 0)), np.int32)
    for i, p in enumerate(prompts):
        toks[i, : len(p)] = p
    return jnp.asarray(toks), jnp.asarray(lens)


def new_cache(cfg: ModelConfig, batch: int, capacity: int, dtype) -> KVCache:
    return init_cache(cfg.num_layers, batch, capacity, cfg.num_kv_heads, cfg.head_dim, dtype)


def prefill(weights, cfg: ModelConfig, tokens, lens, cache: KVCache, hidden_layer_ids=()):
    """Run the ragged prompts; returns (last-position logits [B, V], cache advanced by lens, hidden)."""
    b, t = tokens.shape
    out = forward(weights, cfg, tokens, jnp.broadcast_to(jnp.arange(t), (b, t)), cache, None, hidden_layer_ids)
    last = jnp.take_along_axis(out.logits, (lens - 1)[:, None, None], axis=1)[:, 0]
    return last, advance(out.cache, lens), out.hidden


def append_tokens(out: jax.Array, n_out: jax.Array, new: jax.Array, n_new: jax.Array) -> jax.Array:
    """Write new[b, :n_new[b]] into out[b] at n_out[b] (entries past n_new are written but later
    overwritten or cut; `out` has slack for a whole round). The slots are distinct: `unique_indices`."""
    slots = n_out[:, None] + jnp.arange(new.shape[1])[None, :]
    keep = jnp.arange(new.shape[1])[None, :] < n_new[:, None]
    cur = jnp.take_along_axis(out, jnp.clip(slots, 0, out.shape[1] - 1), axis=1)
    return out.at[jnp.arange(out.shape[0])[:, None], slots].set(jnp.where(keep, new, cur), mode="drop",
                                                                unique_indices=True)


def first_eos(tokens: jax.Array, n: jax.Array, eos_ids: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """Per row: (length up to and including the first EOS among tokens[:, :n], or n; whether one exists)."""
    if not eos_ids:
        return n, jnp.zeros(n.shape, bool)
    idx = jnp.arange(tokens.shape[1])[None, :]
    is_eos = jnp.isin(tokens, jnp.asarray(eos_ids)) & (idx < n[:, None])
    found = is_eos.any(axis=1)
    return jnp.where(found, jnp.argmax(is_eos, axis=1) + 1, n).astype(jnp.int32), found


@dataclasses.dataclass
class GenerateResult:
    """Output of any engine. `acceptance_lengths[i]` lists the tokens committed per round of request i
    (the prefill's first token is not a round)."""

    engine: str
    tokens: list[list[int]]
    acceptance_lengths: list[list[int]]
    stats: dict = dataclasses.field(default_factory=dict)

    @property
    def steps(self) -> int:
        """Target forward passes after prefill, counted per request and summed."""
        return int(sum(len(a) for a in self.acceptance_lengths))

    @property
    def tokens_per_step(self) -> float:
        committed = sum(sum(a) for a in self.acceptance_lengths)
        return committed / max(self.steps, 1)

    def to_json(self) -> dict:
        return {
            "engine": self.engine,
            "tokens": self.tokens if len(self.tokens) > 1 else self.tokens[0],
            "steps": self.steps,
            "tokens_per_step": self.tokens_per_step,
            "acceptance_lengths": self.acceptance_lengths if len(self.tokens) > 1 else self.acceptance_lengths[0],
            **({"stats": self.stats} if self.stats else {}),
        }
