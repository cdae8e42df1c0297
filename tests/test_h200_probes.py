"""The GPU probes run here, so a broken script fails on the CPU, not in device minutes: ``swiglu_matmul_probe.py``'s
configs, ``w12_probe.py``'s stand-in decode and bf16 configs, ``stream_probe.py``'s layouts,
``cluster_merge_probe.py``'s kernels lowered for Hopper, ``stall_table.py`` on a recorded Nsight Compute page,
``loop_copies.py``'s count of cache copies in a compiled loop (``split_probe.py``'s run is in
``test_skinny_matmul.py``). Probes whose question is settled
are deleted with their tests; their results name the commit to rerun them from: ``tree_probe.py``,
``attention_ablation_probe.py`` and ``fusion_flag_probe.py`` are at ``a1b13e9``; ``rope_prologue_probe.py``,
``cupti_switch_probe.py`` (and ``cupti_switch.sh``), ``grid_barrier_probe.py``, ``prefetch_probe.py``,
``skinny_model_probe.py``, ``combine_probe.py``, ``pdl_probe.py`` and ``topk_probe.py`` at ``63e1118``."""

import importlib.util
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


def load_probe(name, monkeypatch):
  monkeypatch.syspath_prepend(str(REPO / "scripts" / "h200"))  # as running the script puts its folder first
  spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / "h200" / f"{name}.py")
  probe = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(probe)
  return probe


def test_swiglu_matmul_probe_configs_are_valid_and_it_refuses_a_cpu(monkeypatch):
  """Every pipeline config the probe times is a valid tuning config, and off a GPU it stops with a line naming the
  backend (here, before any device minute is spent on a broken script)."""
  probe = load_probe("swiglu_matmul_probe", monkeypatch)
  from pallas_kernels.swiglu_matmul import mosaic_gpu

  for tile_k, steps in probe.CONFIGS:
    mosaic_gpu.TuningConfig(tile_k=tile_k, max_concurrent_steps=steps)
    assert 4096 % tile_k == 0
  monkeypatch.setattr("sys.argv", ["swiglu_matmul_probe.py", "--m", "1"])
  with pytest.raises(SystemExit, match="needs a Hopper GPU; this backend is 'cpu'"):
    probe.main()


def test_cluster_merge_probe_lowers_for_hopper(monkeypatch):
  """The probe's cluster kernel (partials in each block's shared memory, two cluster barriers, the first block reading
  its peers' rows) and its GMEM baseline lower for sm_90, each one Mosaic GPU kernel; off a GPU the probe stops."""
  probe = load_probe("cluster_merge_probe", monkeypatch)
  for splits, width in ((2, 128), (8, 1024)):
    spec = jax.ShapeDtypeStruct((8, splits, width), jnp.float32)
    for fn in (probe.cluster_merge, probe.two_launches, probe.partials):
      assert jax.jit(fn).trace(spec).lower(lowering_platforms=("cuda",)).as_text().count(
          "custom_call @mosaic_gpu") == 1, (fn.__name__, splits)
  with pytest.raises(SystemExit, match="needs a Hopper GPU; this backend is 'cpu'"):
    probe.main([])


def test_stall_table_sums_a_recorded_source_page(monkeypatch, capsys):
  """``stall_table.py`` on the twenty-second session's Nsight Compute source page of the capped W12 kernel: the stall
  reasons it sums are the page's, and the TMA wait it names first is the one the results README reports (20 %)."""
  table = load_probe("stall_table", monkeypatch)
  page = REPO / "docs" / "results" / "2026-12-03-w12-sass-h200" / "call3.cap.source.csv.gz"
  header, rows = table.read_rows(str(page))
  samples = sum(int(r[header.index("Warp Stall Sampling (All Samples)")] or 0) for r in rows)
  monkeypatch.setattr("sys.argv", ["stall_table.py", str(page), "--top", "3"])
  table.main()
  out = capsys.readouterr().out
  total = int(re.search(r"warp-stall samples: (\d+)", out).group(1))
  assert abs(total - samples) <= samples // 20  # the reasons add up to the sampled total (~3 % unattributed)
  assert re.search(r"stall_long_sb\s+\d+\s+21\.\d %", out)
  most_stalled = out.split("most stalled instructions")[1].splitlines()[1]
  assert "BRA" in most_stalled and "long_sb" in most_stalled  # the pipeline's wait for its TMA data


def test_w12_probe_stand_in_decode_reaches_the_kernel_and_is_undone(monkeypatch):
  """``w12_probe.py --ablate-decode``: inside ``stand_in_decode`` the threads' fragments are the stand-in's (not the
  weights), the kernel lowers for Hopper with it, and the real decode is back afterwards."""
  import ml_dtypes
  import numpy as np

  from pallas_kernels import w12
  from pallas_kernels.w12 import mosaic_gpu
  from pallas_kernels.w12 import register_decode as rd

  probe = load_probe("w12_probe", monkeypatch)
  rng = np.random.default_rng(0)
  byte_tile = rng.integers(0, 256, (64, 128), dtype=np.uint8)
  nibble_tile = rng.integers(0, 256, (64, 64), dtype=np.uint8)
  bases = rng.integers(100, 120, 64).astype(np.uint8)
  real = rd.simulate_chunk(byte_tile, nibble_tile, bases, 1)
  packed = w12.pack((rng.normal(size=(512, 128)) * 0.02).astype(ml_dtypes.bfloat16))
  config = w12.TuningConfig(decode="registers", tile_k=256, escapes_in_kernel=True)
  with probe.stand_in_decode():
    stand_in = rd.simulate_chunk(byte_tile, nibble_tile, bases, 1)
    lowered = jax.jit(lambda x, p: mosaic_gpu.w12_matmul(x, p, config=config)).trace(
        jnp.ones((1, 512), jnp.bfloat16), packed).lower(lowering_platforms=("cuda",))
  assert "mosaic_gpu" in lowered.as_text()
  assert (stand_in != real).any()
  np.testing.assert_array_equal(rd.simulate_chunk(byte_tile, nibble_tile, bases, 1), real)


def test_stream_probe_layouts_run_interpreted_and_lower_for_hopper(monkeypatch):
  """``stream_probe.py``: each layout's empty pipeline runs in GPU interpret mode and lowers for sm_90 as one Mosaic
  GPU kernel; both W12 layouts hold 1.5 bytes a weight and bf16 two; the tile layout refuses a step narrower than
  its tile."""
  from jax.experimental.pallas import mosaic_gpu as plgpu

  probe = load_probe("stream_probe", monkeypatch)
  k, n = 512, 128
  x = jnp.zeros((8, k), jnp.bfloat16)
  for layout, bytes_per_weight in (("w12_rows", 1.5), ("w12_tiles", 1.5), ("bf16_kn", 2)):
    weights = probe.arrays(layout, k, n, jax.random.key(0))
    assert sum(a.nbytes for a in weights) == bytes_per_weight * k * n, layout
    out = probe.stream_call(layout, k, n, 2, 256, 2, interpret=plgpu.InterpretGPUParams())([weights], x)
    assert out[0].shape == (2, 8, n)
    lowered = probe.stream_call(layout, k, n, 2, 128, 4).trace([weights], x).lower(lowering_platforms=("cuda",))
    assert lowered.as_text().count("custom_call @mosaic_gpu") == 1, layout
  with pytest.raises(ValueError, match="w12_tiles reads whole 128-wide tiles, not tile_k=64"):
    probe.stream_call("w12_tiles", k, n, 2, 64, 2)


def test_w12_probe_bf16_configs_parse_as_skinny_configs(monkeypatch):
  """``w12_probe.py --bf16-config`` takes the skinny kernel's fields, and a bad one is named with its flag."""
  from pallas_kernels import skinny_matmul

  probe = load_probe("w12_probe", monkeypatch)
  config = probe.parse_config("tile_k=256,max_concurrent_steps=2", skinny_matmul.TuningConfig, "--bf16-config")
  assert config == skinny_matmul.TuningConfig(tile_k=256, max_concurrent_steps=2)
  with pytest.raises(SystemExit, match="--bf16-config: 'decode=registers' is not FIELD=VALUE"):
    probe.parse_config("decode=registers", skinny_matmul.TuningConfig, "--bf16-config")


def test_w12_probe_records_the_kernel_form_it_traced(monkeypatch):
  """``w12_probe.py`` names what each timed config ran (traced for sm_90 on the CPU): at one split with every escape
  in the lists the kernel stores bf16, at two f32 halves."""
  import ml_dtypes
  import numpy as np

  from pallas_kernels import w12
  from pallas_kernels.w12 import mosaic_gpu

  probe = load_probe("w12_probe", monkeypatch)
  w = np.full((1024, 128), 0.5, np.float32)
  w[3, 5] = 1e30
  packed = w12.pack(w.astype(ml_dtypes.bfloat16), group_k=1024)
  x = jax.ShapeDtypeStruct((1, 1024), jnp.bfloat16)
  seen = []
  for fields in ("split_k=1", "split_k=2"):
    config = probe.parse_config(f"decode=registers,tile_k=128,tile_m=8,escapes_in_kernel=True,{fields}")
    with probe.recorded_forms() as forms:
      jax.jit(lambda x, p: mosaic_gpu.w12_matmul(x, p, config=config)).trace(x, packed).lower(
          lowering_platforms=("cuda",))
    seen += forms
  assert seen == ["split 1, 128 a step, 4 deep, bf16, escapes in the kernel",
                  "split 2, 128 a step, 4 deep, f32 halves, escapes in the kernel"]
  assert mosaic_gpu._register_decode_call.__name__ == "_register_decode_call"  # undone


def test_loop_copies_finds_a_branchs_cache_copies_and_bills_one_branch_a_round(monkeypatch, capsys, tmp_path):
  """``loop_copies.py``: a while loop whose ``lax.switch`` branch writes a carried cache twice gets a copy of it
  (XLA's CPU compile; the probe runs the same count on a GPU), which the count finds inside the loop and bills once a
  round (the branch that writes once has none); DDTree's loop (XLA attention) copies no whole cache, only the CPU's
  layer-sized dot-layout transposes (in the HLO dump); SpecPilot's (pallas_tree, its switch branches writing no
  cache) copies nothing of a cache's or a layer's size, and under xla (one while loop a branch) no whole cache."""
  probe = load_probe("loop_copies", monkeypatch)
  cache = jnp.zeros((3, 8, 256, 16))

  def body(carry):
    i, c = carry

    def twice(c):
      c = c.at[0, :, i].set(1.0)
      c = c.at[1, :, i].set(c[0, :, i] + 1.0)
      return c.at[2, :, i].set(c[1, :, i] + c[0, :, 0])

    return i + 1, jax.lax.switch(i % 2, [lambda c: c.at[0, :, i].set(2.0), twice], c)

  hlo = jax.jit(lambda c: jax.lax.while_loop(lambda s: s[0] < 4, body, (0, c))).lower(cache).compile().as_text()
  found = probe.cache_copies(hlo, {"cache": cache.size})
  assert found and all(f["cache"] == "cache" and f["bytes"] == 2 * cache.size * 4 for f in found)
  (small, big), = probe.branches(probe.computations(hlo))
  assert all(f["computation"] in big and f["computation"] not in small for f in found)
  assert probe.bytes_a_round(hlo, found) == sum(f["bytes"] for f in found)  # one branch's, once a round
  assert probe.cache_copies(hlo, {"other": cache.size + 1}) == []
  rows = probe.main(["--engines", "ddtree@8", "--attentions", "xla", "--dump", str(tmp_path)])
  whole = [f for f in rows[0]["copies"] if "layer" not in f["cache"]]
  assert rows[0]["engine"] == "ddtree@8" and whole == []
  # the CPU lays a layer's K and V slice out for its dots: layer-sized transposes, which the dump shows
  layers = [f for f in rows[0]["copies"] if "layer" in f["cache"]]
  assert layers and all(f["op"] == "fusion" and "transpose" in f["instruction"] for f in layers)
  assert all(f["instruction"] in (tmp_path / "ddtree@8.hlo.txt").read_text() for f in layers)
  assert f"| ddtree@8 | 0 | {len(layers)} |" in capsys.readouterr().out
  # SpecPilot's pallas_tree branches hand their new K/V back and one scatter after the switch writes them: no copy
  rows = probe.main(["--engines", "specpilot@7,8", "--attentions", "pallas_tree"])
  assert [(r["engine"], r["copies"]) for r in rows] == [("specpilot[7,8]+pallas_tree", [])]
  # under xla its branches write the cache where it lies (`spec.switch_in_place`; as a `lax.switch`: 4 copies)
  rows = probe.main(["--engines", "specpilot@7,8", "--attentions", "xla"])
  assert rows[0]["engine"] == "specpilot[7,8]" and [f for f in rows[0]["copies"] if "layer" not in f["cache"]] == []
