"""Tree-verification attention for Hopper, written with Mosaic GPU (``plgpu.kernel``).

What it computes: every node of a draft tree attends to its request's cached prefix
(positions below ``lengths[b]``) and to its own ancestors in the tree (the bitmask
of ``ancestors.py``), softmax in f32, scale ``D**-0.5``.

Rows. Decode-time attention has few queries, so the queries of the ``G = Hq / Hkv``
heads that share a KV head are packed with the tree nodes into the wgmma M
dimension: one block of ``block_m`` rows holds ``T = block_m / G`` nodes times the G
heads, row ``r = g * T + t`` (head-major inside the block, so each head's rows are one
contiguous ``[T, D]`` TMA box of ``q`` and of the output; no transpose in HBM). K and
V of that KV head are then read once per ``block_m`` rows instead of once per head.

KV. The keys of one request are the prefix blocks ``0 .. ceil(length / block_kv)``
followed by the tree's keys, padded to whole blocks. A tree no longer than a prefix split's share gets the
last split to itself, the prefix cut evenly over the others; a longer one is cut with the prefix as one sequence
into ``splits`` contiguous ranges (``split_ranges``). Each CTA of the grid ``(B, Hkv, row blocks,
splits)`` streams its range with a TMA pipeline (one for the prefix part, one for the
tree part), running the online softmax (FlashAttention-2 style, base-2 exponentials).
The prefix mask (key < length) only bites in the block holding ``length``; tree blocks
apply the ancestor bits, decoded in registers from ``block_kv / 32`` words per row
(node ``t``'s words, repeated for its G heads, arrive with the Q tile). Because the
split ranges follow the live length rather than the cache capacity, blocks past
``length`` are never read and every split gets an equal share of the real work.

Combine. With one split the kernel writes the normalised output in q's dtype. With
more, each split writes its normalised f32 partial and its log2-sum-exp, both as
``[B, n, Hkv, G, D]`` tiles in the output's order (the lse repeated along D, from a tile
of its own where shared memory allows, so both stores are in flight at once; else from
the output tile's once TMA has read the partial), and a jnp combine
(``_combine``) weights them: ``o = sum_s 2**(lse_s - m) o_s / sum_s 2**(lse_s - m)``.
Elementwise throughout, so XLA makes it one kernel (``combine_probe.py``, at ``63e1118``); with ``COMBINE_KERNEL``
it is one Mosaic GPU kernel of the same operations instead (``_combine_kernel``). The merge inside this kernel
(the row block's CTAs meeting at a GMEM semaphore) was built and timed on the H200: its merge lengthened the kernel by
what the merge kernel took, and XLA added a memset of the semaphores a call, so the AR step went 4.405 -> 4.457 ms
(docs/results/2026-12-02-merge-in-kernel-h200/; the code is at commit ``f565ca6``). So was a one-token step's merge
inside a thread-block cluster of its splits, through distributed shared memory: 0 to -4 us a step on an H100, the
barriers and peer reads costing what the merge kernel's launch costs inside XLA's command buffers
(docs/results/2026-12-06-fusion-ab-h100/; the code, ``CLUSTER_MERGE``, is at commit ``2b79b3e``).
The auto split (``TuningConfig.splits``) keeps ``B * Hkv * row blocks * splits`` at
about one wave of 132 SMs: B=1, Hkv=8, n=16 (one row block) gets 16 splits of a 2k
prefix.

PDL. With ``pallas_kernels.pdl`` on and ``cache_settled`` (no kernel of the two launches before this one wrote the
cache prefix or the lengths: ``ops.tree_attention``), the lengths and the prefix pipeline's first loads come before
the grid-dependency wait, and q, the ancestor words and the tree's K/V after it; otherwise the wait is the kernel's
first instruction.

Status: passes ``tests/test_tree_attention.py`` in Pallas GPU-interpret mode on CPU and on the H200, where it
beats XLA's masked attention at every size measured (docs/results/2026-11-30-kernels-h200-splitk/) and, as a
one-node tree, makes the fastest AR step measured (docs/results/2026-11-30-ar-tree-attention-h200/). The two
forms differ only in ``P V``: interpret mode runs neither a register wgmma operand nor ``pl.run_state``, so
``interpretable`` (the default when interpreting) stages P in SMEM and adds ``P V`` from a fresh accumulator;
the GPU form keeps P in registers and accumulates in place (as jax's ``attention_mgpu`` does), which saves an
SMEM round trip and a [block_m, D] f32 register tile. ``q`` and the tree's K/V go in unpadded when TMA can
tile them (``pad_for_tma``: fewer than 8 nodes, or a multiple of 8): an AR step's one node then costs no XLA
pad kernels (~0.1 ms of a Qwen3-8B step in the H200's kernel split). With its merge as one XLA kernel and Q
awaited in the first pipeline step, a Qwen3-8B AR forward on it is 587 launches, 16 a layer
(docs/results/2026-12-01-combine-h200/).

Not done yet (in expected order of gain): warp specialisation (a TMA warpgroup and
two compute warpgroups ping-ponging softmax and wgmma, as in FA3 / ``attention_mgpu``);
async wgmma so ``Q K^T`` of the next block overlaps the softmax; two compute
warpgroups per CTA (block_m = 128) so the prefix is re-read by half as many row blocks
(16 per KV head at n = 256, G = 4).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import pdl
from pallas_kernels.lowering import lowered_once
from pallas_kernels.split_k import exit_wait
from pallas_kernels.tma import pad_for_tma
from pallas_kernels.tree_attention.ancestors import WORD_BITS, num_words
from pallas_kernels.tree_attention.config import TuningConfig
from pallas_kernels.tree_attention.ops import unpack_heads

_LOG2E = math.log2(math.e)
_SUPPORTED_DTYPES = (jnp.bfloat16, jnp.float16)
_SMEM_LIMIT = 227 * 1024  # per CTA on H100 / H200
_SMEM_RESERVED = 4 * 1024  # Mosaic GPU's reduction scratch, barriers, alignment
_EMPTY_LSE = -1e30
"""The lse of a row that saw no key: finite, so the merge needs no ``isfinite`` guard (``2^(_EMPTY_LSE - m)`` is 0
for any real lse ``m``; a row empty in every split merges its zeros with equal weights)."""


def _cdiv(a, b):
    return -(-a // b)


def _smem_transforms(minor_dim: int, dtype) -> tuple:
    """Tiling + swizzle that wgmma operands and conflict-free SMEM access need."""
    bits = jnp.dtype(dtype).itemsize * 8
    swizzle = plgpu.find_swizzle(minor_dim * bits)
    return (plgpu.TilingTransform((8, swizzle * 8 // bits)), plgpu.SwizzleTransform(swizzle))


def check_supported(q, k_cache, v_cache, k_tree, v_tree, ancestor_bits, config: TuningConfig) -> None:
    """Raises ValueError for inconsistent inputs, NotImplementedError for shapes not tiled yet."""
    if q.ndim != 4 or k_cache.ndim != 4:
        raise ValueError(f"tree attention: q and k_cache must be 4-D, got {q.shape}, {k_cache.shape}")
    b, n, hq, d = q.shape
    _, s, hkv, _ = k_cache.shape
    if v_cache.shape != k_cache.shape or (k_cache.shape[0], k_cache.shape[3]) != (b, d):
        raise ValueError(f"tree attention: k_cache {k_cache.shape} / v_cache {v_cache.shape} do not match q {q.shape}")
    if k_tree.shape != (b, n, hkv, d) or v_tree.shape != k_tree.shape:
        raise ValueError(f"tree attention: k_tree/v_tree must be {(b, n, hkv, d)}, got {k_tree.shape}, {v_tree.shape}")
    if ancestor_bits.shape != (b, n, num_words(n)):
        raise ValueError(f"tree attention: ancestor_bits must be {(b, n, num_words(n))}, got {ancestor_bits.shape}")
    if hq % hkv:
        raise ValueError(f"tree attention: Hq={hq} is not a multiple of Hkv={hkv}")
    dtypes = {jnp.dtype(x.dtype) for x in (q, k_cache, v_cache, k_tree, v_tree)}
    if len(dtypes) != 1 or dtypes.pop() not in map(jnp.dtype, _SUPPORTED_DTYPES):
        raise NotImplementedError(f"tree attention kernel needs one 16-bit float dtype, got {q.dtype}, {k_cache.dtype}")
    if d % 64:
        raise NotImplementedError(f"head_dim={d} is not a multiple of 64")
    g = hq // hkv
    if config.block_m % g or (config.block_m // g) % 8:
        raise NotImplementedError(f"block_m={config.block_m} / G={g} must be a whole multiple of 8 nodes, and no "
                                  f"padded group tiles it (padded_group): G > {config.block_m // 8} needs a larger "
                                  "TuningConfig.block_m")
    if s % config.block_kv:
        raise NotImplementedError(f"cache capacity S={s} is not a multiple of block_kv={config.block_kv}")


def smem_bytes(d: int, row_words: int, config: TuningConfig, *, final: bool, interpretable: bool,
               lse_apart: bool = False) -> int:
    """Shared memory one CTA allocates (the two KV pipelines reuse the same buffers); ``lse_apart``: the lse tile has
    a buffer of its own instead of reusing the output tile's."""
    m, kv = config.block_m, config.block_kv
    return (
        m * d * 2  # Q tile
        + row_words * m * 4  # ancestor words
        + m * d * (2 if final else 4) * (2 if lse_apart else 1)  # output tile (and the lse tile)
        + (m * kv * 2 if interpretable else 0)
        + 2 * config.max_concurrent_steps * kv * d * 2
    )  # K and V stages


@lowered_once("groups", "head0", "config", "n_pad", "splits", "tree_blocks", "interpretable", "interpret",
              "early_cache", "lse_apart")
def _kernel_call(
    q,
    k_cache,
    v_cache,
    lengths,
    k_tree,
    v_tree,
    row_bits,
    *,
    groups: int,
    head0: tuple[int, int, int],
    config: TuningConfig,
    n_pad: int,
    splits: int,
    tree_blocks: int,
    interpretable: bool,
    interpret,
    early_cache: bool,
    lse_apart: bool,
):
    """The ``(B, Hkv, row blocks, splits)`` grid over ``n_pad`` nodes (``q`` may hold fewer: TMA reads zeros past
    them and stores nothing there); returns the output ``[B, n, Hkv, G, D]``, plus lse when ``splits > 1``.

    ``q``, ``k_tree`` and ``v_tree`` are ``[B, n, heads, D]`` arrays in which the query heads start at head
    ``head0[0]`` (``G = groups`` of them per KV head, KV head-major), the tree's key heads at ``head0[1]`` and its
    value heads at ``head0[2]``: three arrays of their own (offsets 0), or one array holding all three.

    ``early_cache``: the PDL grid-dependency wait (``pdl.begin_kernel``) comes after the prefix pipeline's first loads
    and before anything else is read (q, the ancestor words, the tree's K/V), instead of first thing. ``lse_apart``
    (split only): the lse tile goes through a buffer of its own, so its store does not wait for the output's."""
    b, n_q, _, d = q.shape
    capacity, hkv, g = k_cache.shape[1], k_cache.shape[2], groups
    q0, k0, v0 = head0
    dtype = q.dtype
    block_m, block_kv = config.block_m, config.block_kv
    nodes = block_m // g  # T: nodes per row block
    row_blocks = n_pad // nodes
    words_per_block = block_kv // WORD_BITS
    final = splits == 1
    out_dtype = dtype if final else jnp.float32
    score_scale = d**-0.5 * _LOG2E  # scores in log2 units: exp2 is the native instruction
    kv_transforms = _smem_transforms(d, dtype)
    kv_spec = lambda first: plgpu.BlockSpec((block_kv, d), lambda i: (first + i, 0), transforms=kv_transforms)

    def tree_attention_body(q_ref, k_cache_ref, v_cache_ref, lengths_ref, k_tree_ref, v_tree_ref, bits_ref,
                              *refs):  # its name in profiles (CUPTI)
        outputs = 1 if final else 2
        out_ref, lse_ref = (*refs[:outputs], None)[:2]
        q_smem, bits_smem, out_smem, lse_smem, p_smem, load_barrier = refs[outputs:]
        bi, hi = lax.axis_index("b"), lax.axis_index("h")
        row_block, split = lax.axis_index("rows"), lax.axis_index("split")
        node0 = row_block * nodes

        def load_q():
            for gi in range(g):
                plgpu.copy_gmem_to_smem(
                    q_ref.at[bi, pl.ds(node0, nodes), q0 + hi * g + gi], q_smem.at[pl.ds(gi * nodes, nodes)],
                    load_barrier,
                )
            plgpu.copy_gmem_to_smem(bits_ref.at[bi, row_block], bits_smem, load_barrier)

        if not early_cache:
            pdl.begin_kernel(interpret)
            load_q()  # awaited in the first step that uses it (``wait_for_q``): the first K/V loads go out alongside

        length = jnp.clip(lengths_ref[bi], 0, capacity)  # here, not in XLA: a launch less a step
        prefix_blocks = (length + block_kv - 1) // block_kv
        prefix_lo, prefix_hi, tree_lo, tree_hi = split_ranges(prefix_blocks, tree_blocks, split, splits)

        def column():
            return plgpu.broadcasted_iota(jnp.int32, (block_m, block_kv), 1, layout=plgpu.Layout.WGMMA)

        def attend(carry, k_smem, v_smem, visible):
            """One online-softmax step over a ``[block_kv, D]`` block of keys and values."""
            acc, row_max, row_sum = carry

            def scores_of(acc_ref):
                plgpu.wgmma(acc_ref, q_smem, k_smem.transpose((1, 0)))
                return acc_ref[...]

            scores = pl.run_scoped(scores_of, plgpu.ACC((block_m, block_kv), jnp.float32))
            scores = jnp.where(visible, scores * score_scale, -jnp.inf)
            new_max = jnp.maximum(row_max, scores.max(axis=1))
            alpha = jnp.exp2(row_max - new_max)
            probs = jnp.exp2(scores - lax.broadcast_in_dim(new_max, scores.shape, [0]))
            row_sum = row_sum * alpha + probs.sum(axis=1)
            probs = probs.astype(dtype)

            acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
            if interpretable:  # P through SMEM, P V into a fresh accumulator
                p_smem[...] = probs
                plgpu.commit_smem()

                def values_of(acc_ref):
                    plgpu.wgmma(acc_ref, p_smem, v_smem)
                    return acc_ref[...]

                return acc + pl.run_scoped(values_of, plgpu.ACC((block_m, d), jnp.float32)), new_max, row_sum

            def accumulate_values(acc_ref):  # P from registers, accumulated into acc in place
                plgpu.wgmma(acc_ref, probs, v_smem)

            return pl.run_state(accumulate_values)(plgpu.ACC.init(acc)), new_max, row_sum

        prefix_steps, tree_steps = prefix_hi - prefix_lo, tree_hi - tree_lo

        def wait_for_q(when):
            """Q and the ancestor words, awaited once: in the first step of the first pipeline with steps (or after
            both, if this split has none), so their load overlaps the pipeline's first K/V loads. With
            ``early_cache`` the grid-dependency wait and Q's loads come here too, after the prefix pipeline's first
            loads (the cache was written before the kernel this one follows)."""

            def ready():
                if early_cache:
                    pdl.begin_kernel(interpret)
                    load_q()
                plgpu.barrier_wait(load_barrier)

            pl.when(when)(ready)

        def prefix_step(idx, k_smem, v_smem, carry):
            wait_for_q(idx[0] == 0)
            first_key = (prefix_lo + idx[0]) * block_kv
            return attend(carry, k_smem, v_smem, first_key + column() < length)

        def tree_step(idx, k_smem, v_smem, carry):
            if not early_cache:
                wait_for_q((idx[0] == 0) & (prefix_steps == 0))
            col = column()
            first_word = (tree_lo + idx[0]) * words_per_block
            word = None
            for w in range(words_per_block):  # row r's word for column c: bits_smem[first_word + c // 32, r]
                word_w = lax.broadcast_in_dim(bits_smem[first_word + w], (block_m, block_kv), [0])
                word = word_w if word is None else jnp.where(col >= w * WORD_BITS, word_w, word)
            bit = lax.shift_right_logical(word, (col & (WORD_BITS - 1)).astype(jnp.uint32)) & jnp.uint32(1)
            return attend(carry, k_smem, v_smem, bit != jnp.uint32(0))

        # a finite start for the running max: a fully masked block then yields p = 0, not NaN
        carry = (
            jnp.zeros((block_m, d), jnp.float32),
            jnp.full((block_m,), -1e30, jnp.float32),
            jnp.zeros((block_m,), jnp.float32),
        )
        carry = plgpu.emit_pipeline(
            prefix_step,
            grid=(prefix_steps,),
            in_specs=[kv_spec(prefix_lo)] * 2,
            max_concurrent_steps=config.max_concurrent_steps,
            init_carry=carry,
        )(k_cache_ref.at[bi, :, hi], v_cache_ref.at[bi, :, hi])
        if early_cache:  # the tree's K/V come from the kernel just before: its loads go out after the wait
            wait_for_q(prefix_steps == 0)
        carry = plgpu.emit_pipeline(
            tree_step,
            grid=(tree_steps,),
            in_specs=[kv_spec(tree_lo)] * 2,
            max_concurrent_steps=min(config.max_concurrent_steps, tree_blocks),
            init_carry=carry,
        )(k_tree_ref.at[bi, :, k0 + hi], v_tree_ref.at[bi, :, v0 + hi])
        if not early_cache:
            wait_for_q((prefix_steps == 0) & (tree_steps == 0))
        acc, row_max, row_sum = carry

        seen = row_sum > 0  # rows with no visible key (padding) write 0, lse _EMPTY_LSE
        out = acc / lax.broadcast_in_dim(jnp.where(seen, row_sum, 1.0), acc.shape, [0])

        def store(tile, smem, dst):
            smem[...] = tile
            plgpu.commit_smem()
            for gi in range(g):
                out_rows = (bi, pl.ds(node0, nodes), hi, gi)
                plgpu.copy_smem_to_gmem(smem.at[pl.ds(gi * nodes, nodes)],
                                        dst.at[out_rows] if final else dst.at[(split, *out_rows)])

        lse = jnp.where(seen, row_max + jnp.log(row_sum) * _LOG2E, _EMPTY_LSE)
        store(out.astype(out_dtype), out_smem, out_ref)
        # the lse along D: from a tile of its own, both stores in flight at once, or after the output's
        if not final:
            if lse_smem is None:
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)
            store(lax.broadcast_in_dim(lse, (block_m, d), [0]), out_smem if lse_smem is None else lse_smem, lse_ref)
        exit_wait()

    if final:
        out_type = jax.ShapeDtypeStruct((b, n_q, hkv, g, d), dtype)
    else:
        out_type = (
            jax.ShapeDtypeStruct((splits, b, n_q, hkv, g, d), jnp.float32),
            jax.ShapeDtypeStruct((splits, b, n_q, hkv, g, d), jnp.float32),
        )
    part_transforms = _smem_transforms(d, out_dtype)
    scratch = (
        plgpu.SMEM((block_m, d), dtype, transforms=_smem_transforms(d, dtype)),
        plgpu.SMEM(row_bits.shape[2:], jnp.uint32),
        plgpu.SMEM((block_m, d), out_dtype, transforms=part_transforms),
        plgpu.SMEM((block_m, d), out_dtype, transforms=part_transforms) if lse_apart else None,
        plgpu.SMEM((block_m, block_kv), dtype, transforms=_smem_transforms(block_kv, dtype)) if interpretable else None,
        plgpu.Barrier(num_arrivals=g + 1),
    )
    call = plgpu.kernel(
        tree_attention_body,
        out_type=out_type,
        grid=(b, hkv, row_blocks, splits),
        grid_names=("b", "h", "rows", "split"),
        scratch_types=scratch,
        compiler_params=plgpu.CompilerParams(approx_math=True, lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=interpret,
    )
    return call(q, k_cache, v_cache, lengths, k_tree, v_tree, row_bits)


def split_ranges(prefix_blocks, tree_blocks: int, split, splits: int):
    """The KV blocks split ``split`` of ``splits`` attends: prefix blocks ``[p_lo, p_hi)`` and tree blocks
    ``[t_lo, t_hi)`` (``prefix_blocks`` and ``split`` traced in the kernel, plain integers in tests).

    A tree no longer than a prefix split's share gets the last split to itself, the prefix spread evenly over the
    others. Why: a CTA runs its prefix pipeline and then its tree pipeline, whose loads go out only when the first one
    is done, so a CTA holding both pays two memory latencies where the others pay one; an AR step's one-node tree
    (1 block after 16 of a 1k prefix, 8 splits) put it beside a prefix block. A longer tree (or an empty prefix) takes
    the old cut: the prefix blocks then the tree's as one sequence in ``splits`` contiguous ranges."""
    if splits == 1:
        return 0, prefix_blocks, 0, tree_blocks
    rest = splits - 1
    alone = (prefix_blocks > 0) & (tree_blocks * rest <= prefix_blocks + rest - 1)  # tree <= ceil(prefix / rest)
    own_lo, own_hi = jnp.minimum(split, rest), jnp.minimum(split + 1, rest)  # the last split: no prefix block
    total = prefix_blocks + tree_blocks
    per = (total + splits - 1) // splits
    lo = jnp.minimum(split * per, total)
    hi = jnp.minimum(lo + per, total)
    ranges = (
        (own_lo * prefix_blocks // rest, jnp.minimum(lo, prefix_blocks)),
        (own_hi * prefix_blocks // rest, jnp.minimum(hi, prefix_blocks)),
        (0, jnp.maximum(lo, prefix_blocks) - prefix_blocks),
        (jnp.where(split == rest, tree_blocks, 0), jnp.maximum(hi, prefix_blocks) - prefix_blocks),
    )
    return tuple(jnp.where(alone, own, cut) for own, cut in ranges)


def _row_bits(ancestor_bits, n, n_pad, nodes, g, words):
    """uint32 ``[B, row blocks, words, block_m]``: row ``r = g * T + t`` of a block holds node ``t``'s words.

    numpy bits (a mask fixed at trace time) are laid out on the host: a constant operand, no kernels a step."""
    xp = np if isinstance(ancestor_bits, np.ndarray) else jnp
    b = ancestor_bits.shape[0]
    last = n - (num_words(n) - 1) * WORD_BITS  # valid bits in the last word; keys >= n must stay hidden
    keep = np.full((num_words(n),), 0xFFFFFFFF, np.uint32)
    keep[-1] = (1 << last) - 1
    bits = ancestor_bits.astype(xp.uint32) & keep
    bits = xp.pad(bits, ((0, 0), (0, n_pad - n), (0, words - num_words(n))))
    bits = bits.reshape(b, n_pad // nodes, nodes, words).transpose(0, 1, 3, 2)
    return xp.tile(bits, (1, 1, 1, g))


def _combine(out_parts, lse):
    """Merges normalised f32 partials ``[S, B, n, Hkv, G, D]`` by their log2-sum-exps (the same shape: each row's value
    along D): ``sum_s 2^(lse_s - M) out_s / sum_s 2^(lse_s - M)``, ``M`` the largest lse.

    Written split by split (S is static and small: about one wave of SMs over the grid), over an lse with one value
    per output element: elementwise throughout, with no reduction, no transpose and no broadcast to share, so XLA
    emits one kernel. An lse of one value per row made it two on the H200 (the rows' max apart from the sums), and
    the variadic reduction over a transposed lse before it three (docs/results/2026-12-01-combine-h200/). Splits
    that saw no key (``_EMPTY_LSE``) weigh nothing; a row no split saw merges zeros.
    """
    splits = range(lse.shape[0])
    return _merge_splits([lse[s] for s in splits], [out_parts[s] for s in splits])


def _merge_splits(lses, parts):
    """``sum_s 2^(lse_s - M) part_s / sum_s 2^(lse_s - M)`` over per-split arrays of one shape, split by split: the
    operations both merges run (``_combine`` in XLA, ``_combine_kernel`` on rows it loaded), so they round alike."""
    top = lses[0]
    for lse in lses[1:]:
        top = jnp.maximum(top, lse)
    total = acc = None
    for lse, part in zip(lses, parts):
        weight = jnp.exp2(lse - top)
        total = weight if total is None else total + weight
        acc = weight * part if acc is None else acc + weight * part
    return acc / total


COMBINE_KERNEL = False
"""Merge the splits with ``_combine_kernel`` (a Mosaic GPU kernel) instead of XLA's fusion of ``_combine``. Why: the
two are one launch each (~1.6 us on the H200), and it was built so that, under ``pallas_kernels.pdl``, a layer's chain
is all the package's kernels (the o projection after the merge then starts its weight loads early). Off: on the H200
it took 60.0 us a decode step against XLA's 56.5 (36 calls); inside XLA's command buffers PDL overlaps nothing, and
without them XLA launches its own fusions as programmatic dependents too (docs/results/2026-12-01-pdl-early-loads-h200/).
``bench_roofline.py --combine-kernel`` (rows ``chain_*``). Read at trace time."""


@lowered_once("dtype", "interpret")
def _combine_kernel(out_parts, lse, dtype, interpret):
    """``_combine`` as one Mosaic GPU kernel, rounded to ``dtype``: one block of 128 threads per (request, node, KV
    head) reads its ``G x D`` values of every split and merges them as ``_combine`` does (``_merge_splits``); None
    where the kernel does not tile the row (``G * D`` not a multiple of 128)."""
    splits = out_parts.shape[0]
    rows, width = math.prod(out_parts.shape[1:4]), math.prod(out_parts.shape[4:])
    if width % 128:
        return None

    def tree_attention_combine_body(parts_ref, lse_ref, out_ref):  # its name in profiles (CUPTI)
        pdl.begin_kernel(interpret, release_first=True)  # a small kernel: the o projection may start now
        r = lax.axis_index("row")
        lses = [lse_ref[i, r, :] for i in range(splits)]  # every load first, so their latencies overlap
        parts = [parts_ref[i, r, :] for i in range(splits)]
        out_ref[r, :] = _merge_splits(lses, parts).astype(dtype)

    call = plgpu.kernel(tree_attention_combine_body, out_type=jax.ShapeDtypeStruct((rows, width), dtype),
                        grid=(rows,), grid_names=("row",), interpret=interpret,
                        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup))
    merged = call(out_parts.reshape(splits, rows, width), lse.reshape(splits, rows, width))
    return merged.reshape(out_parts.shape[1:])


_NODE_TILES = (1, 8, 1, 1)
"""The TMA tiling of q's and the tree K/V's node axis (``pad_for_tma``): 8 nodes, or fewer unpadded."""


def tree_attention(
    q,
    k_cache,
    v_cache,
    lengths,
    k_tree,
    v_tree,
    ancestor_bits,
    *,
    config: TuningConfig | None = None,
    interpret: plgpu.InterpretGPUParams | None = None,
    interpretable: bool | None = None,
    cache_settled: bool = False,
) -> jax.Array:
    """Tree attention with the Mosaic GPU kernel; shapes and semantics as ``tree_attention_reference``,
    ``cache_settled`` as ``ops.tree_attention``.

    ``interpret=plgpu.InterpretGPUParams()`` runs it on CPU for tests. ``interpretable``
    (default: only when interpreting) selects the ``P V`` form interpret mode can run.
    Unsupported shapes raise NotImplementedError so ``ops.tree_attention`` can fall back.
    """
    config = config or TuningConfig()
    hq, hkv = q.shape[-2], k_cache.shape[-2]
    group = padded_group(q, k_cache, config)
    if group:  # extra query heads of zeros: each KV head's rows fill whole 8-node tiles; their outputs are dropped
        q = _pad_group(q, hkv, group)
    check_supported(q, k_cache, v_cache, k_tree, v_tree, ancestor_bits, config)
    # q, k_tree and v_tree go in unpadded where TMA can tile them (a one-node AR step, any n a multiple of 8):
    # the boxes past their nodes read zeros (hidden by the ancestor bits) and store nothing
    q, k_tree, v_tree = (pad_for_tma(x, _NODE_TILES) for x in (q, k_tree, v_tree))
    out = _attend(q, k_tree, v_tree, (0, 0, 0), q.shape[2], k_cache, v_cache, lengths, ancestor_bits, config,
                  interpret, interpretable, cache_settled)
    if group:
        b, n, _, d = out.shape
        out = out.reshape(b, n, hkv, group, d)[:, :, :, : hq // hkv].reshape(b, n, hq, d)
    return out


def padded_group(q, k_cache, config: TuningConfig) -> int | None:
    """The query heads a KV head's row block holds in place of ``G = Hq / Hkv`` where ``block_m / G`` is not a whole
    multiple of 8 nodes (G = 3, 5, 6 or 7 at ``block_m`` 64: Qwen3-14B's 40 heads over 8 make G = 5): the smallest
    count above G that tiles (``TuningConfig.tiled_group``), the heads past G zeros whose rows are dropped (G = 5
    computes 8 rows a node, 3 of them wasted; the kernel reads K and V once either way, which is what bounds it).
    None where G tiles as it is, or nothing does (``check_supported`` then says so), or the shapes are not a tree
    attention's."""
    if q.ndim != 4 or k_cache.ndim != 4 or q.shape[2] % k_cache.shape[2]:
        return None
    g = q.shape[2] // k_cache.shape[2]
    tiled = config.tiled_group(g)
    return tiled if tiled != g else None


def _pad_group(q, hkv: int, group: int):
    """q ``[B, n, Hq, D]`` with each KV head's query heads padded with zero heads to ``group``."""
    b, n, hq, d = q.shape
    q = q.reshape(b, n, hkv, hq // hkv, d)
    return jnp.pad(q, ((0, 0), (0, 0), (0, 0), (0, group - hq // hkv), (0, 0))).reshape(b, n, hkv * group, d)


def tree_attention_packed(
    qkv,
    k_cache,
    v_cache,
    lengths,
    ancestor_bits,
    *,
    config: TuningConfig | None = None,
    interpret: plgpu.InterpretGPUParams | None = None,
    interpretable: bool | None = None,
    cache_settled: bool = False,
) -> jax.Array:
    """``tree_attention`` with the nodes' query, key and value heads side by side in one array ``qkv``
    ``[B, n, Hq + 2 Hkv, D]`` (Hkv from the cache): the kernel reads each from its head offset, so a model that
    norms and rotates q and k in one kernel hands that kernel's output over whole, with no copies of q, k or v.
    """
    config = config or TuningConfig()
    hkv = k_cache.shape[2]
    b, n, heads, d = qkv.shape
    hq = heads - 2 * hkv
    if hq < hkv:
        raise ValueError(f"tree attention: qkv has {heads} heads; packed q, k, v need Hq + 2 Hkv with Hq >= Hkv = "
                         f"{hkv} (the cache's), so at least {3 * hkv}")
    q_view, kv_view = (jax.ShapeDtypeStruct((b, n, h, d), qkv.dtype) for h in (hq, hkv))
    if padded_group(q_view, k_cache, config):  # q is copied out to be padded anyway, and k and v with it
        q, k_tree, v_tree = unpack_heads(qkv, hkv)
        return tree_attention(q, k_cache, v_cache, lengths, k_tree, v_tree, ancestor_bits, config=config,
                              interpret=interpret, interpretable=interpretable, cache_settled=cache_settled)
    check_supported(q_view, k_cache, v_cache, kv_view, kv_view, ancestor_bits, config)
    qkv = pad_for_tma(qkv, _NODE_TILES)
    return _attend(qkv, qkv, qkv, (0, hq, hq + hkv), hq, k_cache, v_cache, lengths, ancestor_bits, config, interpret,
                   interpretable, cache_settled)


def _attend(q_src, k_src, v_src, head0, hq, k_cache, v_cache, lengths, ancestor_bits, config, interpret,
            interpretable, cache_settled):
    """The kernel and its combine over checked, TMA-ready ``[B, n (or more), heads, D]`` sources."""
    b, n = ancestor_bits.shape[:2]
    d = q_src.shape[3]
    s, hkv = k_cache.shape[1], k_cache.shape[2]
    g = hq // hkv
    nodes = config.block_m // g
    n_pad = _cdiv(n, nodes) * nodes
    tree_blocks = _cdiv(n, config.block_kv)
    splits = config.splits(b * hkv * (n_pad // nodes), s // config.block_kv + tree_blocks)
    row_words = tree_blocks * config.block_kv // WORD_BITS
    interpretable = interpret is not None if interpretable is None else interpretable
    smem = smem_bytes(d, row_words, config, final=splits == 1, interpretable=interpretable)
    n_q = q_src.shape[1]
    # the lse tile apart when it fits: one store round trip less at the end of every split
    lse_apart = (splits > 1 and smem_bytes(
        d, row_words, config, final=False, interpretable=interpretable, lse_apart=True) + _SMEM_RESERVED <= _SMEM_LIMIT)
    if smem + _SMEM_RESERVED > _SMEM_LIMIT:
        raise NotImplementedError(
            f"{smem} bytes of shared memory per CTA exceed {_SMEM_LIMIT}: lower max_concurrent_steps or block_kv"
        )
    row_bits = _row_bits(ancestor_bits, n, n_pad, nodes, g, row_words)
    lengths = lengths.astype(jnp.int32)  # clipped to [0, S] in the kernel
    result = _kernel_call(
        q_src,
        k_cache,
        v_cache,
        lengths,
        k_src,
        v_src,
        row_bits,
        groups=g,
        head0=head0,
        config=config,
        n_pad=n_pad,
        splits=splits,
        tree_blocks=tree_blocks,
        interpretable=interpretable,
        interpret=interpret,
        early_cache=cache_settled and pdl.ENABLED,
        lse_apart=lse_apart,
    )
    if splits == 1:
        out = result
    else:
        merged = _combine_kernel(*result, q_src.dtype, interpret) if COMBINE_KERNEL else None
        out = _combine(*result) if merged is None else merged
    out = out.reshape(b, n_q, hq, d)
    return (out if n_q == n else out[:, :n]).astype(q_src.dtype)
