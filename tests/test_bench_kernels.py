"""scripts/bench_kernels.py --quick runs end to end on CPU (both kernels in Pallas GPU-interpret mode), with
only jax and numpy: every case in its own process, JSON and markdown written, outputs checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ABSENT_ON_THE_GPU_MACHINE = ("hydra", "omegaconf", "pydantic", "wandb", "torch", "transformers")


def test_quick_run_on_cpu(tmp_path):
    blocked = tmp_path / "blocked"  # on PYTHONPATH, which the per-case processes inherit
    blocked.mkdir()
    for name in ABSENT_ON_THE_GPU_MACHINE:
        (blocked / f"{name}.py").write_text(f"raise ImportError('{name} is not on the GPU machine')\n")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_DISABLE_MOST_OPTIMIZATIONS": "1", "PYTHONPATH": str(blocked)}
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_kernels.py"), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=170, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]

    res = json.loads((out / "kernels_bench.json").read_text())
    assert [(c["name"], c["status"]) for c in res["cases"]] == [
        ("ceiling", "ok"), ("tree_attention_b1_n16", "ok"), ("w12_prepare_512x256", "ok"), ("w12_512x256_m1", "ok"),
        ("skinny_512x256_m1", "ok")]
    assert res["platform"] == "cpu" and res["ceiling"]["ceiling_Bps"] > 0
    assert {r["method"] for r in res["ceiling"]["rows"]} == {"read", "read_write", "d2d_copy"}
    shape = res["w12"]["shapes"]["512x256"]
    assert 12.0 <= shape["bits_per_weight"] < 12.5 and shape["escapes"] > 0

    w12_rows = {r["method"]: r for r in res["w12"]["rows"]}
    assert set(w12_rows) == {"kernel[0]", "xla_decode", "reference", "xla_bf16"}  # int8: GPU only
    assert w12_rows["kernel[0]"]["mode"] == "interpret"
    for r in w12_rows.values():
        assert "error" not in r and r["ok"] and r["median_us"] > 0 and r["TBps"] > 0
        assert r["copies"] == 2
    assert w12_rows["xla_bf16"]["weight_bytes"] == 2 * 512 * 256
    for name in ("kernel[0]", "xla_decode"):
        assert w12_rows[name]["weight_bytes"] < 0.8 * 2 * 512 * 256  # charged the compressed bytes

    skinny_rows = {r["method"]: r for r in res["skinny"]["rows"]}
    assert set(skinny_rows) == {"skinny[0]", "xla_bf16"} and skinny_rows["skinny[0]"]["mode"] == "interpret"
    for r in skinny_rows.values():
        assert "error" not in r and r["ok"] and r["weight_bytes"] == 2 * 512 * 256 and r["median_us"] > 0
    assert "## Few-token bf16 matmul" in (out / "kernels_bench.md").read_text()

    md = (out / "kernels_bench.md").read_text()
    assert "W12 must-show (issue #4)" in md and "| 512x256 | 1 | kernel[0] (interpret) " in md

    tree_rows = {r["method"]: r for r in res["tree_attention"]["rows"]}
    assert set(tree_rows) == {"xla_einsum", "xla_dpa", "kernel[0]"}
    for r in tree_rows.values():
        assert "error" not in r and r["max_abs_err"] < 0.05 and r["median_us"] > 0
    assert tree_rows["kernel[0]"]["mode"] == "interpret"

    md = (out / "kernels_bench.md").read_text()
    assert "## W12 matmul" in md and "## Tree attention" in md and "(interpret)" in md
    assert "5 of 5 ok" in md and md.strip().splitlines()[-1] in proc.stdout
    assert sorted(p.name for p in (out / "logs").iterdir()) == sorted(f"{c['name']}.log" for c in res["cases"])


def test_w12_must_show_picks_the_fastest_of_each_format():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_kernels", REPO / "scripts" / "bench_kernels.py")
    bk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bk)

    def row(method, fmt, us, nbytes, **kw):
        return dict(method=method, format=fmt, k=4096, n=4096, m=1, weight_bytes=nbytes, ok=True, device_us=us,
                    median_us=us + 5, **kw)

    w12_bytes, bf16_bytes = 25_000_000, 33_554_432
    rows = [row("kernel[0]", "w12", 9.0, w12_bytes), row("kernel[1]", "w12", 7.0, w12_bytes),
            row("xla_bf16", "bf16", 10.0, bf16_bytes), row("skinny_bf16", "bf16", 9.5, bf16_bytes),
            row("kernel[2]", "w12", 1.0, w12_bytes, error="boom"),  # failed rows never count
            row("reference", "w12", 2.0, w12_bytes)]  # only kernels are the W12 side
    lines = bk.w12_must_show(rows, c_bps=4e12)
    # 7.0 / 9.5 = 0.74; 25 MB in 7 us = 3.57 TB/s = 89 % of 4 TB/s
    assert lines[-2] == "| 4096x4096 | 1 | kernel[1] 7.0 | skinny_bf16 9.5 | device | 0.74 | 89 | yes |"
    rows[1]["device_us"] = 8.0  # 0.84: too slow
    assert bk.w12_must_show(rows, c_bps=4e12)[-2].endswith("| 0.84 | 78 | no |")
