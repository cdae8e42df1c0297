"""The loop's layouts for programs that run one piece of it alone (`Engine.profile`).

Inside `Engine.generate`'s while_loop XLA picks the physical layout of every carried buffer (the KV caches above all)
to suit the kernels that read it. A stage jitted alone gets its state in the default row-major layout, and on a GPU
XLA then transposes whole buffers at the program's entry and back at its exit: on the 36-layer proxy at batch 8 (H100,
docs/results/2026-12-07-profile-vs-loop-rounds-h100/) four `wrapped_transpose` kernels of ~0.1 ms each ran in every
profiled round and never in the loop. Here the state is held in the layouts XLA picks for the round compiled alone
with free ("AUTO") layouts, the nearest thing to the loop's carry that one can ask XLA for; each stage is compiled
with its state in them, hands a cache on in the layout it came in (`output_formats`) and the rest of its carry in
whatever layout XLA picks. Measured on H100s (docs/results/2026-12-07-profile-loop-layouts-h100/ and
2026-12-07-profile-vs-loop-stages-h100/): the transposes go, but stock's and DDTree's stages then copy the caches XLA
will not write in the state's layout, so their kernels do not move (4.596 -> 4.604, 11.967 -> 11.980 ms a round);
`Engine.profile` keeps them off by default.

PRNG key leaves keep their default layout (None below): a key's format is its raw uint32 data's, which the
`Format` of a key-typed leaf cannot name.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import jax
from jax.experimental.layout import Format, Layout


def is_key(x) -> bool:
    return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _auto(tree):
    return jax.tree.map(lambda x: None if is_key(x) else Format(Layout.AUTO), tree)


def _formats_like(formats, tree):
    """`formats` (a compiled program's, one per leaf of `tree`) with None at `tree`'s key leaves."""
    return jax.tree.map(lambda f, x: None if is_key(x) else f, formats, tree)


def loop_formats(round_fn: Callable, params, state) -> Any:
    """Per leaf of `state`, the layout XLA gives it in `round_fn(params, state) -> state` compiled alone with free
    layouts in and the same layouts out (as a loop's carry must keep them)."""
    free = jax.jit(round_fn, in_shardings=(None, _auto(state)), out_shardings=_auto(state))
    return _formats_like(free.lower(params, state).compile().input_formats[0][1], state)


def output_formats(out, inputs, input_formats) -> Any:
    """Layouts for a stage's outputs `out` (shapes) given its donated `inputs` (state, carry) in `input_formats`
    (None at keys): a returned `out["state"]` in the state's layouts, so the next round finds them; any other output of
    a donated input's shape and dtype (a cache a stage hands on) in that input's layout, the state's first, so XLA can
    update it in place (in another layout XLA copies it: +0.4 ms a round on the H100,
    docs/results/2026-12-07-profile-loop-layouts-h100/); the rest free."""
    layout_of: dict = {}
    for x, f in zip(jax.tree.leaves(inputs), jax.tree.structure(inputs).flatten_up_to(input_formats)):
        if not is_key(x):
            layout_of.setdefault((x.shape, x.dtype), f)
    leaves, tree = jax.tree.flatten(out)
    formats = jax.tree.unflatten(tree, [
        None if is_key(x) else layout_of.get((x.shape, x.dtype), Format(Layout.AUTO)) for x in leaves])
    return {k: input_formats[0] if k == "state" else v for k, v in formats.items()}


# jax's message when XLA would not produce an output in the layout asked for (jax 0.11: pxla.py)
_OVERRIDE = re.compile(r"\(XLA\) Layout\(major_to_minor=\(([\d, ]*)\).*?!= Layout\(major_to_minor=\(([\d, ]*)\).*?"
                       r"\(User output layout\) for type=(\S+)")


def _type_name(x) -> str:
    return f"{x.dtype.name}[{','.join(map(str, x.shape))}]"


def compile_pinned(fn: Callable, params, state, carry, in_formats, out_formats):
    """`fn` compiled with state and carry donated in `in_formats` and its outputs in `out_formats`, except where XLA
    will not write an output in the layout asked for (a stage writing the drafter's context on an H100): that output
    takes XLA's layout, and if XLA overrides the same type again (it did on the H100, whose stock draft stage never
    converged that way), the default row-major one, which XLA always writes. Either way the next program gets a copy."""
    out_shapes = jax.eval_shape(fn, params, state, carry)
    leaves, tree = jax.tree.flatten(out_shapes)
    overridden: set[str] = set()
    for _ in range(2 * len(leaves) + 1):
        try:
            return jax.jit(fn, in_shardings=(None, *in_formats), out_shardings=out_formats,
                           donate_argnums=(1, 2)).lower(params, state, carry).compile()
        except AssertionError as e:
            m = _OVERRIDE.search(str(e))
            if m is None:
                raise
            xla, asked = (tuple(int(d) for d in g.split(",") if d.strip()) for g in m.groups()[:2])
            type_name = m.group(3)

            def retry(x, f):
                if f is None or _type_name(x) != type_name or getattr(f.layout, "major_to_minor", None) != asked:
                    return f
                return None if type_name in overridden else Format(Layout(major_to_minor=xla), f.sharding)

            # up to the outputs' structure: a None output (an empty subtree) holds no format, a None format is a leaf's
            formats = tree.flatten_up_to(out_formats)
            out_formats = jax.tree.unflatten(tree, [retry(x, f) for x, f in zip(leaves, formats)])
            overridden.add(type_name)
    raise RuntimeError(f"{getattr(fn, '__name__', fn)}: XLA kept overriding output layouts")


def pinned_stage(fn: Callable, state_formats) -> Callable:
    """`fn(params, state, carry) -> carry` jitted with state and carry donated, compiled on its first call: the state
    in `state_formats`, the carry in the layouts the arguments have (the previous stage's output), the outputs as
    `output_formats` says (where XLA can write them so: `compile_pinned`)."""
    compiled = None

    def call(params, state, carry):
        nonlocal compiled
        if compiled is None:
            in_formats = (state_formats, jax.tree.map(lambda x: None if is_key(x) else x.format, carry))
            out_formats = output_formats(jax.eval_shape(fn, params, state, carry), (state, carry), in_formats)
            compiled = compile_pinned(fn, params, state, carry, in_formats, out_formats)
        return compiled(params, state, carry)

    return call


def fresh_copies(tree):
    """Device copies of every leaf in its own layout (`jnp.copy` would return row-major ones), finished before it
    returns."""
    return jax.block_until_ready(jax.tree.map(
        lambda x: jax.device_put(x, may_alias=False) if is_key(x) else jax.device_put(x, x.format, may_alias=False),
        tree))
