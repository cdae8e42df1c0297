"""One engine interface for AR and every speculative engine, and the jitted loop that drives it.

An engine is `prefill(prompts) -> state` plus `round(state) -> state` (named stages fused in one
trace), both pure and jittable. Generation is a `jax.lax.while_loop` over `round` (no host round trip
per round); the host only steps in when a large batch is half finished, to drop the finished rows
(`Engine.generate`). `LoopState` holds what every engine shares (committed tokens, round
counts, done flags, rng); `extra` holds the engine's own pytree (caches, drafter context, ...).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specpilot.decoding import layouts
from specpilot.decoding.common import (GenerateResult, append_tokens, check_prompts, first_eos, pad_prompts,
                                      pow2_at_least)


COMMAND_BUFFER_FLAGS = "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"
"""XLA_FLAGS that put while loops and conditionals inside XLA's command buffers (CUDA graphs) as well: the host then
no longer reads a `lax.switch`'s branch index back between launches. SpecPilot's switch cost +0.45 ms a round over
DDTree@64's step with them, +1.09 without (batch 8, H100: docs/results/2026-12-07-switch-conditional-graphs-h100/);
AR's and stock's loops moved −0.02 to +0.01 ms (docs/results/2026-12-07-loop-graphs-ab3-h100/). Not a default: the
benchmarks take them with `--command-buffers` (`use_command_buffers`), and say so in their provenance."""


def use_command_buffers() -> None:
    """Add `COMMAND_BUFFER_FLAGS` to XLA_FLAGS. XLA reads them once, when the backend starts: a process whose backend
    has started already gets a one-line error rather than flags that change nothing."""
    from jax._src import xla_bridge

    flags = os.environ.get("XLA_FLAGS", "")
    if COMMAND_BUFFER_FLAGS in flags.split():
        return
    if xla_bridge.backends_are_initialized():
        raise SystemExit("--command-buffers: XLA's backend has started in this process already; set XLA_FLAGS="
                         f"{COMMAND_BUFFER_FLAGS} before it starts")
    os.environ["XLA_FLAGS"] = f"{flags} {COMMAND_BUFFER_FLAGS}".strip()


def while_loops_in_command_buffers() -> bool:
    """Whether this process's XLA_FLAGS put while loops inside XLA's command buffers (`COMMAND_BUFFER_FLAGS`; the
    last `--xla_gpu_enable_command_buffer` counts: `+X` / `-X` items change XLA's default set, which holds no WHILE,
    bare items replace it). SpecPilot's `spec.switch_in_place` gave wrong results there on an H100 (a rerun of its
    fused loop returned negative acceptance lengths: docs/results/2026-12-07-switch-in-place-h100/), so its verify
    goes through `lax.switch` then."""
    on = False
    for flag in os.environ.get("XLA_FLAGS", "").split():
        name, _, value = flag.partition("=")
        if name != "--xla_gpu_enable_command_buffer":
            continue
        items = [v for v in value.split(",") if v]
        if items and all(v[0] in "+-" for v in items):
            for v in items:
                on = (v[0] == "+") if v[1:] == "WHILE" else on
        else:
            on = "WHILE" in items
    return on


CUPTI_COMPILER_OPTIONS = {"xla_gpu_enable_command_buffer": ""}
"""A program timed under CUPTI that holds control flow is compiled with these: no XLA command buffers
(`cupti_program`)."""


def holds_control_flow(lowered) -> bool:
    """Whether a lowered program holds a conditional (`lax.switch` / `lax.cond`) or a while loop (SpecPilot's
    `switch_in_place`; also jax.random's threefry hash, which XLA may unroll): under `COMMAND_BUFFER_FLAGS` XLA's
    command buffers run both as CUDA-graph conditional nodes."""
    text = lowered.as_text()
    return "stablehlo.case" in text or "stablehlo.while" in text


def cupti_program(fn, args: tuple):
    """The program a stage's CUPTI call runs: `fn` itself, or, where the stage holds control flow
    (`holds_control_flow`: SpecPilot's verify, every engine's commit), `fn` compiled for `args` without XLA's
    command buffers. Why: under command buffers CUPTI loses the durations of a conditional's kernels when other work
    precedes it in the program, so SpecPilot's verify stage showed 0.052 ms of kernels where 0.114 ran, DDTree@64's
    0.108 (docs/results/2026-12-07-cupti-switch-h100/). The flag leaves kernel durations as they are (a switch run
    alone: 0.327 ms of kernels with command buffers, 0.329 without), so the stages stay comparable. A stage that is
    not a jitted function (`layouts.pinned_stage`) is timed as it is."""
    return cupti_compiled(fn.lower(*args), fn) if hasattr(fn, "lower") else fn


def cupti_compiled(lowered, program):
    """`cupti_program` for a program already lowered (`lowered`; `program` is its usual compile): the compile without
    command buffers where it holds control flow, else `program`."""
    return lowered.compile(compiler_options=CUPTI_COMPILER_OPTIONS) if holds_control_flow(lowered) else program


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LoopState:
    out: jax.Array  # [B, max_new + slack] committed new tokens
    n_out: jax.Array  # [B] how many are valid
    last: jax.Array  # [B] last committed token (the next round's root)
    done: jax.Array  # [B] bool
    acc: jax.Array  # [B, max_rounds] tokens committed per round
    n_rounds: jax.Array  # [B]
    key: jax.Array
    extra: Any  # engine-specific pytree
    max_new: int = dataclasses.field(metadata=dict(static=True))
    # The public DFlash/DDTree loops run rounds while (committed − first token) < max_new, i.e. one
    # round more when the pending bonus token already completes max_new; True reproduces that.
    reference_stop: bool = dataclasses.field(default=False, metadata=dict(static=True))


def init_loop_state(
    first: jax.Array, max_new: int, slack: int, key: jax.Array, extra: Any, eos_ids: tuple[int, ...] = (),
    reference_stop: bool = False,
) -> LoopState:
    """The loop's state after prefill committed `first` [B]. A request that `first` already finishes (max_new = 1, or
    an EOS) starts done, so no round runs or is counted for it; `reference_stop` keeps the reference loops' rule
    (rounds while fewer than max_new tokens follow the first, whatever it is)."""
    b = first.shape[0]
    out = jnp.zeros((b, max_new + slack + 1), jnp.int32).at[:, 0].set(first)
    done = jnp.full((b,), max_new + int(reference_stop) <= 1)
    if eos_ids and not reference_stop:
        done = done | jnp.isin(first, jnp.asarray(eos_ids))
    return LoopState(
        out=out,
        n_out=jnp.ones((b,), jnp.int32),
        last=first,
        done=done,
        acc=jnp.zeros((b, max_new + 1), jnp.int32),  # each round commits >= 1; +1 for reference_stop
        n_rounds=jnp.zeros((b,), jnp.int32),
        key=key,
        extra=extra,
        max_new=max_new,
        reference_stop=reference_stop,
    )


def commit(state: LoopState, new: jax.Array, n_new: jax.Array, eos_ids: tuple[int, ...], extra: Any) -> LoopState:
    """Append each live request's committed tokens new[b, :n_new[b]]; finish on EOS or max_new.

    Finished requests commit nothing (their rounds are not counted). The count recorded per round is
    what the round produced, before truncation at max_new / EOS, as the reference loops do; `n_out`
    may exceed max_new inside the loop and is cut in `harvest_row`.
    """
    live = ~state.done
    n_new = jnp.where(live, n_new, 0)
    out = append_tokens(state.out, state.n_out, new, n_new)
    n_out = state.n_out + n_new
    stop, hit_eos = first_eos(out, n_out, eos_ids)
    n_out = jnp.minimum(n_out, stop)
    done = state.done | hit_eos | (n_out >= state.max_new + int(state.reference_stop))
    rows = jnp.arange(out.shape[0])
    acc = state.acc.at[rows, state.n_rounds].set(jnp.where(live, n_new, state.acc[rows, state.n_rounds]), mode="drop",
                                                 unique_indices=True)  # one slot a row
    last = jnp.take_along_axis(new, jnp.clip(n_new - 1, 0)[:, None], axis=1)[:, 0]
    return dataclasses.replace(
        state,
        out=out,
        n_out=n_out,
        last=jnp.where(live, last, state.last),
        done=done,
        acc=acc,
        n_rounds=state.n_rounds + live.astype(jnp.int32),
        extra=extra,
    )


class Engine:
    """Base class. Subclasses set `name`, `cfg` (the target's ModelConfig), `params` (a pytree of all
    weights the engine reads), `context` (cache capacity) and `slack` (most tokens one round commits),
    and define `prefill(params, tokens, lens, max_new, key) -> LoopState` and
    `round(params, state) -> LoopState`. Weights are jit arguments, never baked-in constants; every other setting
    (sampling, context, attention) is fixed when the engine is built: the first `generate` traces it into the loop.
    """

    name = "engine"
    slack = 1
    max_commit = 1  # most tokens one round commits (the acceptance histogram's length)

    def prefill(self, params, tokens, lens, max_new: int, key) -> LoopState:  # pragma: no cover - interface
        raise NotImplementedError

    def stages(self) -> list[tuple[str, Callable]]:  # pragma: no cover - interface
        """The round as named stages `fn(params, state, carry: dict) -> carry`; the last returns
        {"state": next_state}. `round` fuses them in one trace; `profile` times them one by one."""
        raise NotImplementedError

    def round(self, params, state: LoopState) -> LoopState:
        """The stages in one trace, each under its name's scope: the compiled loop's instructions carry it in their
        `op_name`, which is how `specpilot.costmodel.attribution` gives each of the loop's kernels to its stage."""
        carry: dict = {}
        for name, fn in self.stages():
            with jax.named_scope(name):
                carry = fn(params, state, carry)
        return carry["state"]

    def profile(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, rounds: int = 8, seed: int = 0,
                eager_prefill: bool = False, repeats: int = 5, gpu_time: bool = False, loop_layouts: bool = False
                ) -> dict:
        """Device time per round of each stage (ms), each stage jitted alone, over up to `rounds` rounds
        after one warm-up round. Feeds the cost model's measured components.

        Each stage is jitted with its state and carry donated and every timed call gets fresh copies of them
        (made before the clock starts), as in the fused loop of `generate`, where a stage updates the KV cache
        and the drafter's context in place. A stage jitted alone without donation copies every buffer it
        updates: on the H200 that was most of the commit stage's GPU time (the whole cache, for a
        compaction that moves a few slots) and ~0.1 ms of each batch-1 verify.

        The fused loop of `generate` keeps the GPU busy while the host dispatches, so what a stage costs there
        is its device time, not the host's handling of the call (hundreds of parameter leaves; twice as many
        with a level-1 copy). Per stage and round, two estimates of it are taken and the smaller counts:
        - synchronised: one call, minus `dispatch_ms` (the median synchronised call of a program taking the
          same arguments and doing nothing). Close for small stages, but a 36-layer step's call carries
          host jitter that moved whole runs by 15-20 % on the H200 (docs/results/2026-11-30-costmodel-*);
        - pipelined: `repeats` calls issued back to back on the same inputs (stages are pure) and one sync,
          minus one `dispatch_ms`, divided by `repeats`: host work overlaps the device, so a device-bound
          stage measures its device time; a host-bound one measures the host's per-call time, an overcount.
          `stage_issue_ms` is the host's time to issue one of those calls: near the stage's time, the stage is
          host-bound there, and its time is the host's, not the GPU's.
        Both overcount (jitter, host time), so the minimum is the tighter one. `stage_ms` is the mean over
        rounds; `stage_ms_rounds` keeps each round's value (the spread). `verified_nodes` lists, per timed
        round, the most tree nodes a request verified; `chosen_budgets`, per timed round, the budget a cost-aware
        `specpilot` round chose (which a tree with fewer valid nodes than it verifies only in part).
        `eager_prefill` runs the (untimed) prefill op by op instead of compiling it. `gpu_time` adds
        `stage_gpu_ms`: per stage, the summed run time of its kernels in one more call per timed round under CUPTI
        (`specpilot.costmodel.cupti`; launch gaps and host time excluded), `stage_gpu_kernels` the same per
        kernel name (ms a round, its launches summed, the largest first) and `stage_gpu_launches` the launches a
        round (a stage whose kernels CUPTI did not see shows few), where CUPTI exists; without it the
        result says why in `stage_gpu_error`. A stage holding control flow (SpecPilot's verify, the commit) is timed
        under CUPTI from a compile without command buffers (`cupti_program`). `loop_layouts` holds the state in the
        layouts XLA gives the round's carry and compiles each stage for them (`specpilot.decoding.layouts`): a stage
        alone in default layouts transposes whole caches at its entry and exit on a GPU, which the loop never does.
        Off by default: the speculative engines' stages then copy caches instead, and their kernel time did not move
        on an H100."""
        import time
        import warnings

        check_prompts(prompts, self.cfg, max_new_tokens, self.context, self.slack)
        tokens, lens = pad_prompts(prompts)
        prefill = self.prefill if eager_prefill else jax.jit(self.prefill, static_argnums=(3,))
        state = prefill(self.params, tokens, lens, max_new_tokens, jax.random.key(seed))
        if loop_layouts:
            formats = layouts.loop_formats(self.round, self.params, state)
            state = jax.device_put(state, formats)
            stage_fns = [(name, layouts.pinned_stage(fn, formats)) for name, fn in self.stages()]
        else:
            stage_fns = [(name, jax.jit(fn, donate_argnums=(1, 2))) for name, fn in self.stages()]
        dispatch = self._dispatch_seconds(state)
        per_round = {name: [] for name, _ in stage_fns}
        per_issue = {name: [] for name, _ in stage_fns}  # host seconds to issue one pipelined call
        timed_rounds, committed, nodes, budgets = 0, 0, [], []
        # stage -> kernel name -> ms summed over the timed rounds (each stage is timed once a timed round)
        gpu_kernels = {name: {} for name, _ in stage_fns} if gpu_time else None
        gpu_launches = {name: 0 for name, _ in stage_fns}  # stage -> launches summed over the timed rounds
        cupti_fns = {}  # stage -> the program its CUPTI call runs (`cupti_program`)
        gpu_error = None
        with warnings.catch_warnings():  # a stage forwards some donated buffers unchanged
            warnings.filterwarnings("ignore", "Some donated buffers were not usable")
            for r in range(rounds + 1):
                if bool(np.all(np.asarray(state.done))):
                    break
                carry, before = {}, np.asarray(state.n_out).sum()
                for name, fn in stage_fns:
                    inputs = layouts.fresh_copies((state, carry))
                    t0 = time.perf_counter()
                    out = jax.block_until_ready(fn(self.params, *inputs))
                    synced = time.perf_counter() - t0 - dispatch
                    if r > 0:
                        k = max(repeats, 1)
                        copies = [layouts.fresh_copies((state, carry)) for _ in range(k)]
                        t0 = time.perf_counter()
                        for copy in copies:
                            again = fn(self.params, *copy)
                        per_issue[name].append((time.perf_counter() - t0) / k)
                        jax.block_until_ready(again)
                        del again, copies
                        pipelined = (time.perf_counter() - t0 - dispatch) / k
                        per_round[name].append(max(min(synced, pipelined), 0.0))
                        if gpu_kernels is not None and gpu_error is None:
                            from specpilot.costmodel.cupti import kernel_timings

                            inputs = layouts.fresh_copies((state, carry))
                            if name not in cupti_fns:
                                cupti_fns[name] = cupti_program(fn, (self.params, *inputs))
                            try:
                                launches = kernel_timings(lambda: cupti_fns[name](self.params, *inputs))
                            except RuntimeError as e:  # no CUPTI here
                                gpu_error = str(e)
                            else:
                                gpu_launches[name] += len(launches)
                                for kernel, ms in launches:
                                    gpu_kernels[name][kernel] = gpu_kernels[name].get(kernel, 0.0) + ms
                        if "nodes" in out:
                            nodes.append(int(np.max(np.asarray(out["nodes"]))))
                        if "budget" in out:
                            budgets.append(int(out["budget"]))
                    carry = out
                # a stage may hand the state back in layouts XLA insisted on (`layouts.compile_pinned`): untimed copy
                state = jax.device_put(carry["state"], formats) if loop_layouts else carry["state"]
                if r > 0:
                    timed_rounds += 1
                    committed += int(np.asarray(state.n_out).sum() - before)
        n = max(timed_rounds, 1)
        stage_ms = {k: 1e3 * sum(v) / n for k, v in per_round.items()}
        gpu = {}
        if gpu_time:
            kernels = {k: {kernel: ms / n for kernel, ms in sorted(v.items(), key=lambda kv: -kv[1])}
                       for k, v in gpu_kernels.items()}
            gpu = {"stage_gpu_error": gpu_error} if gpu_error else {
                "stage_gpu_ms": {k: sum(v.values()) for k, v in kernels.items()}, "stage_gpu_kernels": kernels,
                "stage_gpu_launches": {k: v / n for k, v in gpu_launches.items()}}
        return {
            "engine": self.name,
            "batch": len(prompts),
            "rounds": timed_rounds,
            "stage_ms": stage_ms,
            **gpu,
            "stage_ms_rounds": {k: [round(1e3 * x, 4) for x in v] for k, v in per_round.items()},
            "stage_issue_ms": {k: 1e3 * sum(v) / max(len(v), 1) for k, v in per_issue.items()},
            "round_ms": sum(stage_ms.values()),
            "tokens_per_round": committed / n,
            "verified_nodes": nodes,
            **({"chosen_budgets": budgets} if budgets else {}),
            "dispatch_ms": 1e3 * dispatch,
        }

    def _dispatch_seconds(self, state, calls: int = 21) -> float:
        """Median wall time of one synchronised call of a program that takes (params, state) and computes
        nothing: the host-side cost every profiled stage call carries (`profile`)."""
        import time

        noop = jax.jit(lambda params, st: st.n_out[0], keep_unused=True)
        jax.block_until_ready(noop(self.params, state))
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            jax.block_until_ready(noop(self.params, state))
            times.append(time.perf_counter() - t0)
        return float(np.median(times))

    # Batches at least this large drop finished requests: the loop pauses when at most half the rows
    # are live, keeps the live ones (batch rounded up to a power of two, so few shapes compile) and
    # goes on. Smaller batches just run finished rows along (cheaper than another compile).
    shrink_from = 4

    # The jitted prefill and loop are made per engine, on first use: a jit with the engine as a static argument would
    # keep every engine (and the weight copies it holds: W12, TLV's level 1) alive in JAX's cache for the process.
    @functools.cached_property
    def _prefill(self):
        return jax.jit(self.prefill, static_argnums=(3,))

    @functools.cached_property
    def _run(self):
        def run(params, state: LoopState, pause_at_live: int) -> LoopState:
            """Rounds until every request is done or at most `pause_at_live` are live: one while_loop."""
            return jax.lax.while_loop(
                lambda s: jnp.any(~s.done) & (jnp.sum(~s.done) > pause_at_live), lambda s: self.round(params, s), state
            )

        return jax.jit(run, static_argnums=(2,), donate_argnums=(1,))

    def generate(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int, seed: int = 0, pad_to: int | None = None
    ) -> GenerateResult:
        check_prompts(prompts, self.cfg, max_new_tokens, self.context, self.slack)
        tokens, lens = pad_prompts(prompts, pad_to)
        state = self._prefill(self.params, tokens, lens, max_new_tokens, jax.random.key(seed))
        rows = np.arange(len(prompts))  # request index of each row; -1 = padding
        harvested: dict[int, tuple] = {}
        while True:
            b = rows.shape[0]
            state = self._run(self.params, state, b // 2 if b >= self.shrink_from else 0)
            host = jax.device_get((state.done, state.out, state.n_out, state.acc, state.n_rounds))
            done = host[0]
            counters = self.row_counters(state)
            for r, row in enumerate(rows):
                if row >= 0 and done[r] and row not in harvested:
                    harvested[row] = harvest_row(host[1:], state.max_new, r, counters)
            if done.all():
                break
            live = np.nonzero(~done)[0]
            keep = np.concatenate([live, np.full(pow2_at_least(len(live)) - len(live), live[0])])
            state = take_rows(state, jnp.asarray(keep))
            pad = np.arange(len(keep)) >= len(live)
            state = dataclasses.replace(state, done=state.done | jnp.asarray(pad))
            rows = np.where(pad, -1, rows[keep])
        ordered = [harvested[i] for i in range(len(prompts))]
        result = GenerateResult(
            engine=self.name, tokens=[h[0] for h in ordered], acceptance_lengths=[h[1] for h in ordered]
        )
        result.stats = self.summarize(result.acceptance_lengths, [h[2] for h in ordered])
        return result

    def row_counters(self, state: LoopState) -> dict[str, np.ndarray]:
        """Engine-specific per-request counters to keep when a request finishes (e.g. tree nodes)."""
        return {}

    def summarize(self, acceptance_lengths: list[list[int]], counters: list[dict]) -> dict:
        """Statistics over all requests: τ (tokens committed per round) and its histogram, plus what
        the engine adds. JSON-serialisable."""
        lengths = np.concatenate([np.asarray(a, np.int64) for a in acceptance_lengths] + [np.zeros(0, np.int64)])
        if lengths.size == 0:
            return {"tau": 0.0, "acceptance_histogram": []}
        return {
            "tau": float(lengths.mean()),
            "acceptance_histogram": np.bincount(lengths, minlength=self.max_commit + 1)[1:].tolist(),
        }


def harvest_row(host: tuple, max_new: int, r: int, counters: dict) -> tuple:
    """(tokens, acceptance lengths, counters) of row r, cut at max_new; `host` = numpy copies of
    (out, n_out, acc, n_rounds), fetched once per pause."""
    out, n_out, acc, n_rounds = host
    return (
        out[r, : min(int(n_out[r]), max_new)].tolist(),
        acc[r, : int(n_rounds[r])].tolist(),
        {k: float(v[r]) for k, v in counters.items()},
    )


def take_rows(tree, idx: jax.Array):
    """Rows `idx` of every per-request leaf (KV caches keep batch on axis 1; the rng key is shared)."""
    from specpilot.models.kv_cache import KVCache

    def take(x):
        if isinstance(x, KVCache):
            return KVCache(k=x.k[:, idx], v=x.v[:, idx], lengths=x.lengths[idx])
        if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) or x.ndim == 0:
            return x
        return x[idx]

    return jax.tree.map(take, tree, is_leaf=lambda x: isinstance(x, KVCache))
