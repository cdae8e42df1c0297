"""A deployment made runnable: its models, its prompt batches, and an engine for any engine config.

`ModelBackend` is the real one (models from the proxy pair, a checkpoint or random weights; every
engine through `specpilot.decoding.make_engine`). `FakeBackend` runs the scripted `FakeEngine`, whose
acceptance and stage times follow `scripted_fake_model`, so the loop above it can be tested in
milliseconds with exact numbers; its measured time is simulated (rounds × scripted round time).

Every engine of one backend shares one KV capacity (room for token forcing: prompt + 2 × max_new, plus
the largest tree this deployment allows), so engines are compared on equal footing.
"""

from __future__ import annotations

import collections
import logging
import math
import time
from typing import Any, Sequence

import numpy as np

log = logging.getLogger("specpilot.search")

# Built-in prompt set for targets with a tokenizer: short Python openings, the proxy's domain.
CODE_PROMPTS = (
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "import os\n\n\ndef list_python_files(root):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "def is_prime(n: int) -> bool:\n",
    "for i, line in enumerate(open(path)):\n",
    "def merge_sorted(a, b):\n    result = []\n",
    "with open(filename) as f:\n    data = json.load(f)\n",
    "def parse_args(argv=None):\n    parser = argparse.ArgumentParser(\n",
)


def batches(prompts: Sequence[Sequence[int]], batch: int) -> list[list[list[int]]]:
    return [[list(p) for p in prompts[i : i + batch]] for i in range(0, len(prompts), batch)]


def pad_len(group: Sequence[Sequence[int]], max_new: int) -> int:
    """The padded width token forcing uses for this batch; timing uses the same, so one program serves both."""
    return max(len(p) for p in group) + max_new


# ---- the real backend ---------------------------------------------------------------------------------


def resolve_proxy(name: str):
    """(target_dir, drafter_dir) of the trained proxy pair `name`, or None when the proxy code is absent."""
    try:
        from specpilot.training.proxy import ensure_proxy  # issue 5
    except ImportError:
        return None
    got = ensure_proxy(name)
    if isinstance(got, (tuple, list)) and len(got) == 2:
        return str(got[0]), str(got[1])
    if isinstance(got, dict):
        return str(got["target"]), str(got["drafter"])
    for t, d in (("target_dir", "drafter_dir"), ("target_path", "drafter_path"), ("target", "drafter")):
        if hasattr(got, t) and hasattr(got, d):
            return str(getattr(got, t)), str(getattr(got, d))
    raise TypeError(f"ensure_proxy({name!r}) returned {type(got).__name__}; expected (target_dir, drafter_dir)")


class ModelBackend:
    def __init__(self, cfg):
        """cfg: a validated RootConfig (its `deployment` group says which models, prompts and batch)."""
        from specpilot.build import load_models
        from specpilot.decoding.sampling import Sampling

        dep = cfg.deployment
        self.cfg = cfg
        source = "config"
        if dep.models != "config":
            paths = resolve_proxy(dep.models)
            if paths is None:
                log.warning("deployment.models=%s: the trained proxy pair is not available yet "
                            "(specpilot.training.proxy); using target.path / drafter.path / random weights of "
                            "the model group instead", dep.models)
            else:
                cfg = cfg.model_copy(update={
                    "target": cfg.target.model_copy(update={"path": paths[0]}),
                    "drafter": cfg.drafter.model_copy(update={"path": paths[1]}),
                })
                source = dep.models
        self.cfg = cfg
        self.target_cfg, self.target_w, self.drafter_cfg, self.drafter_w, self.tokenizer = load_models(cfg, True)
        if dep.target_passthrough_layers:
            from specpilot.models.weights import add_passthrough_layers

            self.target_cfg, self.target_w = add_passthrough_layers(self.target_cfg, self.target_w,
                                                                    dep.target_passthrough_layers)
        self.max_new = dep.max_new_tokens
        self.source = source
        self.prompts = self._prompts(cfg)
        self.prompt_groups = batches(self.prompts, dep.batch)
        longest = max(len(p) for p in self.prompts)
        self.context = longest + 2 * self.max_new + max(dep.max_tree_budget, self.drafter_cfg.block_size) + 8
        self.sampling = Sampling(temperature=float(dep.temperature), top_k=cfg.sampling.top_k,
                                 top_p=float(cfg.sampling.top_p))
        self.greedy = Sampling()
        self._engines: collections.OrderedDict = collections.OrderedDict()
        self._margin_fn = None
        self.descriptor = self._describe(source)

    def _prompts(self, cfg) -> list[list[int]]:
        from specpilot.config import ConfigError

        dep, vocab = cfg.deployment, self.target_cfg.vocab_size
        kind = dep.prompts
        if kind == "auto":
            kind = "heldout" if self.source != "config" else "code" if self.tokenizer is not None else "synthetic"
        if kind in ("code", "heldout") or (isinstance(kind, list) and isinstance(kind[0], str)):
            if self.tokenizer is None:
                raise ConfigError.at("deployment.prompts", "text prompts need a target with a tokenizer; use synthetic")
            if kind == "heldout":
                ids = self._heldout(dep)
                if ids:
                    return ids
                kind = "code"
            texts = kind if isinstance(kind, list) else [CODE_PROMPTS[i % len(CODE_PROMPTS)]
                                                         for i in range(dep.num_prompts)]
            ids = [list(self.tokenizer.encode(t)) for t in texts]
            if not isinstance(kind, list):  # one length for all: one compiled program serves every batch
                n = min(dep.prompt_len, *(len(p) for p in ids))
                ids = [p[:n] for p in ids]
            return ids
        if isinstance(kind, list):
            bad = [t for p in kind for t in p if t >= vocab]
            if bad:
                raise ConfigError.at("deployment.prompts", f"token id {bad[0]} outside the vocabulary [0, {vocab})")
            return [list(p) for p in kind]
        # synthetic: seeded ids, avoiding the drafter's mask token and EOS so no prompt ends a request at once
        avoid = {self.drafter_cfg.mask_token_id, *self.target_cfg.eos_token_ids}
        allowed = np.array([t for t in range(vocab) if t not in avoid])
        rng = np.random.default_rng(cfg.seed)
        return [rng.choice(allowed, size=dep.prompt_len).tolist() for _ in range(dep.num_prompts)]

    def _heldout(self, dep) -> list[list[int]]:
        """`num_prompts` held-out snippets of the proxy's corpus, cut to `prompt_len` tokens ([] if unavailable)."""
        try:
            from specpilot.training.corpus import held_out_snippets, load_corpus
            from specpilot.training.spec import load_spec

            corpus = load_corpus(load_spec(self.source if self.source != "config" else "proxy_tiny").corpus)
            texts = held_out_snippets(corpus, 4 * dep.num_prompts)
        except Exception as e:  # no training package, no corpus: say so and use the built-in snippets
            log.warning("deployment.prompts=heldout unavailable (%s); using the built-in code prompts",
                        " ".join(str(e).split())[:160])
            return []
        out = []
        for t in texts:
            ids = list(self.tokenizer.encode(t))
            if len(ids) >= dep.prompt_len:
                out.append(ids[: dep.prompt_len])
            if len(out) == dep.num_prompts:
                return out
        log.warning("deployment.prompts=heldout: only %d snippets of %d tokens; using the built-in code prompts",
                    len(out), dep.prompt_len)
        return []

    def _describe(self, source: str) -> dict:
        import jax

        t, d, dep = self.target_cfg, self.drafter_cfg, self.cfg.deployment
        dev = jax.devices()[0]
        return {
            "name": dep.name,
            "gpu": dep.gpu,
            "platform": dev.platform,
            "device_kind": dev.device_kind,
            "models": source if source != "config" else (self.cfg.target.path or "random"),
            "target": {"family": t.family, "vocab_size": t.vocab_size, "hidden_size": t.hidden_size,
                       "intermediate_size": t.intermediate_size, "num_layers": t.num_layers,
                       "num_heads": t.num_heads, "num_kv_heads": t.num_kv_heads, "head_dim": t.head_dim,
                       "dtype": self.cfg.target.dtype},
            "drafter": {"num_layers": d.layers.num_layers, "block_size": d.block_size},
            "batch": dep.batch,
            "temperature": float(dep.temperature),
            "max_new_tokens": self.max_new,
            "num_prompts": len(self.prompts),
            "prompt_len": max(len(p) for p in self.prompts),
            "max_tree_budget": dep.max_tree_budget,
            "kernels": self.cfg.kernels.model_dump(),  # applied process-wide by load_models
        }

    def engine(self, engine_cfg: dict, greedy: bool = False):
        from specpilot.agent.space import config_key, normalize
        from specpilot.decoding import make_engine

        sampling = self.greedy if greedy or self.sampling.greedy else self.sampling
        key = (config_key(engine_cfg), sampling)
        if key not in self._engines:
            self._engines[key] = make_engine(normalize(engine_cfg), self.target_cfg, self.target_w,
                                             self.drafter_cfg, self.drafter_w, sampling, self.context)
            while len(self._engines) > 4:  # each engine holds its compiled programs (and w12/tlv weight copies)
                self._engines.popitem(last=False)
        self._engines.move_to_end(key)
        return self._engines[key]

    def margin_fn(self):
        if self._margin_fn is None:
            from specpilot.forcing import target_margin_fn

            self._margin_fn = target_margin_fn(self.target_w, self.target_cfg)
        return self._margin_fn

    def timed_generate(self, engine, group):
        t0 = time.perf_counter()
        result = engine.generate(group, self.max_new, pad_to=pad_len(group, self.max_new))
        return result, time.perf_counter() - t0

    def ceilings(self, engine_cfg: dict, profile: dict) -> tuple[dict, str]:
        from specpilot.agent.ceilings import ceilings_for
        from specpilot.costmodel.predict import observed_budgets

        # the committed prompt (as bench.py's --context), not the KV capacity; the weights' own dtype (float32 on cpu);
        # a specpilot engine's budgets in the shares it chose them
        return ceilings_for(self.target_cfg, self.drafter_cfg, engine_cfg, self.cfg.deployment.batch,
                            max(len(p) for p in self.prompt_groups[0]), self.cfg.deployment.gpu,
                            self.target_w.embed.dtype.itemsize, observed_budgets(profile, engine_cfg))

    def spec(self) -> tuple:
        """What a worker process needs to build the same backend."""
        return ("model", self.cfg.model_dump())


# ---- the scripted fake --------------------------------------------------------------------------------


def _cycle(tau: float, n: int = 10) -> tuple[int, ...]:
    """n integers >= 1 whose mean is tau (rounded to 1/n)."""
    total = max(n, int(round(tau * n)))
    base, extra = divmod(total, n)
    return tuple(base + (1 if i < extra else 0) for i in range(n))


def scripted_fake_model(cfg: dict) -> dict:
    """FakeEngine arguments for an engine config: a small, deterministic world with a known optimum.

    AR: 10 ms per token. Stock: τ 3. Trees raise τ with log(budget) while verify and tree building grow
    with the budget (optimum near 64 nodes); specpilot verifies fewer nodes for the same τ; tlv verifies
    one path exactly after a cheap level-1 pass; w12 cuts verify by 20%. `tree_budget=13` is a planted
    cheat: much faster, but it corrupts every third token (token forcing must reject it).
    """
    name = cfg["name"]
    block = cfg.get("block_size") or 16
    w = 0.8 if cfg.get("weight_format") == "w12" else 1.0
    if name == "ar":
        return {"acceptance": (1,), "stage_ms": {"verify": 10.0 * w, "commit": 0.2}}
    draft = 0.5 + 0.1 * block
    if name == "stock":
        tau = min(3.0, block - 1.0)
        return {"acceptance": _cycle(tau),
                "stage_ms": {"draft": draft, "tree": 0.1, "verify": (10.0 + 0.01 * block) * w, "commit": 0.3}}
    n = cfg["tree_budget"]
    if n == 13:
        return {"acceptance": (12,), "stage_ms": {"draft": 0.1, "tree": 0.1, "verify": 1.0, "commit": 0.1},
                "corrupt_every": 3}
    tau = min(max(3.0 + 0.9 * math.log2(max(n, 1) / 8), 1.5), block - 1.0)
    if name == "ddtree":
        stages = {"draft": draft, "tree": 0.2 + 0.01 * n, "verify": (10.0 + 0.05 * n) * w, "commit": 0.3}
    elif name == "specpilot":
        stages = {"draft": draft, "tree": 0.2 + 0.01 * n, "verify": (10.0 + 0.03 * n) * w, "commit": 0.3}
    else:  # tlv
        level1 = 0.015 if cfg.get("level1_format") == "fp8" else 0.02
        stages = {"draft": draft, "tree": 0.2 + 0.01 * n, "level1": 2.0 + level1 * n, "verify": 9.0 * w,
                  "commit": 0.3}
        tau *= 0.95
    return {"acceptance": _cycle(tau), "stage_ms": stages}


class FakeBackend:
    """A deployment of scripted engines. `delay_s` sleeps once per trial (to make a search slow enough to
    kill mid-round in tests); `eval_log` gets one line per trial started."""

    def __init__(self, name: str = "fake", batch: int = 1, num_prompts: int = 2, max_new: int = 24,
                 max_tree_budget: int = 256, drafter_block_size: int = 16, target_dtype: str = "bfloat16",
                 temperature: float = 0.0, gpu: str = "none", model_fn=scripted_fake_model, delay_s: float = 0.0,
                 eval_log: str | None = None):
        self.kwargs = dict(name=name, batch=batch, num_prompts=num_prompts, max_new=max_new,
                           max_tree_budget=max_tree_budget, drafter_block_size=drafter_block_size,
                           target_dtype=target_dtype, temperature=temperature, gpu=gpu, model_fn=model_fn,
                           delay_s=delay_s, eval_log=eval_log)
        self.model_fn, self.delay_s, self.eval_log = model_fn, delay_s, eval_log
        self.max_new = max_new
        self.prompts = [[1 + i, 2 + i, 3 + i] for i in range(num_prompts)]
        self.prompt_groups = batches(self.prompts, batch)
        self.descriptor = {
            "name": name, "gpu": gpu, "platform": "fake", "device_kind": "fake", "models": "scripted",
            "target": {"family": "fake", "vocab_size": 97, "dtype": target_dtype},
            "drafter": {"num_layers": 1, "block_size": drafter_block_size},
            "batch": batch, "temperature": temperature, "max_new_tokens": max_new, "num_prompts": num_prompts,
            "max_tree_budget": max_tree_budget,
        }

    def started(self, job: dict) -> None:
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.eval_log:
            import os

            with open(self.eval_log, "a") as f:
                f.write(job["id"] + "\n")
                f.flush()
                os.fsync(f.fileno())

    def engine(self, engine_cfg: dict, greedy: bool = False):
        from specpilot.decoding.fake import FakeEngine

        return FakeEngine(name=engine_cfg["name"], **self.model_fn(engine_cfg))

    def margin_fn(self):
        return lambda seqs: np.ones(len(seqs))  # every disagreement is decisive: a violation

    def timed_generate(self, engine, group):
        result = engine.generate(group, self.max_new, pad_to=pad_len(group, self.max_new))
        rounds = max(len(a) for a in result.acceptance_lengths)
        return result, rounds * sum(engine.stage_ms.values()) / 1e3

    def ceilings(self, engine_cfg: dict, profile: dict) -> tuple[dict, str]:
        # a scripted hardware limit: verify could run at 6 ms, everything else at 20% of its time
        return ({s: (6.0 if s == "verify" else 0.2 * ms) for s, ms in profile["stage_ms"].items()}, "scripted")

    def spec(self) -> tuple:
        return ("fake", self.kwargs)


def backend_from_spec(spec: tuple) -> Any:
    kind, payload = spec
    if kind == "fake":
        return FakeBackend(**payload)
    from specpilot.config import RootConfig

    return ModelBackend(RootConfig.model_validate(payload))
