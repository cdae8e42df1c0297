"""specpilot.decoding.layouts: stages compiled for given state layouts keep them, compute what a default-layout jit
computes, and profile rounds the same way (the layouts change where bytes sit, never a value)."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.layout import Format, Layout

from specpilot.decoding import layouts


def transposed(x):
    """x's format with its dimensions' order reversed (row-major is the default; this one never is for rank ≥ 2)."""
    return Format(Layout(major_to_minor=tuple(range(x.ndim))), x.sharding)


def stage(params, state, carry):
    return {"state": {"cache": state["cache"] * params + carry["delta"], "key": jax.random.split(state["key"])[0]},
            "sum": state["cache"].sum(axis=0)}


def test_pinned_stage_keeps_the_state_layouts_and_the_values():
    cache = jnp.arange(24.0).reshape(2, 3, 4)
    state = {"cache": cache, "key": jax.random.key(1)}
    formats = {"cache": transposed(cache), "key": None}
    carry = {"delta": jnp.ones((2, 3, 4))}
    want = jax.jit(stage)(2.0, state, carry)
    pinned = layouts.pinned_stage(stage, formats)
    inputs = layouts.fresh_copies((jax.device_put(state, formats), carry))
    assert inputs[0]["cache"].format.layout.major_to_minor == (0, 1, 2)  # a copy keeps its layout (jnp.copy would not)
    got = pinned(2.0, *inputs)
    assert got["state"]["cache"].format.layout.major_to_minor == (0, 1, 2)  # back in the state's layout
    np.testing.assert_array_equal(got["state"]["cache"], want["state"]["cache"])
    np.testing.assert_array_equal(got["sum"], want["sum"])
    np.testing.assert_array_equal(jax.random.key_data(got["state"]["key"]), jax.random.key_data(want["state"]["key"]))
    again = pinned(2.0, *layouts.fresh_copies((jax.device_put(state, formats), carry)))  # compiled once, reused
    np.testing.assert_array_equal(again["state"]["cache"], want["state"]["cache"])


def test_loop_formats_names_one_format_a_leaf_and_none_for_keys():
    state = {"cache": jnp.ones((2, 3, 4)), "key": jax.random.key(0)}
    formats = layouts.loop_formats(lambda p, s: {"cache": s["cache"] * p, "key": s["key"]}, 3.0, state)
    assert formats["key"] is None and formats["cache"].layout.major_to_minor in ((0, 1, 2), (2, 1, 0), (0, 2, 1))
    moved = jax.device_put(state, formats)
    np.testing.assert_array_equal(moved["cache"], state["cache"])
