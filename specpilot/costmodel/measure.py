"""Deployments (synthetic shapes or real checkpoints) and the measurements the cost model reads.

Nothing here imports the Hydra/pydantic config layer: the benchmark and reproduction scripts run on the
GPU machine with only jax, numpy (and optionally matplotlib) installed. Synthetic shapes come from
`conf/model/<name>.yaml`; the synthetic drafter is DFlash-b16-shaped (5 layers, block 16, context layers
spread over the target by z-lab's rule, as `specpilot.build` does).
"""

from __future__ import annotations

import dataclasses
import json
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from specpilot.costmodel import counts
from specpilot.costmodel.gaps import gap_report
from specpilot.costmodel.predict import StepTimeModel, config_label, measured_row, observed_budgets, program_variant
from specpilot.models.config import DrafterConfig, ModelConfig, model_config_from_shapes, synthetic_drafter_config

REPO = Path(__file__).resolve().parents[2]
# shared/ inside the checkout (as the GPU machine's copy has it) or beside it (this workstation).
ORACLE_PAIR = next((p for p in (REPO / "shared" / "oracle_pair", REPO.parent / "shared" / "oracle_pair")
                    if (p / "target").is_dir()), REPO.parent / "shared" / "oracle_pair")


# ---- shapes -------------------------------------------------------------------------------------------


def _read_yaml(path: Path) -> dict:
    try:
        import yaml

        return yaml.safe_load(path.read_text())
    except ImportError:  # two levels of `key: value` is all conf/model/*.yaml uses
        out: dict[str, Any] = {}
        section = None
        for line in path.read_text().splitlines():
            body = line.split("#", 1)[0].rstrip()
            if not body.strip() or ":" not in body:
                continue
            key, val = (s.strip() for s in body.split(":", 1))
            target = out if not line.startswith(" ") else out[section]
            if not line.startswith(" "):
                section = key
            if val == "":
                out[key] = {}
                continue
            low = val.lower()
            target[key] = (True if low == "true" else False if low == "false" else None if low in ("null", "~")
                           else _number(val))
        return out


def _number(val: str):
    for cast in (int, float):
        try:
            return cast(val)
        except ValueError:
            pass
    return val


def model_config(name: str) -> ModelConfig:
    """conf/model/<name>.yaml → ModelConfig (or a path to such a YAML file)."""
    path = Path(name) if name.endswith(".yaml") else REPO / "conf" / "model" / f"{name}.yaml"
    if not path.is_file():
        options = sorted(p.stem for p in (REPO / "conf" / "model").glob("*.yaml"))
        raise ValueError(f"model {name!r}: no {path} (available: {', '.join(options)})")
    return model_config_from_shapes(_read_yaml(path))


@dataclasses.dataclass
class Deployment:
    name: str
    synthetic: bool  # random weights: step times are real, acceptance is not
    target_cfg: ModelConfig
    target_w: Any
    drafter_cfg: DrafterConfig
    drafter_w: Any
    act_bytes: int
    prompts: list[list[int]] | None = None  # real prompts that come with a checkpoint pair

    @property
    def block(self) -> int:
        return self.drafter_cfg.block_size

    def describe(self) -> dict:
        t, d = self.target_cfg, self.drafter_cfg
        return {
            "name": self.name, "synthetic": self.synthetic, "act_bytes": self.act_bytes,
            "target": {k: getattr(t, k) for k in ("family", "vocab_size", "hidden_size", "intermediate_size",
                                                  "num_layers", "num_heads", "num_kv_heads", "head_dim")},
            "drafter": {"num_layers": d.layers.num_layers, "block_size": d.block_size,
                        "target_layer_ids": list(d.target_layer_ids)},
        }


def _dtype(name: str):
    import jax.numpy as jnp

    return {"bfloat16": jnp.bfloat16, "bf16": jnp.bfloat16, "float32": jnp.float32, "f32": jnp.float32}[name]


def synthetic_deployment(model: str, dtype: str = "bfloat16", seed: int = 0, drafter_layers: int = 5,
                         block_size: int = 16) -> Deployment:
    from specpilot.models.weights import init_random_drafter, init_random_target

    cfg = model_config(model)
    dcfg = synthetic_drafter_config(cfg, drafter_layers, block_size)
    dt = _dtype(dtype)
    return Deployment(name=f"{Path(model).stem} (synthetic)", synthetic=True, target_cfg=cfg,
                      target_w=init_random_target(cfg, seed, dt), drafter_cfg=dcfg,
                      drafter_w=init_random_drafter(dcfg, seed + 1, dt), act_bytes=np.dtype(dt).itemsize)


def checkpoint_deployment(target: str | Path, drafter: str | Path, dtype: str = "float32",
                          name: str | None = None) -> Deployment:
    """A real HF target + z-lab DFlash drafter. An `oracle.json` or `prompts.json` (a list of token-id
    lists, or {"prompts": [...]}) beside the two folders supplies the prompts."""
    from specpilot.models import hf

    dt = _dtype(dtype)
    tcfg, tw = hf.load_target(target, dt, None)
    dcfg, dw = hf.load_drafter(drafter, dt, None)
    prompts = None
    for f in ("oracle.json", "prompts.json"):
        p = Path(target).resolve().parent / f
        if p.is_file():
            d = json.loads(p.read_text())
            prompts = [list(map(int, x)) for x in (d["prompts"] if isinstance(d, dict) else d)]
            break
    return Deployment(name=name or Path(target).resolve().parent.name, synthetic=False, target_cfg=tcfg,
                      target_w=tw, drafter_cfg=dcfg, drafter_w=dw, act_bytes=np.dtype(dt).itemsize, prompts=prompts)


def random_prompts(batch: int, length: int, vocab: int, seed: int = 0, exclude: Sequence[int] = ()) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    allowed = np.setdiff1d(np.arange(vocab), np.asarray(exclude, dtype=np.int64))
    return [rng.choice(allowed, size=length).tolist() for _ in range(batch)]


def enable_compile_cache(path: str | Path | None, min_compile_s: float = 0.5) -> None:
    """jax's persistent compilation cache: identical programs of different engine instances (the shared
    draft stage, say) compile once per run, and a rerun on a still-warm machine skips compiling."""
    if not path:
        return
    import jax

    Path(path).mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_s)


# ---- measuring ------------------------------------------------------------------------------------------


def profile_engine(engine, prompts, max_new_tokens: int, rounds: int = 8, seed: int = 0,
                   eager_prefill: bool | None = None, gpu_time: bool = False, loop_layouts: bool = False) -> dict:
    """`Engine.profile`, with the prefill run op by op on an accelerator (None = auto): it is not
    timed, and for a 36-layer target skipping its compile saves ~30-60 s per (engine, batch)."""
    import jax

    if eager_prefill is None:
        eager_prefill = jax.devices()[0].platform != "cpu"
    if not hasattr(engine, "stages"):  # FakeEngine
        return engine.profile(prompts, max_new_tokens, rounds, seed)
    return engine.profile(prompts, max_new_tokens, rounds, seed, eager_prefill=eager_prefill, gpu_time=gpu_time,
                          loop_layouts=loop_layouts)


def slack_of(engine_cfg: dict, block: int) -> int:
    """Scratch cache slots one round writes past the committed prefix (the engine's `slack`)."""
    name = engine_cfg["name"]
    if name == "ar":
        return 1
    if name == "stock":
        return int(engine_cfg.get("block_size") or block)
    if name == "tlv":  # level 1 writes the whole tree
        return int(engine_cfg.get("tree_budget", 128)) + 1
    return counts.verify_nodes(engine_cfg, None) + 1


def build_engine(dep: Deployment, engine_cfg: dict, capacity: int, sampling=None):
    from specpilot.decoding import make_engine
    from specpilot.decoding.sampling import Sampling

    return make_engine(engine_cfg, dep.target_cfg, dep.target_w, dep.drafter_cfg, dep.drafter_w,
                       sampling or Sampling(), context=capacity)


def measure_row(dep: Deployment, engine_cfg: dict, batch: int, context: int, capacity: int, rounds: int, hw,
                seed: int = 0, eager_prefill: bool | None = None, max_new: int | None = None,
                gpu_time: bool = False) -> dict:
    """Profile one (engine, batch) on `batch` random prompts of `context` tokens; attach the ceilings
    and the gap report. `max_new` (default: room for `rounds` + 2 full rounds) sizes the output buffers,
    so it is part of every stage's compiled shapes."""
    block = dep.block
    max_new = max_new or (rounds + 2) * block
    prompts = random_prompts(batch, context, dep.target_cfg.vocab_size, seed, exclude=(dep.drafter_cfg.mask_token_id,))
    engine = build_engine(dep, engine_cfg, capacity)
    prof = profile_engine(engine, prompts, max_new, rounds, seed, eager_prefill, gpu_time)
    del engine
    # a specpilot engine that chose one budget in every timed round sits on the shared target-pass curve
    mix = observed_budgets(prof, engine_cfg)
    nodes = next(iter(mix)) if len(mix) == 1 else None
    costs, ceilings = counts.mixed_stage_costs(dep.target_cfg, dep.drafter_cfg, engine_cfg, batch, context,
                                               dep.act_bytes, mix, hw)
    return {
        **measured_row(prof, engine_cfg, block, nodes),
        "context": context,
        "capacity": capacity,
        "rounds": prof["rounds"],
        "costs": {s: c.to_json() for s, c in costs.items()},
        "ceilings_ms": ceilings,
        "gaps": gap_report(prof, ceilings) if ceilings else None,
    }


def kv_capacity(context: int, rounds: int, block: int, configs: Sequence[dict], multiple: int = 256) -> int:
    """KV slots a sweep needs (prefix + the rounds' tokens + the largest scratch), rounded up to `multiple`:
    the bench and the reproduction scripts then build the same shapes, so jax's persistent compilation
    cache serves one script's programs to the next."""
    need = context + (rounds + 2) * block + max(slack_of(c, block) for c in configs)
    return -(-need // multiple) * multiple


def kv_cache_bytes(dep: Deployment, batch: int, capacity: int) -> int:
    """The target's KV cache at `batch` rows of `capacity` slots."""
    t = dep.target_cfg
    return 2 * t.num_layers * batch * capacity * t.num_kv_heads * t.head_dim * dep.act_bytes


def warm_up_workers(requested: int, kv_cache_bytes: int, free_bytes: int | None, copies: int = 6) -> int:
    """Threads that fit the device: each warm-up runs a whole engine, whose state and unfused stage outputs
    hold about `copies` KV caches at once. At batch 32 on the H200 three threads ran out of memory
    (docs/h200_runbook.md). `free_bytes` None (a CPU): `requested`."""
    if free_bytes is None:
        return requested
    return max(1, min(requested, free_bytes // max(copies * kv_cache_bytes, 1)))


def _free_device_bytes() -> int | None:
    import jax

    stats = jax.devices()[0].memory_stats() if jax.devices()[0].platform != "cpu" else None
    if not stats or "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


def _warm_in_threads(what: str, run: Callable[[dict], Any], configs: Sequence[dict], batch: int, workers: int,
                     log: Callable[[str], None]) -> None:
    """`run(cfg)` for every config in `workers` threads (XLA compiles with the GIL released), so its programs land in
    jax's persistent compilation cache for the sequential, timed pass that follows. Skipped when the cache is off (it
    would compile everything twice); a failure is only logged (the timed pass reports it properly). The stages'
    donation hint is silenced around all the threads at once: a warnings filter is process state, and threads setting
    their own would restore each other's."""
    from concurrent.futures import ThreadPoolExecutor

    import jax

    if not jax.config.jax_compilation_cache_dir:
        log(f"  {what} skipped: the persistent compilation cache is off, so it would compile everything twice")
        return

    def one(cfg):
        try:
            run(cfg)
        except Exception as e:
            log(f"  {what} of {config_label(cfg)} B={batch} failed: {type(e).__name__}: {e}")

    with warnings.catch_warnings(), ThreadPoolExecutor(max_workers=workers) as pool:
        warnings.filterwarnings("ignore", "Some donated buffers were not usable")
        list(pool.map(one, configs))


def warm_up(dep: Deployment, configs: Sequence[dict], batch: int, context: int, capacity: int, rounds: int,
            seed: int = 0, eager_prefill: bool | None = None, workers: int = 1,
            log: Callable[[str], None] = print) -> None:
    """Compile every config's stages at `batch` in `workers` threads (`_warm_in_threads`), one round each, with the
    shapes of the timed pass (`rounds` sizes the output buffers): a sweep's wall time is mostly compilation. Needs the
    cache enabled (`enable_compile_cache`)."""
    _warm_in_threads("warm-up", lambda cfg: measure_row(dep, cfg, batch, context, capacity, 1, None, seed,
                                                        eager_prefill, max_new=(rounds + 2) * dep.block),
                     configs, batch, workers, log)


def sweep(dep: Deployment, configs: list[dict], batches: Sequence[int], context: int, rounds: int, hw,
          budget_s: float | None = None, log: Callable[[str], None] = print, seed: int = 0,
          eager_prefill: bool | None = None, capacity: int | None = None,
          on_row: Callable[[list[dict], list[dict]], None] | None = None,
          calibration: Sequence[dict] = (), compile_workers: int = 1,
          gpu_time: bool = False) -> tuple[list[dict], list[dict]]:
    """Measure every (config, batch), batch by batch in the given order; at each batch the `calibration`
    configs come first (rows tagged role "calibration": the cost model fits them but they are not among
    the configurations it is checked on; the others are role "config"). `specpilot` configs get their
    verify-cost table from the rows measured before them at the same batch (the cost model's fit).
    `compile_workers` > 1 compiles a batch's configs in parallel first (`warm_up`). `gpu_time`: rows also get
    `stage_gpu_ms`, each stage's kernel time from CUPTI (`Engine.profile`).
    Returns (rows, skipped); a config is skipped when the time spent plus the slowest config so far would
    exceed `budget_s`. `on_row(rows, skipped)` runs after each measurement (to save partial results)."""
    block = dep.block
    plan = [(c, "calibration") for c in calibration] + [(c, "config") for c in configs]
    capacity = capacity or kv_capacity(context, rounds, block, [c for c, _ in plan])
    rows, skipped, t_start, slowest = [], [], time.perf_counter(), 0.0
    for batch in batches:
        if compile_workers > 1 and (budget_s is None or time.perf_counter() - t_start + slowest < budget_s):
            t0 = time.perf_counter()
            # specpilot's cost table is fitted from this batch's rows: its program is compiled in the timed pass
            workers = warm_up_workers(compile_workers, kv_cache_bytes(dep, batch, capacity), _free_device_bytes())
            warm_up(dep, [c for c, _ in plan if c["name"] != "specpilot"], batch, context, capacity, rounds, seed,
                    eager_prefill, workers, log)
            log(f"[{time.perf_counter() - t_start:6.1f}s] compiled B={batch} in {workers} threads "
                f"({time.perf_counter() - t0:.1f}s)")
        for cfg, role in plan:
            elapsed = time.perf_counter() - t_start
            if budget_s is not None and elapsed + slowest > budget_s:
                skipped.append({"label": config_label(cfg), "batch": batch, "reason": f"time budget {budget_s:.0f} s"})
                log(f"[{elapsed:6.1f}s] skip {config_label(cfg)} B={batch}: time budget")
                continue
            if cfg["name"] == "specpilot":
                done = [r for r in rows if r["batch"] == batch]
                try:
                    cfg = StepTimeModel.fit(done).specpilot_config(cfg, batch, block)
                except (KeyError, ValueError):
                    pass  # nothing measured yet at this batch: keep the config's own table
            t0 = time.perf_counter()
            row = measure_row(dep, cfg, batch, context, capacity, rounds, hw, seed, eager_prefill, gpu_time=gpu_time)
            row["wall_s"] = time.perf_counter() - t0
            row["role"] = role
            slowest = max(slowest, row["wall_s"])
            rows.append(row)
            if on_row is not None:
                on_row(rows, skipped)
            stages = " ".join(f"{k}={v:.2f}" for k, v in row["stage_ms"].items())
            log(f"[{time.perf_counter() - t_start:6.1f}s] {row['label']:>22} B={batch:<3} "
                f"round {row['round_ms']:8.3f} ms ({stages}) in {row['wall_s']:.1f}s"
                + (" [calibration]" if role == "calibration" else ""))
    return rows, skipped


def loop_iterations(result) -> int:
    """Iterations of the fused loop in one `generate` call: its rows run in lockstep (a finished row rides along or is
    dropped), so as many as its longest-running request has rounds (the prefill's token is no round)."""
    return max(map(len, result.acceptance_lengths), default=0)


def lockstep_tau(results) -> float:
    """Tokens a row commits per iteration of the fused loop, over `generate` results: all rounds' tokens ÷ (rows ×
    the loop's iterations), summed over the results. The loop runs as long as its slowest row (`loop_iterations`), so
    at batch B this is the mean τ cut by the stragglers (batch 32 on the H200: stock τ 2.62, 1.29 here,
    docs/results/2026-12-07-batched-order-32-h200/); one row alone gets its τ."""
    committed = sum(a for res in results for row in res.acceptance_lengths for a in row)
    slots = sum(len(res.acceptance_lengths) * loop_iterations(res) for res in results)
    return committed / slots if slots else 0.0


def generate_chunks(engine, prompts: list[list[int]], max_new: int, batch: int, seed: int = 0) -> list:
    """`engine.generate` on `prompts` in chunks of `batch` (a last partial chunk dropped; fewer prompts than the batch
    are repeated), all padded to one length so one program serves every chunk."""
    pad = max(len(p) for p in prompts)
    if len(prompts) < batch:
        prompts = (prompts * batch)[:batch]
    chunks = [prompts[i: i + batch] for i in range(0, len(prompts) - batch + 1, batch)]
    return [engine.generate(c, max_new, seed, pad_to=pad) for c in chunks]


def warm_up_generation(dep: Deployment, configs: Sequence[dict], prompts: list[list[int]], max_new: int, batch: int,
                       capacity: int, seed: int = 0, workers: int = 1, log: Callable[[str], None] = print) -> None:
    """Compile every config's generation programs (prefill, and the fused loop at each batch its chunks shrink to)
    in `workers` threads (`_warm_in_threads`), each running its config's chunks once on an engine of its own:
    `measure_generate`'s own untimed run then loads them instead of compiling. A batch-8 table on the 36-layer proxy
    spent ~355 s of a 580 s device call compiling its four engines' loops one after another
    (docs/results/2026-12-07-batched-order-gpu-time-h100/). Needs the cache enabled (`enable_compile_cache`)."""
    _warm_in_threads("generation warm-up",
                     lambda cfg: generate_chunks(build_engine(dep, cfg, capacity), prompts, max_new, batch, seed),
                     configs, batch, workers, log)


def measure_generate(dep: Deployment, engine_cfg: dict, prompts: list[list[int]], max_new: int, batch: int,
                     capacity: int, seed: int = 0, repeats: int = 1) -> dict:
    """Fused-loop generation on real prompts in chunks of `batch` (a last partial chunk is dropped): τ and
    wall time (after a warm-up run that compiles every shape). All prompts are padded to one length so one
    program serves all chunks."""
    engine = build_engine(dep, engine_cfg, capacity)

    def run():
        return generate_chunks(engine, prompts, max_new, batch, seed)

    run()
    best = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        results = run()
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    lengths = [a for res in results for row in res.acceptance_lengths for a in row]
    tokens = sum(len(t) for res in results for t in res.tokens)
    steps = sum(map(loop_iterations, results))
    return {
        "label": config_label(engine_cfg),
        "batch": batch,
        "tau": float(np.mean(lengths)) if lengths else 0.0,
        "rounds": len(lengths),
        "tokens": tokens,
        "wall_s": best,
        "ms_per_token": 1e3 * best / max(tokens, 1),
        "loop_steps": steps,
        "loop_step_ms": 1e3 * best / max(steps, 1),
        "lockstep_tau": lockstep_tau(results),
        "stats": {k: v for r in results[:1] for k, v in r.stats.items() if k != "acceptance_histogram"},
        "tokens_out": [t for res in results for t in res.tokens],
    }


def generation_rows(dep: Deployment, configs_by_batch: dict[int, list[dict]], prompts: list[list[int]],
                    max_new: int, seed: int = 0, log: Callable[[str], None] = print, repeats: int = 1,
                    compile_workers: int = 1) -> list[dict]:
    """Real-acceptance measurements on a checkpoint pair: for each batch and config (AR first), τ, wall
    time of the fused loop, MEASURED speedup = AR's wall time ÷ the engine's for the same prompts and
    tokens, and whether the tokens equal AR's (greedy: they must). AR is the AR row of the configuration's own
    program variant (`predict.program_variant`: stock+w12 against AR+w12, as `predict.project` does), else the
    first AR row of the batch. `compile_workers` > 1 compiles a batch's generation programs in parallel first
    (`warm_up_generation`; the timed runs stay one at a time)."""
    block = dep.block
    out = []
    for batch, configs in configs_by_batch.items():
        configs = sorted(configs, key=lambda c: c["name"] != "ar")
        capacity = max(len(p) for p in prompts) + max_new + max(slack_of(c, block) for c in configs) + 1
        if compile_workers > 1:
            t0 = time.perf_counter()
            workers = warm_up_workers(compile_workers, kv_cache_bytes(dep, batch, capacity), _free_device_bytes())
            warm_up_generation(dep, configs, prompts, max_new, batch, capacity, seed, workers, log)
            log(f"compiled generation B={batch} in {workers} threads ({time.perf_counter() - t0:.1f}s)")
        ars: dict[str, dict] = {}
        for cfg in configs:
            t0 = time.perf_counter()
            g = measure_generate(dep, cfg, prompts, max_new, batch, capacity, seed, repeats)
            if cfg["name"] == "ar":
                ars.setdefault(program_variant(cfg), g)
            ar = ars.get(program_variant(cfg)) or next(iter(ars.values()), None)
            if ar is not None:
                g["speedup"] = ar["wall_s"] / g["wall_s"]
                g["lossless"] = g["tokens_out"] == ar["tokens_out"]
            log(f"generate {g['label']:>22} B={batch:<3} τ {g['tau']:.2f}  {g['ms_per_token']:.3f} ms/token"
                f"  speedup {g.get('speedup', float('nan')):.2f}  ({time.perf_counter() - t0:.1f}s)")
            out.append(g)
    for g in out:
        g.pop("tokens_out", None)
    return out


def tau_profile_from(gen_rows: list[dict], source: str, batch: int | None = None):
    """A TauProfile from measured generations: τ at `batch` (default the smallest measured), and at every batch with
    an AR row and speculative ones its lockstep share (`TauProfile.lockstep`)."""
    from specpilot.costmodel.predict import TauProfile

    batch = batch or min(g["batch"] for g in gen_rows)
    tau = {g["label"].split("+")[0]: g["tau"] for g in gen_rows if g["batch"] == batch and g["label"] != "ar"}
    lockstep = {}
    for b in sorted({g["batch"] for g in gen_rows}):
        rows = [g for g in gen_rows if g["batch"] == b and g.get("lockstep_tau") and g["tau"] > 0]
        ar = next((g for g in rows if g["label"] == "ar"), None)
        spec = [g["lockstep_tau"] / g["tau"] for g in rows if g["label"] != "ar"]
        if ar is not None and spec:
            lockstep[b] = float(np.mean(spec)) / (ar["lockstep_tau"] / ar["tau"])
    return TauProfile(tau=tau, source=f"{source}, batch {batch}", lockstep=lockstep)
