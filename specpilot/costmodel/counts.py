"""Bytes and FLOPs each stage of a round must move and compute, counted from the shapes alone.

A ceiling is the time of the *necessary* work at the hardware's limits, so everything here is a minimum
that any implementation must pay, counted explicitly per kind (`Cost` fields):

- `weights`: every weight leaf the stage reads once (linear leaves at the weight format's bytes, norm
  vectors at the activation dtype) plus the embedding rows it gathers;
- `lm_head`: the LM head's weight bytes (kept apart: it is the largest single leaf, and TLV's level 1
  reads a quantized copy of it);
- `kv_read` / `kv_write`: K and V of every layer — the committed prefix plus the step's own tokens read
  by attention, the step's tokens written (the commit stage moves accepted slots: one read + one write);
- `activations`: each linear's input read and output written, attention's query read and output
  written, once per layer (norms, RoPE and residual adds are assumed fused into them), the LM head's
  input, and the context features written for the drafter;
- `logits`: float32 logits written by an LM head, or read by the tree stage.

FLOPs: 2 per multiply-add of every linear, 4·T·S·(heads·head_dim) per layer for attention (QKᵀ and PV
over S = visible keys), and the LM head. Norms, softmax and sampling are left out (negligible).

Weight formats (`engine.weight_format`, and TLV's `level1_format`): `bf16` = the model's own dtype
(`act_bytes` per element: 2 for bf16, 4 for the float32 CPU deployments); `w12` = 12/16 of that (W12's
per-block bases and escape lists, < 1 % of it, are ignored); `int8` / `fp8` = 1 byte per element plus a
float32 scale per output column.

Known differences from what the XLA path actually moves (they show up as gaps, by design): attention
there reads the whole cache capacity, not the committed prefix; the drafter's context ingest runs the q columns of
its fused QKV leaf (counted: the leaf is read whole).
"""

from __future__ import annotations

import dataclasses

from specpilot.models.config import DrafterConfig, ModelConfig

FORMATS = ("bf16", "w12", "int8", "fp8")
LOGIT_BYTES = 4  # logits are float32


@dataclasses.dataclass(frozen=True)
class Cost:
    weights: float = 0.0
    lm_head: float = 0.0
    kv_read: float = 0.0
    kv_write: float = 0.0
    activations: float = 0.0
    logits: float = 0.0
    flops: float = 0.0

    @property
    def bytes(self) -> float:
        return self.weights + self.lm_head + self.kv_read + self.kv_write + self.activations + self.logits

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)})

    def __mul__(self, w: float) -> "Cost":
        return Cost(**{f.name: getattr(self, f.name) * w for f in dataclasses.fields(self)})

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "bytes": self.bytes}


def linear_bytes(k: int, n: int, fmt: str, act_bytes: int) -> float:
    """Bytes of one [k, n] linear weight stored in `fmt`."""
    if fmt == "bf16":
        return k * n * act_bytes
    if fmt == "w12":
        return k * n * act_bytes * 12 / 16
    if fmt in ("int8", "fp8"):
        return k * n * 1 + n * 4
    raise ValueError(f"weight format {fmt!r} (expected one of {', '.join(FORMATS)})")


def _linears(c: ModelConfig) -> list[tuple[int, int]]:
    h = c.hidden_size
    return [(h, c.q_size + 2 * c.kv_size), (c.q_size, h), (h, 2 * c.intermediate_size), (c.intermediate_size, h)]


def _norm_elems(c: ModelConfig) -> int:
    return 2 * c.hidden_size + (2 * c.head_dim if c.qk_norm else 0)


def _layer_weights(c: ModelConfig, fmt: str, act: int) -> float:
    return sum(linear_bytes(k, n, fmt, act) for k, n in _linears(c)) + _norm_elems(c) * act


def _layer_macs(c: ModelConfig) -> int:
    return sum(k * n for k, n in _linears(c))


def _layer_activation_elems(c: ModelConfig) -> int:
    """Per token and layer: qkv (in H, out q+2kv), attention (q in, q out), o (q in, H out),
    gate_up (H in, 2I out), down (I in, H out)."""
    h, q, kv, i = c.hidden_size, c.q_size, c.kv_size, c.intermediate_size
    return (h + q + 2 * kv) + 2 * q + (q + h) + (h + 2 * i) + (i + h)


def target_pass(cfg: ModelConfig, batch: int, tokens: int, context: int, fmt: str, act_bytes: int = 2,
                feature_layers: int = 0) -> Cost:
    """One target forward of `tokens` new tokens per request over `context` committed ones.
    `feature_layers`: how many layers' outputs are written out as drafter features."""
    b, t, s = batch, tokens, context
    L, h, v = cfg.num_layers, cfg.hidden_size, cfg.vocab_size
    kv_row = 2 * cfg.kv_size * act_bytes  # K and V of one token in one layer
    return Cost(
        weights=L * _layer_weights(cfg, fmt, act_bytes) + h * act_bytes + b * t * h * act_bytes,
        lm_head=linear_bytes(h, v, fmt, act_bytes),
        kv_read=L * b * (s + t) * kv_row,
        kv_write=L * b * t * kv_row,
        activations=b * t * act_bytes * (L * _layer_activation_elems(cfg) + h + feature_layers * h),
        logits=b * t * v * LOGIT_BYTES,
        flops=L * (2 * b * t * _layer_macs(cfg) + 4 * b * t * (s + t) * cfg.q_size) + 2 * b * t * h * v,
    )


def draft_pass(dcfg: DrafterConfig, target: ModelConfig, batch: int, block: int, context: int, fmt: str,
               act_bytes: int = 2) -> Cost:
    """One DFlash block pass: `block` queries over the cached context features (and the block itself),
    then the target's LM head on every block row."""
    c = dcfg.layers
    b, t, s = batch, block, context
    L, h, v = c.num_layers, c.hidden_size, target.vocab_size
    return Cost(
        weights=L * _layer_weights(c, fmt, act_bytes) + h * act_bytes + b * t * h * act_bytes,
        lm_head=linear_bytes(h, v, fmt, act_bytes),
        kv_read=L * b * s * 2 * c.kv_size * act_bytes,  # the block's own K/V never leave the chip
        activations=b * t * act_bytes * (L * _layer_activation_elems(c) + h),
        logits=b * t * v * LOGIT_BYTES,
        flops=L * (2 * b * t * _layer_macs(c) + 4 * b * t * (s + t) * c.q_size) + 2 * b * t * h * v,
    )


def tree_build(target: ModelConfig, batch: int, depth: int) -> Cost:
    """Chain argmax or best-first top-k over the drafter's logits: reads them once; FLOPs negligible."""
    return Cost(logits=batch * depth * target.vocab_size * LOGIT_BYTES)


def spec_commit(target: ModelConfig, batch: int, path: int, act_bytes: int = 2) -> Cost:
    """Move the accepted path's K/V (all `path` slots, as `kv_cache.compact` does)."""
    moved = target.num_layers * batch * path * 2 * target.kv_size * act_bytes
    return Cost(kv_read=moved, kv_write=moved)


def context_ingest(dcfg: DrafterConfig, target: ModelConfig, batch: int, path: int, fmt: str,
                   act_bytes: int = 2) -> Cost:
    """The last round's `path` committed target features into the drafter's context, at the start of the draft
    stage (`SpecEngine._stage_draft`): fc and hidden norm. The rows then ride the block pass's QKV projection
    (`dflash.ingest_and_draft`): its FLOPs are counted here, its weights and norms in `draft_pass`, read once."""
    c = dcfg.layers
    b, p, h = batch, path, target.hidden_size
    feat = len(dcfg.target_layer_ids) * h
    qkv_out = c.q_size + 2 * c.kv_size
    return Cost(
        weights=linear_bytes(feat, h, fmt, act_bytes) + h * act_bytes,
        kv_write=c.num_layers * b * p * 2 * c.kv_size * act_bytes,
        activations=b * p * feat * act_bytes,
        flops=2 * b * p * feat * h + c.num_layers * 2 * b * p * h * qkv_out,
    )


def block_size_of(engine_cfg: dict, dcfg: DrafterConfig | None) -> int:
    return int(engine_cfg.get("block_size") or (dcfg.block_size if dcfg is not None else 1))


def verify_nodes(engine_cfg: dict, dcfg: DrafterConfig | None, nodes: int | None = None) -> int:
    """Draft nodes the target verifies per round (AR: 0). `nodes` overrides the tree budget (the budget
    a `specpilot` engine chose, for instance)."""
    name = engine_cfg["name"]
    depth = block_size_of(engine_cfg, dcfg) - 1
    if name == "ar":
        return 0
    if name in ("stock", "tlv"):  # TLV's exact target verifies only the chosen chain
        return depth
    if nodes is not None:
        return int(nodes)
    if name == "specpilot":
        return int(max(engine_cfg.get("budget_candidates") or [engine_cfg.get("tree_budget", 256)]))
    return int(engine_cfg.get("tree_budget", 64))


def stage_costs(target: ModelConfig, dcfg: DrafterConfig | None, engine_cfg: dict, batch: int, context: int,
                act_bytes: int = 2, nodes: int | None = None) -> dict[str, Cost]:
    """{stage: Cost} for one round of `engine_cfg` (a `make_engine` dict) at `batch` requests with
    `context` committed tokens each; stages as the engines name them."""
    name = engine_cfg["name"]
    fmt = engine_cfg.get("weight_format", "bf16")
    if name == "ar":
        return {"verify": target_pass(target, batch, 1, context, fmt, act_bytes), "commit": Cost()}
    if dcfg is None:
        raise ValueError(f"engine {name!r} needs drafter shapes")
    block = block_size_of(engine_cfg, dcfg)
    depth = block - 1
    features = len(dcfg.target_layer_ids)
    stages = {
        "draft": draft_pass(dcfg, target, batch, block, context, fmt, act_bytes)
        + context_ingest(dcfg, target, batch, depth + 1, fmt, act_bytes),
        "tree": tree_build(target, batch, depth),
    }
    if name == "tlv":
        n1 = int(engine_cfg.get("tree_budget", 128)) if nodes is None else int(nodes)
        stages["level1"] = target_pass(target, batch, n1 + 1, context, engine_cfg.get("level1_format", "int8"),
                                       act_bytes)
    n = verify_nodes(engine_cfg, dcfg, None if name == "tlv" else nodes)
    stages["verify"] = target_pass(target, batch, n + 1, context, fmt, act_bytes, feature_layers=features)
    stages["commit"] = spec_commit(target, batch, depth + 1, act_bytes)
    return stages


def mixed_stage_costs(target_cfg: ModelConfig, drafter_cfg: DrafterConfig | None, engine_cfg: dict, batch: int,
                      context: int, act_bytes: int, mix: dict[int, float] | None, hw) -> tuple[dict, dict]:
    """({stage: Cost}, {stage: ceiling ms}) of a round that verified n nodes in share ``mix[n]`` of the rounds (a
    `specpilot` engine's budgets, `predict.observed_budgets`): each budget's bytes, FLOPs and ceiling weighted by its
    share, so an engine that chose several budgets is not charged its largest one. An empty ``mix``: the engine's own
    size (``stage_costs(..., nodes=None)``). ``hw`` None: no ceilings."""
    share = mix or {None: 1.0}
    per = {n: stage_costs(target_cfg, drafter_cfg, engine_cfg, batch, context, act_bytes, n) for n in share}
    stages = next(iter(per.values()))
    costs = {s: sum((per[n][s] * w for n, w in share.items()), Cost()) for s in stages}
    if hw is None:
        return costs, {}
    return costs, {s: sum(w * hw.ms(per[n][s].bytes, per[n][s].flops) for n, w in share.items()) for s in stages}


def ceilings_ms(target_cfg: ModelConfig, drafter_cfg: DrafterConfig | None, engine_cfg: dict, batch: int,
                context: int, hw, act_bytes: int = 2, budgets: dict[int, float] | None = None) -> dict[str, float]:
    """{stage: ms per round at the hardware's limit} = max(bytes ÷ bandwidth, FLOPs ÷ matmul peak); ``budgets``: a
    specpilot engine's {nodes: share of rounds} (`mixed_stage_costs`)."""
    return mixed_stage_costs(target_cfg, drafter_cfg, engine_cfg, batch, context, act_bytes, budgets, hw)[1]
