"""Cost model: byte/FLOP counts against a hand count, exact predictions on fake engines with known stage
times, τ profiles, the hardware calibration cache, and the shapes the GPU scripts read without Hydra."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specpilot.costmodel import (
    Hardware,
    StepTimeModel,
    TauProfile,
    ceilings_ms,
    choose_budget,
    config_label,
    gap_report,
    leave_one_out,
    speedup,
    stage_costs,
)
from specpilot.costmodel import counts
from specpilot.costmodel.predict import measured_row, observed_budgets, project, stage_points
from specpilot.decoding.fake import FakeEngine
from specpilot.models.config import DrafterConfig, ModelConfig, RopeConfig

# A hand-countable Qwen3: V=10, H=8, I=12, L=2, 2 query heads / 1 KV head of D=4 (q = 8, kv = 4).
TARGET = ModelConfig(family="qwen3", vocab_size=10, hidden_size=8, intermediate_size=12, num_layers=2, num_heads=2,
                     num_kv_heads=1, head_dim=4, rope=RopeConfig())
# Its drafter: 1 layer of the same widths, block 4, context from target layers 0 and 1 (2 features).
DRAFTER = DrafterConfig(layers=TARGET.replace(num_layers=1), block_size=4, mask_token_id=9, target_layer_ids=(0, 1),
                        num_target_layers=2)


def test_linear_bytes_per_format():
    assert counts.linear_bytes(16, 10, "bf16", 2) == 16 * 10 * 2
    assert counts.linear_bytes(16, 10, "w12", 2) == 16 * 10 * 1.5  # 12 of 16 bits
    assert counts.linear_bytes(16, 10, "int8", 2) == 16 * 10 + 4 * 10  # + a float32 scale per output column
    assert counts.linear_bytes(16, 10, "fp8", 2) == 16 * 10 + 4 * 10
    with pytest.raises(ValueError, match="weight format"):
        counts.linear_bytes(1, 1, "int4", 2)


def test_verify_pass_matches_hand_count():
    # ddtree with 4 nodes: T = 5 tokens per request, B = 2, 10 committed tokens, bf16, features from 2 layers.
    c = stage_costs(TARGET, DRAFTER, {"name": "ddtree", "tree_budget": 4}, batch=2, context=10)["verify"]
    # linear weights per layer: qkv 8×(8+4+4) + o 8×8 + gate_up 8×24 + down 12×8 = 128+64+192+96 = 480 elements;
    # norms per layer: attn + mlp (2×8) + q_norm + k_norm (2×4) = 24 elements. 2 bytes each.
    layer = (480 + 24) * 2
    final_norm = 8 * 2
    embed_rows = 2 * 5 * 8 * 2  # B·T rows of H
    assert c.weights == 2 * layer + final_norm + embed_rows == 2192
    assert c.lm_head == 8 * 10 * 2 == 160
    # K and V (kv = 4 each) of 10 committed + 5 new tokens, 2 layers, 2 requests.
    assert c.kv_read == 2 * 2 * (10 + 5) * (2 * 4) * 2 == 960
    assert c.kv_write == 2 * 2 * 5 * (2 * 4) * 2 == 320
    # per token and layer: qkv in 8 out 16, attention q in 8 out 8, o in 8 out 8, gate_up in 8 out 24,
    # down in 12 out 8 → 108; × 2 layers, + head input 8 + 2 feature layers × 8 → 240 elements per token.
    assert c.activations == 2 * 5 * 2 * (108 * 2 + 8 + 2 * 8) == 4800
    assert c.logits == 2 * 5 * 10 * 4 == 400
    assert c.bytes == 2192 + 160 + 960 + 320 + 4800 + 400 == 8832
    # 2 FLOPs per MAC: 2·B·T·480 per layer; attention 4·B·T·(S+T)·q per layer; head 2·B·T·H·V.
    assert c.flops == 2 * (2 * 10 * 480 + 4 * 10 * 15 * 8) + 2 * 10 * 8 * 10 == 30400


def test_commit_and_tree_match_hand_count():
    st = stage_costs(TARGET, DRAFTER, {"name": "stock"}, batch=2, context=10)
    assert set(st) == {"draft", "tree", "verify", "commit"}
    c = st["commit"]
    # the accepted path has up to block = 4 slots (root + 3 drafts); compact moves all 4 per layer.
    moved = 2 * 2 * 4 * (2 * 4) * 2  # L·B·P·(K+V)·bytes = 256
    assert c.kv_read == c.kv_write == moved and c.bytes == 2 * moved and c.flops == 0
    assert st["tree"].bytes == 2 * 3 * 10 * 4  # the drafter's logits of depths 1..3, read once
    assert st["verify"].kv_write == 2 * 2 * 4 * 8 * 2  # stock verifies root + 3 drafts


def test_context_ingest_matches_hand_count_and_is_billed_to_the_draft_stage():
    c = counts.context_ingest(DRAFTER, TARGET, batch=2, path=4, fmt="bf16")
    # fc [2·8, 8] + hidden_norm 8 at 2 bytes; the fused QKV and k_norm are the draft pass's (read once)
    assert c.weights == 16 * 8 * 2 + 8 * 2 == 272
    assert c.kv_read == 0 and c.kv_write == 1 * 2 * 4 * (2 * 4) * 2 == 128  # the drafter context's K/V
    assert c.activations == 2 * 4 * 16 * 2 == 256  # features read
    assert c.flops == 2 * 2 * 4 * 16 * 8 + 1 * 2 * 2 * 4 * 8 * 16 == 4096
    # SpecEngine ingests the last round's path (block = 4 slots) at the start of its draft stage
    draft = stage_costs(TARGET, DRAFTER, {"name": "stock"}, batch=2, context=10)["draft"]
    assert draft == counts.draft_pass(DRAFTER, TARGET, 2, 4, 10, "bf16") + c


def test_draft_pass_matches_hand_count():
    c = counts.draft_pass(DRAFTER, TARGET, batch=1, block=4, context=6, fmt="bf16")
    # 1 drafter layer (504 elements of weights and norms) + final norm + 4 embedding rows, 2 bytes each.
    assert c.weights == (504 + 8 + 4 * 8) * 2
    assert c.lm_head == 160
    assert c.kv_read == 1 * 1 * 6 * 8 * 2  # the cached context only
    assert c.kv_write == 0
    assert c.activations == 4 * 2 * (108 + 8)
    assert c.logits == 4 * 10 * 4
    assert c.flops == 2 * 4 * 480 + 4 * 4 * (6 + 4) * 8 + 2 * 4 * 8 * 10


def test_engine_stages_formats_and_ceilings():
    ar = stage_costs(TARGET, None, {"name": "ar"}, 1, 10)
    assert set(ar) == {"verify", "commit"} and ar["commit"].bytes == 0
    tlv = stage_costs(TARGET, DRAFTER, {"name": "tlv", "tree_budget": 6, "level1_format": "int8"}, 1, 10)
    assert list(tlv) == ["draft", "tree", "level1", "verify", "commit"]
    assert tlv["level1"].kv_write == 2 * 7 * 8 * 2  # level 1 walks the whole tree: 6 nodes + root
    assert tlv["level1"].lm_head == 8 * 10 + 4 * 10  # quantized head
    assert tlv["verify"].kv_write == 2 * 4 * 8 * 2  # the exact target verifies only the chain
    bf = stage_costs(TARGET, DRAFTER, {"name": "ddtree", "tree_budget": 4}, 2, 10)["verify"]
    w12 = stage_costs(TARGET, DRAFTER, {"name": "ddtree", "tree_budget": 4, "weight_format": "w12"}, 2, 10)["verify"]
    assert bf.weights - w12.weights == 2 * 480 * 2 * 0.25 and bf.lm_head - w12.lm_head == 160 * 0.25
    sp = stage_costs(TARGET, DRAFTER, {"name": "specpilot", "budget_candidates": [2, 4]}, 2, 10, nodes=2)
    assert sp["verify"].kv_write == 2 * 2 * 3 * 8 * 2
    hw = Hardware("test", hbm_bytes_per_s=8832.0, matmul_flops_per_s=1e12)
    ceil = ceilings_ms(TARGET, DRAFTER, {"name": "ddtree", "tree_budget": 4}, 2, 10, hw)
    assert ceil["verify"] == pytest.approx(1000.0)  # memory-bound: 8832 bytes at 8832 B/s
    compute_bound = Hardware("test", hbm_bytes_per_s=1e15, matmul_flops_per_s=30400.0)
    assert ceilings_ms(TARGET, DRAFTER, {"name": "ddtree", "tree_budget": 4}, 2, 10, compute_bound)["verify"] == \
        pytest.approx(1000.0)


# ---- predictions on fake engines with known stage times ----------------------------------------------

BLOCK = 16
SWITCH_MS = lambda b: 1.5 + 0.1 * b  # noqa: E731


def true_ms(curve: str, x: float, b: int) -> float:
    """Known, bilinear stage times: the fitted model must reproduce them exactly."""
    if curve == "switch_verify/bf16":  # specpilot's verify: a lax.switch branch costs a fixed extra
        return true_ms("target_pass/bf16", x, b) + SWITCH_MS(b)
    return {
        "target_pass/bf16": 2.0 + 0.05 * x + 0.5 * b + 0.01 * x * b,
        "tlv_verify/bf16": 2.5 + 0.05 * x + 0.6 * b,
        "level1/int8": 1.0 + 0.02 * x + 0.3 * b,
        "draft/chain/bf16": 1.0 + 0.2 * b,
        "draft/tree/bf16": 1.1 + 0.2 * b,
        "draft/tlv/bf16": 1.3 + 0.25 * b,
        "tree/chain": 0.05 * b,
        "tree/best_first": 0.1 + 0.001 * x * b,
        "commit/chain/bf16": 0.3 + 0.1 * b,
        "commit/tree/bf16": 0.35 + 0.1 * b,
        "commit/tlv/bf16": 0.5 + 0.1 * b,
        "commit/ar": 0.02 * b,
    }[curve]


def fake(engine_cfg: dict, batch: int, acceptance=(1,), nodes=None) -> dict:
    pts = stage_points(engine_cfg, BLOCK, nodes)
    eng = FakeEngine(config_label(engine_cfg), acceptance=acceptance,
                     stage_ms={s: true_ms(c, x, batch) for s, (c, x) in pts.items()})
    return measured_row(eng.profile([[1, 2]] * batch, 32), engine_cfg, BLOCK, nodes)


MEASURED = [{"name": "ar"}, {"name": "stock"}, {"name": "ddtree", "tree_budget": 16},
            {"name": "ddtree", "tree_budget": 64}, {"name": "ddtree", "tree_budget": 256},
            {"name": "tlv", "tree_budget": 32, "level1_format": "int8"},
            {"name": "tlv", "tree_budget": 128, "level1_format": "int8"}]


SPECPILOT_CALIBRATION = {"name": "specpilot", "tree_budget": 64, "budget_candidates": [16, 64]}


@pytest.fixture(scope="module")
def rows():
    return [fake(c, b) for b in (1, 8) for c in MEASURED] + [fake(SPECPILOT_CALIBRATION, b, nodes=16) for b in (1, 8)]


def expected_step(engine_cfg, b, nodes=None):
    return sum(true_ms(c, x, b) for c, x in stage_points(engine_cfg, BLOCK, nodes).values())


@pytest.mark.parametrize("batch", [1, 4, 8, 32])
@pytest.mark.parametrize("engine_cfg", [
    {"name": "ar"}, {"name": "stock"}, {"name": "ddtree", "tree_budget": 32}, {"name": "ddtree", "tree_budget": 512},
    {"name": "tlv", "tree_budget": 64, "level1_format": "int8"},
])
def test_predictions_exact_on_fake_engines(rows, engine_cfg, batch):
    model = StepTimeModel.fit(rows)
    assert model.predict_step(engine_cfg, batch, BLOCK) == pytest.approx(expected_step(engine_cfg, batch), rel=1e-9)


def test_specpilot_budget_choice_and_speedup_exact(rows):
    model = StepTimeModel.fit(rows)
    cfg = {"name": "specpilot", "tree_budget": 256, "budget_candidates": [16, 64, 256]}
    cfg = model.specpilot_config(cfg, 8, BLOCK)
    assert cfg["verify_cost_ms"] == {n: pytest.approx(true_ms("target_pass/bf16", n + 1, 8), abs=1e-4)
                                     for n in (16, 64, 256)}
    tau = {16: 2.0, 64: 3.5, 256: 3.6}
    t = {n: cfg["draft_cost_ms"] + cfg["verify_cost_ms"][n] for n in tau}
    best = max(tau, key=lambda n: tau[n] / t[n])
    assert choose_budget(cfg, tau.get) == best == 64
    assert choose_budget(cfg) == 16  # random drafts: every budget yields ~1 token, the cheapest wins
    assert model.predict_step(cfg, 8, BLOCK, expected_tokens=tau.get) == pytest.approx(expected_step(cfg, 8, 64))
    # speedup = τ · t_AR / t_step, with FakeEngine stage times: exact.
    stock = fake({"name": "stock"}, 8, acceptance=(2, 4))
    ar_ms = expected_step({"name": "ar"}, 8)
    tau_stock = stock["tokens_per_round"] / 8
    assert tau_stock == 3.0
    want = 3.0 * ar_ms / expected_step({"name": "stock"}, 8)
    assert speedup(tau_stock, ar_ms, stock["round_ms"]) == pytest.approx(want)


def test_leave_one_out_exact_inside_the_measured_range(rows):
    loo = {(v["label"], v["batch"]): v for v in leave_one_out(rows, BLOCK)}
    assert loo[("ddtree@64", 1)]["error"] == pytest.approx(0.0, abs=1e-9)  # interpolated from x = 17 and 257
    assert loo[("ddtree@64", 8)]["error"] == pytest.approx(0.0, abs=1e-9)
    assert loo[("ddtree@16", 8)]["error"] == pytest.approx(0.0, abs=1e-9)  # extrapolated linearly: exact here
    # chain draft, tree and commit are measured by stock alone: without it, B=8 takes B=1's values.
    only_stock = 0.2 * 7 + 0.05 * 7 + 0.1 * 7
    assert loo[("stock", 8)]["predicted_ms"] == pytest.approx(expected_step({"name": "stock"}, 8) - only_stock)


def test_engine_kinds_keep_their_own_draft_and_commit_curves(rows):
    model = StepTimeModel.fit(rows)
    for name, kind in (("stock", "chain"), ("ddtree", "tree"), ("tlv", "tlv")):
        pts = stage_points({"name": name, "tree_budget": 64}, BLOCK)
        assert pts["draft"][0] == f"draft/{kind}/bf16" and pts["commit"][0] == f"commit/{kind}/bf16"
        assert model.curve_ms(*pts["commit"], 8) == pytest.approx(true_ms(f"commit/{kind}/bf16", 0, 8))


def test_specpilot_rounds_are_predicted_at_the_budgets_they_chose(rows):
    cfg = {"name": "specpilot", "tree_budget": 256, "budget_candidates": [16, 64, 256]}
    assert observed_budgets({"verified_nodes": [64, 60, 256, 64]}, cfg) == {64: 0.75, 256: 0.25}
    assert observed_budgets({"verified_nodes": [64]}, {"name": "ddtree", "tree_budget": 64}) == {}
    # the engine's own record wins: a 256-node budget whose tree had 60 valid nodes is not read as 64
    assert observed_budgets({"verified_nodes": [64, 60, 256], "chosen_budgets": [64, 256, 256]}, cfg) == {
        64: pytest.approx(1 / 3), 256: pytest.approx(2 / 3)}
    # a measured row that chose 64 in three rounds of four and 256 in one: its truth is that mixture
    truth = 0.75 * expected_step(cfg, 8, 64) + 0.25 * expected_step(cfg, 8, 256)
    eng = FakeEngine("specpilot", stage_ms={"draft": 0.0, "tree": 0.0, "verify": truth, "commit": 0.0})
    prof = {**eng.profile([[1, 2]] * 8, 32), "verified_nodes": [64, 64, 256, 64]}
    row = measured_row(prof, cfg, BLOCK)
    assert row["nodes_mix"] == {64: 0.75, 256: 0.25}
    (v,) = [v for v in leave_one_out(rows + [row], BLOCK) if v["label"] == row["label"]]
    assert v["predicted_ms"] == pytest.approx(truth, rel=1e-9)


def test_specpilot_verify_is_the_target_pass_plus_a_fitted_switch_overhead(rows):
    """A specpilot round verifies through `lax.switch`: it never moves the plain target-pass curve, and the
    overhead it adds is recovered per batch (and linearly in B between them), also from a row of mixed budgets."""
    model = StepTimeModel.fit(rows)
    for b in (1, 4, 8, 16):
        assert model.switch_overhead_ms("bf16", b) == pytest.approx(SWITCH_MS(b))
        assert model.curve_ms("target_pass/bf16", 17, b) == pytest.approx(true_ms("target_pass/bf16", 17, b))
    assert StepTimeModel.fit([r for r in rows if "specpilot" not in r["label"]]).switch_overhead_ms("bf16", 8) == 0.0
    cfg = {"name": "specpilot", "tree_budget": 256, "budget_candidates": [64, 256]}
    verify = 0.5 * true_ms("switch_verify/bf16", 65, 8) + 0.5 * true_ms("switch_verify/bf16", 257, 8)
    eng = FakeEngine("specpilot", stage_ms={"draft": 0.0, "tree": 0.0, "verify": verify, "commit": 0.0})
    row = measured_row({**eng.profile([[1, 2]] * 8, 32), "verified_nodes": [64, 256]}, cfg, BLOCK)
    only_mixed = StepTimeModel.fit([r for r in rows if "specpilot" not in r["label"]] + [row])
    assert only_mixed.switch_overhead_ms("bf16", 8) == pytest.approx(SWITCH_MS(8))
    assert model.specpilot_config(cfg, 8, BLOCK)["draft_cost_ms"] == pytest.approx(
        expected_step(cfg, 8, 64) - true_ms("switch_verify/bf16", 65, 8) + SWITCH_MS(8))


def test_single_level1_point_borrows_the_target_pass_shape(rows):
    model = StepTimeModel.fit([r for r in rows if r["label"] != "tlv@32/int8"])
    x0, x = 129, 65
    want = true_ms("level1/int8", x0, 8) * true_ms("target_pass/bf16", x, 8) / true_ms("target_pass/bf16", x0, 8)
    assert model.curve_ms("level1/int8", x, 8) == pytest.approx(want)
    assert model.curve_ms("level1/int8", x0, 8) == pytest.approx(true_ms("level1/int8", x0, 8))


def test_projection_labels_and_values(rows):
    tau = TauProfile({"stock": 2.5, "ddtree@16": 3.0, "ddtree@256": 4.0}, source="unit test")
    proj = {(p["label"], p["batch"]): p for p in project(rows, tau, BLOCK)}
    p = proj[("ddtree@64", 8)]
    assert p["kind"] == "projected" and p["tau"] == pytest.approx(3.5)  # halfway in log2 between 16 and 256
    assert p["speedup"] == pytest.approx(3.5 * expected_step({"name": "ar"}, 8) / expected_step(MEASURED[3], 8))
    assert proj[("stock", 1)]["tau_how"] == "measured"


def test_tau_profile_lookups():
    tau = TauProfile({"stock": 1.4, "ddtree@4": 1.5, "ddtree@64": 2.5, "tlv@128/int8": 2.2}, "t")
    assert tau.lookup({"name": "ar"}) == (1.0, "exact")
    assert tau.lookup({"name": "stock", "weight_format": "w12"}) == (1.4, "measured")  # W12 is lossless
    assert tau.lookup({"name": "ddtree", "tree_budget": 16})[0] == pytest.approx(2.0)
    assert tau.lookup({"name": "ddtree", "tree_budget": 1024})[0] == pytest.approx(2.5)  # flat beyond
    assert tau.lookup({"name": "tlv", "tree_budget": 128, "level1_format": "int8"}) == (2.2, "measured")
    assert tau.lookup({"name": "tlv", "tree_budget": 64})[1].startswith("ddtree τ")
    assert TauProfile.from_json(json.loads(json.dumps(tau.to_json()))) == tau


def test_gap_report_on_fake_profile():
    prof = FakeEngine(acceptance=(3,), stage_ms={"draft": 2.0, "verify": 10.0, "commit": 1.0}).profile([[1]], 8)
    rep = gap_report(prof, {"draft": 1.0, "verify": 4.0, "commit": 1.0})
    assert [c["stage"] for c in rep["components"]] == ["verify", "draft", "commit"]
    assert rep["components"][0]["gap_ms_per_token"] == pytest.approx(2.0)
    assert rep["ms_per_token"] == pytest.approx(13.0 / 3)


# ---- hardware calibration cache and shapes ------------------------------------------------------------


def test_calibration_is_cached_per_device_kind(tmp_path, monkeypatch):
    from specpilot.costmodel import hardware

    hw = hardware.load_or_calibrate(cache_dir=tmp_path, bandwidth_bytes=1 << 20, matmul_size=64)
    assert hw.hbm_bytes_per_s > 0 and hw.matmul_flops_per_s > 0 and hw.name == hardware.device_kind()
    assert (tmp_path / f"{hardware._file_name(hw.name)}.json").is_file()
    monkeypatch.setattr(hardware, "calibrate", lambda **kw: pytest.fail("should have used the cache"))
    assert hardware.load_or_calibrate(cache_dir=tmp_path) == hw


def test_shapes_without_hydra_match_the_config_layer(monkeypatch):
    import builtins

    from specpilot.costmodel import measure

    cfg = measure.model_config("llama31_8b")
    assert (cfg.num_layers, cfg.hidden_size, cfg.rope.kind, cfg.rope.factor) == (32, 4096, "llama3", 8.0)
    real_import = builtins.__import__

    def no_yaml(name, *a, **kw):  # the fallback parser (no PyYAML) reads every model file the same way
        if name == "yaml":
            raise ImportError(name)
        return real_import(name, *a, **kw)

    parsed = {m: measure.model_config(m) for m in ("tiny", "qwen3_4b", "qwen3_8b", "qwen3_14b", "llama31_8b")}
    monkeypatch.setattr(builtins, "__import__", no_yaml)
    assert {m: measure.model_config(m) for m in parsed} == parsed
    d = measure.synthetic_drafter_config(parsed["qwen3_8b"])
    assert (d.layers.num_layers, d.block_size, d.target_layer_ids) == (5, 16, (1, 9, 17, 25, 33))
    big = parsed["qwen3_14b"]  # GQA group 5: the tree-attention kernel pads it to 8 heads a KV head
    assert (big.num_layers, big.num_heads // big.num_kv_heads, big.hidden_size) == (40, 5, 5120)


def test_the_h200_bench_is_predicted_within_10_percent():
    """Issue #6's must-show, kept as a regression test: every configuration of the committed H200 bench
    (qwen3_8b shapes, batch 1, 8 and 32; docs/results/2026-11-30-costmodel-h200/) predicted from the other rows
    by today's model, within 10 %."""
    results = Path(__file__).resolve().parents[1] / "docs" / "results" / "2026-11-30-costmodel-h200"
    checked = []
    for part in ("b1_b8", "b32"):
        bench = json.loads((results / part / "bench.json").read_text())
        checked += leave_one_out(bench["rows"], bench["deployment"]["drafter"]["block_size"])
    assert sorted({(v["label"].split("@")[0].split("[")[0], v["batch"]) for v in checked}) == sorted(
        (e, b) for e in ("ar", "ddtree", "specpilot", "stock", "tlv") for b in (1, 8, 32))
    worst = max(checked, key=lambda v: abs(v["error"]))
    assert abs(worst["error"]) <= 0.10, worst


def test_warm_up_threads_fit_the_device_memory():
    from specpilot.costmodel.measure import warm_up_workers

    kv_b32 = 2 * 36 * 32 * 1536 * 8 * 128 * 2  # qwen3_8b shapes at batch 32: 7.2 GB of K/V
    assert warm_up_workers(3, kv_b32, free_bytes=120 * 2**30) == 2  # three ran out of memory on the H200
    assert warm_up_workers(3, kv_b32 // 32, free_bytes=120 * 2**30) == 3  # batch 1: no limit in sight
    assert warm_up_workers(3, kv_b32, free_bytes=10 * 2**30) == 1  # never fewer than one
    assert warm_up_workers(4, kv_b32, free_bytes=None) == 4  # a CPU reports no limit


def test_gpu_time_table_shows_tree_and_commit_share():
    from specpilot.costmodel.report import gpu_time_lines

    rows = [{"label": "ddtree@64", "batch": 1, "stage_gpu_ms": {"draft": 0.9, "tree": 0.1, "verify": 8.8, "commit": 0.2}},
            {"label": "ar", "batch": 1, "role": "calibration", "stage_gpu_ms": {"verify": 5.0, "commit": 0.05}},
            {"label": "stock", "batch": 8, "stage_ms": {"verify": 9.0}}]  # no --gpu-time: not listed
    md = "\n".join(gpu_time_lines(rows))
    assert "| ddtree@64 | 1 | 0.900 | 0.100 | 8.800 | 0.200 | 10.000 | 3.0 % |" in md
    assert "| ar (calibration) | 1 | – | – | 5.000 | 0.050 | 5.050 | 1.0 % |" in md
    assert "stock" not in md and "kernel by kernel" not in md  # no per-kernel split in these rows
    rows[0]["stage_gpu_kernels"] = {"tree": {"sort": 0.08, "pick": 0.02}, "commit": {"scatter": 0.15, "add": 0.05}}
    md = "\n".join(gpu_time_lines(rows))
    assert "- ddtree@64 B=1 tree: sort 80.00, pick 20.00" in md
    assert "- ddtree@64 B=1 commit: scatter 150.00, add 50.00" in md
    assert gpu_time_lines([{"label": "ar", "batch": 1, "stage_ms": {}}]) == []
    assert gpu_time_lines([{"label": "ar", "batch": 1, "stage_gpu_error": "no CUPTI"}])[-2] == "- not measured: no CUPTI"


def test_cupti_says_why_it_cannot_time_here():
    import jax

    from specpilot.costmodel.cupti import kernel_timings

    if jax.devices()[0].platform == "gpu":
        assert sum(ms for _, ms in kernel_timings(lambda: jax.numpy.ones(1024) + 1)) > 0
    else:
        with pytest.raises(RuntimeError, match="need an NVIDIA GPU; this backend is 'cpu'"):
            kernel_timings(lambda: jax.numpy.ones(4) + 1)


# ---- review: what the search, the projections and the fit get from the model ------------------------------------


def test_search_ceilings_count_the_deployment_dtype_and_committed_tokens():
    """The search's ceilings (`ModelBackend.ceilings`) count the deployment's weights at its own dtype (the default
    cpu deployment runs float32: 4 bytes) and K/V of the committed prompt, not of the KV capacity the engines share."""
    from hydra import compose, initialize_config_dir

    from specpilot.agent.backend import ModelBackend
    from specpilot.agent.ceilings import _hardware
    from specpilot.config import validate

    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "conf"), version_base=None):
        cfg = validate(compose("config", overrides=["deployment.models=config", "target.cache_dir=null"]))
    backend = ModelBackend(cfg)
    assert cfg.target.dtype == "float32" and [len(p) for p in backend.prompts] == [32, 32] and backend.context == 136
    # conf/model/tiny.yaml, an AR step over 32 committed tokens, float32: V=256, H=64, I=128, L=2, q=64, kv=32
    layer = 64 * 128 + 64 * 64 + 64 * 256 + 128 * 64 + 2 * 64 + 2 * 16  # linears + norms: 37024 elements
    weights = (2 * layer + 64 + 64) * 4  # + final norm + one embedding row
    kv = 2 * 33 * 64 * 4 + 2 * 1 * 64 * 4  # K/V of 32 committed + 1 new token read, 1 written, per layer
    acts = (2 * (192 + 128 + 128 + 320 + 192) + 64) * 4
    total = weights + 64 * 256 * 4 + kv + acts + 256 * 4
    assert total == 388608
    flops = 2 * (2 * (layer - 160) + 4 * 33 * 64) + 2 * 64 * 256
    hw = _hardware(cfg.deployment.gpu)
    assert flops / hw.matmul_flops_per_s < total / hw.hbm_bytes_per_s  # memory-bound
    ceil, source = backend.ceilings({"name": "ar"}, {})
    assert source == "costmodel"
    assert ceil["verify"] == pytest.approx(1e3 * total / hw.hbm_bytes_per_s, rel=1e-9)
    # a specpilot engine that chose 4 nodes in three rounds of four and 16 in one: each budget's ceiling in its share
    sp = {"name": "specpilot", "tree_budget": 16, "budget_candidates": [4, 16]}
    mixed, _ = backend.ceilings(sp, {"chosen_budgets": [4, 4, 16, 4]})
    small, _ = backend.ceilings(sp, {"chosen_budgets": [4]})
    large, _ = backend.ceilings(sp, {"chosen_budgets": [16]})
    assert small["verify"] < large["verify"] == backend.ceilings(sp, {})[0]["verify"]  # no record: the largest
    assert mixed["verify"] == pytest.approx(0.75 * small["verify"] + 0.25 * large["verify"])


def test_tau_profile_ignores_the_attention_implementation():
    """The attention kernel is lossless like W12: `tau_profile_from` keeps labels without either suffix, and a
    lookup for a pallas_tree engine finds the measured τ (it raised KeyError for stock, and called DDTree's measured
    τ interpolated)."""
    from specpilot.costmodel.measure import tau_profile_from

    gens = [{"label": "stock+pallas_tree", "batch": 1, "tau": 1.4}, {"label": "ddtree@64+w12+pallas_tree",
                                                                     "batch": 1, "tau": 2.5}]
    tau = tau_profile_from(gens, "t")
    assert tau.tau == {"stock": 1.4, "ddtree@64": 2.5}
    assert tau.lookup({"name": "stock", "attention": "pallas_tree"}) == (1.4, "measured")
    assert tau.lookup({"name": "ddtree", "tree_budget": 64, "attention": "pallas_tree"}) == (2.5, "measured")


def test_tau_profile_carries_the_lockstep_share_of_each_measured_batch_into_projections():
    """`tau_profile_from` keeps τ at the smallest batch and, per batch, the mean share of τ the loop delivered to the
    speculative rows (lockstep τ ÷ τ, over AR's); `project` multiplies τ by it at that batch only, and the share
    survives JSON."""
    from specpilot.costmodel.measure import tau_profile_from

    def gen(label, batch, tau, lockstep):
        return {"label": label, "batch": batch, "tau": tau, "lockstep_tau": lockstep}

    gens = [gen("ar", 1, 1.0, 1.0), gen("stock", 1, 2.0, 2.0),
            gen("ar", 32, 1.0, 1.0), gen("stock", 32, 2.6, 1.3), gen("ddtree@64", 32, 4.0, 1.6),
            gen("ar", 8, 1.0, 1.0)]  # batch 8: no speculative row, no share
    tau = tau_profile_from(gens, "t")
    assert tau.tau == {"stock": 2.0} and tau.lockstep == {1: 1.0, 32: pytest.approx(0.45)}
    assert TauProfile.from_json(json.loads(json.dumps(tau.to_json()))) == tau

    def row(cfg, batch, stages):
        return measured_row(FakeEngine(config_label(cfg), stage_ms=stages).profile([[1, 2]] * batch, 32), cfg, BLOCK)

    rows = [row(cfg, b, st) for b in (1, 8, 32) for cfg, st in (({"name": "ar"}, {"verify": 10.0, "commit": 0.0}),
                                                                ({"name": "stock"}, {"draft": 1.0, "verify": 4.0}))]
    proj = {p["batch"]: p for p in project(rows, tau, BLOCK)}
    assert proj[1]["tau"] == 2.0 and proj[8]["tau"] == 2.0 and proj[32]["tau"] == pytest.approx(0.9)
    assert proj[32]["speedup"] == pytest.approx(0.9 * 10.0 / 5.0) and "lockstep at batch 32" in proj[32]["tau_how"]


def test_projection_takes_t_ar_from_the_configurations_own_variant():
    """`project`'s t_AR at a batch is the AR row of the configuration's own weight format and attention (what it
    predicts when none was measured), whatever the row order: a bf16 stock's speedup was taken against AR+w12's
    step when a --formats bf16 w12 sweep measured that one last."""
    def row(cfg, stages):
        return measured_row(FakeEngine(config_label(cfg), stage_ms=stages).profile([[1, 2]] * 8, 32), cfg, BLOCK)

    stock, stock_w12 = {"name": "stock"}, {"name": "stock", "weight_format": "w12"}
    rows = [row({"name": "ar"}, {"verify": 10.0, "commit": 0.0}), row(stock, {"draft": 1.0, "verify": 4.0}),
            row({"name": "ar", "weight_format": "w12"}, {"verify": 8.0, "commit": 0.0}),
            row(stock_w12, {"draft": 1.0, "verify": 3.0})]
    tau = TauProfile({"stock": 2.0}, "t")
    for order in (rows, rows[::-1]):
        proj = {p["label"]: p for p in project(order, tau, BLOCK)}
        assert (proj["stock"]["t_ar_ms"], proj["stock"]["speedup"]) == (10.0, pytest.approx(2.0 * 10.0 / 5.0))
        assert (proj["stock+w12"]["t_ar_ms"], proj["stock+w12"]["speedup"]) == (8.0, pytest.approx(2.0 * 8.0 / 4.0))


def test_a_fit_without_a_target_pass_reports_no_switch_overhead():
    """Specpilot rows alone (bench.py --engines specpilot --calibration off) give no target pass to subtract: the
    fitted curves are still written (`to_json` raised IndexError after the whole sweep) and asking for the switch
    overhead says which curve is missing."""
    only = [fake(SPECPILOT_CALIBRATION, b, nodes=16) for b in (1, 8)]
    model = StepTimeModel.fit(only)
    assert model.to_json()["draft/tree/bf16@B8"] == [[16.0, pytest.approx(true_ms("draft/tree/bf16", 16, 8))]]
    assert not any(k.startswith("switch_overhead/") for k in model.to_json())
    with pytest.raises(KeyError, match="target_pass/bf16"):
        model.switch_overhead_ms("bf16", 8)
    assert [v["predicted_ms"] for v in leave_one_out(only, BLOCK)] == [None, None]


def test_measured_speedups_compare_each_configuration_with_its_own_variants_ar():
    """`generation_rows`: stock is timed against bf16 AR, not AR+w12 (whichever AR row came last was every row's
    baseline), and keeps AR's tokens."""
    from specpilot.costmodel import measure as M

    dep = M.synthetic_deployment("tiny", "bfloat16", 0, drafter_layers=1, block_size=4)
    configs = [{"name": "ar"}, {"name": "ar", "weight_format": "w12"}, {"name": "stock"}]
    rows = {g["label"]: g for g in M.generation_rows(dep, {1: configs}, [[1, 2, 3, 4]], 6, log=lambda _: None)}
    assert set(rows) == {"ar", "ar+w12", "stock"}
    for label, ar in (("stock", "ar"), ("ar+w12", "ar+w12")):
        assert rows[label]["speedup"] == pytest.approx(rows[ar]["wall_s"] / rows[label]["wall_s"])
        assert rows[label]["lossless"] is True
    # the loop's iterations: AR makes one a token after the prefill's; every row's rounds at most
    assert rows["ar"]["loop_steps"] == rows["ar"]["rounds"] == rows["ar"]["tokens"] - 1
    assert 1 <= rows["stock"]["loop_steps"] <= rows["ar"]["loop_steps"]
    assert rows["stock"]["loop_step_ms"] == pytest.approx(1e3 * rows["stock"]["wall_s"] / rows["stock"]["loop_steps"])
    assert rows["ar"]["lockstep_tau"] == 1.0


def test_lockstep_tau_counts_the_iterations_the_slowest_row_sets():
    """A batch of two where one row commits 3 tokens a round and the other 1: the loop runs the slow row's six
    iterations, so the rows get 12 tokens in 2 × 6 slots (τ 1.5 counts 8 rounds); results are pooled by slots."""
    from types import SimpleNamespace

    from specpilot.costmodel.measure import lockstep_tau

    fast_slow = SimpleNamespace(acceptance_lengths=[[3, 3], [1, 1, 1, 1, 1, 1]])
    alone = SimpleNamespace(acceptance_lengths=[[4, 4]])
    assert lockstep_tau([fast_slow]) == 1.0
    assert lockstep_tau([alone]) == 4.0
    assert lockstep_tau([fast_slow, alone]) == pytest.approx((12 + 8) / (12 + 2))
    assert lockstep_tau([]) == 0.0


def test_a_specpilot_row_that_chose_several_budgets_is_charged_their_mixture():
    """`counts.mixed_stage_costs`: 64 nodes in three rounds of four and 256 in one cost 3/4 and 1/4 of each, bytes
    and ceilings alike (it was the largest candidate's, 256, in every round)."""
    from specpilot.costmodel.hardware import Hardware

    cfg = {"name": "specpilot", "tree_budget": 256, "budget_candidates": [64, 256]}
    hw = Hardware(name="test", hbm_bytes_per_s=1e9, matmul_flops_per_s=1e6)

    def at(n):
        return stage_costs(TARGET, DRAFTER, cfg, 2, 16, 2, n)

    costs, ceilings = counts.mixed_stage_costs(TARGET, DRAFTER, cfg, 2, 16, 2, {64: 0.75, 256: 0.25}, hw)
    small, large = at(64)["verify"], at(256)["verify"]
    assert small.bytes < large.bytes
    assert costs["verify"].bytes == pytest.approx(0.75 * small.bytes + 0.25 * large.bytes)
    assert costs["verify"].flops == pytest.approx(0.75 * small.flops + 0.25 * large.flops)
    assert ceilings["verify"] == pytest.approx(0.75 * hw.ms(small.bytes, small.flops)
                                               + 0.25 * hw.ms(large.bytes, large.flops))
    assert counts.ceilings_ms(TARGET, DRAFTER, cfg, 2, 16, hw, 2, {64: 0.75, 256: 0.25}) == pytest.approx(ceilings)
    alone, _ = counts.mixed_stage_costs(TARGET, DRAFTER, cfg, 2, 16, 2, {}, None)  # no mix: the engine's own size
    assert alone["verify"].bytes == at(None)["verify"].bytes

def test_projection_on_kernel_time_leaves_specpilots_lost_switch_kernels_out_of_the_fit(rows):
    """`--gpu-time` rows projected on their CUPTI kernel time (`with_kernel_projections`): every stage's kernels
    here take half its wall, so speedups equal the wall projection's at half the step. SpecPilot's verify reads
    0.01 ms, as CUPTI lost its `lax.switch` branch on an H100: it is projected, never fitted, so its step is the
    DDTree step at the budget it picks. A row without every stage's kernel time is not projected on kernels."""
    from specpilot.costmodel.predict import on_kernel_time, with_kernel_projections

    def kernel_projections(rows, tau, block):
        return {(p["label"], p["batch"]): {"t_step_ms": p["t_step_kernels_ms"], "speedup": p["model_speedup_kernels"]}
                for p in with_kernel_projections(rows, tau, block)}

    def timed(r):
        gpu = {s: ms / 2 for s, ms in r["stage_ms"].items()}
        if r["engine_cfg"]["name"] == "specpilot":
            gpu["verify"] = 0.01
        return {**r, "stage_gpu_ms": gpu}

    kernel_rows = [timed(r) for r in rows]
    partial = {**kernel_rows[1], "stage_gpu_ms": {"draft": 1.0}}
    assert on_kernel_time([partial]) == [] and on_kernel_time(rows) == []
    tau = TauProfile({"stock": 2.5, "ddtree@16": 3.0, "ddtree@256": 4.0}, source="unit test")
    wall = {(p["label"], p["batch"]): p for p in project(kernel_rows, tau, BLOCK)}
    kern = kernel_projections(kernel_rows, tau, BLOCK)
    assert set(kern) == set(wall)
    for key in (("ddtree@64", 8), ("stock", 1), ("tlv@128/int8", 8)):
        assert kern[key]["t_step_ms"] == pytest.approx(wall[key]["t_step_ms"] / 2)
        assert kern[key]["speedup"] == pytest.approx(wall[key]["speedup"])
    [(label, nodes)] = {(k[0], int(k[0].split("budget ")[1].rstrip(")"))) for k in kern if k[0].startswith("spec")}
    assert kern[(label, 8)]["t_step_ms"] == pytest.approx(kern[(f"ddtree@{nodes}", 8)]["t_step_ms"])
    assert all(v == {"t_step_ms": None, "speedup": None} for v in kernel_projections(rows, tau, BLOCK).values())
    # AR and SpecPilot alone: no curve left for SpecPilot's draft and tree on kernel time, nothing projected on it
    alone = [r for r in kernel_rows if r["engine_cfg"]["name"] in ("ar", "specpilot")]
    assert all(v == {"t_step_ms": None, "speedup": None} for v in kernel_projections(alone, tau, BLOCK).values())
