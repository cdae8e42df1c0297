"""Speculative sampling for a chain draft: exact at any temperature.

Each draft token x_i was sampled from the drafter's distribution q_i; it is accepted with probability
min(1, p_i(x_i) / q_i(x_i)) where p_i is the target's distribution (`target_probs`). At the first
rejection the bonus is drawn from norm(max(p_i − q_i, 0)); if all pass, from p at the last position.
The committed tokens then follow the target's own distribution exactly (Leviathan et al., 2023).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specpilot.decoding.tree import Walk


def speculative_accept(key: jax.Array, drafts: jax.Array, q: jax.Array, p: jax.Array) -> Walk:
    """drafts [D]; q [D, V] drafter probs; p [D + 1, V] target probs at root, d1..dD. One request."""
    d = drafts.shape[0]
    k_u, k_bonus = jax.random.split(key)
    rows = jnp.arange(d)
    p_x = p[rows, drafts]
    q_x = q[rows, drafts]
    u = jax.random.uniform(k_u, (d,))
    ok = u * q_x < p_x  # u < p/q without dividing by q
    n_acc = jnp.sum(jnp.cumprod(ok.astype(jnp.int32))).astype(jnp.int32)
    p_n = p[n_acc]
    q_n = jnp.where(n_acc < d, q[jnp.minimum(n_acc, d - 1)], 0.0)
    residual = jnp.maximum(p_n - q_n, 0.0)
    residual = jnp.where(residual.sum() > 0, residual, p_n)
    bonus = jax.random.categorical(k_bonus, jnp.log(residual)).astype(jnp.int32)
    i = jnp.arange(d + 1)
    new_tokens = jnp.where(i < n_acc, jnp.concatenate([drafts, drafts[-1:]]), bonus).astype(jnp.int32)
    return Walk(n_accepted=n_acc, path=i.astype(jnp.int32), new_tokens=new_tokens, bonus=bonus)
