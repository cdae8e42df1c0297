"""Acceptance report of a proxy pair: τ and the committed-length histogram of the speculative engines.

    python scripts/acceptance.py                                  # proxy_tiny (trained on first use), greedy, held-out
    python scripts/acceptance.py --temperature 1 --prompts humaneval
    python scripts/acceptance.py --target DIR --drafter DIR --engines stock ddtree --set ddtree.tree_budget=32

A table goes to stderr; the LAST stdout line is one JSON object {engine: {"tau": ..., "histogram": [...]}},
where histogram[i] counts the rounds that committed i + 1 tokens and τ is the mean tokens per round.
Plain argparse (no Hydra), so it runs on machines that only have JAX.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a bare checkout (GPU machine)

from specpilot.argtypes import non_negative_float, positive_int  # noqa: E402

CONF_ENGINE = Path(__file__).resolve().parents[1] / "conf" / "engine"
ENGINES = sorted(p.stem for p in CONF_ENGINE.glob("*.yaml"))


def _engine_overrides(ap, items: list[str], engines: list[str]) -> dict:
    """`--set ENGINE.KEY=VALUE` items as {engine: {knob: value}}; a knob that would be ignored (an engine not run, a
    key its conf/engine/ENGINE.yaml lacks) or, where pydantic is installed, a value the engine refuses is one line."""
    import yaml

    out: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        engine, dot, knob = key.partition(".")
        if not sep or not dot:
            ap.error(f"--set expects ENGINE.KEY=VALUE, got {item!r}")
        if engine not in engines:
            ap.error(f"--set {key}: {engine} is not among --engines ({' '.join(engines)})")
        defaults = yaml.safe_load((CONF_ENGINE / f"{engine}.yaml").read_text())
        if knob == "name" or knob not in defaults:
            ap.error(f"--set {key}: {engine} has no knob {knob!r} ({', '.join(k for k in defaults if k != 'name')})")
        out.setdefault(engine, {})[knob] = yaml.safe_load(value)
    try:
        from pydantic import TypeAdapter, ValidationError

        from specpilot.config import EngineConfig
    except ImportError:  # the GPU machine has no pydantic: the engines' own checks apply
        return out
    for engine, knobs in out.items():
        try:
            TypeAdapter(EngineConfig).validate_python(
                {**yaml.safe_load((CONF_ENGINE / f"{engine}.yaml").read_text()), **knobs})
        except ValidationError as e:
            err = e.errors()[0]
            loc = [str(part) for part in err["loc"][1:]]  # the first part is the engine's name
            ap.error(f"--set {engine}.{'.'.join(loc)}: {err['msg']}, got {knobs.get(loc[0], '?')!r}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--proxy", default="proxy_tiny", help="recipe (conf/proxy/): its pair, eval prompts and corpus")
    ap.add_argument("--target", help="target folder (default: the recipe's cached pair, trained if missing)")
    ap.add_argument("--drafter", help="drafter folder (with --target)")
    ap.add_argument("--engines", nargs="+", default=["stock", "ddtree", "specpilot"], choices=ENGINES)
    ap.add_argument("--temperature", type=non_negative_float, default=0.0)
    ap.add_argument("--prompts", default="heldout", choices=["heldout", "humaneval", "both"])
    ap.add_argument("--num-prompts", type=positive_int, help="default: the recipe's eval.num_prompts")
    ap.add_argument("--prompt-tokens", type=positive_int, help="default: the recipe's eval.prompt_tokens")
    ap.add_argument("--max-new-tokens", type=positive_int, help="default: the recipe's eval.max_new_tokens")
    ap.add_argument("--batch-size", type=positive_int, help="default: the recipe's eval.batch_size")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="ENGINE.KEY=VALUE",
                    help="engine knob override, e.g. ddtree.tree_budget=32")
    args = ap.parse_args(argv)
    overrides = _engine_overrides(ap, args.set, args.engines)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s: %(message)s")
    for noisy in ("jax", "absl", "orbax"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    from specpilot.training.acceptance import eval_prompts, measure
    from specpilot.training.corpus import load_corpus
    from specpilot.training.proxy import ensure_proxy
    from specpilot.training.spec import SpecError, load_spec
    from specpilot.training.tokenizer import load_tokenizer

    try:
        spec = load_spec(args.proxy)
    except SpecError as e:
        print(e, file=sys.stderr)
        return 2
    if bool(args.target) != bool(args.drafter):
        print("give both --target and --drafter, or neither", file=sys.stderr)
        return 2
    target, drafter = (Path(args.target), Path(args.drafter)) if args.target else ensure_proxy(spec)
    if not (target / "tokenizer.json").is_file():
        print(f"{target} has no tokenizer.json: prompts are built from text", file=sys.stderr)
        return 2
    e = spec.eval
    prompts = eval_prompts(args.prompts, load_tokenizer(target), load_corpus(spec.corpus),
                           args.num_prompts or e.num_prompts, args.prompt_tokens or e.prompt_tokens)
    results = measure(target, drafter, prompts, args.engines, args.temperature, args.max_new_tokens or e.max_new_tokens,
                      args.batch_size or e.batch_size, args.dtype, args.seed, overrides)
    print(f"{len(prompts)} {args.prompts} prompts, T={args.temperature:g}, target {target}", file=sys.stderr)
    print(f"{'engine':<10} {'tau':>6} {'rounds':>7}  histogram (rounds committing 1, 2, ... tokens)", file=sys.stderr)
    for name, r in results.items():
        print(f"{name:<10} {r['tau']:6.3f} {r['rounds']:7d}  {r['histogram']}", file=sys.stderr)
    print(json.dumps({name: {"tau": r["tau"], "histogram": r["histogram"]} for name, r in results.items()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
