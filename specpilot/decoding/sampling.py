"""The target's sampling distribution, shared by every engine.

Lossless speculative sampling needs the *exact* distribution the target would sample from, so
temperature, top-k and top-p are applied in one place (`target_probs`) and every engine — AR,
chain, tree — samples from or verifies against that same function.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"sampling.temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"sampling.top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def target_probs(logits: jax.Array, s: Sampling) -> jax.Array:
    """Probabilities [..., V] the target samples from (one-hot argmax when greedy)."""
    v = logits.shape[-1]
    if s.greedy:
        return jax.nn.one_hot(jnp.argmax(logits, axis=-1), v, dtype=jnp.float32)
    x = logits.astype(jnp.float32) / s.temperature
    if s.top_k and s.top_k < v:
        kth = jax.lax.top_k(x, s.top_k)[0][..., -1:]
        x = jnp.where(x < kth, -jnp.inf, x)
    if s.top_p < 1.0:
        order = jnp.argsort(-x, axis=-1)
        sorted_x = jnp.take_along_axis(x, order, axis=-1)
        sorted_p = jax.nn.softmax(sorted_x, axis=-1)
        # keep a token if the mass strictly before it is < top_p (the top token is always kept)
        keep_sorted = (jnp.cumsum(sorted_p, axis=-1) - sorted_p) < s.top_p
        keep = jnp.put_along_axis(jnp.zeros_like(keep_sorted), order, keep_sorted, axis=-1, inplace=False)
        x = jnp.where(keep, x, -jnp.inf)
    return jax.nn.softmax(x, axis=-1)


def sample(key: jax.Array, probs: jax.Array) -> jax.Array:
    """One token per row of `probs` [..., V]."""
    return jax.random.categorical(key, jnp.log(probs), axis=-1).astype(jnp.int32)


def pick(key: jax.Array, logits: jax.Array, s: Sampling) -> jax.Array:
    """The target's own next token: argmax when greedy, else a sample from `target_probs`."""
    if s.greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return sample(key, target_probs(logits, s))
