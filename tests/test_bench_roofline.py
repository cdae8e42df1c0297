"""scripts/bench_roofline.py --quick runs end to end on the CPU: every variant in its own job, the report, and
the torch peer (scripts/peer_torch_decode.py, under the torch reference venv) as the same model as the JAX
forward: the same greedy tokens from the same exported float32 weights and KV cache.

The harness runs once per module (~30 s on 2 cores). Its parent process runs with hydra, omegaconf, pydantic
and wandb made unimportable, as on the GPU machine. The torch peer's compiled modes use the `aot_eager` backend
here: inductor's C++ compile of the step takes ~40 s on this CPU, and CUDA graphs do not exist on it anyway.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
REF_PYTHON = Path(os.environ.get("SPECPILOT_REF_PYTHON", REPO / ".venv-ref" / "bin" / "python"))
HAS_TORCH_PYTHON = REF_PYTHON.exists()
NO_TORCH = (f"torch reference python {REF_PYTHON} not found (`make ref-venv` creates .venv-ref, or set "
            "SPECPILOT_REF_PYTHON): the torch peer part is skipped")
BARE = ("import sys, runpy\n"
        "for m in ('hydra', 'omegaconf', 'pydantic', 'wandb', 'google.genai'): sys.modules[m] = None\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n")


def run_quick(tmp: Path, *args: str) -> tuple[dict, str, str, Path]:
    """`bench_roofline.py --quick *args` in `tmp` with a preset CPU calibration (the calibration itself is tested
    elsewhere): (report JSON, report markdown, stdout, output folder)."""
    hw = tmp / "cache" / "hw"
    hw.mkdir(parents=True)
    (hw / "cpu.json").write_text(json.dumps({"name": "cpu", "hbm_bytes_per_s": 2e10, "matmul_flops_per_s": 1e11,
                                             "platform": "cpu", "matmul_dtype": "float32"}))
    env = {**os.environ, "SPECPILOT_CACHE": str(tmp / "cache"), "JAX_DISABLE_MOST_OPTIMIZATIONS": "1",
           "JAX_PLATFORMS": "cpu"}
    out = tmp / "out"
    cmd = [sys.executable, "-c", BARE, str(REPO / "scripts" / "bench_roofline.py"), "--quick", "--out", str(out), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads((out / "roofline.json").read_text()), (out / "roofline.md").read_text(), proc.stdout, out


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    # every variant but the PDL / kernel-chain rows and the loops that differ from another only in what the CPU
    # ignores (the add + norm, rope and PDL kernels, a kernel split, GPU XLA flags: off a Hopper each runs the skinny
    # job's program in a process of its own, ~3.5 s): test_kernel_loops_carry_their_kernels_to_their_jobs,
    # test_chain_rows_carry_their_kernels_to_their_jobs and test_flag_only_loops_carry_their_settings_to_their_jobs
    # check what reaches their jobs, and test_every_xla_flag_set_parses_in_this_jaxlib that XLA takes their flags
    args = ["--variants", "xla_forward", "xla_decode_loop", "skinny_forward", "skinny_decode_loop",
            "xla_forward_w12",
            "xla_forward_w12_xla_decode", "xla_forward_w12_kernel", "w12_kernel_decode_loop", "verify_nodes",
            "verify_loop", "drafter"]
    if HAS_TORCH_PYTHON:
        args += ["torch_peer", "--torch-python", str(REF_PYTHON), "--torch-compile-backend", "aot_eager"]
    return run_quick(tmp_path_factory.mktemp("roofline"), *args, "--skinny-splits", "256x512=2", "64x64=1",
                     "--w12-swiglu-ab")


def test_every_variant_has_a_time_or_an_error_and_a_roofline(quick):
    rep, md, stdout, _ = quick
    names = [r["variant"] for r in rep["rows"]]
    expected = {"xla_forward", "xla_decode_loop", "xla_forward_w12", "xla_forward_w12_xla_decode",
                "xla_forward_w12_kernel", "w12_kernel_decode_loop", "w12_kernel_decode_loop, two-step swiglu",
                "verify_nodes@4", "verify_nodes@8", "verify_loop@4",
                "verify_loop@8", "drafter_b16", "drafter_b16_tree", "drafter_round_b16_tree", "drafter_fused_b16_tree",
                "skinny_forward", "skinny_decode_loop"}
    if HAS_TORCH_PYTHON:
        expected |= {"torch_peer_eager", "torch_peer_compile", "torch_peer_cudagraphs"}
    assert set(names) == expected
    for r in rep["rows"]:
        assert (r.get("ms") or 0) > 0 or r.get("error"), r
        roof = r["roofline"]
        assert roof["bytes"] > 0 and roof["ms_nominal"] > 0 and roof["ms_measured_bw"] > 0, r
        assert roof["bytes"] <= roof["bytes_all"]
        if r.get("ms"):
            assert r["x_roofline_nominal"] == pytest.approx(r["ms"] / roof["ms_nominal"])
        assert f"| {r['variant']} |" in md
    # W12 reads 12/16 of the linear bytes
    by = {r["variant"]: r for r in rep["rows"]}
    assert by["xla_forward_w12"]["roofline"]["weights_bytes"] < by["xla_forward"]["roofline"]["weights_bytes"]
    assert rep["provenance"]["command"].startswith("python ") and rep["provenance"]["device"] == "cpu"
    assert rep["provenance"]["hardware"]["hbm_bytes_per_s"] == 2e10
    assert all(j["status"] == "ok" for j in rep["jobs"]), rep["jobs"]
    assert stdout.rstrip().splitlines()[-1].startswith("wrote ") and "| issue #8 check |" in stdout


def test_jax_variants_ran_and_agree(quick):
    """No errors on the JAX side; the decode loops and W12 reproduce the forward's greedy tokens."""
    rep = quick[0]
    by = {r["variant"]: r for r in rep["rows"]}
    for name, r in by.items():
        if not name.startswith("torch"):
            assert r.get("ms", 0) > 0 and not r.get("error"), r
    ref = by["xla_forward"]["tokens"]
    assert len(ref) == rep["settings"]["check_steps"]
    for name in ("xla_decode_loop", "skinny_forward", "skinny_decode_loop"):
        assert by[name]["tokens"] == ref and by[name]["tokens_match"] is True, name
    # the drafter pass with the tree-attention op (its jnp reference on the CPU) drafts what XLA attention drafts
    draft, tree = by["drafter_b16"], by["drafter_b16_tree"]
    assert len(draft["tokens"]) == rep["settings"]["block_size"] - 1 and "tokens_match" not in draft
    assert tree["attention"] == "pallas_tree" and tree["tokens"] == draft["tokens"] and tree["tokens_match"] is True
    # the round rows: the one-pass ingest + draft drafts what the two calls draft; their roofline adds fc
    two, one = by["drafter_round_b16_tree"], by["drafter_fused_b16_tree"]
    assert one["tokens"] == two["tokens"] and one["tokens_match"] is True and "tokens_match" not in two
    assert two["roofline"]["weights_bytes"] == one["roofline"]["weights_bytes"] > tree["roofline"]["weights_bytes"]
    skinny_job = next(j for j in rep["jobs"] if j["job"] == "skinny")
    assert sorted(skinny_job["rows"]) == ["skinny_decode_loop", "skinny_forward"]
    skinny = json.loads((quick[3] / "jobs" / "skinny.json").read_text())  # what the worker set and reports
    assert skinny["matmul"] == "mosaic_gpu" and skinny["norm"] == "default" and skinny["skinny_splits"] == {}
    for name in ("xla_forward_w12", "xla_forward_w12_xla_decode", "xla_forward_w12_kernel", "w12_kernel_decode_loop",
                 "w12_kernel_decode_loop, two-step swiglu"):
        w = by[name]
        assert w["tokens"] == w["bf16_tokens"] and w["tokens_match"] is True and w["tokens_equal_bf16"] is True
        assert w["ratio_vs_bf16"] == pytest.approx(w["ms"] / w["bf16_ms"])
    assert "not a Hopper GPU" in by["xla_forward_w12_kernel"]["implementation"]
    assert by["xla_forward_w12_xla_decode"]["implementation"].startswith("xla_decode")
    assert by["verify_nodes@8"]["ratio_vs_ar"] == pytest.approx(by["verify_nodes@8"]["ms"] / by["xla_forward"]["ms"])
    loop = by["verify_loop@8"]  # per verify in a loop, against the decode loop's step
    assert loop["loop_steps"] == rep["settings"]["loop_steps"] and loop["nodes"] == 8
    assert loop["ratio_vs_ar"] == pytest.approx(loop["ms"] / by["xla_decode_loop"]["ms"])
    assert {t["what"] for t in rep["targets"]} >= {"xla_forward_w12 / bf16 (same process)"}


@pytest.mark.skipif(not HAS_TORCH_PYTHON, reason=NO_TORCH)
def test_torch_peer_is_the_same_model(quick):
    """Exported float32 weights and cache: the peer's greedy tokens equal the JAX forward's, in every mode."""
    rep = quick[0]
    by = {r["variant"]: r for r in rep["rows"]}
    ref = by["xla_forward"]["tokens"]
    for name in ("torch_peer_eager", "torch_peer_compile", "torch_peer_cudagraphs"):
        r = by[name]
        assert not r.get("error"), r
        assert r["weights"] == "exported from the JAX pytree"
        assert r["tokens"] == ref and r["tokens_match"] is True, (name, r["tokens"], ref)
    assert by["torch_peer_compile"]["mode"] == "max-autotune-no-cudagraphs"
    assert by["torch_peer_cudagraphs"]["mode"] == "reduce-overhead"
    assert rep["provenance"]["torch"]


def _load_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_roofline", REPO / "scripts" / "bench_roofline.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_forms_differing_in_a_trace_time_setting_each_trace_their_own_program(monkeypatch):
    """The W12 jobs lower one function in several forms that differ only in a module setting read at trace time;
    ``fresh`` gives each form its own trace (the same function lowered again would reuse the first form's)."""
    import jax
    import jax.numpy as jnp

    from pallas_kernels.w12 import ops as w12_ops

    br = _load_script()
    monkeypatch.setattr(w12_ops, "DEFAULT", w12_ops.DEFAULT)

    def step(x):
        return x * 2 if w12_ops.DEFAULT == "mosaic_gpu" else x + 1

    texts = []
    for setting in ("reference", "mosaic_gpu"):
        w12_ops.DEFAULT = setting
        texts.append(jax.jit(br.fresh(step)).lower(jnp.ones(3)).as_text())
    assert "add" in texts[0] and "multiply" in texts[1]


def test_skinny_splits_parse_items_and_files_and_name_a_bad_entry(tmp_path):
    br = _load_script()
    table = tmp_path / "splits.json"
    table.write_text(json.dumps({"4096x4096": 1, "12288x4096": 4}))
    assert br.parse_skinny_splits(["4096x6144=2", str(table)]) == {"4096x6144": 2, "4096x4096": 1, "12288x4096": 4}
    for bad, message in (("4096x4096=0", "bad entry 4096x4096=0"), ("4096=2", "bad entry 4096=2"),
                         ("nofile.json", "neither KxN=S nor a file")):
        with pytest.raises(SystemExit, match=message):
            br.parse_skinny_splits([bad])


def test_skinny_max_tokens_set_the_row_limits_and_name_a_bad_item(monkeypatch, capsys):
    from pallas_kernels.skinny_matmul import ops as skinny_ops

    br = _load_script()
    monkeypatch.setattr(skinny_ops, "MAX_TOKENS", skinny_ops.MAX_TOKENS)
    monkeypatch.setattr(skinny_ops, "MAX_TOKENS_BY_SHAPE", dict(skinny_ops.MAX_TOKENS_BY_SHAPE))
    args = br.parse_args(["--skinny-max-tokens", "0", "4096x6144=16"])
    br.apply_kernel_settings({"skinny_max_tokens": args.skinny_max_tokens})
    assert skinny_ops.MAX_TOKENS == 0 and skinny_ops.MAX_TOKENS_BY_SHAPE[(4096, 6144)] == 16
    with pytest.raises(SystemExit):
        br.parse_args(["--skinny-max-tokens", "4096x6144"])
    assert "--skinny-max-tokens: '4096x6144' is neither ROWS nor KxN=ROWS" in capsys.readouterr().err


def test_kernel_split_is_opt_in_and_says_why_it_is_missing(tmp_path):
    """--kernel-split adds a per-kernel split to a row, or says why it could not (no CUPTI, as on a CPU); without
    the flag nothing is added."""
    import jax
    import jax.numpy as jnp

    br = _load_script()
    call = lambda st: (st[0] + 1, st[1])  # noqa: E731
    for flag in (False, True):
        worker = br.Worker({"job": "t", "result": str(tmp_path / f"r{flag}.json"), "kernel_split": flag})
        worker.row("v", ms=1.0)
        worker.kernel_split("v", call, (jnp.zeros(3), None))
        row = worker.res["rows"]["v"]
        if not flag:
            assert "kernels" not in row and "kernels_error" not in row, row
        elif jax.devices()[0].platform == "cpu":
            assert "kernels_error" in row and "kernels" not in row, row
        else:  # a GPU: one of the two, never both
            assert ("kernels" in row) != ("kernels_error" in row), row


def test_kernel_fields_group_by_name_and_split_matmuls_from_the_rest():
    br = _load_script()
    timings = [("gemm_fusion_dot_1", 0.020), ("kernel_mosaic_gpu_kernel", 0.025), ("gemm_fusion_dot_1", 0.010),
               ("loop_add_fusion", 0.0015), ("memcpy128", 0.0023), ("nvjet_sm90_tss", 0.1)]
    f = br.kernel_fields(timings)
    assert f["kernel_launches"] == 6 and f["matmul_launches"] == 4
    assert f["kernels_ms"] == pytest.approx(0.1588) and f["matmul_kernels_ms"] == pytest.approx(0.155)
    assert f["kernels"][0] == {"name": "nvjet_sm90_tss", "us": 100.0, "launches": 1}
    assert {"name": "gemm_fusion_dot_1", "us": 30.0, "launches": 2} in f["kernels"]
    named = br.kernel_fields([("skinny_matmul_body_mosaic_gpu_kernel", 0.02), ("w12_matmul_body_mosaic_gpu_kernel", 0.02),
                              ("tree_attention_body_mosaic_gpu_kernel", 0.007),
                              ("add_rms_norm_body_mosaic_gpu_kernel", 0.002)])  # the package's kernels by name
    assert named["matmul_launches"] == 3 and named["matmul_kernels_ms"] == pytest.approx(0.047)
    per_step = br.kernel_fields(timings * 4, per=4)  # a 4-step loop's call, per step
    assert per_step["kernels_ms"] == pytest.approx(f["kernels_ms"]) and per_step["kernel_launches"] == 6
    many = br.kernel_fields([(f"k{i}", 0.001 * (i + 1)) for i in range(br.KERNELS_LISTED + 5)])
    assert len(many["kernels"]) == br.KERNELS_LISTED and many["kernel_launches"] == br.KERNELS_LISTED + 5
    # a loop's split that accounts for little of its step is refused, saying how little it saw
    assert br.unrecorded_kernels(per_step, step_ms=0.2) is None
    assert br.unrecorded_kernels(per_step, step_ms=4.434) == (
        "CUPTI saw 0.159 ms of kernels in a 4.434 ms step (6.0 launches): most of the loop's kernels went unrecorded")


def test_draft_gaps_name_the_differing_positions_and_the_top2_gaps():
    br = _load_script()
    ref = {"tokens": [5, 7, 9], "top2_logits": [[3.0, 1.0], [2.5, 2.4921875], [4.0, 0.0]]}
    row = {"tokens": [5, 8, 9], "top2_logits": [[3.0, 1.0], [2.5, 2.4960938], [4.0, 0.0]]}
    assert br.draft_gaps(row, ref) == ("1 of 3 drafts differ; the reference's top-2 logit gap at position 1: gap "
                                       "0.0078 (this row 0.0039)")
    assert br.draft_gaps({"tokens": [1]}, ref) is None  # a row measured without its top-2 logits


def test_kernel_split_renders_in_the_report():
    br = _load_script()
    kernels = [{"name": "kernel_mosaic_gpu_kernel", "us": 24.4, "launches": 1}]
    row = {"variant": "xla_forward_w12_kernel", "what": "W12", "ms": 9.5, "roofline": {"ms_measured_bw": 3.0,
           "ms_nominal": 2.7}, "x_roofline_nominal": 3.5, "kernels": kernels, "kernels_ms": 0.0244,
           "kernel_launches": 3, "matmul_kernels_ms": 0.0244, "matmul_launches": 1,
           "bf16_kernels": [{"name": "gemv", "us": 29.4, "launches": 1}], "bf16_kernels_ms": 0.0294}
    rep = {"provenance": {"date": "d", "device": "H200", "jax": "0.11.2", "torch": None, "commit": "c",
                          "command": "cmd", "wall_s": 1.0, "hardware": None},
           "settings": {"model": "m", "dtype": "bfloat16", "context": 1}, "rows": [row], "targets": [], "jobs": []}
    md = br.markdown(rep)
    assert ("Kernels of one call of xla_forward_w12_kernel (CUPTI, 0.024 ms GPU time in all, 3 launches; "
            "matmul-like 0.024 ms in 1 launches, the rest 0.000 ms in 2; the 1 largest names)") in md
    assert "| `kernel_mosaic_gpu_kernel` | 24.4 | 1 |" in md
    assert "Kernels of one call of xla_forward_w12_kernel: its bf16 forward" in md and "| `gemv` | 29.4 | 1 |" in md


def test_ar_rows_with_the_tree_attention_path_give_the_same_tokens(quick, tmp_path):
    """--ar-attention pallas_tree: the AR forward and decode loop run the tree-attention path (its jnp reference on
    a CPU) with the K/V written after the last layer, and reproduce the XLA-attention run's greedy tokens. --norm
    mosaic_gpu and --rope mosaic_gpu reach the workers (off a Hopper the add + norm and the rope stay XLA's, so the
    tokens stay too)."""
    rep, md, _, out = run_quick(tmp_path, "--variants", "xla_forward", "xla_decode_loop", "--ar-attention",
                                "pallas_tree", "--norm", "mosaic_gpu", "--rope", "mosaic_gpu")
    by = {r["variant"]: r for r in rep["rows"]}
    assert rep["settings"]["ar_attention"] == "pallas_tree" and rep["settings"]["norm"] == "mosaic_gpu"
    assert "AR rows `pallas_tree`" in md and "Residual add + RMSNorm: `mosaic_gpu`" in md
    assert "q/k norm + rope: `mosaic_gpu`." in md
    job = json.loads((out / "jobs" / "xla.json").read_text())
    assert (job["norm"], job["rope"]) == ("mosaic_gpu", "mosaic_gpu")
    xla_tokens = {r["variant"]: r for r in quick[0]["rows"]}["xla_forward"]["tokens"]
    assert by["xla_forward"]["tokens"] == xla_tokens
    assert by["xla_decode_loop"]["tokens"] == xla_tokens and by["xla_decode_loop"]["tokens_match"] is True


def test_drafter_rows_are_checked_on_gpu_time_too():
    """A drafter row with a kernel split gets the ≤ 1.2× check twice: on its host-synced wall time and on its GPU
    time (the pass inside the fused round), each against the row's roofline at 4.3 TB/s."""
    br = _load_script()
    s = br.settings(br.parse_args(["--quick"]))
    results = {"drafter_fused_b16_tree": {"ms": 1.5, "kernels_ms": 0.002}}
    rep = br.build_report(s, results, [], ["drafter_fused_b16_tree"], None, 1.0)
    roof = rep["rows"][0]["roofline"]["ms_nominal"]
    checks = {t["what"]: t for t in rep["targets"]}
    gpu = checks["drafter_fused_b16_tree GPU time / roofline at 4.3 TB/s"]
    assert gpu["value"] == pytest.approx(0.002 / roof) and gpu["ok"] == (0.002 / roof <= 1.2)
    assert checks["drafter_fused_b16_tree / roofline at 4.3 TB/s"]["value"] == pytest.approx(1.5 / roof)


def test_w12_config_reaches_only_the_w12_job(tmp_path):
    """``--w12-config`` is a W12-job setting: its spec carries it, and a job given it sets the kernel's default config
    (restored here); a bad field or value stops the parse with its name."""
    import dataclasses

    from pallas_kernels.w12 import mosaic_gpu as w12_mosaic_gpu

    br = _load_script()
    args = br.parse_args(["--quick", "--variants", "xla_forward", "w12_kernel_decode_loop",
                          "--w12-config", "escapes_in_kernel=False,overlap_decode=True,max_concurrent_steps=3"])
    jobs, w12 = br.plan_jobs(args, br.settings(args), tmp_path, br.selected_variants(args))
    want = {"escapes_in_kernel": False, "overlap_decode": True, "max_concurrent_steps": 3}
    assert w12.spec["w12_config"] == want and all("w12_config" not in j.spec for j in jobs)
    default = w12_mosaic_gpu.DEFAULT_CONFIG
    assert default.escapes_in_kernel and not default.overlap_decode
    try:
        assert br.apply_kernel_settings(w12.spec)["w12_config"] == want
        assert w12_mosaic_gpu.DEFAULT_CONFIG == dataclasses.replace(default, **want)
    finally:
        w12_mosaic_gpu.DEFAULT_CONFIG = default
    for bad, named in [("overlap_decodes=True", "overlap_decodes"), ("overlap_decode=yes", "True or False"),
                       ("split_k=two", "integer"),
                       ("decode=smem,escapes_in_kernel=True", "escapes_in_kernel needs decode='registers'")]:
        with pytest.raises(SystemExit):
            br.parse_args(["--quick", "--w12-config", bad])
        with pytest.raises(ValueError, match=named):
            br.w12_config_fields(bad)


def test_skinny_config_reaches_every_jax_job(tmp_path):
    """``--skinny-config`` sets the skinny kernel's default config in every JAX job (restored here); a bad field stops
    the parse naming it."""
    from pallas_kernels.skinny_matmul import mosaic_gpu as skinny_mosaic_gpu

    br = _load_script()
    args = br.parse_args(["--quick", "--variants", "xla_forward", "--skinny-config", "tile_k=256,blocks_per_sm=1"])
    jobs, _ = br.plan_jobs(args, br.settings(args), tmp_path, br.selected_variants(args))
    want = {"tile_k": 256, "blocks_per_sm": 1}
    assert jobs and all(j.spec["skinny_config"] == want for j in jobs if j.kind == "jax")
    default = skinny_mosaic_gpu.DEFAULT_CONFIG
    try:
        assert br.apply_kernel_settings(jobs[0].spec)["skinny_config"] == want
        assert skinny_mosaic_gpu.DEFAULT_CONFIG.blocks_per_sm == 1 and skinny_mosaic_gpu.DEFAULT_CONFIG.tile_k == 256
    finally:
        skinny_mosaic_gpu.DEFAULT_CONFIG = default
    for bad, named in [("tile_km=128", "tile_km"), ("tile_m=12", "tile_m must be 0"), ("tile_k=128k", "an integer")]:
        with pytest.raises(SystemExit):
            br.parse_args(["--quick", "--skinny-config", bad])
        with pytest.raises(ValueError, match=named):
            br.skinny_config_fields(bad)


def test_kernel_loops_carry_their_kernels_to_their_jobs(tmp_path):
    """The add + norm, split and rope loops each get a job whose spec names its kernels and K splits, and a worker
    given the split job's spec sets the splits (restored here) and reports them."""
    from pallas_kernels import choices
    from pallas_kernels.skinny_matmul import mosaic_gpu as skinny_mosaic_gpu

    br = _load_script()
    rows = ["fused_norm_decode_loop", "split_decode_loop", "rope_decode_loop"]
    args = br.parse_args(["--quick", "--variants", *rows, "--skinny-splits", "256x512=2", "64x64=1"])
    jobs, _ = br.plan_jobs(args, br.settings(args), tmp_path, br.selected_variants(args))
    by_row = {r: j.spec for j in jobs for r in j.rows}
    fused, split, rope = (by_row[r] for r in rows)
    assert (fused["matmul"], fused["norm"], fused["pdl"]) == ("mosaic_gpu", "mosaic_gpu", False)
    assert not fused.get("skinny_splits") and not fused.get("rope") and rope["rope"] == "mosaic_gpu"
    assert split["skinny_splits"] == {"256x512": 2, "64x64": 1} and split["norm"] == "mosaic_gpu"
    before, splits_before = choices.current(), dict(skinny_mosaic_gpu.SPLIT_K_BY_SHAPE)
    try:
        res = br.apply_kernel_settings(split)
        assert res["skinny_splits"] == split["skinny_splits"]
        assert choices.current()["norm"] == choices.current()["matmul"] == "mosaic_gpu" and not choices.current()["pdl"]
        assert skinny_mosaic_gpu.SPLIT_K_BY_SHAPE[(256, 512)] == 2 and skinny_mosaic_gpu.SPLIT_K_BY_SHAPE[(64, 64)] == 1
    finally:
        choices.use(**before)
        skinny_mosaic_gpu.SPLIT_K_BY_SHAPE.clear()
        skinny_mosaic_gpu.SPLIT_K_BY_SHAPE.update(splits_before)


def test_flag_only_loops_carry_their_settings_to_their_jobs(tmp_path):
    """The loops the quick run leaves out (they differ from a row it runs only in what the CPU ignores): each gets a
    job whose spec holds its kernels, PDL, split handling and XLA flags."""
    br = _load_script()
    rows = ["pdl_decode_loop", "summed_splits_decode_loop", "skinny_cmdbuf_while", "xla_flags"]
    args = br.parse_args(["--quick", "--variants", *rows])
    jobs, _ = br.plan_jobs(args, br.settings(args), tmp_path, br.selected_variants(args))
    by_row = {r: j for j in jobs for r in j.rows}
    pdl, summed, both = (by_row[r].spec for r in rows[:3])
    assert (pdl["matmul"], pdl["norm"], pdl["pdl"]) == ("mosaic_gpu", "mosaic_gpu", True)
    assert (summed["matmul"], summed["norm"], summed["pass_splits"]) == ("mosaic_gpu", "mosaic_gpu", False)
    flags = by_row["skinny_cmdbuf_while"].env["XLA_FLAGS"]
    assert both["matmul"] == "mosaic_gpu" and "WHILE" in flags
    assert flags == by_row["xla_flags_cmdbuf_while"].env["XLA_FLAGS"]
    for name, f in br.XLA_FLAG_VARIANTS.items():  # each flag row: the decode loop in a process with its flags
        assert by_row[name].env["XLA_FLAGS"].endswith(f) and by_row[name].spec["variants"] == ["xla_decode_loop"]


def test_every_xla_flag_set_parses_in_this_jaxlib():
    """XLA aborts a process at an unknown flag, which on the GPU machine would cost a device call: every flag set of
    the bench's flag rows runs a jitted computation here (XLA parses GPU flags on the CPU too)."""
    def jit_under(flags):
        env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
        return subprocess.run([sys.executable, "-c", "import jax; print(jax.jit(lambda x: x + 1)(1.0))"], env=env,
                              capture_output=True, text=True, timeout=120, check=False)

    for name, flags in _load_script().XLA_FLAG_VARIANTS.items():
        proc = jit_under(flags)
        assert proc.returncode == 0 and proc.stdout.strip() == "2.0", (name, proc.stderr[-2000:])
    proc = jit_under("--xla_gpu_no_such_flag=1")
    assert proc.returncode != 0 and "Unknown flag" in proc.stderr  # so the check above can fail


def test_chain_rows_carry_their_kernels_to_their_jobs(tmp_path):
    """The PDL / kernel-chain rows each get a job whose spec names its kernels, and a job given them sets the modules'
    flags (restored here)."""
    from pallas_kernels import pdl
    from pallas_kernels.swiglu import ops as swiglu_ops
    from pallas_kernels.tree_attention import mosaic_gpu as ta_mosaic_gpu

    br = _load_script()
    rows = ["rope_decode_loop", "pdl_rope_decode_loop", "chain_decode_loop", "pdl_chain_decode_loop"]
    args = br.parse_args(["--quick", "--variants", *rows])
    jobs, _ = br.plan_jobs(args, br.settings(args), tmp_path, br.selected_variants(args))
    spec = {j.rows[0]: j.spec for j in jobs}
    assert sorted(spec) == sorted(rows)
    kernels = lambda r: (spec[r].get("pdl"), spec[r].get("swiglu"), bool(spec[r].get("combine_kernel")))
    assert kernels("rope_decode_loop") == (False, None, False)
    assert kernels("pdl_rope_decode_loop") == (True, None, False)
    assert kernels("chain_decode_loop") == (False, "mosaic_gpu", True)
    assert kernels("pdl_chain_decode_loop") == (True, "mosaic_gpu", True)
    assert all(spec[r]["rope"] == spec[r]["norm"] == spec[r]["matmul"] == "mosaic_gpu" for r in rows)
    from pallas_kernels.add_rms_norm import ops as norm_ops
    from pallas_kernels.qk_norm_rope import ops as rope_ops
    from pallas_kernels.skinny_matmul import ops as skinny_ops

    ops = (swiglu_ops, norm_ops, rope_ops, skinny_ops)
    saved = (pdl.ENABLED, ta_mosaic_gpu.COMBINE_KERNEL, [m.DEFAULT for m in ops])
    try:
        res = br.apply_kernel_settings(spec["pdl_chain_decode_loop"])
        assert (res["pdl"], res["swiglu"], res["combine_kernel"]) == (True, "mosaic_gpu", True)
        assert (pdl.ENABLED, swiglu_ops.DEFAULT, ta_mosaic_gpu.COMBINE_KERNEL) == (True, "mosaic_gpu", True)
    finally:
        pdl.ENABLED, ta_mosaic_gpu.COMBINE_KERNEL = saved[:2]
        for m, default in zip(ops, saved[2]):
            m.DEFAULT = default


def test_swiglu_matmul_reaches_the_jobs_and_the_report(tmp_path, monkeypatch, capsys):
    """``--swiglu-matmul`` and its ``--swiglu-matmul-config`` are in every job's spec, a job given them sets the
    kernel's dispatch and tiles, and the report's header names them."""
    from pallas_kernels.swiglu_matmul import mosaic_gpu as sm_mosaic_gpu
    from pallas_kernels.swiglu_matmul import ops as sm_ops

    br = _load_script()
    args = br.parse_args(["--quick", "--variants", "rope_decode_loop", "drafter", "--swiglu-matmul", "mosaic_gpu",
                          "--swiglu-matmul-config", "64", "6"])
    jobs, _ = br.plan_jobs(args, br.settings(args), tmp_path, br.selected_variants(args))
    assert jobs and all(j.spec["swiglu_matmul"] == "mosaic_gpu" for j in jobs)
    monkeypatch.setattr(sm_ops, "DEFAULT", "xla")
    monkeypatch.setattr(sm_mosaic_gpu, "DEFAULT_CONFIG", sm_mosaic_gpu.TuningConfig())
    res = br.apply_kernel_settings(jobs[0].spec)
    assert (res["swiglu_matmul"], sm_ops.DEFAULT) == ("mosaic_gpu", "mosaic_gpu")
    assert sm_mosaic_gpu.DEFAULT_CONFIG == sm_mosaic_gpu.TuningConfig(tile_k=64, max_concurrent_steps=6)
    rep = br.build_report(br.settings(args), {"rope_decode_loop": {"ms": 4.4}}, [], ["rope_decode_loop"], None, 1.0)
    assert "in the gate|up matmul: `mosaic_gpu` (tile_k, steps (64, 6))" in br.markdown(rep)
    with pytest.raises(SystemExit):
        br.parse_args(["--swiglu-matmul-config", "96", "3"])
    assert "--swiglu-matmul-config: TILE_K must be a positive multiple of 64 and STEPS >= 1, got 96 3" in (
        capsys.readouterr().err)


def test_a_job_that_does_not_end_well_leaves_its_last_log_lines_in_the_report(tmp_path, monkeypatch):
    """A job cut by its timeout (or failing) keeps the last lines of its log in its record and in the markdown, so a
    run whose logs folder stays on the GPU machine still says how far the job got; a job that ends well keeps none."""
    br = _load_script()
    args = br.parse_args(["--quick"])
    runner = br.Runner(args, tmp_path, budget_s=60)
    script = "import time; [print(f'step {i}') for i in range(20)]; print('traced 6 programs', flush=True); "
    monkeypatch.setattr(runner, "command", lambda job: [sys.executable, "-c", script + job.spec["then"]])
    slow = runner.run(br.Job("slow", "jax", ["xla_forward"], 5.0, {"then": "time.sleep(60)"}), None)
    fine = runner.run(br.Job("fine", "jax", ["xla_forward"], 30.0, {"then": "pass"}), None)
    assert slow["status"] == "timeout after 5s" and fine["status"] == "ok"
    assert slow["log_tail"] == [f"step {i}" for i in range(13, 20)] + ["traced 6 programs"]
    assert "log_tail" not in fine
    rep = br.build_report(br.settings(args), {}, runner.records, ["xla_forward"], None, 1.0)
    text = br.markdown(rep)
    assert "Last lines of `logs/slow.log` (timeout after 5s):" in text and "traced 6 programs" in text
    assert "logs/fine.log" not in text


def test_report_names_the_xla_flags_its_jobs_inherited(monkeypatch):
    """XLA_FLAGS in the harness's environment reach every job (they inherit it): the report records and names them."""
    br = _load_script()
    s = br.settings(br.parse_args(["--quick"]))
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_command_buffer=")
    rep = br.build_report(s, {"rope_decode_loop": {"ms": 4.4}}, [], ["rope_decode_loop"], None, 1.0)
    assert rep["provenance"]["xla_flags"] == "--xla_gpu_enable_command_buffer="
    assert "XLA_FLAGS of every job: `--xla_gpu_enable_command_buffer=`." in br.markdown(rep)
    monkeypatch.delenv("XLA_FLAGS")
    rep = br.build_report(s, {"rope_decode_loop": {"ms": 4.4}}, [], ["rope_decode_loop"], None, 1.0)
    assert rep["provenance"]["xla_flags"] == "" and "XLA_FLAGS of every job" not in br.markdown(rep)


def test_memory_fractions_leave_the_w12_job_its_two_weight_copies_on_an_h100():
    """The background W12 job holds the bf16 weights and their W12 copy (~29 GB for Qwen3-8B): 0.30 of an 80 GB H100
    is 24 GB (it ran out of memory there), of a 141 GB H200 42 GB. Both fractions together stay under the device."""
    mod = _load_script()
    h100, h200 = mod.memory_fractions(81559.0), mod.memory_fractions(143771.0)
    assert h200 == ("0.60", "0.30") and mod.memory_fractions(None) == h200
    fg, w12 = map(float, h100)
    assert w12 * 80 >= 35 and fg + w12 <= 0.95


@pytest.mark.parametrize("script", sorted(p for p in (REPO / "scripts" / "h200").glob("*.sh")
                                           if "scripts/bench_roofline.py" in p.read_text()), ids=lambda p: p.name)
def test_h200_scripts_pass_bench_roofline_arguments_it_accepts(script):
    """Every `bench_roofline.py` line of a GPU script parses, its variants are known: a typo costs a device call."""
    import shlex

    br = _load_script()
    text = script.read_text().replace("\\\n", " ")
    lines = [ln for ln in text.splitlines() if "scripts/bench_roofline.py" in ln]
    runs = []
    for line in lines:
        words = shlex.split(line.split("scripts/bench_roofline.py", 1)[1].split(">")[0])
        # "$@" (the caller's extra arguments) dropped; another shell variable is a budget in these scripts
        words = ["300" if w.startswith("$") else w for w in words if w != "$@"]
        args = br.parse_args(words)
        assert br.selected_variants(args)
        runs.append((br.selected_variants(args), br.kernel_choices(br.settings(args))))
    assert lines
    if script.name == "ar_side_by_side.sh":  # one run, no kernel flag: plain XLA, our fastest step, PyTorch
        assert runs == [(["xla_decode_loop", "fast_decode_loop", "torch_peer_cudagraphs"], [])]


def test_the_fast_decode_loop_sets_its_kernels_whatever_the_run_sets(tmp_path):
    """`fast_decode_loop` runs our kernels and the tree-attention kernel in its own job, so a run without kernel flags
    has plain XLA (`xla_decode_loop`) and our step side by side; its issue #8 check is <= 1.10x the roofline."""
    br = _load_script()
    args = br.parse_args(["--quick", "--variants", "xla_decode_loop", "fast_decode_loop", "torch_peer_cudagraphs"])
    jobs, _ = br.plan_jobs(args, br.settings(args), tmp_path, br.selected_variants(args))
    spec = {j.name: j.spec for j in jobs if j.kind == "jax"}
    assert br.kernel_choices(spec["xla"]) == []
    assert br.kernel_choices(spec["fast"]) == ["matmul=mosaic_gpu", "norm=mosaic_gpu", "rope=mosaic_gpu",
                                               "swiglu_matmul=mosaic_gpu", "attention=pallas_tree"]
    hopper = yaml.safe_load((REPO / "conf" / "kernels" / "hopper.yaml").read_text())  # the engine's fast choice
    assert br.FAST_KERNELS == {op: impl for op, impl in hopper.items() if impl not in ("xla", False)}
    def report(ms):
        return br.build_report(br.settings(args), {"fast_decode_loop": {"ms": ms}, "xla_decode_loop": {"ms": 2 * ms}},
                               [], ["xla_decode_loop", "fast_decode_loop"], None, 1.0)

    floor = next(r for r in report(1.0)["rows"] if r["variant"] == "fast_decode_loop")["roofline"]["ms_nominal"]
    for ms, ok in ((1.05 * floor, True), (1.2 * floor, False)):
        rep = report(ms)
        check = next(t for t in rep["targets"] if t["what"].startswith("fast_decode_loop"))
        assert (check["target"], check["ok"]) == ("≤ 1.10", ok)
        assert "not plain XLA" not in br.markdown(rep)


def test_an_xla_row_run_with_kernels_says_it_is_not_plain_xla():
    """`--matmul` and friends set every JAX job's ops, the `xla_*` rows' too: a side-by-side run that set them
    measured our step twice (docs/results/2026-12-06-ar-side-by-side-h100/). The report says so on the row."""
    br = _load_script()
    plain = br.parse_args(["--quick", "--variants", "xla_decode_loop"])
    ours = br.parse_args(["--quick", "--variants", "xla_decode_loop", "--matmul", "mosaic_gpu", "--ar-attention",
                          "pallas_tree"])
    texts = [br.markdown(br.build_report(br.settings(a), {"xla_decode_loop": {"ms": 5.5}}, [], ["xla_decode_loop"],
                                         None, 1.0)) for a in (plain, ours)]
    assert "not plain XLA" not in texts[0]
    assert "| xla_decode_loop | XLA, N steps in one fori_loop, with matmul=mosaic_gpu, attention=pallas_tree: not plain " \
           "XLA |" in texts[1]
