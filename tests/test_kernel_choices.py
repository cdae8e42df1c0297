"""`pallas_kernels.choices`: one place sets which ops run on the Hopper kernels, and the config's `kernels` group
reaches it through `build.load_models`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models as tm
from pallas_kernels import choices, pdl
from pallas_kernels.add_rms_norm import ops as norm_ops
from pallas_kernels.skinny_matmul import ops as skinny_ops


@pytest.fixture
def restored():
    """Whatever a test sets is set back: the choices are process-wide, and xdist runs other files in this process."""
    before = choices.current()
    yield
    choices.use(**before)


def test_use_sets_the_modules_defaults_and_returns_the_old_ones(restored):
    before = choices.current()
    assert set(before) == {*choices.OPS, "pdl"}
    old = choices.use(matmul="mosaic_gpu", norm="mosaic_gpu", rope=None, pdl=True)
    assert old == before
    assert skinny_ops.DEFAULT == "mosaic_gpu" and norm_ops.DEFAULT == "mosaic_gpu" and pdl.ENABLED is True
    assert choices.current()["rope"] == before["rope"]  # None leaves it
    choices.use(**old)
    assert choices.current() == before


@pytest.mark.parametrize("kwargs, message", [
    ({"matmul": "triton"}, "kernels.matmul: unknown implementation 'triton'"),
    ({"attention": "xla"}, "kernels: unknown op 'attention'"),
])
def test_a_bad_choice_names_itself_and_sets_nothing(restored, kwargs, message):
    before = choices.current()
    with pytest.raises(ValueError, match=message):
        choices.use(norm="mosaic_gpu", **kwargs)
    assert choices.current() == before


def test_kernel_choices_change_nothing_off_hopper(restored):
    """Off Hopper every kernel choice falls back to XLA's ops: the tiny model's logits are the same bits."""
    from specpilot.models import target
    from specpilot.models.kv_cache import init_cache
    from specpilot.models.weights import init_random_target

    if jax.devices()[0].platform == "gpu":
        pytest.skip("checks the CPU fallback")
    cfg = tm.target_config(vocab=64, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128)
    w = init_random_target(cfg, 0, jnp.bfloat16)
    tokens = jnp.asarray([[3, 9, 27, 41, 17]], jnp.int32)
    positions = jnp.arange(5, dtype=jnp.int32)[None]

    def logits():
        cache = init_cache(cfg.num_layers, 1, 16, cfg.num_kv_heads, cfg.head_dim, jnp.bfloat16)
        step = jax.jit(lambda w, c: target.forward(w, cfg, tokens, positions, c).logits)  # traced anew each call
        return np.asarray(step(w, cache))

    plain = logits()
    choices.use(matmul="mosaic_gpu", norm="mosaic_gpu", rope="mosaic_gpu", swiglu="mosaic_gpu",
                swiglu_matmul="mosaic_gpu")
    np.testing.assert_array_equal(logits(), plain)


BF16_TIE = 0.1
"""Token forcing's tie tolerance for the bf16 test below: about two bf16 steps of its logits (magnitude 4-16). AR
(one row a step) and a verify pass (a block or a tree of rows) add attention's f32 partials over other KV splits, and
run some projections of many rows on XLA's dots, so their logits may differ in the last bits and a near-tie may flip
(on an H100, with AR on XLA's attention, stock and DDTree left AR at a 13th token): the gate that counts is token
forcing's, as the search's."""


@pytest.mark.gpu
@pytest.mark.skipif(jax.devices()[0].platform != "gpu", reason="Hopper kernels need an H100/H200")
@pytest.mark.parametrize("name", ["stock", "ddtree"])
def test_engines_on_the_hopper_kernels_pass_token_forcing(restored, name):
    """Lossless on the kernels the engines run on Hopper (``conf/kernels/hopper.yaml``: the skinny matmul, add + norm,
    q/k norm + rope, gate|up + SwiGLU on two-CTA clusters) and the tree-attention kernel, in bf16 at widths the kernels
    tile (hidden 1024, head_dim 128): every token a speculative engine commits is AR's on the same kernels, or a
    numeric tie (``BF16_TIE``), and most are AR's outright."""
    from pathlib import Path

    import yaml

    from specpilot.decoding import make_engine
    from specpilot.forcing import force, target_margin_fn

    hopper = yaml.safe_load((Path(__file__).resolve().parents[1] / "conf" / "kernels" / "hopper.yaml").read_text())
    choices.use(**hopper)
    tcfg = tm.target_config(vocab=256, hidden=1024, heads=8, kv_heads=2, head_dim=128, intermediate=2048)
    tcfg, tw, dcfg, dw = tm.repeat_pair(tcfg, block_size=8, embed_scale=0.6, seed=0, dtype=jnp.bfloat16)
    prompts = tm.prompts(2, 256, lengths=(3, 6), seed=1, exclude=(255,))
    spec = {"name": name, "attention": "pallas_tree", **({"tree_budget": 15} if name == "ddtree" else {})}
    ar = make_engine({"name": "ar", "attention": "pallas_tree"}, tcfg, tw, dcfg, dw, context=64).generate(prompts, 24)
    engine = make_engine(spec, tcfg, tw, dcfg, dw, context=128)  # forcing restarts: prompt + 2 x 24 + scratch
    report = force(engine, ar.tokens, prompts, target_margin_fn(tw, tcfg), reference_name="ar", tie_tolerance=BF16_TIE)
    assert report.passed, report.to_json()
    assert report.positions_checked == 48 and len(report.ties) <= 4, report.to_json()
