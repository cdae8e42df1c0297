"""The benchmark and reproduction scripts run end to end on the tiny CPU deployment.

bench.py runs in a subprocess with hydra, omegaconf, pydantic and wandb made unimportable, as on the GPU
machine. The reproduction script runs in-process on `shared/oracle_pair` (skipped when absent): real
acceptance, measured speedups, lossless outputs.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ORACLE = REPO.parent / "shared" / "oracle_pair"

# Run a script with the packages the GPU machine lacks made unimportable.
BARE = ("import sys, runpy\n"
        "for m in ('hydra', 'omegaconf', 'pydantic', 'wandb', 'google.genai'): sys.modules[m] = None\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n")


@pytest.fixture()
def cache_env(tmp_path):
    """A private cache with a preset CPU calibration (the calibration itself is tested elsewhere)."""
    hw = tmp_path / "cache" / "hw"
    hw.mkdir(parents=True)
    (hw / "cpu.json").write_text(json.dumps({"name": "cpu", "hbm_bytes_per_s": 2e10, "matmul_flops_per_s": 1e11,
                                             "platform": "cpu", "matmul_dtype": "float32"}))
    env = {**os.environ, "SPECPILOT_CACHE": str(tmp_path / "cache"), "JAX_DISABLE_MOST_OPTIMIZATIONS": "1",
           "JAX_PLATFORMS": "cpu"}
    return env


def test_bench_runs_without_hydra_or_pydantic(tmp_path, cache_env):
    from specpilot.costmodel.report import bench_markdown

    tau = tmp_path / "tau.json"
    tau.write_text(json.dumps({"source": "test τ", "tau": {"stock": 2.0, "ddtree@8": 2.5}}))
    out = tmp_path / "bench"
    cmd = [sys.executable, "-c", BARE, str(REPO / "scripts" / "bench.py"), "--out", str(out), "--model", "tiny",
           "--engines", "ar", "stock", "ddtree", "specpilot", "--budgets", "4", "8", "--batches", "1",
           "--context", "12", "--rounds", "2", "--drafter-layers", "1", "--block-size", "4",
           "--compile-cache", str(tmp_path / "jit"), "--compile-workers", "2", "--calibration-ddtree-budgets", "4",
           "--calibration-specpilot-candidates", "2", "4", "--tau-profile", str(tau),
           "--matmul", "mosaic_gpu", "--norm", "mosaic_gpu", "--rope", "mosaic_gpu",  # off a Hopper: XLA's
           "--swiglu-matmul", "mosaic_gpu",
           "--command-buffers",  # the flag parses on any XLA
           "--tree-rank-max", "4096",
           "--gpu-time"]  # no CUPTI on a CPU: every row says so
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=cache_env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert "compiled B=1 in 2 threads" in proc.stdout
    assert json.loads(proc.stdout.strip().splitlines()[-1])["rows"] == 9
    res = json.loads((out / "bench.json").read_text())
    assert res["matmul"] == res["norm"] == res["swiglu_matmul"] == "mosaic_gpu"
    assert res["pdl"] is False and res["tree_rank_max"] == 4096
    assert res["provenance"]["xla_flags"].endswith("--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL")
    assert [(r["label"], r["role"]) for r in res["rows"]] == [
        ("ar", "calibration"), ("stock", "calibration"), ("ddtree@4", "calibration"),
        ("specpilot[2,4]", "calibration"), ("ar", "config"),
        ("stock", "config"),
        ("ddtree@4", "config"), ("ddtree@8", "config"), ("specpilot[4,8]", "config")]
    sp = res["rows"][-1]["engine_cfg"]
    assert sorted(map(int, sp["verify_cost_ms"])) == [4, 8] and sp["draft_cost_ms"] > 0  # fitted before it ran
    assert "switch_overhead/bf16@B1" in res["fit"]  # measured by the calibration specpilot run
    for r in res["rows"]:
        assert r["gaps"]["components"] and all(c["ceiling_ms"] >= 0 for c in r["gaps"]["components"])
        assert r["round_ms"] == pytest.approx(sum(r["stage_ms"].values()))
    # every configuration, AR and stock included, is predicted from rows other than its own
    assert [v["label"] for v in res["validation"]] == ["ar", "stock", "ddtree@4", "ddtree@8", "specpilot[4,8]"]
    assert all(v["predicted_ms"] > 0 for v in res["validation"])
    assert len(res["projected"]) == 4 and all(p["kind"] == "projected" for p in res["projected"])
    md = (out / "bench.md").read_text()
    assert "PROJECTED speedup" in md and "Components against their ceilings" in md and "leave one out" in md
    assert ("- bf16 linears: mosaic_gpu (`skinny_matmul.ops.DEFAULT`); residual add + RMSNorm: mosaic_gpu "
            "(`add_rms_norm.ops.DEFAULT`); q/k norm + rope: mosaic_gpu (`qk_norm_rope.ops.DEFAULT`); PDL: no; "
            "tree top-k's: counted up to 4096 elements (`tree.RANK_TOP_K_MAX`).") in md
    assert "- XLA_FLAGS: `" in md and md.count("XLA_FLAGS") == 1
    assert all("stage_gpu_ms" not in r and "NVIDIA GPU" in r["stage_gpu_error"] for r in res["rows"])
    assert "- not measured: CUPTI kernel timings need an NVIDIA GPU; this backend is 'cpu'" in md
    assert res["provenance"]["command"].startswith("python ") and res["provenance"]["device"]
    assert sorted(p.name for p in out.iterdir()) == ["bench.json", "bench.md", "components.png", "step_vs_nodes.png"]
    # the projections on kernel time: none without CUPTI; their columns where a row has them
    assert all(p["t_step_kernels_ms"] is None for p in res["projected"]) and "projected on kernels" not in md
    res["projected"][0].update(t_step_kernels_ms=1.5, model_speedup_kernels=0.75)
    assert "| t_step ms | t_AR ms | projected speedup | t_step kernels ms | projected on kernels |" in bench_markdown(res)


@pytest.mark.skipif(not (ORACLE / "oracle.json").is_file(), reason=f"oracle pair not found at {ORACLE}")
def test_reproduce_ddtree_comparison_on_the_oracle_pair(tmp_path, cache_env, monkeypatch, capsys):
    sys.path.insert(0, str(REPO / "scripts"))
    import reproduce_ddtree_comparison

    import jax

    from specpilot.costmodel import cupti

    def one_ms(call):  # a stand-in for CUPTI (a GPU's): every profiled stage call runs 1 ms of kernels
        jax.block_until_ready(call())
        return [("kernel", 1.0)]

    monkeypatch.setenv("SPECPILOT_CACHE", cache_env["SPECPILOT_CACHE"])
    monkeypatch.setattr(cupti, "kernel_timings", one_ms)
    out = tmp_path / "cmp"
    rc = reproduce_ddtree_comparison.main(["--out", str(out), "--models", "--num-prompts", "1", "--max-new", "8",
                                           "--ddtree-budgets", "8", "--specpilot-candidates", "4", "8",
                                           "--tlv-budgets", "--rounds", "1", "--compile-cache", "none",
                                           "--target-passthrough-layers", "1", "--gpu-time"])
    assert rc == 0
    res = json.loads((out / "ddtree_comparison.json").read_text())
    [dep] = res["deployments"]
    assert dep["name"] == "oracle_pair+1 passthrough" and dep["target"]["num_layers"] == 3 + 1
    entries = {e["label"]: e for e in res["entries"]}
    assert set(entries) == {"ar", "ddtree@8", "specpilot[4,8]"}
    assert all(e["kind"] == "measured" and e["lossless"] and e["loop_step_ms"] > 0 for e in entries.values())
    # one prompt, batch 1: the loop runs exactly its row's rounds, so lockstep τ is τ and both models agree
    for e in entries.values():
        assert e["lockstep_tau"] == pytest.approx(e["tau"])
        assert e["model_speedup_lockstep"] == pytest.approx(e["model_speedup"])
    # on kernel time: AR's round is two stages (2 ms), a tree engine's four (4 ms)
    assert entries["ar"]["t_step_kernels_ms"] == 2.0 and entries["ddtree@8"]["t_step_kernels_ms"] == 4.0
    assert entries["ddtree@8"]["stage_gpu_ms"] == {s: 1.0 for s in ("draft", "tree", "verify", "commit")}
    assert entries["ddtree@8"]["stage_gpu_launches"] == {s: 1.0 for s in ("draft", "tree", "verify", "commit")}
    assert set(entries["ar"]["stage_ms"]) == {"verify", "commit"}
    assert entries["ddtree@8"]["model_speedup_kernels"] == pytest.approx(entries["ddtree@8"]["tau"] * 2.0 / 4.0)
    assert entries["ddtree@8"]["tau"] > 1.0  # a trained pair, deepened without changing its outputs: drafts accepted
    assert sorted(map(int, entries["specpilot[4,8]"]["engine_cfg"]["verify_cost_ms"])) == [4, 8]
    md = (out / "ddtree_comparison.md").read_text()
    assert "| oracle_pair+1 passthrough | MEASURED | 1 |" in md and "Commit:" in md and "Command:" in md
    assert md in capsys.readouterr().out


def test_reproduce_projects_synthetic_rows_on_kernel_time_too(tmp_path, monkeypatch):
    """`--gpu-time` on a synthetic deployment: each projected row also gets its projection on the profiled stages'
    kernel time (a stand-in for CUPTI: every stage call 1 ms of kernels, so AR's round is 2 ms, a tree engine's 4)."""
    sys.path.insert(0, str(REPO / "scripts"))
    import reproduce_ddtree_comparison

    import jax

    from specpilot.costmodel import cupti
    from specpilot.costmodel.predict import TauProfile

    def one_ms(call):
        jax.block_until_ready(call())
        return [("kernel", 1.0)]

    monkeypatch.setattr(cupti, "kernel_timings", one_ms)
    tau = tmp_path / "tau.json"
    tau.write_text(json.dumps(TauProfile({"stock": 2.0, "ddtree@8": 3.0}, "unit test").to_json()))
    out = tmp_path / "proj"
    assert reproduce_ddtree_comparison.main(
        ["--out", str(out), "--no-real", "--models", "tiny", "--tau-profile", str(tau), "--batches", "1",
         "--context", "16", "--rounds", "1", "--ddtree-budgets", "8", "--specpilot-candidates", "4", "8",
         "--tlv-budgets", "--compile-cache", "none", "--gpu-time"]) == 0
    entries = {e["label"]: e for e in json.loads((out / "ddtree_comparison.json").read_text())["entries"]}
    ddtree = entries["ddtree@8"]
    assert ddtree["kind"] == "projected" and ddtree["tau"] == 3.0
    assert (ddtree["t_step_kernels_ms"], ddtree["model_speedup_kernels"]) == (4.0, pytest.approx(3.0 * 2.0 / 4.0))
    [spec] = [e for label, e in entries.items() if label.startswith("specpilot")]
    assert spec["t_step_kernels_ms"] == 4.0  # draft, tree, verify (the target pass at its budget) and commit


@pytest.mark.parametrize("sweep", sorted((REPO / "conf" / "sweeps").glob("*.yaml")), ids=lambda p: p.name)
def test_wandb_sweep_files_drive_bench(sweep):
    """Every grid point of a W&B sweep file is a valid bench.py command line (W&B passes `--key=value`), its
    program exists, and the metric it optimises is one bench.py logs."""
    import itertools

    import yaml

    sys.path.insert(0, str(REPO / "scripts"))
    import bench

    spec = yaml.safe_load(sweep.read_text())
    assert (REPO / spec["program"]).is_file() and spec["program"] == "scripts/bench.py"
    assert f'"{spec["metric"]["name"]}"' in (REPO / "scripts" / "bench.py").read_text()
    params = spec["parameters"]
    grids = [[(k, v) for v in (p["values"] if "values" in p else [p["value"]])] for k, p in params.items()]
    points = list(itertools.product(*grids))
    assert len(points) >= 4
    for point in points:
        argv = [f"--{k}={v}" for k, v in point] + [a for a in spec["command"] if a.startswith("--")]
        args = bench.parse_args(argv)
        for k, v in point:
            got = getattr(args, k.replace("-", "_"))
            assert str(got[0] if isinstance(got, list) else got) == str(v)


@pytest.fixture
def fresh_compile_cache(tmp_path):
    """A persistent compilation cache of the test's own, every program cached; the run's own cache restored after."""
    import jax
    from jax._src import compilation_cache

    from specpilot.costmodel import measure as M

    old = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
    cache = tmp_path / "jit"
    M.enable_compile_cache(cache, min_compile_s=0.0)
    compilation_cache.reset_cache()  # the test run's own cache (conftest) is open already: open this one
    try:
        yield cache
    finally:
        jax.config.update("jax_compilation_cache_dir", old[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", old[1])
        compilation_cache.reset_cache()


def test_warm_up_compiles_exactly_the_programs_the_timed_pass_runs(fresh_compile_cache):
    """`measure.warm_up` (parallel compile into the persistent cache) must build the timed pass's shapes:
    after it, measuring the same configurations adds no new program to the cache."""
    from specpilot.costmodel import measure as M

    dep = M.synthetic_deployment("tiny", "float32", 0, drafter_layers=1, block_size=4)
    configs = [{"name": "ar"}, {"name": "ddtree", "tree_budget": 4}]
    context, rounds = 12, 2
    capacity = M.kv_capacity(context, rounds, dep.block, configs)
    with warnings.catch_warnings(record=True) as caught:  # the stages' donation hint stays silenced
        warnings.simplefilter("always")                    # across the warm-up's threads
        M.warm_up(dep, configs, 1, context, capacity, rounds, workers=2, eager_prefill=False)
    assert not [w for w in caught if "donated" in str(w.message)]
    compiled = set(p.name for p in fresh_compile_cache.iterdir())
    assert compiled
    for cfg in configs:
        M.measure_row(dep, cfg, 1, context, capacity, rounds, None, eager_prefill=False)
    assert set(p.name for p in fresh_compile_cache.iterdir()) == compiled


def test_generation_warm_up_compiles_exactly_the_programs_the_timed_generations_run(fresh_compile_cache):
    """`generation_rows(compile_workers=2)` compiles every config's prefill and fused loops (at each batch a chunk
    shrinks to) in threads first: the timed generations then add no program to the cache, and give what a run
    without the warm-up gives."""
    from specpilot.costmodel import measure as M

    dep = M.synthetic_deployment("tiny", "float32", 0, drafter_layers=1, block_size=4)
    configs = [{"name": "ar"}, {"name": "ddtree", "tree_budget": 4}]
    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12], [13, 14]]
    max_new, batch = 6, 4  # batch >= Engine.shrink_from: rows that finish apart shrink the loop (another program)
    capacity = max(map(len, prompts)) + max_new + max(M.slack_of(c, dep.block) for c in configs) + 1
    M.warm_up_generation(dep, configs, prompts, max_new, batch, capacity, workers=2, log=pytest.fail)
    compiled = set(p.name for p in fresh_compile_cache.iterdir())
    assert compiled
    rows = M.generation_rows(dep, {batch: configs}, prompts, max_new, log=lambda _: None)
    assert set(p.name for p in fresh_compile_cache.iterdir()) == compiled
    again = M.generation_rows(dep, {batch: configs}, prompts, max_new, log=lambda _: None, compile_workers=2)
    for a, b in zip(rows, again):
        assert (a["label"], a["tau"], a["loop_steps"], a["lossless"]) == (b["label"], b["tau"], b["loop_steps"],
                                                                          b["lossless"])


@pytest.mark.parametrize("argv,message", [
    (["--model", "nonexistent"], "--model: model 'nonexistent': no "),
    (["--batches", "0"], "argument --batches: must be >= 1, got 0"),
    (["--budgets", "64", "x"], "argument --budgets: invalid positive_int value: 'x'"),
    (["--dtype", "float16"], "argument --dtype: invalid choice: 'float16'"),
    (["--tree-rank-max", "-1"], "argument --tree-rank-max: must be >= 0, got -1"),
])
def test_bench_rejects_bad_arguments_in_one_line(argv, message, capsys):
    """A bad count or an unknown model is argparse's one-line error (exit 2), before anything is built."""
    sys.path.insert(0, str(REPO / "scripts"))
    import bench

    with pytest.raises(SystemExit) as e:
        bench.parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) >= 1 and ": error: " + message in err[-1]


@pytest.mark.parametrize("flag", ["--tau-profile", "--prompts", "--replot", "--target"])
def test_bench_rejects_a_missing_path_before_the_sweep(flag, tmp_path, capsys):
    """A mistyped file or folder is argparse's one-line error at parse time, not a traceback (after the whole
    sweep, for --tau-profile and --prompts)."""
    sys.path.insert(0, str(REPO / "scripts"))
    import bench

    missing = tmp_path / "missing"
    argv = [flag, str(missing)] + (["--drafter", str(tmp_path)] if flag == "--target" else [])
    with pytest.raises(SystemExit) as e:
        bench.parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert f": error: {flag}: " in err[-1] and str(missing) in err[-1]


def test_bench_reports_a_broken_checkpoint_in_one_line(tmp_path, cache_env):
    """A checkpoint folder without config.json: `checkpoint error: ...` on stderr and exit 2, no traceback."""
    (tmp_path / "empty").mkdir()
    cmd = [sys.executable, str(REPO / "scripts" / "bench.py"), "--out", str(tmp_path / "out"), "--target",
           str(tmp_path / "empty"), "--drafter", str(tmp_path / "empty"), "--compile-cache", "none"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=cache_env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [f"checkpoint error: missing file: {tmp_path / 'empty' / 'config.json'}"]


@pytest.mark.parametrize("script,argv,flag", [
    ("bench_roofline", ["--nodes", "64", "0"], "--nodes"),
    ("bench_kernels", ["--out", "unused", "--tokens", "0"], "--tokens"),
    ("reproduce_table2", ["--out", "unused", "--batches", "0"], "--batches"),
    ("acceptance", ["--batch-size", "-1"], "--batch-size"),
])
def test_scripts_reject_a_count_below_one(script, argv, flag, capsys):
    """The scripts' counts (`specpilot.argtypes.positive_int`) fail at parse time, in one line, before any work."""
    import importlib

    sys.path.insert(0, str(REPO / "scripts"))
    module = importlib.import_module(script)
    parse = getattr(module, "parse_args", None) or module.main
    with pytest.raises(SystemExit) as e:
        parse(argv)
    assert e.value.code == 2
    assert f"argument {flag}: must be >= 1, got" in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("argv,message", [
    (["--engines", "foo"], "argument --engines: invalid choice: 'foo'"),
    (["--temperature", "-1"], "argument --temperature: must be >= 0, got -1.0"),
    (["--set", "stock.tree_budgt=32"], "--set stock.tree_budgt: stock has no knob 'tree_budgt' (block_size, "),
    (["--set", "ddtree.tree_budget=32", "--engines", "stock"], "--set ddtree.tree_budget: ddtree is not among "),
    (["--set", "stock.block_size=abc"], "--set stock.block_size: "),
    (["--set", "stock.weight_format=w13"], "--set stock.weight_format: "),
])
def test_acceptance_rejects_bad_engines_and_knobs_in_one_line(argv, message, capsys):
    """An unknown engine, a negative temperature or an `--set` knob that would be ignored or break the engine is a
    one-line error (exit 2) before any model is loaded or trained (a typo in a knob used to be ignored silently)."""
    sys.path.insert(0, str(REPO / "scripts"))
    import acceptance

    with pytest.raises(SystemExit) as e:
        acceptance.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) >= 1 and "error: " + message in err[-1], err


@pytest.mark.parametrize("script", ["reproduce_table1", "reproduce_table2", "reproduce_ddtree_comparison"])
@pytest.mark.parametrize("argv,message", [
    (["--tau-profile", "MISSING"], "argument --tau-profile: no such file: "),
    (["--prompts", "MISSING"], "argument --prompts: no such file: "),
    (["--configs", "MISSING"], "argument --configs: no such file: "),
    (["--target", "MISSING", "--drafter", "MISSING"], "argument --target: no such folder: "),
    (["--models", "tiny", "qwen3_9b"], "argument --models: invalid choice: 'qwen3_9b'"),
    (["--dtype", "float16"], "argument --dtype: invalid choice: 'float16'"),
    (["--proxy", "proxy_h2000"], "argument --proxy: no recipe 'proxy_h2000' (available: proxy_gpu, proxy_h200, "),
    (["--proxy", "MISSING.yaml"], "argument --proxy: no such file: "),
])
def test_reproduce_scripts_reject_a_bad_path_model_or_dtype_before_any_work(script, argv, message, tmp_path, capsys):
    """A mistyped path, model or dtype is argparse's one-line error at once: it was a traceback, some only after
    the real pair's whole sweep."""
    import importlib

    sys.path.insert(0, str(REPO / "scripts"))
    module = importlib.import_module(script)
    argv = [str(tmp_path / "missing") if a == "MISSING" else a for a in argv]
    with pytest.raises(SystemExit) as e:
        module.main(["--out", str(tmp_path / "out"), *argv])
    assert e.value.code == 2
    assert ": error: " + message in capsys.readouterr().err.strip().splitlines()[-1]
    assert not (tmp_path / "out").exists()


def test_reproduce_tables_list_measured_ar_and_each_rows_loop_step():
    """Both tables' "all configurations" list: a measured AR row (its loop step beside its profiled round) and every
    configuration, no projected AR; the loop step and losslessness only where they were measured."""
    from specpilot.costmodel.reproduce import configurations_table

    def entry(label, kind, **extra):
        return {"deployment": kind[:4], "label": label, "batch": 8, "kind": kind, "tau": 2.0, "speedup": 0.5,
                "t_step_ms": 3.0, "t_ar_ms": 1.5, **extra}

    measured = {"lockstep_tau": 1.5, "model_speedup": 1.0, "model_speedup_lockstep": 0.75, "t_step_kernels_ms": 1.0,
                "model_speedup_kernels": 0.5}
    res = {"entries": [entry("ar", "measured", loop_step_ms=1.25, lossless=True, **measured),
                       entry("stock", "measured", loop_step_ms=2.5, lossless=False, **measured),
                       entry("ar", "projected"), entry("stock", "projected", t_ar_ms=None)]}
    md, blank = configurations_table(res)
    assert blank == ""
    lines = md.splitlines()
    assert lines[0] == ("| deployment | config | batch | kind | τ | speedup | t_step ms | t_AR ms | loop ms / step | "
                        "lockstep τ | model | model (lockstep) | t_step kernels ms | model (lockstep, kernels) | "
                        "lossless |")
    assert lines[2:] == [
        "| meas | ar | 8 | measured | 2.000 | 0.500 | 3.000 | 1.500 | 1.250 | 1.500 | 1.000 | 0.750 | 1.000 | 0.500 "
        "| True |",
        "| meas | stock | 8 | measured | 2.000 | 0.500 | 3.000 | 1.500 | 2.500 | 1.500 | 1.000 | 0.750 | 1.000 | 0.500 "
        "| False |",
        "| proj | stock | 8 | projected | 2.000 | 0.500 | 3.000 | – | – | – | – | – | – | – | n/a (random weights) |"]


@pytest.mark.parametrize("argv,message", [
    (["--target", "DIR"], "--target and --drafter go together"),
    (["--proxy", "proxy_test", "--target", "DIR", "--drafter", "DIR"], "--proxy is the real pair: give it or "),
    (["--no-real", "--proxy", "proxy_test"], "--no-real skips the real pair: drop it, or "),
    (["--no-real", "--target-passthrough-layers", "2"], "--no-real skips the real pair: drop it, or "),
])
def test_reproduce_rejects_real_pair_flags_that_contradict_each_other(argv, message, tmp_path):
    """A proxy and a checkpoint pair at once, or a real-pair flag beside --no-real: a one-line exit before any
    calibration, training or output."""
    sys.path.insert(0, str(REPO / "scripts"))
    import reproduce_table2

    argv = [str(tmp_path) if a == "DIR" else a for a in argv]
    with pytest.raises(SystemExit) as e:
        reproduce_table2.main(["--out", str(tmp_path / "out"), *argv])
    assert str(e.value.code).startswith(message)
    assert not (tmp_path / "out").exists()


def test_command_buffers_come_before_the_backend_starts_or_fail_in_one_line(tmp_path, monkeypatch):
    """`reproduce_table2.py --command-buffers` in a process whose backend runs already (this one) would time
    programs compiled without the flags it records: it exits in one line before any work. Where the flags are
    there already, nothing is added (bench.py's subprocess test shows them taking effect before the backend)."""
    sys.path.insert(0, str(REPO / "scripts"))
    import reproduce_table2

    import jax

    from specpilot.decoding.engine import COMMAND_BUFFER_FLAGS, use_command_buffers

    jax.devices()
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    with pytest.raises(SystemExit) as e:
        reproduce_table2.main(["--out", str(tmp_path / "out"), "--no-real", "--command-buffers"])
    assert str(e.value.code) == ("--command-buffers: XLA's backend has started in this process already; set "
                                 f"XLA_FLAGS={COMMAND_BUFFER_FLAGS} before it starts")
    assert os.environ["XLA_FLAGS"] == "--xla_cpu_enable_fast_math=false" and not (tmp_path / "out").exists()
    monkeypatch.setenv("XLA_FLAGS", f"--xla_cpu_enable_fast_math=false {COMMAND_BUFFER_FLAGS}")
    use_command_buffers()
    assert os.environ["XLA_FLAGS"] == f"--xla_cpu_enable_fast_math=false {COMMAND_BUFFER_FLAGS}"


@pytest.mark.parametrize("script,argv,message", [
    ("bench_roofline", ["--model", "qwen3_9b"], "argument --model: invalid choice: 'qwen3_9b'"),
    ("bench_roofline", ["--dtype", "float16"], "argument --dtype: invalid choice: 'float16'"),
    ("bench_kernels", ["--out", "unused", "--shapes", "4096x"], "argument --shapes: expected KxN, e.g. 4096x12288, "
                                                                "got '4096x'"),
])
def test_kernel_benches_reject_a_bad_model_dtype_or_shape_in_one_line(script, argv, message, capsys):
    """A typo in a model name, dtype or weight shape is argparse's one-line error, not a traceback."""
    import importlib

    sys.path.insert(0, str(REPO / "scripts"))
    with pytest.raises(SystemExit) as e:
        importlib.import_module(script).parse_args(argv)
    assert e.value.code == 2
    assert ": error: " + message in capsys.readouterr().err.strip().splitlines()[-1]


def test_profile_vs_loop_puts_each_engines_profiled_round_beside_its_loop_step(tmp_path, capsys):
    """`scripts/profile_vs_loop.py` on the CPU: per engine, the profiled round (the sum of its stages) beside the
    fused loop's step, whose iterations are counted without the prefill (AR: one a token after the prefill's), and
    the round as one program on the same and on fresh buffers, profile and round again with the state in the loop's
    layouts; the CUPTI columns say why they are empty, and the kernel table (GPU only) is checked on made-up launches.
    Bad engines and a loop too short to time are one-line errors."""
    import importlib

    sys.path.insert(0, str(REPO / "scripts"))
    pvl = importlib.import_module("profile_vs_loop")
    out = tmp_path / "pvl"
    assert pvl.main(["--out", str(out), "--model", "tiny", "--batch", "2", "--prompt-len", "8", "--max-new", "6",
                     "--rounds", "1", "--engines", "ddtree@4"]) == 0  # AR's loop steps: --loop-only below
    res = json.loads((out / "profile_vs_loop.json").read_text())
    assert [r["label"] for r in res["rows"]] == ["ddtree@4"]
    assert 1 <= res["rows"][0]["loop_steps"] <= 5 and res["rows"][0]["tau"] >= 1.0
    for r in res["rows"]:
        assert r["profiled_round_ms"] == pytest.approx(sum(r["stage_ms"].values())) and r["profiled_issue_ms"] > 0
        assert list(r["profiled_stage_issue_ms"]) == list(r["stage_ms"])
        assert r["profiled_issue_ms"] == pytest.approx(sum(r["profiled_stage_issue_ms"].values()))
        # a difference of two wall times: on a loaded CPU the tiny loop's step is within the noise, so no sign asserted
        assert math.isfinite(r["loop_step_ms"]) and r["profile_over_loop"] == (
            pytest.approx(r["profiled_round_ms"] / r["loop_step_ms"]) if r["loop_step_ms"] > 0 else None)
        assert r["profiled_kernels_ms"] is None and "loop_kernels_ms" not in r and "kernels" not in r
        assert r["round_same_ms"] > 0 and r["round_fresh_ms"] > 0 and "round_kernels_ms" not in r
        # the same profile and round with the state in the loop's layouts
        assert r["pinned_round_ms"] == pytest.approx(sum(r["pinned_stage_ms"].values()))
        assert list(r["pinned_stage_ms"]) == list(r["stage_ms"]) and r["pinned_kernels_ms"] is None
        assert r["round_pinned_ms"] > 0 and "round_pinned_kernels_ms" not in r and "pinned_kernels" not in r
    # per kernel: the profile's stages summed; the loop's launches minus the prefill-only run's, per iteration
    table = pvl.kernel_table({"verify": {"a": 2.0}, "commit": {"b": 0.5}},
                             [("a", 1.0), ("a", 1.0), ("b", 0.1), ("c", 3.0)], [("c", 3.0)], 2)
    assert list(table) == ["a", "b", "c"]
    assert table["a"] == {"profiled": 2.0, "loop": 1.0} and table["b"]["loop"] == pytest.approx(0.05)
    assert table["c"] == {"profiled": 0.0, "loop": 0.0}
    # --loop-only's kernel names a step (launches, ms) and the kinds two loops differ by most: names that differ only
    # in XLA's per-program fusion number are one kind
    by_name = pvl.kernels_by_name([("a", 1.0), ("a", 1.0), ("b", 0.1), ("c", 3.0), ("f_7", 0.2)], [("c", 3.0)], 2)
    assert by_name["a"] == [1.0, 1.0] and by_name["b"] == pytest.approx([0.5, 0.05]) and by_name["c"] == [0.0, 0.0]
    kinds = pvl.kernel_kinds({"f_7": [1.0, 0.1], "f.2": [2.0, 0.2], "memcpy128": [1.0, 0.3]})
    assert list(kinds) == ["f", "memcpy"] and kinds["f"] == pytest.approx([3.0, 0.3]) and kinds["memcpy"] == [1.0, 0.3]
    capsys.readouterr()
    pvl.print_kernel_diff({"label": "x", "loop_kernel_names": by_name},
                          {"label": "y", "loop_kernel_names": {"a": [1.0, 1.0], "d": [2.0, 0.4], "f_9": [0.5, 0.1]}})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "  y less x, by kernel kind (ms a step, launches a step):"
    assert lines[1] == "  +0.4000 ms +2.0 launches  d" and lines[2] == "  -0.0500 ms -0.5 launches  b"
    assert "  +0.0000 ms +0.0 launches  f" in lines  # f_7 and f_9: one kind, the same launches and time
    md = (out / "profile_vs_loop.md").read_text()
    assert "| ddtree@4 | 2 |" in md
    assert "kernel columns: CUPTI kernel timings need an NVIDIA GPU; this backend is 'cpu'" in md
    # --loop-only: the loop's step alone, under this process's XLA_FLAGS (named in the report), and whether each
    # engine's greedy tokens are the first's
    capsys.readouterr()
    assert pvl.main(["--out", str(out), "--model", "tiny", "--batch", "2", "--prompt-len", "8", "--max-new", "6",
                     "--loop-only", "--engines", "ar", "stock"]) == 0
    only = json.loads((out / "loop_only.json").read_text())
    assert [(r["label"], r["loop_steps"], r["beyond_kernels_ms"], r["same_tokens_as_first"]) for r in only["rows"]] \
        == [("ar", 5, None, True), ("stock", only["rows"][1]["loop_steps"], None, True)]
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("stock: loop step ") and last.endswith(" ms, tokens the same as ar's")
    # specpilot@B1,B2: its candidates sorted, the largest its tree budget (a flat cost table: the defaults)
    assert pvl.engine_cfg("specpilot@4,3") == {"name": "specpilot", "tree_budget": 4, "budget_candidates": [3, 4]}
    assert math.isfinite(only["rows"][0]["loop_step_ms"]) and "xla_flags" in only["provenance"]
    capsys.readouterr()
    for argv, message in ((["--engines", "ddtree@x"], "engine 'ddtree@x': expected ar, stock, ddtree@BUDGET or"),
                          (["--engines", "ddtree@4,8"], "engine 'ddtree@4,8': expected ar, stock, ddtree@BUDGET or"),
                          (["--max-new", "1"], "--max-new must be at least 2")):
        with pytest.raises(SystemExit) as e:
            pvl.main(["--out", str(out), *argv])
        assert e.value.code == 2 and message in capsys.readouterr().err.strip().splitlines()[-1]
