"""Autoregressive baseline: the target alone, one token per step, greedy or sampled."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specpilot.decoding.common import new_cache, prefill
from specpilot.decoding.engine import Engine, LoopState, commit, init_loop_state
from specpilot.decoding.sampling import Sampling, pick
from specpilot.models.config import ModelConfig
from specpilot.models.kv_cache import advance
from specpilot.models.target import forward


class AREngine(Engine):
    name = "ar"
    slack = 1

    def __init__(self, cfg: ModelConfig, weights, sampling: Sampling = Sampling(), context: int | None = None,
                 attention: str = "xla"):
        self.cfg, self.params, self.sampling, self.attention = cfg, weights, sampling, attention
        self.context = context or cfg.max_position_embeddings
        self.dtype = weights.embed.dtype

    def prefill(self, params, tokens, lens, max_new, key):
        cache = new_cache(self.cfg, tokens.shape[0], self.context, self.dtype)
        logits, cache, _ = prefill(params, self.cfg, tokens, lens, cache)
        key, sub = jax.random.split(key)
        first = pick(sub, logits, self.sampling)
        return init_loop_state(first, max_new, self.slack, key, cache, self.cfg.eos_token_ids)

    def stages(self):
        return [("verify", self._stage_step), ("commit", self._stage_commit)]

    def _stage_step(self, params, state: LoopState, carry):
        cache = state.extra
        out = forward(params, self.cfg, state.last[:, None], cache.lengths[:, None], cache, attention=self.attention)
        key, sub = jax.random.split(state.key)
        return {"next": pick(sub, out.logits[:, 0], self.sampling), "cache": out.cache, "key": key}

    def _stage_commit(self, params, state: LoopState, carry):
        nxt = carry["next"]
        cache = advance(carry["cache"], (~state.done).astype(jnp.int32))
        state = commit(state, nxt[:, None], jnp.ones_like(nxt), self.cfg.eos_token_ids, cache)
        return {"state": dataclasses.replace(state, key=carry["key"])}


def generate(weights, cfg: ModelConfig, prompts, max_new_tokens: int, temperature: float = 0.0, top_k: int = 0,
             top_p: float = 1.0, seed: int = 0, context: int | None = None):
    """Plain autoregressive generation; see `AREngine`."""
    engine = AREngine(cfg, weights, Sampling(temperature, top_k, top_p), context)
    return engine.generate(prompts, max_new_tokens, seed)
