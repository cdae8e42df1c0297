"""Pack a checkpoint's linear weights into W12 once, and cache the packed tree with orbax.

    python scripts/convert_w12.py CHECKPOINT                     # HF Qwen3 / Llama target folder
    python scripts/convert_w12.py CHECKPOINT --cache-dir DIR     # default: the engines' target.cache_dir
    python scripts/convert_w12.py --drafter DRAFTER              # a z-lab DFlash drafter folder
    python scripts/convert_w12.py CHECKPOINT --cast-bf16         # float32 / float16 checkpoint: round first

W12 (pallas_kernels/w12) stores a bf16 weight in 12 bits and a little, losslessly. Packing runs on the host
and takes minutes for an 8B model, so this script does it once: the packed tree (every linear leaf a
`W12Array`; embeddings and norms stay bf16) is written under the cache folder, keyed by the checkpoint's
fingerprint (path, file sizes and mtimes) and the W12 format version (`specpilot.models.hf.w12_cache_entry`).
A run with `engine.weight_format=w12` and the same `target.cache_dir` then restores it instead of packing
at start-up; changing the checkpoint or the W12 layout makes the entry a miss, never a misread. A second
conversion of an unchanged checkpoint is a cache hit and packs nothing.

Prints bits per weight (planes, per-block bases and escapes, over every packed matrix) and the cache path;
the last stdout line is one JSON object with both. A missing or broken checkpoint, or weights that are not
bf16, is one line on stderr and exit code 2. W12 is defined for bf16: a float32 (or float16) checkpoint is
packed only with `--cast-bf16`, which rounds it to bf16 first — lossy with respect to the file, after which
W12 is lossless with respect to those bf16 weights (the same rounding `target.dtype=bfloat16` applies).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASTABLE = ("float32", "float16", "float64")


def default_cache_dir() -> Path:
    """conf/config.yaml's `target.cache_dir`: $SPECPILOT_CACHE (or ~/.cache/specpilot) + /weights."""
    return Path(os.environ.get("SPECPILOT_CACHE") or Path.home() / ".cache" / "specpilot") / "weights"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", nargs="?", help="HF target checkpoint folder (config.json + safetensors)")
    ap.add_argument("--drafter", metavar="DIR", help="convert this DFlash drafter folder instead of a target")
    ap.add_argument("--cache-dir", default=None, help=f"cache folder (default: {default_cache_dir()})")
    ap.add_argument("--cast-bf16", action="store_true",
                    help="round a float32/float16 checkpoint to bf16 before packing (lossy w.r.t. the file)")
    args = ap.parse_args(argv)
    if bool(args.checkpoint) == bool(args.drafter):
        ap.error("give either a target CHECKPOINT or --drafter DIR")
    return args


def check_dtypes(path: Path, cast_bf16: bool) -> str | None:
    """None for a bf16 checkpoint, the stored dtype when it will be cast; raises CheckpointError otherwise."""
    from specpilot.models.config import CheckpointError
    from specpilot.models.hf import stored_dtypes

    found = stored_dtypes(path)
    if not found:
        raise CheckpointError(f"{path}: no 2-D weight tensors in the checkpoint")
    other = {d: name for d, name in found.items() if d != "bfloat16"}
    if not other:
        return None
    dtype = min(other)
    example = f"{dtype} weights (e.g. {other[dtype]!r})"
    if dtype not in CASTABLE:
        raise CheckpointError(f"{path} stores {example}; W12 packs bfloat16 weights only")
    if not cast_bf16:
        raise CheckpointError(
            f"{path} stores {example}, but W12 is defined for bfloat16; pass --cast-bf16 to round them to "
            f"bfloat16 first (lossy w.r.t. the {dtype} file; W12 is then lossless w.r.t. the bfloat16 weights)")
    return dtype


def summary(tree) -> dict:
    """Bits per weight over every W12 leaf: both planes (with K padding), bases and escapes."""
    import jax

    from pallas_kernels import w12
    from specpilot.models.weights import _is_w12

    packed = [leaf for leaf in jax.tree.leaves(tree, is_leaf=_is_w12) if _is_w12(leaf)]
    weights = sum(p.shape[0] * p.shape[1] for p in packed)
    bits = sum(w12.bits_per_weight(p) * p.shape[0] * p.shape[1] for p in packed)
    return dict(matrices=len(packed), weights=int(weights), bits_per_weight=bits / weights,
                escapes=int(sum(p.num_escapes for p in packed)), w12_bytes=int(bits // 8), bf16_bytes=2 * int(weights))


def size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from specpilot.cli import one_line
    from specpilot.models.config import CheckpointError
    from specpilot.models.hf import load_w12, w12_cache_entry

    kind = "drafter" if args.drafter else "target"
    path = Path(args.drafter or args.checkpoint)
    cache_dir = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    start = time.perf_counter()
    try:
        if not path.is_dir():
            raise CheckpointError(f"{kind} checkpoint folder not found: {path}")
        cast_from = check_dtypes(path, args.cast_bf16)
        if cast_from:
            print(f"note: rounding {cast_from} weights to bfloat16 before packing: lossy w.r.t. the {cast_from} "
                  "file; W12 is lossless w.r.t. the bfloat16 weights", flush=True)
        _, tree, hit = load_w12(path, cache_dir, kind=kind)
    except CheckpointError as e:
        print(one_line(f"checkpoint error: {e}"), file=sys.stderr, flush=True)
        return 2
    where = w12_cache_entry(path, cache_dir)
    info = summary(tree)
    seconds = time.perf_counter() - start
    if hit:
        print(f"cache hit: {where} already holds this checkpoint's W12 tree; nothing repacked", flush=True)
    else:
        print(f"packed {info['matrices']} matrices in {seconds:.1f}s", flush=True)
    print(f"{info['bits_per_weight']:.4f} bits/weight over {info['weights']:,} weights ({info['escapes']:,} escapes); "
          f"{size(info['w12_bytes'])} vs {size(info['bf16_bytes'])} in bf16", flush=True)
    print(f"cache: {where}", flush=True)
    print(f"used by: engine.weight_format=w12 {kind}.path={path.resolve()} target.cache_dir={cache_dir.resolve()} "
          "target.dtype=bfloat16", flush=True)
    print(json.dumps({"checkpoint": str(path), "kind": kind, "cache": str(where), "cache_hit": hit,
                      "cast_from": cast_from, "seconds": round(seconds, 3), **info}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
