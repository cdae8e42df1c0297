"""Speculative engines with a DFlash drafter: stock (chain), ddtree (best-first tree), specpilot
(cost-aware tree budget) and tlv (two-level verification). One round, all on device:

  ingest the last round's features, draft → build tree → verify (one target pass, ancestor-only mask) → walk
  → compact KV (the accepted path's features wait for the next round's draft stage: the drafter's work is billed
  to the drafter)

Lossless by construction: every committed token is the target's own choice (argmax, or a sample from
`target_probs`) given the committed prefix; the draft only decides how many of them one pass yields.

SpecPilot verifies the budget it picks with one compiled verify per candidate. As a `lax.switch` that cost 1.09-2.28
ms a round over the same tree's verify without it on H100s (batch 8, the 36-layer f32 proxy): under `attention=xla`
mostly copies of the whole KV cache, the rest the host's reading the branch index back
(docs/results/2026-12-07-switch-cost-h100/, docs/results/2026-12-07-switch-conditional-graphs-h100/). So under xla
with plain XLA flags the candidates run as one while loop each, which writes the cache where it lies
(`switch_in_place`); under `pallas_tree` the switch's branches return their new K/V and write no cache.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specpilot.decoding import tree as trees
from specpilot.decoding.chain import speculative_accept
from specpilot.decoding.common import new_cache, prefill
from specpilot.decoding.engine import Engine, LoopState, commit, init_loop_state, while_loops_in_command_buffers
from specpilot.decoding.sampling import Sampling, pick, sample, target_probs
from specpilot.models import dflash
from specpilot.models.config import DrafterConfig, ModelConfig
from specpilot.models.kv_cache import compact, write_every_layer
from specpilot.models.target import forward
from specpilot.models.weights import quantize


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SpecState:
    cache: Any  # target KVCache
    ctx: Any  # drafter context KVCache, up to the previous round's commit
    pending_feats: jax.Array  # [B, D + 1, len(ids)·H] the last round's committed target features, not yet ingested
    pending_n: jax.Array  # [B] how many of them are real
    prompt_lens: jax.Array  # [B]
    nodes: jax.Array  # [B] draft nodes verified so far (for stats)
    level1_right: jax.Array  # [B] TLV rounds where level 2 accepted all level-1 accepted nodes


def switch_in_place(index, branches, state, operand):
    """`lax.switch(index, branches, state, operand)` for branches `(state, operand) -> (state, out)` that update a
    large `state` (the KV cache) where it lies: one `lax.while_loop` a branch, run once when picked and not at all
    otherwise. A while loop updates its carry in place; a conditional's branch writes into the conditional's own
    output, so XLA copied the whole cache there, and once more after it (K and V twice a round under attention=xla:
    docs/results/2026-12-07-switch-conditional-graphs-h100/). Every branch returns `out` of one shape; an index out of
    range is clamped, as `lax.switch` does. Not for a process whose while loops run in XLA's command buffers
    (`engine.while_loops_in_command_buffers`): there it gave wrong results on an H100."""
    index = jnp.clip(index, 0, len(branches) - 1)
    out = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(branches[-1], state, operand)[1])
    for i, branch in enumerate(branches):
        def body(carry, branch=branch):
            state, out = branch(carry[1], operand)
            return jnp.zeros((), bool), state, out

        _, state, out = jax.lax.while_loop(lambda carry: carry[0], body, (index == i, state, out))
    return state, out


def quantize_target(weights, fmt: str):
    """Level-1 weights for TLV: every linear leaf weight-only quantized; embeddings and norms kept."""

    def q(layer):
        return dataclasses.replace(
            layer,
            w_qkv=quantize(layer.w_qkv, fmt),
            w_o=quantize(layer.w_o, fmt),
            w_gate_up=quantize(layer.w_gate_up, fmt),
            w_down=quantize(layer.w_down, fmt),
        )

    return dataclasses.replace(weights, layers=[q(lw) for lw in weights.layers], lm_head=quantize(weights.lm_head, fmt))


class SpecEngine(Engine):
    """`tree` = "chain" (stock) or "best_first" (ddtree / specpilot / tlv)."""

    def __init__(
        self,
        name: str,
        cfg: ModelConfig,
        target_weights,
        dcfg: DrafterConfig,
        drafter_weights,
        sampling: Sampling = Sampling(),
        context: int | None = None,
        tree: str = "chain",
        tree_budget: int | None = None,
        block_size: int | None = None,
        level1_format: str | None = None,
        budget_for_round=None,
        reference_loop: bool = False,
        attention: str = "xla",
    ):
        if dcfg.layers.hidden_size != cfg.hidden_size:
            raise ValueError(
                f"drafter hidden_size {dcfg.layers.hidden_size} != target hidden_size {cfg.hidden_size}"
            )
        if max(dcfg.target_layer_ids) >= cfg.num_layers:
            raise ValueError(f"drafter target_layer_ids {dcfg.target_layer_ids} exceed the target's {cfg.num_layers} layers")
        self.name, self.cfg, self.dcfg, self.sampling = name, cfg, dcfg, sampling
        self.block = block_size or dcfg.block_size
        if not 2 <= self.block <= dcfg.block_size:
            raise ValueError(f"engine.block_size must be in [2, the drafter's block_size {dcfg.block_size}] (the "
                             f"drafter fills blocks of at most the size it was trained on), got {self.block}")
        self.depth = self.block - 1
        self.max_commit = self.block
        self.tree = tree
        self.n_nodes = self.depth if tree == "chain" else int(tree_budget or self.depth)
        self.budget_for_round = budget_for_round
        self.reference_loop = reference_loop
        self.attention = attention  # of the verify (and level-1) passes and the drafter's; the prefill stays on XLA
        self.slack = self.n_nodes + 1  # scratch cache slots one verify writes past the committed prefix
        self.context = context or cfg.max_position_embeddings
        self.dtype = target_weights.embed.dtype
        params = {"target": target_weights, "drafter": drafter_weights}
        if level1_format:
            params["level1"] = quantize_target(target_weights, level1_format)
        self.level1 = bool(level1_format)
        self.params = params

    # ---- prefill ------------------------------------------------------------------------------------
    def prefill(self, params, tokens, lens, max_new, key):
        tw, dw = params["target"], params["drafter"]
        b = tokens.shape[0]
        cache = new_cache(self.cfg, b, self.context, self.dtype)
        logits, cache, feats = prefill(tw, self.cfg, tokens, lens, cache, self.dcfg.target_layer_ids)
        ctx = dflash.ingest(dw, self.dcfg, dflash.init_context(self.dcfg, b, self.context, self.dtype), feats, lens)
        key, sub = jax.random.split(key)
        zeros = jnp.zeros((b,), jnp.int32)
        pending = jnp.zeros((b, self.depth + 1, feats.shape[-1]), feats.dtype)
        extra = SpecState(cache=cache, ctx=ctx, pending_feats=pending, pending_n=zeros, prompt_lens=lens, nodes=zeros,
                          level1_right=zeros)
        return init_loop_state(pick(sub, logits, self.sampling), max_new, self.slack, key, extra,
                               self.cfg.eos_token_ids, self.reference_loop)

    # ---- one round ----------------------------------------------------------------------------------
    def _draft(self, params, state: LoopState, ex: SpecState):
        """The last round's committed features into the drafter's context and the block pass over it, as one pass
        (`dflash.ingest_and_draft`: each layer's QKV weight read once): drafter logits for depths 1..D [B, D, V],
        the depth limit per request and the new context."""
        tw = params["target"]
        b = state.last.shape[0]
        block = jnp.concatenate(
            [state.last[:, None], jnp.full((b, self.depth), self.dcfg.mask_token_id, jnp.int32)], axis=1
        )
        block_valid, shifted = None, None
        if self.reference_loop and self.tree != "chain":
            # DDTree's reference buffers hold max_length + budget + 1 tokens: near the end its block is
            # cut short, and it then reads drafter rows from the root row on (see docs/dflash_semantics.md).
            room = ex.prompt_lens + state.max_new + self.n_nodes + 1 - ex.cache.lengths
            block_valid = jnp.minimum(self.block, room)
            shifted = block_valid < self.block
        logits, ctx = dflash.ingest_and_draft(params["drafter"], self.dcfg, tw.embed, tw.lm_head, ex.ctx,
                                              ex.pending_feats, ex.pending_n, block, block_valid,
                                              attention=self.attention)
        rows = logits[:, 1:]
        depth_limit = jnp.full((b,), self.depth, jnp.int32)
        if shifted is not None:
            rows = jnp.where(shifted[:, None, None], logits[:, :-1], rows)
            depth_limit = jnp.where(shifted, block_valid, depth_limit)
        return rows, depth_limit, ctx

    def _build(self, rows, depth_limit, key):
        """Draft tree per request, plus drafter probabilities (chain sampling only)."""
        if self.tree == "chain":
            if self.sampling.greedy:
                return jax.vmap(trees.chain)(jnp.argmax(rows, -1)), None
            q = target_probs(rows, self.sampling)
            return jax.vmap(trees.chain)(sample(key, q)), q
        logp = jax.nn.log_softmax(rows, axis=-1)
        rank_max = trees.rank_limit(rows.shape[0])  # vmapped, best_first cannot see the batch
        return jax.vmap(lambda lp, lim: trees.best_first(lp, self.n_nodes, lim, rank_max))(logp, depth_limit), None

    def _run_tree(self, weights, last, tree, cache, hidden_layer_ids=(), defer_kv_write=False):
        """One target pass over [root, nodes] at positions start + depth under the ancestor-only mask."""
        anc = jax.vmap(lambda t: trees.ancestor_mask(t, self.depth))(tree)
        toks = jnp.concatenate([last[:, None], tree.tokens], axis=1)
        depth = jnp.concatenate([jnp.zeros_like(tree.depth[:, :1]), tree.depth], axis=1)
        out = forward(weights, self.cfg, toks, cache.lengths[:, None] + depth, cache, anc, hidden_layer_ids,
                      attention=self.attention, defer_kv_write=defer_kv_write)
        return out, anc

    def _verify(self, weights, last, tree, cache, defer_kv_write=False):
        return self._run_tree(weights, last, tree, cache, self.dcfg.target_layer_ids, defer_kv_write)

    def _accept(self, key, state, tree, anc, q, logits):
        if q is not None:  # sampled chain: speculative sampling against the drafter's distribution
            p = target_probs(logits, self.sampling)
            keys = jax.random.split(key, tree.tokens.shape[0])
            return jax.vmap(speculative_accept)(keys, tree.tokens, q, p)
        choice = pick(key, logits, self.sampling)  # argmax, or an independent sample per node
        return jax.vmap(lambda t, r, c, a: trees.walk(t, r, c, a, self.depth))(tree, state.last, choice, anc)

    def _select_path(self, params, state, ex, tree):
        """TLV level 1: the cheap target walks the big tree (its K/V go to scratch slots and are
        discarded); its accepted path plus its own next token become a chain for the exact target."""
        out1, anc = self._run_tree(params["level1"], state.last, tree, ex.cache)
        w1 = jax.vmap(lambda t, r, c, a: trees.walk(t, r, c, a, self.depth))(
            tree, state.last, jnp.argmax(out1.logits, -1).astype(jnp.int32), anc
        )
        chain = jax.vmap(trees.chain)(w1.new_tokens[:, : self.depth])
        n_valid = jnp.minimum(w1.n_accepted + 1, self.depth)
        chain = chain._replace(valid=jnp.arange(self.depth)[None, :] < n_valid[:, None])
        return chain, w1.n_accepted

    def _verify_accept(self, params, state, ex: SpecState, tree, q, key, defer_to: int | None = None):
        """Verify and walk: (walk, cache, accepted path's features, nodes). With `defer_to` (a `pallas_tree` switch
        branch) the cache is left unwritten and its place holds the new K/V, every layer's, padded to `defer_to`
        tokens, so every branch returns one shape and the caller writes them after the switch."""
        out, anc = self._verify(params["target"], state.last, tree, ex.cache, defer_kv_write=defer_to is not None)
        w = self._accept(key, state, tree, anc, q, out.logits)
        feats = jnp.take_along_axis(out.hidden, w.path[:, :, None], axis=1)  # root + accepted path
        kv = out.cache if defer_to is None else tuple(
            jnp.pad(a, ((0, 0), (0, 0), (0, defer_to - a.shape[2]), (0, 0), (0, 0))) for a in out.new_kv)
        return w, kv, feats, jnp.sum(tree.valid, -1).astype(jnp.int32)

    # ---- one round as named stages (the cost model times them one by one; `round` fuses them) ---------
    def stages(self):
        st = [("draft", self._stage_draft), ("tree", self._stage_tree)]
        if self.level1:
            st.append(("level1", self._stage_level1))
        return st + [("verify", self._stage_verify), ("commit", self._stage_commit)]

    @staticmethod
    def _keys(state):
        return jax.random.split(state.key, 3)  # next round's key, tree sampling, acceptance sampling

    def _stage_draft(self, params, state, carry):
        """The drafter's whole share of a round: the last round's committed target features into its context,
        then the block pass, in one pass (`_draft`). Ingesting here rather than in the commit stage computes the
        same thing in the same order (ingest, then draft) and bills it to the drafter, so the commit stage is the
        round's bookkeeping and KV compaction alone (issue #8 counts tree + accept + compaction)."""
        rows, depth_limit, ctx = self._draft(params, state, state.extra)
        return {"rows": rows, "depth_limit": depth_limit, "ctx": ctx}

    def _stage_tree(self, params, state, carry):
        tree, q = self._build(carry["rows"], carry["depth_limit"], self._keys(state)[1])
        return {"tree": tree, "q": q, "n1": None, "ctx": carry["ctx"]}

    def _stage_level1(self, params, state, carry):
        chain, n1 = self._select_path(params, state, state.extra, carry["tree"])
        return {**carry, "tree": chain, "n1": n1}

    def _stage_verify(self, params, state, carry):
        tree, q, k_accept = carry["tree"], carry["q"], self._keys(state)[2]
        chosen = {}
        if self.budget_for_round is None:
            out = self._verify_accept(params, state, state.extra, tree, q, k_accept)
        else:  # best-first nodes are sorted by score and parents precede children: a prefix is a tree
            policy = self.budget_for_round
            pick = policy.choose(tree.score, tree.valid, ~state.done)
            prefix = lambda tr, c: jax.tree.map(lambda a: a[:, :c], tr)  # noqa: E731
            if self.attention == "pallas_tree" or while_loops_in_command_buffers():
                # pallas_tree's pass reads the new K/V from the step: the branches return them (padded to the
                # largest candidate's root + nodes) and one scatter after the switch writes them; the padding lands
                # in scratch slots past the committed prefix. So no branch writes the cache (on the CPU the in-place
                # form below copied it whole twice a round here, where this form copies none). Under xla with while
                # loops in command buffers the in-place form gave wrong results on an H100: there the branches write.
                defer_to = max(policy.candidates) + 1 if self.attention == "pallas_tree" else None
                out = jax.lax.switch(pick, [
                    lambda tr, c=c: self._verify_accept(params, state, state.extra, prefix(tr, c), q, k_accept,
                                                        defer_to)
                    for c in policy.candidates], tree)
                if defer_to is not None:
                    out = (out[0], write_every_layer(state.extra.cache, *out[1]), *out[2:])
            else:
                # XLA's attention reads the new K/V from the cache, so each branch writes it: in a `lax.switch` XLA
                # copied the whole cache into the conditional's output and once more after it (K and V twice a round,
                # 0.40 ms at batch 8 on an H100: docs/results/2026-12-07-switch-conditional-graphs-h100/); an
                # attention beside the cache instead cost more (docs/results/2026-12-07-switch-kernels-h100/).
                def branch(c, cache, tr):
                    ex = dataclasses.replace(state.extra, cache=cache)
                    w, cache, feats, nodes = self._verify_accept(params, state, ex, prefix(tr, c), q, k_accept)
                    return cache, (w, feats, nodes)

                cache, (w, feats, nodes) = switch_in_place(
                    pick, [functools.partial(branch, c) for c in policy.candidates], state.extra.cache, tree)
                out = (w, cache, feats, nodes)
            chosen = {"budget": jnp.asarray(policy.candidates, jnp.int32)[pick]}  # what `Engine.profile` records
        return dict(zip(("walk", "cache", "feats", "nodes"), out), n1=carry["n1"], ctx=carry["ctx"], **chosen)

    def _stage_commit(self, params, state, carry):
        ex: SpecState = state.extra
        w, n1 = carry["walk"], carry["n1"]
        live = ~state.done
        n_commit = jnp.where(live, w.n_accepted + 1, 0)
        cache = compact(carry["cache"], w.path, n_commit)
        live_i = live.astype(jnp.int32)
        right = ex.level1_right + (live_i * (w.n_accepted >= n1) if n1 is not None else 0)
        ex = dataclasses.replace(ex, cache=cache, ctx=carry["ctx"], pending_feats=carry["feats"], pending_n=n_commit,
                                 nodes=ex.nodes + live_i * carry["nodes"], level1_right=right)
        state = commit(state, w.new_tokens, w.n_accepted + 1, self.cfg.eos_token_ids, ex)
        return {"state": dataclasses.replace(state, key=self._keys(state)[0])}

    def row_counters(self, state: LoopState) -> dict:
        return {"nodes": np.asarray(state.extra.nodes), "level1_right": np.asarray(state.extra.level1_right)}

    def summarize(self, acceptance_lengths, counters) -> dict:
        stats = super().summarize(acceptance_lengths, counters)
        rounds = max(sum(len(a) for a in acceptance_lengths), 1)
        stats["mean_tree_nodes"] = sum(c["nodes"] for c in counters) / rounds
        if self.level1:
            stats["level1_picked_right"] = sum(c["level1_right"] for c in counters) / rounds
        return stats
