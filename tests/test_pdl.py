"""Programmatic dependent launch (``pallas_kernels.pdl``): with ``ENABLED`` every Mosaic GPU kernel of the package
lowers for sm_90 with the grid-dependency wait, which marks its module ``mosaic_gpu.uses_pdl`` (the launch
attribute); without it, and in interpret mode, nothing changes. Whether it pays is the H200's question
(``bench_roofline.py`` row ``pdl_decode_loop``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import pdl, w12
from pallas_kernels import tree_attention as ta
from pallas_kernels.add_rms_norm import mosaic_gpu as norm_mosaic_gpu
from pallas_kernels.device import on_hopper
from pallas_kernels.skinny_matmul import mosaic_gpu as skinny_mosaic_gpu
from pallas_kernels.skinny_matmul.reference import skinny_matmul_reference
from pallas_kernels.swiglu import mosaic_gpu as swiglu_mosaic_gpu
from pallas_kernels.tree_attention import mosaic_gpu as ta_mosaic_gpu
from pallas_kernels.w12 import mosaic_gpu as w12_mosaic_gpu

sds = jax.ShapeDtypeStruct
BF16 = jnp.bfloat16


@pytest.fixture
def pdl_enabled(request):
  """Sets ``pdl.ENABLED`` for one test, with jax's trace caches cleared around it (the flag is read at trace time)."""
  default = pdl.ENABLED
  pdl.ENABLED = request.param
  jax.clear_caches()
  yield request.param
  pdl.ENABLED = default
  jax.clear_caches()


def _w12_case(decode):
  packed = w12.pack((np.random.default_rng(0).normal(size=(512, 128)) * 0.02).astype(np.float32).astype(BF16))
  config = w12.TuningConfig(decode=decode, tile_m=64, tile_k=128)
  return (lambda x, p: w12_mosaic_gpu.w12_matmul(x, p, config=config)), (jnp.ones((1, 512), BF16), packed)


def _tree_attention_case():
  kv, tree_kv = sds((1, 2048, 8, 128), BF16), sds((1, 16, 8, 128), BF16)
  shapes = (sds((1, 16, 32, 128), BF16), kv, kv, sds((1,), jnp.int32), tree_kv, tree_kv,
            sds((1, 16, ta.num_words(16)), jnp.uint32))
  return (lambda *a: ta_mosaic_gpu.tree_attention(*a, interpretable=False)), shapes


def _settled_tree_attention_case():
  fn, shapes = _tree_attention_case()
  return (lambda *a: ta_mosaic_gpu.tree_attention(*a, interpretable=False, cache_settled=True)), shapes


def _combine_case():
  parts = sds((8, 1, 1, 8, 4, 128), jnp.float32)
  return (lambda o, l: ta_mosaic_gpu._combine_kernel(o, l, BF16, None)), (parts, parts)


CASES = {
    "skinny_matmul": lambda: (skinny_mosaic_gpu.skinny_matmul, (sds((1, 4096), BF16), sds((4096, 1024), BF16))),
    "swiglu": lambda: (swiglu_mosaic_gpu.swiglu, (sds((1, 24576), BF16),)),
    "tree_attention_settled_cache": _settled_tree_attention_case,
    "tree_attention_combine": _combine_case,
    "add_rms_norm": lambda: ((lambda x, d, w: norm_mosaic_gpu.add_rms_norm(x, d, w, 1e-6)),
                             (sds((1, 4096), BF16), sds((1, 4096), BF16), sds((4096,), BF16))),
    "tree_attention": _tree_attention_case,
    "w12_smem_decode": lambda: _w12_case("smem"),
    "w12_register_decode": lambda: _w12_case("registers"),
}


@pytest.mark.parametrize("pdl_enabled", [True, False], indirect=True)
@pytest.mark.parametrize("kernel", list(CASES))
def test_every_kernel_lowers_with_the_launch_attribute_only_when_enabled(kernel, pdl_enabled):
  fn, args = CASES[kernel]()
  text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  assert "mosaic_gpu" in text
  assert ("mosaic_gpu.uses_pdl" in text) == pdl_enabled


@pytest.mark.parametrize("pdl_enabled", [True], indirect=True)
def test_interpret_mode_ignores_it(pdl_enabled):
  """Interpret mode has no grid dependencies: an enabled flag emits nothing there and the kernel still computes."""
  x = jax.random.normal(jax.random.key(0), (3, 256)).astype(BF16)
  w = jax.random.normal(jax.random.key(1), (256, 128)).astype(BF16)
  got = skinny_mosaic_gpu.skinny_matmul(x, w, interpret=plgpu.InterpretGPUParams())
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(skinny_matmul_reference(x, w), np.float32),
                             rtol=2e-2, atol=2e-2)


def _chain(x, ws, norm_w):
  """A residual stream through ``len(ws)`` rounds of add + norm, then a matmul (each kernel reads its predecessor's
  output): a kernel that read before its predecessor's writes landed would change the result."""
  h = x
  delta = None
  for w in ws:
    h, normed = norm_mosaic_gpu.add_rms_norm(h, delta, norm_w, 1e-6)
    delta = skinny_mosaic_gpu.skinny_matmul(normed, w)
  return h + delta


NO_COMMAND_BUFFERS = {"xla_gpu_enable_command_buffer": ""}
"""The GPU tests' compile options: inside XLA's command buffers (the default) PDL overlaps no kernels at all, so a load
that raced its predecessor could not show there; without them it does (docs/results/2026-12-01-pdl-early-loads-h200/)."""


def _compiled(fn, *args):
  return jax.jit(fn).lower(*args).compile(compiler_options=NO_COMMAND_BUFFERS)


@pytest.mark.gpu
@pytest.mark.skipif(not on_hopper(), reason="needs an H100/H200")
def test_a_dependent_chain_gives_the_same_bits_with_and_without_pdl():
  keys = jax.random.split(jax.random.key(3), 10)
  x = jax.random.normal(keys[0], (1, 4096)).astype(BF16)
  ws = [(jax.random.normal(k, (4096, 4096)) * 0.02).astype(BF16) for k in keys[1:9]]
  norm_w = (1 + 0.1 * jax.random.normal(keys[9], (4096,))).astype(BF16)
  results = {}
  default = pdl.ENABLED
  try:
    for on in (False, True):
      pdl.ENABLED = on
      jax.clear_caches()
      run = _compiled(_chain, x, ws, norm_w)
      results[on] = [np.asarray(run(x * (i + 1), ws, norm_w), np.float32) for i in range(5)]
  finally:
    pdl.ENABLED = default
    jax.clear_caches()
  for a, b in zip(results[False], results[True]):
    np.testing.assert_array_equal(a, b)


@pytest.mark.gpu
@pytest.mark.skipif(not on_hopper(), reason="needs an H100/H200")
def test_decode_steps_on_every_kernel_give_the_same_bits_with_and_without_pdl():
  """Four decode steps of a 3-layer model at Qwen3-8B widths in one jitted loop, every op on this package's kernels
  (skinny matmul, add + norm, q/k norm + rope, tree attention with the settled-cache order and the combine kernel,
  SwiGLU), compiled without command buffers: under PDL each kernel's early loads (weights, the cache prefix and its
  lengths) run before its predecessor has finished, so a load that depended on it would change the bits."""
  import dataclasses as dc

  from pallas_kernels.add_rms_norm import ops as norm_ops
  from pallas_kernels.qk_norm_rope import ops as rope_ops
  from pallas_kernels.skinny_matmul import ops as skinny_ops
  from pallas_kernels.swiglu import ops as swiglu_ops
  from specpilot.models import target
  from specpilot.models.kv_cache import KVCache
  from specpilot.models.weights import init_random_target
  from tests import models as tm

  cfg = tm.target_config(vocab=4096, hidden=4096, layers=3, heads=32, kv_heads=8, head_dim=128, intermediate=12288)
  w = init_random_target(cfg, 0, BF16)
  rng = np.random.default_rng(1)
  kv = rng.normal(size=(2, cfg.num_layers, 1, 1024, cfg.num_kv_heads, cfg.head_dim)).astype(np.float32)
  cache = KVCache(k=jnp.asarray(kv[0], BF16), v=jnp.asarray(kv[1], BF16), lengths=jnp.asarray([700], jnp.int32))

  def steps(w, tok, cache):
    def body(_, carry):
      tok, cache, logits = carry
      out = target.forward(w, cfg, tok, cache.lengths[:, None], cache, attention="pallas_tree")
      nxt = jnp.argmax(out.logits[:, -1], axis=-1).astype(jnp.int32)[:, None]
      return nxt, dc.replace(out.cache, lengths=out.cache.lengths + 1), logits + out.logits[:, -1]
    return jax.lax.fori_loop(0, 4, body, (tok, cache, jnp.zeros((1, cfg.vocab_size), jnp.float32)))

  modules = (skinny_ops, norm_ops, rope_ops, swiglu_ops)
  saved = [m.DEFAULT for m in modules] + [pdl.ENABLED, ta_mosaic_gpu.COMBINE_KERNEL]
  results = {}
  try:
    for m in modules:
      m.DEFAULT = "mosaic_gpu"
    ta_mosaic_gpu.COMBINE_KERNEL = True
    for on in (False, True):
      pdl.ENABLED = on
      jax.clear_caches()
      tok0 = jnp.asarray([[5]], jnp.int32)
      tok, out_cache, logits = _compiled(steps, w, tok0, cache)(w, tok0, cache)
      results[on] = [np.asarray(x, np.float32) for x in (tok, logits, out_cache.k, out_cache.v)]
  finally:
    for m, d in zip(modules, saved):
      m.DEFAULT = d
    pdl.ENABLED, ta_mosaic_gpu.COMBINE_KERNEL = saved[-2:]
    jax.clear_caches()
  for a, b in zip(results[False], results[True]):
    np.testing.assert_array_equal(a, b)
