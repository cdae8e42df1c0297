"""specpilot.decoding.layouts: stages compiled for the loop's state layouts compute what a default-layout jit computes,
hand caches on in their donated layouts, and profile rounds the same way (layouts move bytes, never a value).

XLA's CPU backend keeps every output row-major, so the layouts a GPU would pick are checked where they are chosen
(`output_formats`) and the compiled stages run with the formats the CPU gives."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.layout import Format, Layout

from specpilot.decoding import layouts


def transposed(x):
    """x's format with its dimensions' order reversed (row-major, major_to_minor (0, 1, ...), is the default)."""
    return Format(Layout(major_to_minor=tuple(reversed(range(x.ndim)))), x.sharding)


def stage(params, state, carry):
    """With a None output before the others (an engine's carry holds some): formats must line up with arrays."""
    return {"empty": None, "state": {"cache": state["cache"] * params + carry["delta"], "key": jax.random.split(state["key"])[0]},
            "sum": state["cache"].sum(axis=0), "handed_on": state["cache"] + 1}


def inputs():
    return {"cache": jnp.arange(24.0).reshape(2, 3, 4), "key": jax.random.key(1)}, {"delta": jnp.ones((2, 3, 4))}


def test_output_formats_keep_the_state_and_hand_caches_on_in_the_donated_layout():
    state, carry = inputs()
    formats = ({"cache": transposed(state["cache"]), "key": None}, {"delta": carry["delta"].format})
    out = layouts.output_formats(jax.eval_shape(stage, 2.0, state, carry), (state, carry), formats)
    assert out["state"] is formats[0]  # the next round finds the state where the loop keeps it
    # shaped like the donated cache and delta: the state's layout wins (it is the loop's)
    assert out["handed_on"].layout.major_to_minor == (2, 1, 0)
    assert out["sum"].layout == Layout.AUTO  # shaped like no input: XLA picks


def test_pinned_stage_computes_what_a_plain_jit_does_and_copies_keep_their_layout():
    state, carry = inputs()
    want = jax.jit(stage)(2.0, state, carry)
    formats = layouts.loop_formats(lambda p, s: stage(p, s, carry)["state"], 2.0, state)
    assert formats["key"] is None and formats["cache"].layout.major_to_minor in ((0, 1, 2), (2, 1, 0), (0, 2, 1))
    pinned = layouts.pinned_stage(stage, formats)
    for _ in range(2):  # compiled once, then reused
        got = pinned(2.0, *layouts.fresh_copies((jax.device_put(state, formats), carry)))
        for k in ("sum", "handed_on"):
            np.testing.assert_array_equal(got[k], want[k])
        np.testing.assert_array_equal(got["state"]["cache"], want["state"]["cache"])
        np.testing.assert_array_equal(jax.random.key_data(got["state"]["key"]),
                                      jax.random.key_data(want["state"]["key"]))
    moved = jax.device_put(state["cache"], transposed(state["cache"]))  # inputs may take any layout, even on a CPU
    assert layouts.fresh_copies(moved).format.layout.major_to_minor == (2, 1, 0)  # jnp.copy would give (0, 1, 2)


def test_an_output_layout_xla_overrides_takes_xlas_layout():
    """The CPU writes every output row-major: a stage asked for a transposed output compiles with XLA's layout for
    that output (as a GPU does for some caches) and keeps the asked layouts elsewhere."""
    state, carry = inputs()
    in_formats = jax.tree.map(lambda x: None if layouts.is_key(x) else x.format, (state, carry))
    out = layouts.output_formats(jax.eval_shape(stage, 2.0, state, carry), (state, carry), in_formats)
    out["handed_on"] = transposed(state["cache"])
    compiled = layouts.compile_pinned(stage, 2.0, state, carry, in_formats, out)
    got = compiled(2.0, *layouts.fresh_copies((state, carry)))
    assert got["handed_on"].format.layout.major_to_minor == (0, 1, 2)
    np.testing.assert_array_equal(got["handed_on"], state["cache"] + 1)
    with pytest.raises(AssertionError, match="layout override"):  # what compile_pinned answers
        jax.jit(stage, in_shardings=(None, *in_formats), out_shardings=out, donate_argnums=(1, 2)).lower(
            2.0, state, carry).compile()
