"""Finished requests stop costing work: a big batch drops its finished rows and results do not change."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from specpilot.decoding import make_engine
from specpilot.models.config import DrafterConfig, ModelConfig
from specpilot.models.weights import init_random_drafter, init_random_target


def test_batch_shrinks_and_matches_unbatched(monkeypatch):
    cfg = ModelConfig(family="qwen3", vocab_size=16, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=96)
    w = init_random_target(cfg, seed=5, dtype=jnp.float32)
    dcfg = DrafterConfig(layers=cfg.replace(num_layers=1), block_size=4, mask_token_id=15,
                         target_layer_ids=(0, 1), num_target_layers=2)
    dw = init_random_drafter(dcfg, seed=6, dtype=jnp.float32)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 15, size=int(rng.integers(2, 7))).tolist() for _ in range(8)]
    plain = make_engine({"name": "ar"}, cfg, w, context=96).generate(prompts, 24).tokens
    # pick an EOS that ends most requests early but not all
    counts = {t: sum(t in p[:12] for p in plain) for t in range(15)}
    eos = max((t for t in counts if 4 <= counts[t] <= 7), key=lambda t: counts[t])
    cfg = cfg.replace(eos_token_ids=(eos,))
    engine = make_engine({"name": "ddtree", "tree_budget": 6}, cfg, w, dcfg, dw, context=96)
    batch_sizes = []
    run = engine._run  # the engine's jitted loop

    def spy(params, state, pause_at_live):
        batch_sizes.append(int(state.done.shape[0]))
        return run(params, state, pause_at_live)

    monkeypatch.setattr(engine, "_run", spy)
    together = engine.generate(prompts, 24)
    assert batch_sizes[0] == 8 and min(batch_sizes) < 8, batch_sizes  # finished rows were dropped
    monkeypatch.setattr(engine, "_run", run)
    pad = max(map(len, prompts))  # as the batch pads them: one prefill program for every request alone
    for i, p in enumerate(prompts):
        alone = engine.generate([p], 24, pad_to=pad)
        assert alone.tokens[0] == together.tokens[i]
        assert alone.acceptance_lengths[0] == together.acceptance_lengths[i]
    assert any(len(t) < 24 for t in together.tokens)
