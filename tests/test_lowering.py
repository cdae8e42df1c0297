"""``pallas_kernels.lowering.lowered_once``: a program lowers each distinct Mosaic GPU kernel once, whatever its number
of call sites, and a trace-time setting still reaches the kernel (lowered for ``cuda`` on the CPU: no GPU needed)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import pdl
from pallas_kernels.lowering import lowered_once
from pallas_kernels.skinny_matmul import mosaic_gpu as skinny_mosaic_gpu
from pallas_kernels.tree_attention import mosaic_gpu as tree_mosaic_gpu
from pallas_kernels.tree_attention import num_words

BF16 = jnp.bfloat16
sds = jax.ShapeDtypeStruct
_spec = importlib.util.spec_from_file_location(
    "lowering_time", Path(__file__).resolve().parents[1] / "scripts" / "lowering_time.py")
lowering_time = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lowering_time)
kernels_in = lowering_time.kernels_in


def cuda_text(fn, *args) -> str:
  return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def test_equal_call_sites_lower_one_kernel_and_a_new_shape_another():
  def three_sites(x, w, v):
    return (skinny_mosaic_gpu.skinny_matmul(x, w), skinny_mosaic_gpu.skinny_matmul(x * 2, w),
            skinny_mosaic_gpu.skinny_matmul(x, v))

  w = sds((4096, 1024), BF16)
  assert kernels_in(cuda_text(three_sites, sds((1, 4096), BF16), w, w)) == 1
  assert kernels_in(cuda_text(three_sites, sds((1, 4096), BF16), w, sds((4096, 2048), BF16))) == 2


@pytest.mark.parametrize("tokens", [1, 64])
def test_the_forward_lowers_as_many_kernels_at_three_layers_as_at_two(tokens):
  """Qwen3-8B's layer shapes, two and three layers: a third layer adds call sites, not kernels."""
  with lowering_time.fast_kernels_as_if_on_hopper():
    two, three = (lowering_time.lower_forward("qwen3_8b", layers, tokens)["kernels"] for layers in (2, 3))
  assert two >= 5  # q|k|v, o, down (skinny), add + norm, q/k norm + rope, attention at least
  assert three == two


def test_qwen3_14b_lowers_the_same_kernels_as_qwen3_8b_in_an_ar_step(caplog):
  """Qwen3-14B's shapes (GQA group 5: the tree-attention kernel pads it to 8 heads a KV head) take every kernel
  Qwen3-8B's AR step takes, none falling back to a reference."""
  with caplog.at_level("WARNING"), lowering_time.fast_kernels_as_if_on_hopper():
    counts = [lowering_time.lower_forward(model, 2, 1)["kernels"] for model in ("qwen3_8b", "qwen3_14b")]
  assert counts[0] >= 5 and counts[1] == counts[0]
  assert "falls back" not in caplog.text


def test_the_lowering_time_script_reports_and_restores(capsys):
  """``scripts/lowering_time.py`` prints its JSON line and leaves the kernel choices and device checks as they were."""
  from pallas_kernels import choices
  from pallas_kernels.skinny_matmul import ops as skinny_ops

  before, on_hopper = choices.current(), skinny_ops._on_hopper
  res = lowering_time.main(["--layers", "2"])
  assert json.loads(capsys.readouterr().out) == res
  assert res["layers"] == 2 and res["tokens"] == 1 and res["kernels"] >= 5 and res["lower_s"] > 0
  assert choices.current() == before and skinny_ops._on_hopper is on_hopper


def test_a_setting_passed_in_reaches_an_already_traced_kernel(monkeypatch):
  """A setting the kernel entry takes as an argument is part of its key: with PDL on in both traces, only
  ``cache_settled`` differing (the grid-dependency wait after the prefix pipeline's first loads, ``early_cache``),
  the second trace lowers a kernel of its own, not the first trace's."""
  def attend(*args, settled):  # a new function each trace: jit's cache of the outer program is not the question here
    return tree_mosaic_gpu.tree_attention(*args, interpretable=False, cache_settled=settled)

  kv, tree_kv = sds((1, 2048, 8, 128), BF16), sds((1, 16, 8, 128), BF16)
  args = (sds((1, 16, 32, 128), BF16), kv, kv, sds((1,), jnp.int32), tree_kv, tree_kv,
          sds((1, 16, num_words(16)), jnp.uint32))
  monkeypatch.setattr(pdl, "ENABLED", True)
  plain = cuda_text(lambda *a: attend(*a, settled=False), *args)
  assert cuda_text(lambda *a: attend(*a, settled=True), *args) != plain


def test_a_static_name_must_name_a_parameter():
  with pytest.raises(TypeError, match="no parameter named tile"):
    lowered_once("tile")(lambda x, tile_m: x)


def test_w12_call_sites_of_one_shape_lower_one_kernel():
  """The W12 register decode (its escape lists traced arguments): two weights of one shape, one kernel."""
  from pallas_kernels import w12
  from pallas_kernels.w12 import mosaic_gpu as w12_mosaic_gpu

  rng = np.random.default_rng(0)
  a, b = (w12.pack((rng.normal(size=(512, 128)) * 0.02).astype(np.float32).astype(BF16)) for _ in range(2))
  config = w12.TuningConfig(decode="registers", tile_m=64, tile_k=128)
  two = lambda x, p, q: (w12_mosaic_gpu.w12_matmul(x, p, config=config),  # noqa: E731
                         w12_mosaic_gpu.w12_matmul(x, q, config=config))
  assert kernels_in(cuda_text(two, jnp.ones((1, 512), BF16), a, b)) == 1
