"""Tiny in-process target/drafter pairs for engine tests (no checkpoints, no network).

`repeat_pair` builds a target whose greedy continuation mostly repeats its last token, switching now
and then depending on the context, and a DFlash drafter constructed from the target's embedding that
drafts "repeat the root token" at every depth. So drafts are often right (rounds commit several
tokens, KV compaction and feature ingestion are exercised) and often wrong (rejections, siblings).

Construction of the drafter (one layer, one head of width H):
- `embed[mask] = 0` in the target, so the block's mask rows have zero K and V;
- q_proj and k_proj are small, so attention is close to uniform over context + block, and the value
  is dominated by the root row's `v = embed[root]` (v_proj = identity); `hidden_norm` is small, so
  the context adds a small, context-dependent perturbation (the drafts do depend on the features);
- o_proj = identity, no MLP; the final RMSNorm removes the 1/length scale of the uniform average;
- the target's head is tied to its embedding, so row i's logits ≈ alpha · embed · normalize(embed[root]),
  maximal at the root token.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specpilot.models.config import DrafterConfig, ModelConfig, RopeConfig
from specpilot.models.weights import DrafterWeights, Layer, init_random_drafter, init_random_target


def target_config(vocab=16, hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8, intermediate=64,
                  family="qwen3", eos=()) -> ModelConfig:
    return ModelConfig(
        family=family, vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_layers=layers,
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, rope=RopeConfig(theta=10000.0),
        tie_word_embeddings=True, max_position_embeddings=512, eos_token_ids=tuple(eos),
    )


def drafter_layers_config(tcfg: ModelConfig, num_layers=1, heads=1, kv_heads=1, head_dim=None,
                          intermediate=None) -> ModelConfig:
    return ModelConfig(
        family="qwen3", vocab_size=tcfg.vocab_size, hidden_size=tcfg.hidden_size,
        intermediate_size=intermediate or tcfg.intermediate_size, num_layers=num_layers, num_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim or tcfg.hidden_size // heads, rope=RopeConfig(theta=10000.0),
        max_position_embeddings=tcfg.max_position_embeddings,
    )


def random_pair(tcfg: ModelConfig, block_size=8, target_layer_ids=(0, 1), seed=0, dtype=jnp.float32,
                drafter_layers: ModelConfig | None = None):
    """Plain random target + random drafter (drafts rarely right)."""
    dlayers = drafter_layers or drafter_layers_config(tcfg, num_layers=1, heads=2, kv_heads=1)
    dcfg = DrafterConfig(layers=dlayers, block_size=block_size, mask_token_id=tcfg.vocab_size - 1,
                         target_layer_ids=tuple(target_layer_ids), num_target_layers=tcfg.num_layers)
    return tcfg, init_random_target(tcfg, seed, dtype), dcfg, init_random_drafter(dcfg, seed + 1, dtype)


def repeat_pair(tcfg: ModelConfig, block_size=8, embed_scale=2.0, drafter_alpha=1.0, ctx_scale=0.05, seed=0,
                dtype=jnp.float32):
    """(target cfg, target weights, drafter cfg, drafter weights); see the module docstring.

    embed_scale: norm of each token embedding (larger: the target repeats more often);
    drafter_alpha: drafter logit scale (smaller: flatter drafts, bushier trees);
    ctx_scale: how much the drafter's context (target features) perturbs its drafts.
    """
    assert tcfg.tie_word_embeddings
    h, v = tcfg.hidden_size, tcfg.vocab_size
    mask = v - 1
    rng = np.random.default_rng(seed)
    base = init_random_target(tcfg, seed, jnp.float32)
    e = rng.standard_normal((v, h)).astype(np.float32)
    e *= embed_scale / np.linalg.norm(e, axis=1, keepdims=True)
    e[mask] = 0.0
    embed = jnp.asarray(e)
    target = dataclasses.replace(base, embed=embed, lm_head=embed.T)

    dl = ModelConfig(
        family="qwen3", vocab_size=v, hidden_size=h, intermediate_size=8, num_layers=1, num_heads=1,
        num_kv_heads=1, head_dim=h, rope=RopeConfig(theta=10000.0),
        max_position_embeddings=tcfg.max_position_embeddings,
    )
    dcfg = DrafterConfig(layers=dl, block_size=block_size, mask_token_id=mask,
                         target_layer_ids=(0, tcfg.num_layers - 1), num_target_layers=tcfg.num_layers)
    small = lambda *shape: jnp.asarray(0.05 * rng.standard_normal(shape).astype(np.float32))  # noqa: E731
    w_qkv = jnp.concatenate([small(h, h), small(h, h), jnp.eye(h, dtype=jnp.float32)], axis=1)
    layer = Layer(
        attn_norm=jnp.ones((h,), jnp.float32), w_qkv=w_qkv, q_norm=jnp.ones((h,), jnp.float32),
        k_norm=jnp.ones((h,), jnp.float32), w_o=jnp.eye(h, dtype=jnp.float32),
        mlp_norm=jnp.ones((h,), jnp.float32), w_gate_up=jnp.zeros((h, 16), jnp.float32),
        w_down=jnp.zeros((8, h), jnp.float32),
    )
    fc = jnp.asarray(rng.standard_normal((2 * h, h)).astype(np.float32) / np.sqrt(2 * h))
    # hidden_norm's weight sets the context rows' scale (the RMSNorm removes fc's)
    drafter = DrafterWeights(fc=fc, hidden_norm=jnp.full((h,), ctx_scale, jnp.float32), layers=[layer],
                             final_norm=jnp.full((h,), drafter_alpha, jnp.float32))
    cast = lambda t: jax.tree.map(lambda a: a.astype(dtype), t)  # noqa: E731
    return tcfg, cast(target), dcfg, cast(drafter)


def prompts(n: int, vocab: int, lengths=(3, 6, 9), seed=0, exclude=()) -> list[list[int]]:
    """n prompts, lengths cycling through `lengths`, tokens avoiding `exclude` (e.g. the mask token)."""
    rng = np.random.default_rng(seed)
    allowed = np.array([t for t in range(vocab) if t not in set(exclude)])
    return [rng.choice(allowed, size=lengths[i % len(lengths)]).tolist() for i in range(n)]


def generate(engine, prompts, max_new_tokens: int, seed: int = 0):
    """`engine.generate` (tests/conftest.py already switches XLA's slow optimisation passes off)."""
    return engine.generate(prompts, max_new_tokens, seed)


def whole_batch(engine):
    """Keep every row to the end instead of dropping finished requests (`Engine.shrink_from`): one loop
    compile per engine instead of one per power-of-two batch size. For tests whose subject is not the
    shrinking itself (test_engines covers it)."""
    engine.shrink_from = 1 << 30
    return engine


def on_device(a, dtype=jnp.bfloat16) -> jax.Array:
    """A numpy array as a device array of ``dtype``, rounded on the host through float32 (as jnp's conversion does
    without x64). Random test inputs are drawn in numpy and put on the device so: jnp ops or ``jax.random`` draws
    compile at every new shape (~0.7 s a case on a 2-core CPU, docs/h200_runbook.md, fifty-eighth session)."""
    return jnp.asarray(np.asarray(a, np.float32).astype(dtype))


def bf16_step_inputs(cfg: ModelConfig, capacity: int = 16, length: int = 5):
    """A random bf16 target (seed 1) and a KV cache of ``capacity`` slots with ``length`` random committed positions:
    what the kernel-in-the-model tests run one forward over."""
    from specpilot.models.kv_cache import KVCache

    w = init_random_target(cfg, 1, jnp.bfloat16)
    kv = np.random.default_rng(0).normal(size=(2, cfg.num_layers, 1, capacity, cfg.num_kv_heads, cfg.head_dim))
    cache = KVCache(k=jnp.asarray(kv[0], jnp.bfloat16), v=jnp.asarray(kv[1], jnp.bfloat16),
                    lengths=jnp.asarray([length], jnp.int32))
    return w, cache


def choose_kernels(monkeypatch, kernels: dict) -> None:
    """Each ``ops`` module in ``kernels`` picks its Mosaic GPU kernel as if on a Hopper, and runs it through the given
    function (the kernel in interpret mode, usually wrapped to record what it was given)."""
    for module, kernel in kernels.items():
        monkeypatch.setattr(module, "DEFAULT", "mosaic_gpu")
        monkeypatch.setattr(module, "_on_hopper", lambda: True)
        monkeypatch.setattr(module, "_mosaic_gpu", kernel)


def xla_then_kernels(monkeypatch, kernels: dict, run):
    """``run()`` on the XLA path, then again with ``kernels`` chosen (``choose_kernels``): ``(want, got)``, what a
    kernel-in-the-model test compares."""
    want = run()
    choose_kernels(monkeypatch, kernels)
    return want, run()


def interpreted_skinny(x, w, config, reduce):
    """``skinny_matmul.ops``'s kernel hook (``_mosaic_gpu``) run in Pallas GPU-interpret mode, for ``choose_kernels``."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from pallas_kernels.skinny_matmul import mosaic_gpu as skinny_mosaic_gpu

    return skinny_mosaic_gpu.skinny_matmul(x, w, config=config, reduce=reduce, interpret=plgpu.InterpretGPUParams())
