"""One tree-attention suite, run by every implementation: the jnp reference, the Mosaic GPU
kernel interpreted on CPU, and the kernel on a real Hopper when one is present. All are
checked against a float64 numpy oracle; the ancestor bitmask against a brute-force walk."""

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

import models as tm
from pallas_kernels import pdl
from pallas_kernels import tree_attention as ta
from pallas_kernels.tree_attention import mosaic_gpu as ta_mosaic_gpu
from pallas_kernels.tree_attention import ops as ta_ops
from specpilot.models import target


def random_parents(n, rng, shuffle=False):
    """A random tree; with ``shuffle`` node labels are permuted, so parents may follow children."""
    parents = np.array([-1] + [rng.integers(0, i) for i in range(1, n)])
    if not shuffle:
        return parents
    order = rng.permutation(n)  # node i is relabelled order[i]
    relabelled = np.empty(n, np.int64)
    relabelled[order] = np.where(parents < 0, -1, order[np.maximum(parents, 0)])
    return relabelled


def tree_parents(kind, n, rng):
    if kind == "chain":
        return np.arange(n) - 1
    if kind == "star":
        return np.where(np.arange(n) == 0, -1, 0)
    return random_parents(n, rng, shuffle=kind == "shuffled")


def ancestor_walk(parents):
    """Brute force: ``[n, n]`` bool, row i marks i and every node on its path to the root."""
    n = len(parents)
    seen = np.zeros((n, n), bool)
    for i in range(n):
        j = i
        while j >= 0:
            seen[i, j] = True
            j = parents[j]
    return seen


def oracle(q, k_cache, v_cache, lengths, k_tree, v_tree, visible_tree):
    """float64 attention with the dense mask: prefix below ``lengths``, then ``visible_tree`` [B, n, n]."""
    q, k_cache, v_cache, k_tree, v_tree = (np.asarray(x, np.float64) for x in (q, k_cache, v_cache, k_tree, v_tree))
    b, n, hq, d = q.shape
    s, hkv = k_cache.shape[1:3]
    k = np.concatenate([k_cache, k_tree], axis=1)
    v = np.concatenate([v_cache, v_tree], axis=1)
    mask = np.concatenate(
        [np.broadcast_to(np.arange(s)[None, None] < np.asarray(lengths)[:, None, None], (b, n, s)), visible_tree],
        axis=-1,
    )
    k = np.repeat(k, hq // hkv, axis=2)
    v = np.repeat(v, hq // hkv, axis=2)
    scores = np.einsum("bnhd,bshd->bhns", q, k) * d**-0.5
    scores = np.where(mask[:, None], scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    probs = weights / weights.sum(-1, keepdims=True)
    return np.einsum("bhns,bshd->bnhd", probs, v)


def make_inputs(b, n, hq, hkv, d, s, kind, lengths, seed, dtype=jnp.bfloat16):
    """Built in numpy (``tm.on_device``). The bits pack the brute-force walk; ``parents_to_ancestor_bits`` is checked
    against the same walk above."""
    rng = np.random.default_rng(seed)
    normal = lambda *shape: tm.on_device(rng.normal(size=shape), dtype)  # noqa: E731
    parents = np.stack([tree_parents(kind, n, rng) for _ in range(b)])
    visible = np.stack([ancestor_walk(p) for p in parents])
    bits = ta.dense_to_ancestor_bits(visible)
    args = (
        normal(b, n, hq, d),
        normal(b, s, hkv, d),
        normal(b, s, hkv, d),
        jnp.asarray(np.asarray(lengths, np.int32)),
        normal(b, n, hkv, d),
        normal(b, n, hkv, d),
        jnp.asarray(bits),
    )
    return args, visible


# ---------------------------------------------------------------------------------------------------------------
# the ancestor bitmask


@pytest.mark.parametrize("kind", ["random", "shuffled", "chain", "star"])
@pytest.mark.parametrize("n", [1, 5, 32, 33, 100])
def test_parents_to_bits_matches_ancestor_walk(kind, n):
    rng = np.random.default_rng(n)
    parents = np.stack([tree_parents(kind, n, rng) for _ in range(3)])
    bits = ta.parents_to_ancestor_bits(jnp.asarray(parents, jnp.int32))
    assert bits.shape == (3, n, ta.num_words(n)) and bits.dtype == jnp.uint32
    expected = np.stack([ancestor_walk(p) for p in parents])
    np.testing.assert_array_equal(np.asarray(ta.ancestor_bits_to_dense(bits, n)), expected)
    np.testing.assert_array_equal(np.asarray(ta.dense_to_ancestor_bits(jnp.asarray(expected))), np.asarray(bits))


def test_bits_match_the_engine_tree_mask():
    """The engine's ``ancestor_mask`` (verify index 0 = root) packs to the same bits as its parents."""
    from specpilot.decoding import tree as tree_lib

    logp = jax.nn.log_softmax(jax.random.normal(jax.random.key(0), (4, 6)))
    tree = tree_lib.best_first(logp, budget=9)
    dense = tree_lib.ancestor_mask(tree, max_depth=4)
    parents = jnp.concatenate([jnp.array([-1], jnp.int32), tree.parent])
    bits = ta.parents_to_ancestor_bits(parents[None])[0]
    valid = np.concatenate([[True], np.asarray(tree.valid)])
    np.testing.assert_array_equal(
        np.asarray(ta.ancestor_bits_to_dense(bits, len(valid)))[valid][:, valid], np.asarray(dense)[valid][:, valid]
    )


# ---------------------------------------------------------------------------------------------------------------
# attention: one suite per implementation


# jitted, as the model calls them: one compile a case, not one per op
jitted_reference = jax.jit(functools.partial(ta.tree_attention, implementation="reference"))
jitted_packed_reference = jax.jit(functools.partial(ta.tree_attention_packed, implementation="reference"))


class TreeAttentionSuite:
    """Cases every implementation must pass; subclasses say how to run one."""

    def run(self, args, config):
        raise NotImplementedError

    @pytest.mark.parametrize(
        "b,n,hq,hkv,d,s,kind,lengths,config",
        [
            # n not a multiple of 16, partial prefix blocks, one split: the kernel writes the output itself
            (2, 20, 4, 1, 64, 128, "random", [37, 128], ta.TuningConfig(num_splits=1)),
            # GQA ratio 1 (64 nodes per row block), a deep tree, an empty prefix, 3 splits and a combine
            (2, 37, 2, 2, 64, 192, "chain", [0, 150], ta.TuningConfig(num_splits=3)),
            # a wide tree over two tree blocks; one split straddles prefix and tree
            (1, 70, 8, 2, 64, 192, "star", [130], ta.TuningConfig(num_splits=3)),
            # nodes out of order, D=128, the automatic split
            (1, 64, 4, 1, 128, 256, "shuffled", [200], ta.TuningConfig()),
            # nodes out of order over three tree blocks: ancestors in later blocks than their descendants
            (1, 130, 4, 1, 64, 128, "shuffled", [64], ta.TuningConfig(num_splits=2)),
            # an AR step: one node, unpadded (TMA reads zeros past it, stores nothing there), split and combined
            (1, 1, 4, 1, 64, 128, "chain", [37], ta.TuningConfig(num_splits=2)),
            # 8 nodes in a 16-node row block, unpadded, one split: the kernel's own store is clipped
            (2, 8, 8, 2, 64, 128, "random", [100, 5], ta.TuningConfig(num_splits=1)),
            # G = 3 (padded to 4 query heads a KV head), split and combined
            (1, 9, 6, 2, 64, 128, "random", [50], ta.TuningConfig(num_splits=2)),
            # G = 5 (Qwen3-14B's; padded to 8), one split
            (2, 3, 5, 1, 64, 128, "chain", [70, 128], ta.TuningConfig(num_splits=1)),
        ],
    )
    def test_matches_oracle(self, b, n, hq, hkv, d, s, kind, lengths, config):
        args, visible = make_inputs(b, n, hq, hkv, d, s, kind, lengths, seed=n)
        out = self.run(args, config)
        assert out.shape == (b, n, hq, d) and out.dtype == jnp.bfloat16
        expected = oracle(*args[:-1], visible)
        err = np.abs(np.asarray(out, np.float64) - expected)
        assert err.max() < 2e-2 and err.mean() < 2e-3, (err.max(), err.mean())


class TestReference(TreeAttentionSuite):
    def run(self, args, config):
        return jitted_reference(*args)

    def test_matches_the_model_attention(self):
        """The reference equals ``target.attention`` under the dense cache mask the engine builds (f32)."""
        b, n, s = 2, 9, 16
        args, visible = make_inputs(b, n, 8, 2, 16, s, "random", [5, 16], seed=0, dtype=jnp.float32)
        q, k_cache, v_cache, lengths, k_tree, v_tree, bits = args
        # the engine writes the tree's K/V at slots length..length+n-1 of a cache with room for them
        k_full = jnp.zeros((b, s + n, 2, 16)).at[:, :s].set(k_cache)
        v_full = jnp.zeros((b, s + n, 2, 16)).at[:, :s].set(v_cache)
        for i in range(b):
            k_full = k_full.at[i, lengths[i] : lengths[i] + n].set(k_tree[i])
            v_full = v_full.at[i, lengths[i] : lengths[i] + n].set(v_tree[i])
        mask = target.cache_mask(lengths, jnp.asarray(visible), s + n)
        expected = target.attention(q, k_full, v_full, mask).reshape(q.shape)
        np.testing.assert_allclose(
            np.asarray(ta.tree_attention_reference(*args)), np.asarray(expected), rtol=1e-5, atol=1e-5
        )


class TestMosaicGpuInterpret(TreeAttentionSuite):
    def run(self, args, config):
        return ta_mosaic_gpu.tree_attention(*args, config=config, interpret=plgpu.InterpretGPUParams())

    def test_lse_reuses_the_output_tile_where_shared_memory_is_short(self):
        """Five K/V stages at D = 128 leave no room for an lse tile of its own: the split kernel then stores the lse
        from the output tile once TMA has read the partial, and still matches the oracle."""
        config = ta.TuningConfig(max_concurrent_steps=5, num_splits=2)
        limit = ta_mosaic_gpu._SMEM_LIMIT - ta_mosaic_gpu._SMEM_RESERVED
        sizes = [ta_mosaic_gpu.smem_bytes(128, 2, config, final=False, interpretable=True, lse_apart=apart)
                 for apart in (False, True)]
        assert sizes[0] <= limit < sizes[1]
        args, visible = make_inputs(1, 16, 4, 1, 128, 512, "random", [300], seed=3)
        out = self.run(args, config)
        err = np.abs(np.asarray(out, np.float64) - oracle(*args[:-1], visible))
        assert err.max() < 2e-2 and err.mean() < 2e-3, (err.max(), err.mean())

    @pytest.mark.parametrize(
        "b,n,s,lengths,config,dtype",
        [
            # f16, the kernel's other 16-bit dtype (the suite runs bf16 only)
            (2, 20, 128, [37, 128], ta.TuningConfig(num_splits=2), jnp.float16),
            # 128 keys a step; lengths past either end of the cache, clipped in the kernel, and one off a block
            (3, 9, 256, [-5, 500, 129], ta.TuningConfig(block_kv=128, num_splits=2, max_concurrent_steps=2),
             jnp.bfloat16),
            # 128 query rows a block (32 nodes at G = 4): two row blocks, the second partly past n
            (1, 40, 128, [100], ta.TuningConfig(block_m=128, num_splits=1), jnp.bfloat16),
        ],
    )
    def test_tiles_and_dtypes_the_suite_leaves_out(self, b, n, s, lengths, config, dtype):
        """Kernel paths only the lowering tests reached: the oracle reads the lengths as given (a negative one sees
        no prefix, one past the capacity all of it)."""
        args, visible = make_inputs(b, n, 4, 1, 64, s, "random", lengths, seed=n, dtype=dtype)
        out = self.run(args, config)
        assert out.shape == (b, n, 4, 64) and out.dtype == dtype
        err = np.abs(np.asarray(out, np.float64) - oracle(*args[:-1], visible))
        assert err.max() < 2e-2 and err.mean() < 2e-3, (err.max(), err.mean())

    @pytest.mark.parametrize(
        "hq,hkv,d,s,config,match",
        [
            (4, 1, 48, 128, ta.TuningConfig(), "head_dim"),
            (16, 1, 64, 128, ta.TuningConfig(), "whole multiple of 8 nodes"),  # 64 rows hold 4 nodes of 16 heads
            (4, 1, 64, 96, ta.TuningConfig(), "capacity"),
            (4, 1, 128, 256, ta.TuningConfig(block_kv=256, max_concurrent_steps=4), "shared memory"),
        ],
    )
    def test_unsupported_shapes_raise_not_implemented(self, hq, hkv, d, s, config, match):
        args, _ = make_inputs(1, 8, hq, hkv, d, s, "random", [s], seed=0)
        with pytest.raises(NotImplementedError, match=match):
            self.run(args, config)


@pytest.fixture
def pdl_on(monkeypatch):
    """``pdl.ENABLED`` for one test (read at trace time; interpret mode emits no grid-dependency instructions, so
    what it tests is the kernel's order of loads and waits)."""
    monkeypatch.setattr(pdl, "ENABLED", True)
    jax.clear_caches()
    yield
    jax.clear_caches()


@pytest.fixture
def combine_kernel(monkeypatch):
    monkeypatch.setattr(ta_mosaic_gpu, "COMBINE_KERNEL", True)


@pytest.mark.usefixtures("pdl_on", "combine_kernel")
class TestMosaicGpuInterpretSettledCache(TreeAttentionSuite):
    """The kernel with its prefix loads ahead of the PDL wait and q, the ancestor words and the tree's K/V after it
    (``cache_settled`` with PDL on), its splits merged by the combine kernel where ``G * D`` tiles it (by XLA
    elsewhere): every case of the suite, splits without prefix blocks among them. The packed form differs only in
    its head offsets, which the packed classes check."""

    def run(self, args, config):
        return ta_mosaic_gpu.tree_attention(*args, config=config, interpret=plgpu.InterpretGPUParams(),
                                            cache_settled=True)


def test_combine_kernel_equals_the_xla_combine():
    """Random partials as the kernel writes them (as in the split-by-split test below), merged by the Mosaic GPU kernel
    in interpret mode and by XLA: equal up to the f32 exponential's last bits, then rounded alike."""
    rng = np.random.default_rng(11)
    splits, b, n, hkv, g, d = 6, 2, 3, 2, 4, 64
    lse = rng.normal(scale=4.0, size=(splits, b, n, hkv, g)).astype(np.float32)
    empty = rng.random(lse.shape) < 0.3
    empty[:, 0, 1, 1, 2] = True  # a row no split saw: zeros
    out_parts = np.where(empty[..., None], 0.0, rng.normal(size=(splits, b, n, hkv, g, d))).astype(np.float32)
    tiles = np.broadcast_to(np.where(empty, ta_mosaic_gpu._EMPTY_LSE, lse)[..., None], out_parts.shape)
    args = (jnp.asarray(out_parts), jnp.asarray(np.ascontiguousarray(tiles)))
    got = ta_mosaic_gpu._combine_kernel(*args, jnp.float32, plgpu.InterpretGPUParams())
    np.testing.assert_allclose(np.asarray(got), np.asarray(ta_mosaic_gpu._combine(*args)), rtol=1e-5, atol=1e-6)
    assert (np.asarray(got)[0, 1, 1, 2] == 0).all()
    assert ta_mosaic_gpu._combine_kernel(args[0][..., :1, :32], args[1][..., :1, :32], jnp.float32, None) is None


def pack(args):
    """The suite's inputs with the nodes' q, k and v packed head-wise: ``tree_attention_packed``'s arguments."""
    q, k_cache, v_cache, lengths, k_tree, v_tree, bits = args
    packed = jnp.asarray(np.concatenate([np.asarray(x) for x in (q, k_tree, v_tree)], axis=2))  # numpy: no compile
    return packed, k_cache, v_cache, lengths, bits


class TestPackedReference(TreeAttentionSuite):
    def run(self, args, config):
        return jitted_packed_reference(*pack(args))

    def test_unpack_heads_inverts_pack(self):
        args, _ = make_inputs(2, 5, 8, 2, 64, 64, "random", [3, 9], seed=4)
        for got, want in zip(ta.unpack_heads(pack(args)[0], 2), (args[0], args[4], args[5])):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


class TestPackedMosaicGpuInterpret(TreeAttentionSuite):
    """The kernel reading q, k and v at their head offsets in one array, every case of the suite."""

    def run(self, args, config):
        return ta_mosaic_gpu.tree_attention_packed(*pack(args), config=config, interpret=plgpu.InterpretGPUParams())

    def test_too_few_heads_is_a_clear_error(self):
        args, _ = make_inputs(1, 8, 4, 2, 64, 128, "random", [10], seed=0)
        qkv = pack(args)[0][:, :, :5]
        with pytest.raises(ValueError, match="qkv has 5 heads"):
            ta_mosaic_gpu.tree_attention_packed(qkv, *pack(args)[1:], interpret=plgpu.InterpretGPUParams())


@pytest.mark.parametrize("b,n", [(1, 1), (1, 16), (1, 64)])
def test_packed_kernel_lowers_for_cuda(b, n):
    """The packed form at Qwen3-8B shapes (48 heads: 32 q, 8 k, 8 v) lowers for the H200 on the CPU: TMA boxes at
    head offsets 0, 32 and 40 of one array."""
    sds = jax.ShapeDtypeStruct
    kv = sds((b, 2048, 8, 128), jnp.bfloat16)
    shapes = (sds((b, n, 48, 128), jnp.bfloat16), kv, kv, sds((b,), jnp.int32), sds((b, n, ta.num_words(n)), jnp.uint32))
    run = jax.jit(lambda *a: ta_mosaic_gpu.tree_attention_packed(*a, interpretable=False))
    assert "mosaic_gpu" in run.trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()


def test_padded_group_is_the_smallest_that_tiles():
    """G heads a KV head, 64 rows a block: a group tiles when 64 / G is a multiple of 8 nodes (1, 2, 4, 8)."""
    config = ta.TuningConfig()
    pads = {g: ta_mosaic_gpu.padded_group(jnp.zeros((1, 1, 2 * g, 64)), jnp.zeros((1, 64, 2, 64)), config)
            for g in range(1, 10)}
    assert pads == {1: None, 2: None, 3: 4, 4: None, 5: 8, 6: 8, 7: 8, 8: None, 9: None}
    assert ta_mosaic_gpu.padded_group(jnp.zeros((1, 1, 9, 64)), jnp.zeros((1, 64, 1, 64)),
                                      ta.TuningConfig(block_m=128)) == 16
    assert [ta.TuningConfig(block_m=128).tiled_group(g) for g in (3, 16, 17)] == [4, 16, None]


@pytest.mark.parametrize(
    "b,n,config",
    [
        (1, 1, ta.TuningConfig()),  # Qwen3-14B's heads (G = 5, padded to 8): an AR step
        (1, 64, ta.TuningConfig()),  # and a 64-node tree
    ],
)
def test_padded_group_lowers_for_cuda_at_qwen3_14b_heads(b, n, config):
    """40 query heads over 8 KV heads, packed as the model hands them over: the GPU path lowers on the CPU."""
    sds = jax.ShapeDtypeStruct
    kv = sds((b, 2048, 8, 128), jnp.bfloat16)
    bits = sds((b, n, ta.num_words(n)), jnp.uint32)
    shapes = (sds((b, n, 56, 128), jnp.bfloat16), kv, kv, sds((b,), jnp.int32), bits)
    run = jax.jit(lambda *a: ta_mosaic_gpu.tree_attention_packed(*a, config=config, interpretable=False))
    assert "mosaic_gpu" in run.trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize(
    "b,n,config",
    [
        (1, 16, ta.TuningConfig()),  # 16 splits + combine
        (1, 1, ta.TuningConfig()),  # an AR step: q and the tree's K/V unpadded
        (1, 12, ta.TuningConfig()),  # 12 nodes: TMA cannot tile them unpadded, so they are padded to 16
        (8, 256, ta.TuningConfig()),  # 1 split: the kernel writes bf16 itself
        (1, 100, ta.TuningConfig(block_m=128, max_concurrent_steps=2, num_splits=3)),
    ],
)
def test_gpu_kernel_lowers_for_cuda(b, n, config):
    """Mosaic GPU accepts the GPU path (probabilities in registers, which interpret mode cannot take) at
    Qwen3-8B shapes: layout inference and lowering to NVVM run on CPU; only ptxas and the run need a GPU."""
    sds = jax.ShapeDtypeStruct
    kv = sds((b, 2048, 8, 128), jnp.bfloat16)
    tree_kv = sds((b, n, 8, 128), jnp.bfloat16)
    shapes = (
        sds((b, n, 32, 128), jnp.bfloat16),
        kv,
        kv,
        sds((b,), jnp.int32),
        tree_kv,
        tree_kv,
        sds((b, n, ta.num_words(n)), jnp.uint32),
    )
    run = jax.jit(lambda *a: ta_mosaic_gpu.tree_attention(*a, config=config, interpretable=False))
    text = run.trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text


def test_an_ar_step_hands_its_split_partials_to_xlas_merge():
    """At an AR step's Qwen3-8B shapes (8 splits of a 1k cache) the kernel lowers for cuda returning f32 partials and
    lses, which XLA's merge (2^(lse - max)) combines after it."""
    sds = jax.ShapeDtypeStruct
    kv, tree_kv = sds((1, 1024, 8, 128), jnp.bfloat16), sds((1, 1, 8, 128), jnp.bfloat16)
    shapes = (sds((1, 1, 32, 128), jnp.bfloat16), kv, kv, sds((1,), jnp.int32), tree_kv, tree_kv,
              sds((1, 1, 1), jnp.uint32))
    run = jax.jit(lambda *a: ta_mosaic_gpu.tree_attention(*a, interpretable=False))
    text = run.trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
    (call,) = [line for line in text.splitlines() if "stablehlo.custom_call" in line]
    assert "-> (tensor<8x1x1x8x4x128xf32>, tensor<8x1x1x8x4x128xf32>)" in call, call[-200:]
    ops = {line.split("=", 1)[1].split()[0] for line in text.splitlines() if " = stablehlo." in line}
    assert ops & {"stablehlo.exponential", "stablehlo.power"}, ops


def test_auto_split_fills_one_wave_at_decode_shapes():
    config = ta.TuningConfig()
    kv_blocks = 2048 // config.block_kv + 1
    assert config.splits(1 * 8 * 1, kv_blocks) == 16  # B=1, Hkv=8, n=16 (one row block): 128 CTAs
    assert config.splits(1 * 8 * 16, kv_blocks) == 1  # n=256: 128 row blocks already fill the GPU
    assert config.splits(1 * 8 * 1, 3) == 1  # never fewer than min_blocks_per_split blocks per CTA


@pytest.mark.gpu
@pytest.mark.skipif(not ta_ops._on_hopper(), reason="needs an H100/H200")
class TestMosaicGpu(TreeAttentionSuite):
    def run(self, args, config):
        return jax.jit(lambda *a: ta.tree_attention(*a, implementation="pallas", config=config))(*args)

    @pytest.mark.parametrize("b,n,hq", [(1, 16, 32), (1, 64, 32), (8, 256, 32), (1, 1, 40), (1, 64, 40)])
    def test_qwen3_shapes(self, b, n, hq):
        """Qwen3-8B's heads (32 over 8); with hq = 40 Qwen3-14B's (G = 5, padded to 8)."""
        lengths = [2048 - 37 * i for i in range(b)]
        args, visible = make_inputs(b, n, hq, 8, 128, 2048, "random", lengths, seed=b + n)
        out = self.run(args, None)
        err = np.abs(np.asarray(out, np.float64) - oracle(*args[:-1], visible))
        assert err.max() < 2e-2 and err.mean() < 2e-3, (err.max(), err.mean())


@pytest.mark.gpu
@pytest.mark.skipif(not ta_ops._on_hopper(), reason="needs an H100/H200")
class TestPackedMosaicGpu(TestMosaicGpu):
    def run(self, args, config):
        return jax.jit(lambda *a: ta.tree_attention_packed(*a, implementation="pallas", config=config))(*pack(args))

    @pytest.mark.parametrize("n", [1, 5])
    def test_qwen3_8b_few_nodes(self, n):
        """An AR step's one node and a small tree over a 1k prefix at Qwen3-8B's heads."""
        args, visible = make_inputs(1, n, 32, 8, 128, 2048, "random", [1000], seed=n)
        out = jax.jit(lambda *a: ta.tree_attention_packed(*a, implementation="pallas"))(*pack(args))
        err = np.abs(np.asarray(out, np.float64) - oracle(*args[:-1], visible))
        assert err.max() < 2e-2 and err.mean() < 2e-3, (err.max(), err.mean())


def test_default_falls_back_to_reference_loudly(caplog):
    args, visible = make_inputs(1, 5, 4, 1, 48, 64, "random", [10], seed=1)  # head_dim 48: no kernel
    with caplog.at_level(logging.WARNING, logger=ta_ops.__name__):
        out = ta.tree_attention(*args, interpret=True)
    assert "falls back" in caplog.text
    np.testing.assert_allclose(np.asarray(out, np.float64), oracle(*args[:-1], visible), atol=2e-2)


def test_named_kernel_does_not_fall_back():
    args, _ = make_inputs(1, 5, 4, 1, 48, 64, "random", [10], seed=1)
    with pytest.raises(NotImplementedError):
        ta.tree_attention(*args, implementation="pallas", interpret=not ta_ops._on_hopper())


def _combine_two_pass(out_parts, lse):
    """The split merge as reductions over the split axis (the max, then the weighted sums)."""
    top = jnp.max(lse, axis=0)
    weights = jnp.exp2(lse - jnp.where(jnp.isfinite(top), top, 0.0))
    total = jnp.sum(weights, axis=0)
    return jnp.sum(out_parts * weights[..., None], axis=0) / jnp.where(total > 0, total, 1.0)[..., None]


def test_split_by_split_merge_equals_the_two_pass_one():
    """Random partials and log-sum-exps as the kernel writes them (the lse repeated along D, a split that saw no key
    with the finite empty sentinel and zeros), with a row that no split saw (zeros out)."""
    rng = np.random.default_rng(7)
    splits, b, n, hkv, g, d = 5, 2, 7, 2, 2, 16
    lse = rng.normal(scale=4.0, size=(splits, b, n, hkv, g)).astype(np.float32)
    empty = rng.random(lse.shape) < 0.3
    empty[:, 1, 0, 0, 0] = True  # request 1, node 0, KV head 0, query head 0: no split saw a key
    out_parts = np.where(empty[..., None], 0.0, rng.normal(size=(splits, b, n, hkv, g, d))).astype(np.float32)
    tiles = np.broadcast_to(np.where(empty, ta_mosaic_gpu._EMPTY_LSE, lse)[..., None], out_parts.shape)
    got = jax.jit(ta_mosaic_gpu._combine)(jnp.asarray(out_parts), jnp.asarray(tiles))
    want = _combine_two_pass(jnp.asarray(out_parts), jnp.asarray(np.where(empty, -np.inf, lse)))
    assert (np.asarray(got)[1, 0, 0, 0] == 0).all()
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
    assert np.isfinite(np.asarray(got)).all() and (np.asarray(got)[1, 0, 0, 0] == 0).all()


def test_host_masks_pack_to_the_same_bits_as_traced_ones():
    """A numpy mask (causal or all-visible, fixed at trace time) packs on the host, and the kernel's row layout of its
    bits is built on the host too: both equal the jnp results bit for bit."""
    rng = np.random.default_rng(5)
    mask = rng.random((2, 40, 40)) < 0.5
    host = ta.dense_to_ancestor_bits(mask)
    assert isinstance(host, np.ndarray)
    np.testing.assert_array_equal(host, np.asarray(ta.dense_to_ancestor_bits(jnp.asarray(mask))))
    rows = ta_mosaic_gpu._row_bits(host, 40, 48, 16, 4, 2)
    assert isinstance(rows, np.ndarray)
    np.testing.assert_array_equal(rows, np.asarray(ta_mosaic_gpu._row_bits(jnp.asarray(host), 40, 48, 16, 4, 2)))


@pytest.mark.parametrize("splits", [1, 2, 3, 8, 16])
def test_split_ranges_cover_every_block_once_and_give_a_short_tree_its_own_split(splits):
    """For every prefix length and tree size: the splits' ranges partition the prefix and the tree blocks; a tree no
    longer than a prefix split's share sits alone in the last split (so no CTA runs two pipelines), and no split holds
    more blocks than the longer of that share and the even cut of all blocks."""
    for prefix_blocks in range(0, 40):
        for tree_blocks in range(1, 6):
            ranges = [tuple(int(v) for v in ta_mosaic_gpu.split_ranges(prefix_blocks, tree_blocks, s, splits))
                      for s in range(splits)]
            prefix = [i for p_lo, p_hi, _, _ in ranges for i in range(p_lo, p_hi)]
            tree = [i for _, _, t_lo, t_hi in ranges for i in range(t_lo, t_hi)]
            assert prefix == list(range(prefix_blocks)) and tree == list(range(tree_blocks)), (prefix_blocks, ranges)
            share = -(-prefix_blocks // max(splits - 1, 1))
            if splits > 1 and prefix_blocks and tree_blocks <= share:
                assert ranges[-1][:2] == (prefix_blocks, prefix_blocks) and ranges[-1][2:] == (0, tree_blocks)
                assert all(t_hi == t_lo for _, _, t_lo, t_hi in ranges[:-1])
            most = max(share, -(-(prefix_blocks + tree_blocks) // splits))
            assert max(p_hi - p_lo + t_hi - t_lo for p_lo, p_hi, t_lo, t_hi in ranges) <= most


def test_bench_shape_runs_other_heads_in_interpret_mode():
    """The benchmark at Qwen3-14B's group (G = 5: 10 query heads over 2 here), kernel interpreted: every method runs,
    the kernel matches the reference, and its split count is the padded group's (8 heads a KV head, 8 nodes a block)."""
    from pallas_kernels.tree_attention import bench

    config = ta.TuningConfig(num_sms=8)  # 8 SMs over 4 row-block CTAs at G padded to 8 (2 splits); unpadded, 2 (4)
    rows = bench.bench_shape(1, 12, 512, 1, (config,), interpret=True, calls=1, max_copies=2, heads=(10, 2, 64))
    assert [r["method"] for r in rows] == ["xla_einsum", "xla_dpa", "kernel[0]"]
    assert all("error" not in r and r["heads"] == [10, 2, 64] for r in rows), rows
    kernel = rows[-1]
    assert kernel["max_abs_err"] < 2e-2
    assert kernel["splits"] == 2
