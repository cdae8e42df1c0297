"""The proxy deployment: corpus → tokenizer → target → drafter → HF folders, cached by what decides them.

    ensure_proxy("proxy_tiny") -> (target_dir, drafter_dir)     # trains on first use, then loads in seconds

Folder `<cache>/<name>-<key>/` (key = hash of the recipe minus its bookkeeping keys, the corpus fingerprint and
this package's source): `tokenizer/`, `target/` (HF Qwen3 + tokenizer), `drafter/` (z-lab DFlash),
`report.json` (written last: its presence means complete), `run/` (orbax checkpoints, greedy data, W&B
offline files). An interrupted build resumes from its checkpoints when called again.

`python -m specpilot.training.proxy ...` is the train-and-measure command (`specpilot.training.run`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
import time
from pathlib import Path

from specpilot.training.spec import ProxySpec, load_spec

log = logging.getLogger(__name__)

PACKAGE = Path(__file__).resolve().parent
REPO = PACKAGE.parents[1]


def cache_root() -> Path:
    base = os.environ.get("SPECPILOT_CACHE") or str(Path.home() / ".cache" / "specpilot")
    return Path(base) / "proxy"


# The code that decides the trained weights (not the acceptance report or the command line). The model
# code (specpilot/models) is left out on purpose: the cached pair is an ordinary checkpoint any version loads.
WEIGHT_CODE = ("spec.py", "corpus.py", "tokenizer.py", "loop.py", "train_target.py", "train_drafter.py", "proxy.py")


def code_version() -> str:
    h = hashlib.sha256()
    for f in [PACKAGE / n for n in WEIGHT_CODE] + [REPO / "specpilot" / "models" / "export.py"]:
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()[:12]


def proxy_key(spec: ProxySpec, corpus_fingerprint: str) -> str:
    blob = json.dumps(spec.fingerprint_dict(), sort_keys=True) + corpus_fingerprint + code_version()
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _as_spec(spec_or_name: ProxySpec | str) -> ProxySpec:
    return spec_or_name if isinstance(spec_or_name, ProxySpec) else load_spec(spec_or_name)


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock across processes (several sessions may ask for the same proxy at once)."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def proxy_dir(spec_or_name: ProxySpec | str, root: str | Path | None = None) -> Path:
    from specpilot.training.corpus import load_corpus

    spec = _as_spec(spec_or_name)
    corpus = load_corpus(spec.corpus)
    return Path(root or cache_root()) / f"{spec.name}-{proxy_key(spec, corpus.fingerprint)}"


def ensure_proxy(spec_or_name: ProxySpec | str = "proxy_tiny", root: str | Path | None = None) -> tuple[Path, Path]:
    """(target_dir, drafter_dir) of the trained pair; trains it (or resumes training) when not cached."""
    spec = _as_spec(spec_or_name)
    work = proxy_dir(spec, root)
    if not (work / "report.json").is_file():
        with _locked(work.with_name(work.name + ".lock")):
            if not (work / "report.json").is_file():  # another process may have finished meanwhile
                print(f"training the {spec.name} proxy pair into {work} (first use; resumable)", file=sys.stderr,
                      flush=True)
                build(spec, work)
    return work / "target", work / "drafter"


def _tokenizer(spec: ProxySpec, corpus, work: Path):
    from specpilot.training import tokenizer as tk

    folder = work / "tokenizer"
    if (folder / "tokenizer.json").is_file():
        return tk.load_tokenizer(folder)
    texts, total = [], 0
    limit = spec.tokenizer.max_train_bytes
    for f in corpus.train:
        if limit is not None and total >= limit:
            break
        texts.append(f.text)
        total += len(f.text)
    tok = tk.train_tokenizer(texts, spec.tokenizer.vocab_size, spec.tokenizer.min_frequency)
    tk.save_tokenizer(tok, folder, spec.target.max_position_embeddings)
    return tok


def _streams(tok, corpus, work: Path):
    import numpy as np

    from specpilot.training.tokenizer import encode_all
    from specpilot.training.train_target import token_stream

    path = work / "run" / "tokens.npz"
    if path.is_file():
        with np.load(path) as z:
            return z["train"], z["held_out"]
    train = token_stream(encode_all(tok, [f.text for f in corpus.train]))
    held = token_stream(encode_all(tok, [f.text for f in corpus.held_out]))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name("tokens.tmp.npz")
    np.savez(tmp, train=train, held_out=held)
    tmp.replace(path)
    return train, held


def prepare_data(spec: ProxySpec, work: Path):
    """(corpus, tokenizer, train token stream, held-out token stream); tokenizer and streams cached in `work`."""
    from specpilot.training.corpus import load_corpus

    t0 = time.perf_counter()
    corpus = load_corpus(spec.corpus)
    tok = _tokenizer(spec, corpus, work)
    train_stream, held_stream = _streams(tok, corpus, work)
    log.info("%s: corpus %s; %d train / %d held-out tokens (%.1f s)", spec.name, corpus.summary(),
             len(train_stream), len(held_stream), time.perf_counter() - t0)
    return corpus, tok, train_stream, held_stream


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.stem + ".tmp.json")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def build_target(spec: ProxySpec, work: str | Path, tracker=None, stop_after: int | None = None) -> dict:
    """Train (or resume) the target in `work/run/target`; export it with the tokenizer to `work/target`."""
    from specpilot.models.export import export_target
    from specpilot.training.train_target import train_target

    work = Path(work)
    t0 = time.perf_counter()
    corpus, tok, train_stream, held_stream = prepare_data(spec, work)
    data_s = time.perf_counter() - t0
    tcfg, tparams, report = train_target(spec, train_stream, held_stream, work / "run" / "target", tracker, stop_after)
    export_target(work / "target", tcfg, tparams, "float32", tokenizer_dir=work / "tokenizer")
    report.update(
        corpus=corpus.summary(),
        tokenizer={"vocab_size": tok.get_vocab_size(), "model_vocab_size": spec.tokenizer.vocab_size,
                   "train_tokens": int(len(train_stream)), "held_out_tokens": int(len(held_stream)),
                   "bytes_per_token": corpus.train_bytes / max(len(train_stream), 1)},
        data_s=data_s,
        seconds=time.perf_counter() - t0,
    )
    _write_json(work / "target_report.json", report)
    return report


def build_drafter(spec: ProxySpec, work: str | Path, target_dir: str | Path | None = None, tracker=None,
                  stop_after: int | None = None) -> dict:
    """Train (or resume) a drafter for the target in `target_dir` (default `work/target`, float32) in
    `work/run/drafter`; export it to `work/drafter`. Prompts come from the target's tokenizer on the corpus."""
    import jax.numpy as jnp

    from specpilot.models import hf
    from specpilot.models.config import CheckpointError
    from specpilot.models.export import export_drafter
    from specpilot.training.train_drafter import prompt_windows, train_drafter

    from specpilot.training.tokenizer import MASK, MASK_ID, load_tokenizer

    work = Path(work)
    target_dir = Path(target_dir or work / "target")
    t0 = time.perf_counter()
    if not (target_dir / "tokenizer.json").is_file():
        raise CheckpointError(f"{target_dir}: no tokenizer.json (a proxy target folder carries its tokenizer)")
    if load_tokenizer(target_dir).token_to_id(MASK) != MASK_ID:
        raise CheckpointError(f"{target_dir}: its tokenizer has no {MASK} token at id {MASK_ID}")
    if not (work / "tokenizer" / "tokenizer.json").is_file():  # the prompts must use the target's tokenizer
        import shutil

        shutil.copytree(target_dir, work / "tokenizer", dirs_exist_ok=True,
                        ignore=lambda d, names: [n for n in names if not n.startswith(("tokenizer", "special"))])
    _, _, train_stream, held_stream = prepare_data(spec, work)
    tcfg, tparams = hf.load_target(target_dir, jnp.float32)
    ds = spec.drafter_train
    train_prompts = prompt_windows(train_stream, ds.num_sequences, ds.prompt_tokens, spec.seed)
    held_prompts = prompt_windows(held_stream, ds.eval_batches * ds.batch_size, ds.prompt_tokens, spec.seed)
    dcfg, dparams, report = train_drafter(spec, tcfg, tparams, train_prompts, held_prompts, work / "run" / "drafter",
                                          tracker, stop_after)
    export_drafter(work / "drafter", dcfg, dparams, "float32")
    report["seconds"] = time.perf_counter() - t0
    _write_json(work / "drafter_report.json", report)
    return report


def make_tracker(spec: ProxySpec, work: Path):
    from specpilot.tracking import Tracker

    return Tracker(spec.wandb.mode, spec.wandb.project, work / "run", f"{spec.name}-{work.name[-8:]}",
                   spec.to_dict(), name=spec.name)


def build(spec: ProxySpec, work: str | Path, stop_after: dict | None = None) -> dict:
    """Train (or resume) the whole pair into `work`; returns the report (also `work/report.json`, last).

    stop_after: {"target": n} or {"drafter": n} simulates an interruption after n steps (tests)."""
    stop_after = stop_after or {}
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tracker = make_tracker(spec, work)
    try:
        target_report = build_target(spec, work, tracker, stop_after.get("target"))
        drafter_report = build_drafter(spec, work, None, tracker, stop_after.get("drafter"))
    finally:
        tracker.finish()
    report = {
        "name": spec.name,
        "key": work.name,
        "corpus": target_report.pop("corpus"),
        "tokenizer": target_report.pop("tokenizer"),
        "target": target_report,
        "drafter": drafter_report,
        "timings": {"data_s": target_report["data_s"], "target_s": target_report["seconds"] - target_report["data_s"],
                    "drafter_s": drafter_report["seconds"], "total_s": time.perf_counter() - t0},
        "recipe": spec.to_dict(),
    }
    _write_json(work / "report.json", report)
    log.info("%s: done in %.0f s: target held-out loss %.3f, drafter held-out loss %.3f", spec.name,
             report["timings"]["total_s"], target_report["held_out_loss"], drafter_report["held_out_loss"])
    return report


if __name__ == "__main__":
    from specpilot.training.run import main

    sys.exit(main())
