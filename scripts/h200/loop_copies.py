"""Does a compiled generation loop copy whole caches every round? Counted in XLA's optimized HLO, no run needed.

On the CPU (fifty-second session) SpecPilot's loop under `attention=xla` copies the target's whole K and V caches
twice each a round where DDTree@64's copies none: its verify runs as a `lax.switch`, which XLA turns into a
conditional with one operand tuple per branch, each holding the same cache buffers; the first branch writes them in
place, the second copies them (after its first layer's write, and into the conditional's output). The CPU's scheduler
is not the GPU's, so this probe compiles the same loops on the device it runs on and lists, per engine and attention,
every copy inside the while loop (its body and what the body calls: conditional branches, nested loops) whose result
has as many elements as a cache it carries (the target's K or V, the drafter's context K or V) or one layer of
it, with the bytes it moves a round (read + write). No GPU run: it only compiles. A layer-sized match is by element
count only (the CPU's dot-layout transposes of a layer's slice are such copies; a score tensor may match by chance):
`--dump` writes each loop's optimized HLO to read them in. On an H100 the switch's branch ran two memcpys and two
memsets a layer that DDTree@64's loop does not (fifty-third session, docs/results/2026-12-07-switch-kernels-h100/);
the layer-sized rows and the dump name the HLO behind them.

    PYTHONPATH=$PWD python3 scripts/h200/loop_copies.py [--model proxy_h200_deep --layers 4 --batch 8 \
        --engines ddtree@64 specpilot@63,64 --attentions xla pallas_tree --dtype bfloat16 --dump DIR]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from profile_vs_loop import engine_cfg  # noqa: E402

COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$")
CALLEES = re.compile(r"(?:body|condition|calls|to_apply|true_computation|false_computation)=%?([\w.\-]+)"
                     r"|branch_computations=\{([^}]*)\}")
INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\w+)\[([\d,]*)\]\S* (\w+)\(")


def computations(hlo: str) -> dict[str, list[str]]:
    """Computation name -> its instruction lines."""
    comps, name = {}, None
    for line in hlo.splitlines():
        m = COMPUTATION.match(line)
        if m:
            name = m.group(1)
            comps[name] = []
        elif name is not None and line.strip() == "}":
            name = None
        elif name is not None:
            comps[name].append(line)
    return comps


def callees(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        for m in CALLEES.finditer(line):
            out += [m.group(1)] if m.group(1) else [x.strip().lstrip("%") for x in m.group(2).split(",")]
    return out


def reach(comps: dict[str, list[str]], roots: list[str]) -> set[str]:
    todo, seen = list(roots), set()
    while todo:
        c = todo.pop()
        if c not in seen and c in comps:
            seen.add(c)
            todo += callees(comps[c])
    return seen


def loop_computations(comps: dict[str, list[str]]) -> set[str]:
    """Every computation a while loop's body reaches (the body, its branches, nested loops, fusions)."""
    return reach(comps, [m.group(1) for lines in comps.values() for line in lines if " while(" in line
                         for m in [re.search(r"body=%?([\w.\-]+)", line)] if m])


def branches(comps: dict[str, list[str]]) -> list[list[set[str]]]:
    """Per conditional: per branch, the computations it reaches (one branch runs a round)."""
    out = []
    for lines in comps.values():
        for line in lines:
            if " conditional(" in line:
                m = re.search(r"branch_computations=\{([^}]*)\}", line)
                names = ([x.strip().lstrip("%") for x in m.group(1).split(",")] if m else
                         re.findall(r"(?:true|false)_computation=%?([\w.\-]+)", line))
                out.append([reach(comps, [n]) for n in names])
    return out


DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1, "f64": 8, "s64": 8}


COPYING_OPS = ("copy", "slice", "dynamic-slice")


def cache_copies(hlo: str, cache_elements: dict[str, int]) -> list[dict]:
    """Copies inside the loop whose result has a cache's element count (or a cache layer's, where `cache_elements`
    names one): a `copy`, `slice` or `dynamic-slice` instruction outside fusions (what a GPU runs as a memcpy), or
    a fusion whose name says copy or slice (how a standalone copy is emitted as a kernel)."""
    comps = computations(hlo)
    fused = {c for lines in comps.values() for line in lines for c in re.findall(r"calls=%?([\w.\-]+)", line)}
    found = []
    for c in sorted(loop_computations(comps) - fused):
        for line in comps[c]:
            m = INSTRUCTION.match(line)
            if not m:
                continue
            name, dtype, dims, op = m.groups()
            sliced = "slice" in name.replace("update-slice", "")  # an update-slice fusion writes in place
            if op not in COPYING_OPS and not (op == "fusion" and ("copy" in name or sliced)):
                continue
            n = math.prod(int(d) for d in dims.split(",")) if dims else 1
            which = [k for k, v in cache_elements.items() if v == n]
            if which:
                found.append({"computation": c, "instruction": name, "op": op, "shape": f"{dtype}[{dims}]",
                              "cache": " or ".join(which), "bytes": 2 * n * DTYPE_BYTES.get(dtype, 4)})
    return found


def bytes_a_round(hlo: str, found: list[dict]) -> int:
    """What the copies move in one iteration: those outside conditionals, plus per conditional its costliest
    branch's (one branch runs)."""
    comps = computations(hlo)
    conds = branches(comps)
    in_branch = set().union(*(b for cond in conds for b in cond)) if conds else set()
    total = sum(f["bytes"] for f in found if f["computation"] not in in_branch)
    for cond in conds:
        total += max(sum(f["bytes"] for f in found if f["computation"] in b) for b in cond)
    return total


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--layers", type=int, default=None, help="override the model's layer count")
    ap.add_argument("--dtype", default="float32", choices=("bfloat16", "float32"))
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--engines", nargs="+", type=engine_cfg, default=[engine_cfg("ddtree@8"), engine_cfg("specpilot@7,8")])
    ap.add_argument("--dump", default=None, help="also write each loop's optimized HLO text into this folder")
    ap.add_argument("--attentions", nargs="+", default=["xla", "pallas_tree"], choices=("xla", "cudnn", "pallas_tree"))
    args = ap.parse_args(argv)

    import jax

    from specpilot.costmodel import measure as M
    from specpilot.costmodel.predict import config_label
    from specpilot.decoding.common import pad_prompts

    dep = M.synthetic_deployment(args.model, args.dtype, drafter_layers=2)
    if args.layers:
        cfg = dataclasses.replace(dep.target_cfg, num_layers=args.layers)
        dep = dataclasses.replace(dep, target_cfg=cfg, target_w=dataclasses.replace(
            dep.target_w, layers=dep.target_w.layers[: args.layers]))
        dcfg = dataclasses.replace(dep.drafter_cfg, target_layer_ids=tuple(
            min(i, args.layers - 1) for i in dep.drafter_cfg.target_layer_ids))
        dep = dataclasses.replace(dep, drafter_cfg=dcfg)
    prompts = M.random_prompts(args.batch, 16, dep.target_cfg.vocab_size, exclude=(dep.drafter_cfg.mask_token_id,))
    capacity = M.kv_capacity(16, 4, dep.block, args.engines)
    tokens, lens = pad_prompts(prompts)
    print(f"{jax.devices()[0].device_kind}; {args.model}, {dep.target_cfg.num_layers} layers, {args.dtype}, "
          f"batch {args.batch}, {capacity} KV slots")
    print("| engine | whole-cache copies in the loop (all branches) | layer-sized copies | MB a round (read + write; "
          "one branch) | which |\n|---|---|---|---|---|")
    rows = []
    for attention in args.attentions:
        for cfg in args.engines:
            engine = M.build_engine(dep, {**cfg, "attention": attention}, capacity)
            state = engine._prefill(engine.params, tokens, lens, 16, jax.random.key(0))
            caches = {"target K/V": state.extra.cache.k, "drafter K/V": state.extra.ctx.k}
            sizes = {**{k: v.size for k, v in caches.items()},
                     **{f"{k} layer": v.size // v.shape[0] for k, v in caches.items()}}
            hlo = engine._run.lower(engine.params, state, 0).compile().as_text()
            found = cache_copies(hlo, sizes)
            label = config_label({**cfg, "attention": attention})
            rows.append({"engine": label, "copies": found, "bytes_a_round": bytes_a_round(hlo, found)})
            if args.dump:
                Path(args.dump).mkdir(parents=True, exist_ok=True)
                stem = label.replace("[", "_").replace("]", "").replace(",", "_")
                (Path(args.dump) / f"{stem}.hlo.txt").write_text(hlo)
            kinds = collections.Counter(f"{f['cache']} ({f['op']})" for f in found)
            which = ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())) or "-"
            mb = rows[-1]["bytes_a_round"] / 1e6
            layers = sum("layer" in f["cache"] for f in found)
            print(f"| {label} | {len(found) - layers} | {layers} | {mb:.2f} | {which} |", flush=True)
    return rows


if __name__ == "__main__":
    main()
