"""Weight-only quantized matmul (`pallas_kernels.quant_matmul`): reference, dispatch, and jax's
Hopper int8 kernel on a real Hopper when one is present.

The kernel cannot run in Pallas GPU-interpret mode (its wgmma LHS comes from registers, which the
interpreter does not support), so on CPU only the reference, the shape logic and the dispatch are
tested; `TestMosaicGpu` checks kernel == reference on the GPU."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import quant_matmul
from pallas_kernels.quant_matmul import mosaic_gpu as qm_mosaic_gpu
from pallas_kernels.quant_matmul import ops as qm_ops
from specpilot.models.weights import linear, quantize


def random_case(k, n, m, fmt="int8", seed=0):
    rng = np.random.default_rng(seed)
    w = rng.normal(0.0, k**-0.5, size=(k, n)) * rng.uniform(0.1, 10.0, size=n)
    x = rng.normal(size=(m, k))
    return jnp.asarray(x, jnp.bfloat16), jnp.asarray(w, jnp.float32), quantize(jnp.asarray(w, jnp.float32), fmt)


def dequantized_f32(x, qa):
    w = np.asarray(qa.q_t.astype(jnp.float32)).T * np.asarray(qa.scale)
    return np.asarray(x, np.float32) @ w


@pytest.mark.parametrize("fmt", ["int8", "fp8"])
def test_quantize_layout_and_reference(fmt):
    x, w, qa = random_case(256, 128, 17, fmt)
    assert qa.shape == (256, 128) and qa.q_t.shape == (128, 256) and qa.scale.shape == (128,)
    y = quant_matmul.matmul(x, qa, implementation="reference")
    assert y.dtype == jnp.bfloat16 and y.shape == (17, 128)
    np.testing.assert_allclose(np.asarray(y, np.float32), dequantized_f32(x, qa), rtol=2e-2, atol=2e-2)
    tolerance = 0.05 if fmt == "int8" else 0.2  # quantization error, relative to the output scale
    exact = np.asarray(x, np.float32) @ np.asarray(w)
    assert np.abs(np.asarray(y, np.float32) - exact).max() < tolerance * np.abs(exact).max()


@pytest.mark.parametrize("fmt", ["int8", "fp8"])
def test_quantize_keeps_zero_and_tiny_columns_finite(fmt):
    """A column that is all zero, or so small that amax / qmax underflows (flushed to 0), must dequantize to (about)
    itself, never NaN: one NaN weight makes every level-1 logit NaN."""
    w = np.array(random_case(8, 4, 1)[1])
    w[:, 0], w[:, 1] = 0.0, np.linspace(-1e-37, 1e-37, 8)
    qa = quantize(jnp.asarray(w, jnp.bfloat16), fmt)
    deq = np.asarray(qa.q_t.astype(jnp.float32)).T * np.asarray(qa.scale)
    assert np.isfinite(deq).all() and np.isfinite(np.asarray(qa.scale)).all()
    np.testing.assert_allclose(deq[:, :2], 0.0, atol=1e-36)


def test_linear_dispatches_quant_array_with_leading_dims():
    x, _, qa = random_case(128, 64, 6)
    x3 = x.reshape(2, 3, 128)
    y = linear(x3, qa)
    assert y.shape == (2, 3, 64)
    ref = quant_matmul.quant_matmul_reference(x, qa.q_t, qa.scale)
    np.testing.assert_array_equal(np.asarray(y, np.float32).reshape(6, 64), np.asarray(ref, np.float32))


@pytest.mark.parametrize("m,padded", [(1, 64), (17, 64), (64, 64), (129, 192)])
def test_tokens_pad_to_the_token_tile(m, padded):
    assert qm_mosaic_gpu.padded_tokens(m, quant_matmul.TuningConfig()) == padded


@pytest.mark.parametrize(
    "k,n,dtype,x_dtype,match",
    [
        (256, 256, jnp.float8_e4m3fn, jnp.bfloat16, "int8"),
        (256, 256, jnp.int8, jnp.float32, "activations"),
        (256, 192, jnp.int8, jnp.bfloat16, "N=192"),  # a block is 2 x 64 channels
        (200, 256, jnp.int8, jnp.bfloat16, "K=200"),
    ],
)
def test_unsupported_inputs_raise_not_implemented(k, n, dtype, x_dtype, match):
    q_t = jnp.zeros((n, k), dtype)
    with pytest.raises(NotImplementedError, match=match):
        qm_mosaic_gpu.check_supported(jnp.zeros((3, k), x_dtype), q_t, quant_matmul.TuningConfig())


def test_qwen3_8b_shapes_are_supported():
    for k, n in [(4096, 6144), (4096, 4096), (4096, 24576), (12288, 4096), (4096, 151936)]:
        qm_mosaic_gpu.check_supported(
            jax.ShapeDtypeStruct((129, k), jnp.bfloat16),
            jax.ShapeDtypeStruct((n, k), jnp.int8),
            quant_matmul.TuningConfig(),
        )


def test_default_is_the_reference_off_hopper(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("kernel must not run off Hopper")

    monkeypatch.setattr(qm_ops, "_mosaic_gpu", boom)
    x, _, qa = random_case(128, 128, 3)
    quant_matmul.matmul(x, qa)


def test_default_dispatches_int8_to_the_kernel_on_hopper(monkeypatch):
    calls = []
    monkeypatch.setattr(qm_ops, "DEFAULT_TO_KERNEL", True)  # off until the kernel is checked on an H200
    monkeypatch.setattr(qm_ops, "_on_hopper", lambda: True)
    monkeypatch.setattr(qm_ops, "_mosaic_gpu", lambda x, qa, config: calls.append(qa.q_t.dtype) or x[..., :1])
    x, _, qa = random_case(128, 128, 3)
    quant_matmul.matmul(x, qa)
    assert calls == [jnp.int8]
    _, _, qa8 = random_case(128, 128, 3, fmt="fp8")
    quant_matmul.matmul(x, qa8)  # fp8 stays on the reference
    assert calls == [jnp.int8]
    monkeypatch.setattr(qm_ops, "DEFAULT_TO_KERNEL", False)
    quant_matmul.matmul(x, qa)
    assert calls == [jnp.int8]


def test_default_falls_back_to_reference_loudly(monkeypatch, caplog):
    monkeypatch.setattr(qm_ops, "DEFAULT_TO_KERNEL", True)
    monkeypatch.setattr(qm_ops, "_on_hopper", lambda: True)
    x, _, qa = random_case(128, 96, 3)  # N=96: not a multiple of the 128-channel block
    with caplog.at_level(logging.WARNING, logger=qm_ops.__name__):
        y = quant_matmul.matmul(x, qa)
    assert "falls back" in caplog.text
    ref = quant_matmul.quant_matmul_reference(x, qa.q_t, qa.scale)
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(ref, np.float32))


@pytest.mark.gpu
@pytest.mark.skipif(not qm_ops._on_hopper(), reason="needs an H100/H200")
class TestMosaicGpu:
    @pytest.mark.parametrize("m", [1, 17, 64, 129])
    @pytest.mark.parametrize("k,n", [(256, 128), (1024, 384)])
    def test_matches_reference(self, k, n, m):
        x, _, qa = random_case(k, n, m, seed=m)
        run = jax.jit(lambda x, qa: quant_matmul.matmul(x, qa, implementation="mosaic_gpu"))
        y = np.asarray(run(x, qa), np.float32)
        ref = np.asarray(quant_matmul.matmul(x, qa, implementation="reference"), np.float32)
        assert y.shape == (m, n)
        # both accumulate in f32 and scale the same f32 result: only summation order differs, so
        # they agree to within one bf16 rounding of the output
        np.testing.assert_allclose(y, ref, rtol=1e-2, atol=1e-2 * np.abs(ref).max())
        np.testing.assert_allclose(y, dequantized_f32(x, qa), rtol=1e-2, atol=1e-2 * np.abs(ref).max())

    def test_qwen3_8b_gate_up_decode(self):
        x, _, qa = random_case(4096, 24576, 129, seed=1)
        y = jax.jit(lambda x, qa: quant_matmul.matmul(x, qa, implementation="mosaic_gpu"))(x, qa)
        ref = quant_matmul.matmul(x, qa, implementation="reference")
        np.testing.assert_allclose(
            np.asarray(y, np.float32),
            np.asarray(ref, np.float32),
            rtol=1e-2,
            atol=1e-2 * float(jnp.abs(ref.astype(jnp.float32)).max()),
        )
