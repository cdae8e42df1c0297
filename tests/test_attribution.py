"""specpilot.costmodel.attribution: the fused loop's kernels given to the round's stages through the stage scopes
`Engine.round` traces them under, and `scripts/profile_vs_loop.py`'s per-stage loop kernel time built on it. CUPTI
needs a GPU; here the compiled loop's own instruction names stand in for its launches."""

import importlib
import re
import sys
from pathlib import Path

import jax
import pytest

from specpilot.costmodel import cupti
from specpilot.costmodel import measure as M
from specpilot.costmodel.attribution import UNATTRIBUTED, kernel_stages, shared_kernels, stage_kernel_ms
from specpilot.decoding.common import pad_prompts

REPO = Path(__file__).resolve().parents[1]
STAGES = ["draft", "tree", "verify", "commit"]


@pytest.fixture(scope="module")
def stock():
    dep = M.synthetic_deployment("tiny", "float32", 0, drafter_layers=1)
    prompts = M.random_prompts(2, 8, dep.target_cfg.vocab_size, 0, exclude=(dep.drafter_cfg.mask_token_id,))
    cfg = {"name": "stock"}
    return M.build_engine(dep, cfg, M.kv_capacity(8, 4, dep.block, [cfg])), prompts


def loop_text(engine, prompts, max_new=8):
    tokens, lens = pad_prompts(prompts)
    state = engine._prefill(engine.params, tokens, lens, max_new, jax.random.key(0))
    return engine._run.lower(engine.params, state, 0).compile().as_text()


def test_every_stage_of_the_compiled_loop_has_its_instructions(stock):
    engine, prompts = stock
    assert [name for name, _ in engine.stages()] == STAGES
    stage_of = kernel_stages(loop_text(engine, prompts), STAGES)
    found = set(stage_of.values())
    assert set(STAGES) <= found and UNATTRIBUTED in found  # the loop's condition belongs to no stage
    assert all("." not in name for name in stage_of)  # kernel names: "loop_add_fusion.47" launches loop_add_fusion_47


def test_fusions_identical_across_stages_lose_their_names():
    """XLA's GPU backend launches one kernel for identical fusions under the first one's name, so such a name is no
    evidence of its stage. Here the draft's and the verify's matmuls are the same fusion; their tails are not."""
    def two_stages(x, w):
        with jax.named_scope("draft"):
            y = jax.numpy.tanh(x @ w) * 2 + 1
        with jax.named_scope("verify"):
            z = jax.numpy.tanh(y @ w) * 2 + 1
            return z + jax.numpy.sin(z)

    x, w = jax.numpy.ones((8, 16)), jax.numpy.ones((16, 16))
    text = jax.jit(two_stages).lower(x, w).compile().as_text()
    fusions = [name.replace(".", "_") for name in re.findall(r"%(\S+) = \S+ fusion\(", text)]
    stage_of = kernel_stages(text, ["draft", "verify"])
    kept = {name: stage_of[name] for name in fusions if name in stage_of}
    assert sorted(kept.values()) == ["draft", "verify"]  # each stage's tail keeps its name
    assert len(fusions) - len(kept) == 2  # the two matmuls, alike in both stages
    assert shared_kernels(text, {name: "draft" for name in fusions}) == set()  # alike within one stage: no matter


def test_a_kernel_of_no_known_name_goes_to_the_stage_around_it():
    stage_of = {"fusion_1": "draft", "fusion_2": "verify", "cond": UNATTRIBUTED}
    launches = [("fusion_1", 1.0), ("cublas", 2.0), ("fusion_1", 1.0),  # inside draft
                ("pallas", 4.0),  # between draft and verify: nobody's
                ("fusion_2", 8.0), ("cond", 16.0), ("memcpy", 32.0)]  # the loop's own, then none after it
    got = stage_kernel_ms(launches, stage_of, ["draft", "verify"])
    assert got == {"draft": 4.0, "verify": 8.0, UNATTRIBUTED: 52.0}


def test_profile_vs_loop_divides_each_stages_loop_kernels_by_the_iterations(stock, monkeypatch):
    """With a stand-in for CUPTI that runs the loop and reports one 1 ms launch of one kernel of each stage an
    iteration, every stage gets 1 ms an iteration and the iterations are the loop's (as `generate` counts them)."""
    engine, prompts = stock
    stage_of = kernel_stages(loop_text(engine, prompts), STAGES)
    one_each = [next(k for k, s in stage_of.items() if s == stage) for stage in STAGES]
    ran = []

    def stand_in(call):
        state = call()
        ran.append(int(jax.numpy.max(state.n_rounds)))
        return [(name, 1.0) for _ in range(ran[-1]) for name in one_each]

    monkeypatch.setattr(cupti, "kernel_timings", stand_in)
    sys.path.insert(0, str(REPO / "scripts"))
    pvl = importlib.import_module("profile_vs_loop")
    got = pvl.loop_stages(engine, prompts, 8)
    assert got["loop_stage_iterations"] == ran[0] == M.loop_iterations(engine.generate(prompts, 8)) > 0
    assert got["loop_stage_kernels_ms"] == {**dict.fromkeys(STAGES, 1.0), UNATTRIBUTED: 0.0}
