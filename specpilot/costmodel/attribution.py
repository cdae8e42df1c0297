"""The fused loop's kernel time, stage by stage: each kernel CUPTI saw in the loop given to the round stage that
launched it.

`Engine.profile` times each stage as a program of its own, and such programs run other kernels than the loop's body
(whole-cache transposes at entry and exit, copies) and pay wall time beyond their kernels
(docs/results/2026-12-07-profile-vs-loop-rounds-h100/). The loop itself is one program, so its stages cannot be
timed apart, but its kernels can be sorted: `Engine.round` traces every stage under `jax.named_scope(stage)`, the
compiled loop's instructions keep that scope in their `op_name`, and an XLA fusion's kernel is named after its
instruction ("loop_add_fusion.47" launches "loop_add_fusion_47"). A kernel with no instruction of its name (cuBLAS,
Pallas, memcpy) goes to the stage of the named kernels launched around it when both belong to one stage; between two
stages it stays `unattributed`, as does a kernel of no stage (the loop's condition, its own bookkeeping).

XLA's GPU backend compiles one kernel for fusions that compute the same thing on the same shapes and launches it under
the first one's name (its kernel reuse cache). Stock DFlash's drafter and target both run 16 tokens a row through
layers of one width, so most of its verify launched kernels named after draft instructions: on an H100 the first
attribution gave draft 2.39 ms an iteration and verify 1.54 against 0.34 and 4.25 profiled
(docs/results/2026-12-07-profile-vs-loop-stages-h100/). A name whose identical fusions (same kind, type, settings and
fused computation up to instruction names) lie in different stages therefore tells nothing, and its launches go by
their neighbours like a nameless kernel's.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

_INSTRUCTION = re.compile(r'^\s*(?:ROOT )?%(\S+) = .*?op_name="([^"]*)"', re.M)
_COMPUTATION = re.compile(r"^%(\S+) \(.*?\{\n(.*?)^\}", re.M | re.S)
_FUSION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (.*?) fusion\(.*?\), (kind=\w+), calls=%(\S+?),? (.*)$", re.M)
_METADATA = re.compile(r",?\s*metadata=\{[^}]*\}")
UNATTRIBUTED = "unattributed"


def _fingerprint(kind_type_rest: tuple[str, ...], body: str) -> str:
    """A fusion's identity as XLA's kernel reuse sees it, approximately: its type, kind and settings and its fused
    computation, without metadata and with instruction names numbered in order of appearance."""
    names: dict = {}
    text = _METADATA.sub("", "\n".join((*kind_type_rest, body)))
    return re.sub(r"%[\w.\-]+", lambda m: names.setdefault(m.group(0), f"%{len(names)}"), text)


def shared_kernels(hlo_text: str, stage_of: dict[str, str]) -> set[str]:
    """Kernel names (instruction names with "." as "_") of fusions identical to a fusion of another stage: XLA may
    launch one kernel under either name for both."""
    bodies = dict(_COMPUTATION.findall(hlo_text))
    groups: dict[str, list[str]] = {}
    for name, out_type, kind, calls, rest in _FUSION.findall(hlo_text):
        key = _fingerprint((out_type, kind, rest), bodies.get(calls, calls))
        groups.setdefault(key, []).append(name.replace(".", "_"))
    return {name for names in groups.values() if len({stage_of.get(n) for n in names}) > 1 for name in names}


def kernel_stages(hlo_text: str, stages: Sequence[str]) -> dict[str, str]:
    """{kernel name: stage} for every instruction of a compiled module's text (`Compiled.as_text()`) with an `op_name`:
    the stage whose scope is a segment of it, `UNATTRIBUTED` where none is (or more than one); kernel names are
    instruction names with "." as "_". Fusions identical to another stage's (`shared_kernels`) are left out: their
    launches go by their neighbours (`stage_kernel_ms`)."""
    out = {}
    for name, op_name in _INSTRUCTION.findall(hlo_text):
        hit = [s for s in stages if s in op_name.split("/")]
        out[name.replace(".", "_")] = hit[0] if len(hit) == 1 else UNATTRIBUTED
    for name in shared_kernels(hlo_text, out):
        del out[name]
    return out


def stage_kernel_ms(launches: Iterable[tuple[str, float]], stage_of: dict[str, str], stages: Sequence[str]
                    ) -> dict[str, float]:
    """Per stage and `UNATTRIBUTED`, the ms of `launches` ((kernel name, ms) in launch order, as `kernel_timings`
    gives them) given `stage_of` (`kernel_stages`). A kernel of no known name goes to the stage of the nearest kernels
    of a stage before and after it when they agree."""
    launches = list(launches)
    staged = [stage_of.get(name) if stage_of.get(name) != UNATTRIBUTED else None for name, _ in launches]
    before, after, last = [None] * len(staged), [None] * len(staged), None
    for i, s in enumerate(staged):
        before[i], last = last, s or last
    last = None
    for i in range(len(staged) - 1, -1, -1):
        after[i], last = last, staged[i] or last
    out = dict.fromkeys([*stages, UNATTRIBUTED], 0.0)
    for i, (name, ms) in enumerate(launches):
        if name in stage_of:
            out[stage_of[name]] += ms
        else:
            out[before[i] if before[i] is not None and before[i] == after[i] else UNATTRIBUTED] += ms
    return out
