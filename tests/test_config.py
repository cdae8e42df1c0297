"""The composed Hydra config validates, and every bad key is one line naming it."""

from __future__ import annotations

from pathlib import Path

import jax
import pytest
from hydra import compose, initialize_config_dir

from specpilot import build
from specpilot.config import ENGINE_NAMES, ConfigError, RootConfig, is_known_key, validate

CONF = Path(__file__).resolve().parents[1] / "conf"


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("config", overrides=list(overrides))


def error_of(*overrides: str) -> str:
    with pytest.raises(ConfigError) as e:
        validate(composed(*overrides))
    message = str(e.value)
    assert "\n" not in message and message.startswith("config error: ")
    return message


def test_default_config_validates():
    cfg = validate(composed())
    assert isinstance(cfg, RootConfig)
    assert cfg.engine.name == "ar" and cfg.engine.weight_format == "bf16" and cfg.engine.attention == "xla"
    assert cfg.model.num_layers == 2 and cfg.target.path is None


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_every_engine_option_validates(engine):
    assert validate(composed(f"engine={engine}")).engine.name == engine


@pytest.mark.parametrize("option", sorted(p.stem for p in (CONF / "model").glob("*.yaml")))
def test_every_model_option_validates(option):
    validate(composed(f"model={option}"))


@pytest.mark.parametrize("option", sorted(p.stem for p in (CONF / "deployment").glob("*.yaml")))
def test_every_deployment_option_validates(option):
    validate(composed(f"deployment={option}"))


def test_unknown_key_added_with_plus_is_rejected():
    message = error_of("+engine.foo=1")
    assert message.startswith("config error: engine.foo: unknown key")
    assert "config error: foo: unknown key" in error_of("+foo=1")
    assert "model.bar: unknown key" in error_of("+model.bar=2")


def test_wrong_type_names_key_and_value():
    assert error_of("engine=ddtree", "engine.tree_budget=abc") == (
        "config error: engine.tree_budget: expected an integer, got 'abc'"
    )
    assert "model.tie_word_embeddings: expected true or false" in error_of("model.tie_word_embeddings=1")
    assert "engine.level1_format: expected 'int8' or 'fp8', got 'int4'" in error_of(
        "engine=tlv", "engine.level1_format=int4"
    )


@pytest.mark.parametrize(
    "override, expected",
    [
        ("sampling.top_p=0", "sampling.top_p: must be > 0"),
        ("sampling.top_p=1.5", "sampling.top_p: must be <= 1"),
        ("sampling.temperature=-1", "sampling.temperature: must be >= 0"),
        ("max_new_tokens=0", "max_new_tokens: must be >= 1"),
        ("target.path=", "target.path: must not be empty"),  # an unset $CKPT is not a request for random weights
        ("forcing.tie_tolerance=1e9", "forcing.tie_tolerance: must be <= 1"),  # no setting turns forcing off
        ("forcing.max_restarts=1000000", "forcing.max_restarts: must be <= 64"),
        ("engine.name=beam", "engine.name: expected one of 'ar'"),
        ("model.num_kv_heads=3", "model.num_kv_heads: must divide num_heads 4"),
        ("drafter.target_layer_ids=[1,-1]", "drafter.target_layer_ids[1]: must be >= 0"),
        ("prompt_ids=[1,x]", "prompt_ids: expected a non-empty list of token ids"),
    ],
)
def test_out_of_range_values(override, expected):
    assert expected in error_of(override)


@pytest.mark.parametrize("engine", ["stock", "ddtree", "specpilot", "tlv"])
def test_block_size_range(engine):
    assert "engine.block_size: must be >= 2, got 1" in error_of(f"engine={engine}", "engine.block_size=1")
    assert error_of(f"engine={engine}", "engine.tree_budget=0" if engine != "stock" else "engine.block_size=x")


def test_both_prompts_rejected():
    assert "prompt: give either prompt or prompt_ids, not both" in error_of("prompt=hi", "prompt_ids=[1]")


@pytest.mark.parametrize("value,problem", [("abc", "expected 'auto' or an integer, got 'abc'"),
                                           ("-1", "expected 'auto' or must be >= 0, got -1")])
def test_a_value_every_union_member_refuses_is_one_line_at_its_key(value, problem):
    """`search.workers` is `'auto'` or a count: pydantic refuses a bad value once per member (at keys ending in the
    member's tag); the error is one line at the field's own key, naming what each member wanted."""
    assert error_of(f"search.workers={value}") == f"config error: search.workers: {problem}"


def test_union_members_refusing_alike_are_named_once():
    """`deployment.prompts=[]`: both list members say "must not be empty"; the line says it once."""
    assert error_of("deployment.prompts=[]") == (
        "config error: deployment.prompts: expected 'auto', 'synthetic', 'code' or 'heldout' or must not be empty, "
        "got []")


def test_w12_weights_need_a_bfloat16_target():
    """W12 packs bf16 bit patterns: on a float32 target the config says so in one line, before any weight loads."""
    assert error_of("engine=ddtree", "engine.weight_format=w12") == (
        "config error: engine.weight_format: w12 packs bfloat16 weights; set target.dtype=bfloat16 (now float32)")
    assert composed("engine=ddtree", "engine.weight_format=w12", "target.dtype=bfloat16").engine.weight_format == "w12"


def test_is_known_key():
    assert is_known_key("model.rms_norm_eps") and is_known_key("engine.tree_budget")
    assert not is_known_key("engine.foo") and not is_known_key("model.bar") and not is_known_key("foo")


# ---- build: synthetic shapes and prompts (no JAX arrays needed) ---------------------------------------


def test_default_target_layer_ids_rule():
    assert build.default_target_layer_ids(5, 36) == (1, 9, 17, 25, 33)
    assert build.default_target_layer_ids(1, 36) == (18,)
    ids = build.default_target_layer_ids(5, 2)  # tiny targets are clamped into range
    assert len(ids) == 5 and all(0 <= i <= 1 for i in ids)


def test_synthetic_drafter_config_follows_target():
    cfg = validate(composed("model=qwen3_8b", "engine=ddtree"))
    target = build.target_config_from_group(cfg)
    drafter = build.synthetic_drafter_config(cfg, target)
    assert drafter.target_layer_ids == (1, 9, 17, 25, 33)
    assert drafter.num_target_layers == 36 and drafter.block_size == 16
    assert drafter.mask_token_id == target.vocab_size - 1
    assert drafter.layers.num_layers == 5
    assert (drafter.layers.hidden_size, drafter.layers.head_dim) == (target.hidden_size, target.head_dim)
    assert drafter.layers.intermediate_size == target.intermediate_size


def test_synthetic_drafter_rejects_layer_outside_target():
    cfg = validate(composed("drafter.target_layer_ids=[0,5]"))
    with pytest.raises(ConfigError, match="drafter.target_layer_ids: layer 5 outside the target's 2 layers"):
        build.synthetic_drafter_config(cfg, build.target_config_from_group(cfg))


def test_llama_rope_scaling_reaches_model_config():
    target = build.target_config_from_group(validate(composed("model=llama31_8b")))
    assert target.rope.kind == "llama3" and target.rope.factor == 8.0 and not target.qk_norm


def test_make_prompts():
    assert build.make_prompts(validate(composed("prompt_ids=[1,2,3]")), None) == [[1, 2, 3]]
    assert build.make_prompts(validate(composed("prompt_ids=[[1,2],[3]]")), None) == [[1, 2], [3]]
    default = build.make_prompts(validate(composed()), None)
    assert len(default) == 1 and len(default[0]) > 1
    with pytest.raises(ConfigError, match="prompt: .* has no tokenizer; use prompt_ids"):
        build.make_prompts(validate(composed("prompt=hello")), None)
    with pytest.raises(ConfigError, match="prompt: no prompt given"):
        build.make_prompts(validate(composed("target.path=/some/checkpoint")), None)

    class Tok:
        def encode(self, text):
            return [len(text)]

    assert build.make_prompts(validate(composed("prompt=hello")), Tok()) == [[5]]


def test_load_tokenizer_absent(tmp_path):
    assert build.load_tokenizer(tmp_path) is None


def test_cudnn_attention_off_a_gpu_is_one_line_before_any_load(monkeypatch):
    """engine.attention=cudnn where JAX has no NVIDIA GPU: a ConfigError naming the key, raised before weights load."""
    if jax.devices()[0].platform == "gpu":
        pytest.skip("this machine has a GPU: cudnn attention is valid here")
    monkeypatch.setattr(build, "apply_kernel_choices", lambda cfg: pytest.fail("loading went on past the check"))
    with pytest.raises(ConfigError, match=r"^config error: engine.attention: cudnn needs an NVIDIA GPU; this backend"):
        build.load_models(validate(composed("engine=ddtree", "engine.attention=cudnn", "deployment.models=config")))


def test_load_random_models_and_engine():
    cfg = validate(composed("engine=stock", "max_new_tokens=4", "drafter.num_layers=1", "deployment.models=config"))
    target_cfg, target_w, drafter_cfg, drafter_w, tokenizer = build.load_models(cfg)
    assert tokenizer is None and drafter_cfg is not None and drafter_w is not None
    assert drafter_cfg.target_layer_ids == (1,)
    assert build.load_models(validate(composed("engine=ar", "deployment.models=config")))[2] is None  # no drafter
    engine = build.build_engine(cfg, target_cfg, target_w, drafter_cfg, drafter_w)
    assert callable(engine.generate)


ORACLE_TARGET = Path(__file__).resolve().parents[2] / "shared" / "oracle_pair" / "target"


@pytest.mark.skipif(not ORACLE_TARGET.is_dir(), reason="shared/oracle_pair not present")
def test_checkpoint_with_tokenizer_encodes_text_prompt(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    for f in ORACLE_TARGET.iterdir():
        (tmp_path / f.name).symlink_to(f)
    words = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 5, "world": 6}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]").save_pretrained(tmp_path)

    cfg = validate(composed(f"target.path={tmp_path}", "target.cache_dir=null", "prompt=hello world"))
    build.check_prompt_source(cfg)
    target_cfg, _, drafter_cfg, _, tokenizer = build.load_models(cfg)
    assert target_cfg.num_layers == 3 and drafter_cfg is None and tokenizer is not None
    assert build.make_prompts(cfg, tokenizer) == [[5, 6]]


def test_h200_search_overrides_compose_and_validate():
    """scripts/h200/search_setup.sh's overrides (shared by the H200 search calls) are valid keys and values:
    a typo there would otherwise surface only on a lent GPU."""
    import re

    text = (CONF.parent / "scripts" / "h200" / "search_setup.sh").read_text()
    overrides = re.search(r'^C="([^"]*)"$', text, re.M).group(1).replace("${PASSTHROUGH:-0}", "24").split()
    cfg = validate(composed(*overrides, "deployment.batch=4"))
    assert cfg.deployment.name == "h200" and cfg.deployment.target_passthrough_layers == 24


# ---- kernels: which ops run on the Hopper kernels -----------------------------------------------------


@pytest.mark.parametrize("option", sorted(p.stem for p in (CONF / "kernels").glob("*.yaml")))
def test_every_kernels_option_validates(option):
    """Every option names every op `pallas_kernels.choices` can set (the schema and the choices cannot drift)."""
    from pallas_kernels import choices

    kernels = validate(composed(f"kernels={option}")).kernels
    assert set(kernels.model_dump()) == {*choices.OPS, "pdl"}


def test_bad_kernel_choice_is_one_line():
    assert "kernels.matmul: expected 'xla' or 'mosaic_gpu', got 'triton'" in error_of("kernels.matmul=triton")
    assert "kernels.pdl: expected true or false" in error_of("kernels.pdl=2")


def test_load_models_applies_the_kernels_group():
    from pallas_kernels import choices

    before = choices.current()
    try:
        build.load_models(validate(composed("kernels=hopper", "deployment.models=config")))
        assert choices.current() == {"matmul": "mosaic_gpu", "norm": "mosaic_gpu", "rope": "mosaic_gpu",
                                     "swiglu": "xla", "swiglu_matmul": "mosaic_gpu", "qkv_rope_matmul": "xla",
                                     "pdl": False}
        build.load_models(validate(composed("deployment.models=config")))
        assert set(choices.current().values()) == {"xla", False}
    finally:
        choices.use(**before)


def test_specpilot_needs_a_budget_candidate_within_its_tree_budget():
    """The engine keeps the candidates <= tree_budget; none left was a ValueError traceback at engine build."""
    assert error_of("engine=specpilot", "engine.tree_budget=64", "engine.budget_candidates=[128,256]") == (
        "config error: engine.budget_candidates: none is <= engine.tree_budget 64, got [128, 256]")
    validate(composed("engine=specpilot", "engine.tree_budget=64"))  # the default candidates above 64 are dropped


def test_block_size_above_the_drafters_is_a_config_error():
    """engine.block_size may shorten the drafter's block, never lengthen it (the search's bound too)."""
    cfg = validate(composed("engine=stock", "engine.block_size=100"))
    target = build.target_config_from_group(cfg)
    drafter = build.synthetic_drafter_config(cfg, target)
    with pytest.raises(ConfigError, match=rf"engine.block_size: 100 exceeds the drafter's block_size "
                                          rf"{drafter.block_size} "):
        build.build_engine(cfg, target, None, drafter, None)
