"""Every engine runs from scripts/generate.py's entry (in-process: one JAX start for all of them), and
bad prompts are one clear error each."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from specpilot.decoding.common import PromptError, check_prompts
from specpilot.models.config import ModelConfig

REPO = Path(__file__).resolve().parents[1]


def load_generate_module():
    spec = importlib.util.spec_from_file_location("generate_script", REPO / "scripts" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("engine", ["ar", "stock", "ddtree", "specpilot", "tlv"])
def test_every_engine_runs_from_generate(engine, capsys):
    overrides = [f"engine={engine}", "prompt_ids=[[3,1,4,1,5],[9,2,6]]", "max_new_tokens=10", "target.cache_dir=null",
                 "model=tiny", "target.path=null", "drafter.path=null", "deployment.models=config"]
    if engine != "ar":
        overrides.append("engine.tree_budget=6" if engine != "stock" else "drafter.block_size=4")
    if engine == "specpilot":
        overrides.append("engine.budget_candidates=[2,6]")
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose("config", overrides=overrides)
    load_generate_module().run(cfg)
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["engine"] == engine
    assert [len(t) for t in result["tokens"]] == [10, 10]
    for rounds in result["acceptance_lengths"]:
        assert rounds and all(a >= 1 for a in rounds) and sum(rounds) >= 9
    if engine not in ("ar", "stock"):
        assert result["stats"]["mean_tree_nodes"] <= 6


TINY = ModelConfig(family="qwen3", vocab_size=256, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=1,
                   num_kv_heads=1, head_dim=8)


@pytest.mark.parametrize(
    "prompts, max_new, context, needle",
    [
        ([[]], 4, 64, "prompt 0 is empty"),
        ([[1, 2], [3, 300]], 4, 64, "token id 300"),
        ([[1] * 60], 8, 64, "exceed the context of 64"),
        ([[1, 2]], 0, 64, "max_new_tokens must be >= 1"),
    ],
)
def test_bad_prompts_are_clear_errors(prompts, max_new, context, needle):
    with pytest.raises(PromptError, match=needle) as err:
        check_prompts(prompts, TINY, max_new, context)
    assert "\n" not in str(err.value)


def test_a_round_s_scratch_slots_count_against_the_context():
    """A tree engine keeps its tree's slots free past the text: the error names them, and a prompt that fits
    without them is still refused (a budget larger than the context reads as such, not as a negative room)."""
    check_prompts([[1] * 50], TINY, 8, 64, reserved=6)  # 58 + 6 fit 64 exactly
    with pytest.raises(PromptError, match=r"^prompt 0: 50 prompt tokens \+ max_new_tokens 8, plus the 7 scratch "
                                          r"slots a round writes past them, exceed the context of 64$"):
        check_prompts([[1] * 50], TINY, 8, 64, reserved=7)
