"""Predicted step time and speedup for any (engine, budget, batch), fitted from measured stage times.

Every stage of a round maps to a point on a *curve*: (curve name, x) where x is the number of tokens
the stage pushes through its model (`stage_points`). Curves are shared across engines — a stock chain
verify of 16 tokens and a 15-node tree verify are the same `target_pass` at x = 16 — so AR, stock and
DDTree measurements together pin down t_verify(n, B):

- per measured batch, a curve is piecewise linear in x through the measured points (the mean where
  several engines measured the same x), extended linearly beyond its ends (never with a negative slope);
- between measured batches it is linear in B at fixed x, extended linearly from the two nearest
  batches outside them (one measured batch: used as is).

A bilinear t(x, B) is therefore reproduced exactly, which is what the fake-engine tests check.
Speedup over AR = τ · t_AR / t_step, τ = tokens committed per round per request (`TauProfile`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Iterable

import numpy as np


# ---- which curve each stage of each engine sits on -------------------------------------------------


def config_label(engine_cfg: dict) -> str:
    """A short unique name: ar, stock, ddtree@64, specpilot[16,64], tlv@128/int8 (+ '+w12' etc.)."""
    name = engine_cfg["name"]
    if name in ("ddtree",):
        label = f"ddtree@{int(engine_cfg.get('tree_budget', 64))}"
    elif name == "specpilot":
        cands = engine_cfg.get("budget_candidates") or [engine_cfg.get("tree_budget", 256)]
        label = "specpilot[" + ",".join(str(int(c)) for c in sorted(cands)) + "]"
    elif name == "tlv":
        label = f"tlv@{int(engine_cfg.get('tree_budget', 128))}/{engine_cfg.get('level1_format', 'int8')}"
    else:
        label = name
    if engine_cfg.get("block_size"):
        label += f"/b{int(engine_cfg['block_size'])}"
    fmt = engine_cfg.get("weight_format", "bf16")
    label = label if fmt == "bf16" else f"{label}+{fmt}"
    attention = engine_cfg.get("attention", "xla")
    return label if attention == "xla" else f"{label}+{attention}"


def program_variant(engine_cfg: dict) -> str:
    """What changes the compiled passes besides their size: weight format, plus the verify attention
    when it is not XLA's (e.g. 'bf16', 'w12', 'bf16+pallas_tree'). Each variant has its own curves."""
    fmt = engine_cfg.get("weight_format", "bf16")
    attention = engine_cfg.get("attention", "xla")
    return fmt if attention == "xla" else f"{fmt}+{attention}"


def stage_points(engine_cfg: dict, block: int, nodes: int | None = None) -> dict[str, tuple[str, int]]:
    """{stage: (curve, x)} for one round. `block`: the drafter's block size (ignored for AR);
    `nodes`: the budget a `specpilot` round verified. A measured specpilot round whose budget is unknown
    (nodes=None) puts its verify on a curve of its own, so it never skews the shared target-pass curve;
    predictions pass the budget its policy picks (`choose_budget`) or the mix it was seen to pick.

    The target pass (verify) is one curve for AR, stock and DDTree: the same forward over x tokens.
    SpecPilot runs that forward as one of its candidates' verifies (`switch_verify`; `spec.switch_in_place`):
    the target pass plus a fixed cost per round, which measured 2.5-2.7 ms at batch 1 and 8 on the H200
    (docs/results/2026-11-30-costmodel-h200), so its rounds never feed the plain target-pass curve.
    Draft and commit are separate programs per engine kind (chain, tree, tlv) and measured
    1.5x apart on the H200 (docs/results/2026-11-30-costmodel-h200-b1), so each kind has its own curves;
    so has TLV's exact verify of its chosen chain."""
    name = engine_cfg["name"]
    fmt = program_variant(engine_cfg)
    if name == "ar":
        return {"verify": (f"target_pass/{fmt}", 1), "commit": ("commit/ar", 0)}
    block = int(engine_cfg.get("block_size") or block)
    kind = {"stock": "chain", "tlv": "tlv"}.get(name, "tree")
    points = {"draft": (f"draft/{kind}/{fmt}", block)}
    if name == "stock":
        points["tree"] = ("tree/chain", block - 1)
        points["verify"] = (f"target_pass/{fmt}", block)
    elif name == "specpilot":
        built = max(int(c) for c in engine_cfg.get("budget_candidates") or [engine_cfg.get("tree_budget", 256)])
        points["tree"] = ("tree/best_first", built)
        # the budget each round chose not observed: a curve of its own, which predicts nothing else
        points["verify"] = ((f"specpilot_verify/{fmt}", built + 1) if nodes is None
                            else (f"switch_verify/{fmt}", int(nodes) + 1))
    else:
        built = int(engine_cfg.get("tree_budget", 128 if name == "tlv" else 64))
        points["tree"] = ("tree/best_first", built)
        if name == "tlv":
            points["level1"] = (f"level1/{engine_cfg.get('level1_format', 'int8')}", built + 1)
            points["verify"] = (f"tlv_verify/{fmt}", block)  # the exact target verifies the chosen chain only
        else:
            points["verify"] = (f"target_pass/{fmt}", built + 1)
    points["commit"] = (f"commit/{kind}/{fmt}", block)
    return points


def choose_budget(engine_cfg: dict, expected_tokens: Callable[[int], float] | None = None) -> int:
    """The budget a `specpilot` engine picks with its own verify-cost table: argmax over candidates of
    E(n) / (draft_cost_ms + t_verify(n)), first maximum on ties (as `jnp.argmax`). E(n) = expected
    tokens per round with n nodes; None = 1 for every n (random drafts: the cheapest budget wins)."""
    from specpilot.decoding.budget import CostAwareBudget

    policy = CostAwareBudget.from_config(engine_cfg)
    gains = [(expected_tokens(c) if expected_tokens else 1.0) / policy.step_ms(c) for c in policy.candidates]
    return int(policy.candidates[int(np.argmax(gains))])


# ---- τ: tokens committed per round ------------------------------------------------------------------


@dataclasses.dataclass
class TauProfile:
    """τ per engine config label (`config_label` without the weight-format and attention suffixes: W12 and the
    attention kernels are lossless).
    DDTree budgets not measured are interpolated in log2(budget), flat beyond the measured ones.
    `lockstep`: per batch, the share of τ the fused loop delivers when its rows run in lockstep until the slowest is
    done (lockstep τ ÷ τ, relative to AR's; `measure.lockstep_tau`), measured on the same pair and averaged over its
    speculative configurations (0.47-0.49 for stock, DDTree@64 and SpecPilot at batch 32 on the proxy pair,
    docs/results/2026-12-07-batched-order-32-h200/). `project` multiplies τ by it at that batch; a batch without
    one is projected with the mean τ."""

    tau: dict[str, float]
    source: str = ""
    lockstep: dict[int, float] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        return {"source": self.source, "tau": dict(self.tau), "lockstep": {str(b): v for b, v in self.lockstep.items()}}

    @classmethod
    def from_json(cls, d: dict) -> "TauProfile":
        return cls(tau={k: float(v) for k, v in d["tau"].items()}, source=str(d.get("source", "")),
                   lockstep={int(b): float(v) for b, v in d.get("lockstep", {}).items()})

    def ddtree(self, n: int) -> float:
        pts = sorted((int(k.split("@")[1]), v) for k, v in self.tau.items() if k.startswith("ddtree@") and "/" not in k)
        if not pts:
            raise KeyError(f"τ profile ({self.source}) has no ddtree budgets")
        xs, ys = zip(*pts)
        return float(np.interp(math.log2(n), [math.log2(x) for x in xs], ys))

    def lookup(self, engine_cfg: dict, nodes: int | None = None) -> tuple[float, str]:
        """(τ, how it was obtained)."""
        label = config_label({**engine_cfg, "weight_format": "bf16", "attention": "xla"})
        name = engine_cfg["name"]
        if name == "ar":
            return 1.0, "exact"
        if label in self.tau and not (name == "specpilot" and nodes is not None):
            return self.tau[label], "measured"
        if name == "ddtree":
            return self.ddtree(int(engine_cfg.get("tree_budget", 64))), "interpolated over ddtree budgets"
        if name == "specpilot":
            n = nodes if nodes is not None else max(engine_cfg.get("budget_candidates") or [256])
            return self.ddtree(int(n)), f"ddtree τ at budget {n}"
        if name == "tlv":
            n = int(engine_cfg.get("tree_budget", 128))
            return self.ddtree(n), f"ddtree τ at budget {n} (upper bound: level 1 may pick wrong)"
        raise KeyError(f"τ profile ({self.source}) has no τ for {label}")


def speedup(tau: float, t_ar_ms: float, t_step_ms: float) -> float:
    return tau * t_ar_ms / t_step_ms


# ---- the fitted step-time model ----------------------------------------------------------------------


def _interp_x(points: list[tuple[float, float]], x: float) -> float:
    xs, ys = zip(*points)
    if len(xs) == 1:
        return ys[0]
    if x < xs[0]:
        (x0, y0), (x1, y1) = points[0], points[1]
    elif x > xs[-1]:
        (x0, y0), (x1, y1) = points[-2], points[-1]
    else:
        return float(np.interp(x, xs, ys))
    slope = max((y1 - y0) / (x1 - x0), 0.0)  # more tokens never cost less: noise must not extrapolate down
    return max(y0 + slope * (x - x0), 0.0)


def _interp_batch(values: dict[int, float], batch: int) -> float:
    """A value measured at some batches, at `batch`: linear in B between the nearest measured batches,
    extended linearly from the two nearest outside them; one measured batch is used as is."""
    batches = sorted(values)
    if batch in values or len(batches) == 1:
        return values[batch if batch in values else batches[0]]
    lo = [b for b in batches if b < batch]
    hi = [b for b in batches if b > batch]
    b0, b1 = (lo[-1], hi[0]) if lo and hi else ((batches[0], batches[1]) if hi else (batches[-2], batches[-1]))
    return max(values[b0] + (values[b1] - values[b0]) * (batch - b0) / (b1 - b0), 0.0)


@dataclasses.dataclass
class StepTimeModel:
    # (curve, batch) -> sorted [(x, mean ms)]
    curves: dict[tuple[str, int], list[tuple[float, float]]]
    # (variant, batch) -> [({budget: share of rounds}, verify ms)]: measured `specpilot` verify stages
    switch: dict[tuple[str, int], list[tuple[dict[int, float], float]]] = dataclasses.field(default_factory=dict)

    @classmethod
    def fit(cls, rows: Iterable[dict]) -> "StepTimeModel":
        """rows: measured rounds, each {"batch", "stage_ms": {stage: ms}, "points": {stage: (curve, x)}}.
        A `specpilot` row whose budgets are known ("nodes_mix", or "nodes") gives its verify to `switch`
        (whatever its points say: rows measured before the switch curve existed list the target pass)."""
        acc: dict[tuple[str, int], dict[float, list[float]]] = {}
        switch: dict[tuple[str, int], list[tuple[dict[int, float], float]]] = {}
        for row in rows:
            mix = _budget_mix(row)
            for stage, ms in row["stage_ms"].items():
                if mix and stage == "verify":
                    switch.setdefault((program_variant(row["engine_cfg"]), int(row["batch"])), []).append((mix, float(ms)))
                    continue
                curve, x = row["points"][stage]
                acc.setdefault((curve, int(row["batch"])), {}).setdefault(float(x), []).append(float(ms))
        return cls({k: sorted((x, float(np.mean(v))) for x, v in d.items()) for k, d in acc.items()}, switch)

    def switch_overhead_ms(self, variant: str, batch: int) -> float:
        """What running the verify as one of its candidates' adds per round: the measured specpilot verify
        minus the target pass at the budgets it chose, averaged per batch and interpolated in B. 0 until
        a specpilot round has been measured; KeyError when one has, but no target pass of its variant."""
        if any(v == variant for v, _ in self.switch) and not self.has(f"target_pass/{variant}"):
            raise KeyError(f"no measurements for 'target_pass/{variant}'")
        per_batch = {}
        for (v, b), samples in self.switch.items():
            if v == variant:
                per_batch[b] = float(np.mean([ms - sum(w * self._curve_at(f"target_pass/{v}", n + 1, b)
                                                       for n, w in mix.items()) for mix, ms in samples]))
        return _interp_batch(per_batch, batch) if per_batch else 0.0

    def has(self, curve: str) -> bool:
        if curve.startswith("switch_verify/"):
            return self.has("target_pass/" + curve.split("/", 1)[1])
        return any(c == curve for c, _ in self.curves)

    def curve_ms(self, curve: str, x: float, batch: int) -> float:
        """ms of `curve` at x tokens and `batch` requests. A level-1 curve measured at a single x borrows
        its shape from the bf16 target pass: ms(x) = ms(x0) · t_pass(x) / t_pass(x0). A switch verify is
        the target pass plus `switch_overhead_ms`."""
        if curve.startswith("switch_verify/"):
            variant = curve.split("/", 1)[1]
            return self.curve_ms(f"target_pass/{variant}", x, batch) + self.switch_overhead_ms(variant, batch)
        if not self.has(curve):
            if curve.startswith("level1/") and self.has("target_pass/bf16"):
                curve = "target_pass/bf16"  # no level-1 measurement: assume it costs a bf16 pass
            else:
                raise KeyError(f"no measurements for {curve!r}")
        xs = {x0 for (c, _), pts in self.curves.items() if c == curve for x0, _ in pts}
        if len(xs) == 1 and curve.startswith("level1/") and self.has("target_pass/bf16") and x not in xs:
            (x0,) = xs
            ratio = self._curve_at("target_pass/bf16", x, batch) / self._curve_at("target_pass/bf16", x0, batch)
            return self._curve_at(curve, x0, batch) * ratio
        return self._curve_at(curve, x, batch)

    def _curve_at(self, curve: str, x: float, batch: int) -> float:
        batches = sorted(b for c, b in self.curves if c == curve)
        if batch in batches or len(batches) == 1:
            return _interp_x(self.curves[(curve, batch if batch in batches else batches[0])], x)
        return _interp_batch({b: _interp_x(self.curves[(curve, b)], x) for b in batches}, batch)

    def predict_stages(self, engine_cfg: dict, batch: int, block: int, nodes: int | None = None,
                       expected_tokens: Callable[[int], float] | None = None) -> dict[str, float]:
        if engine_cfg["name"] == "specpilot" and nodes is None:
            nodes = choose_budget(engine_cfg, expected_tokens)
        return {stage: self.curve_ms(c, x, batch) for stage, (c, x) in stage_points(engine_cfg, block, nodes).items()}

    def predict_step(self, engine_cfg: dict, batch: int, block: int, nodes: int | None = None,
                     expected_tokens: Callable[[int], float] | None = None) -> float:
        return sum(self.predict_stages(engine_cfg, batch, block, nodes, expected_tokens).values())

    def verify_cost_table(self, batch: int, candidates: Iterable[int], fmt: str = "bf16") -> dict[int, float]:
        """{nodes: ms} for a `specpilot` engine's `verify_cost_ms` (a verify of n nodes pushes n + 1 tokens)."""
        return {int(n): max(round(self.curve_ms(f"target_pass/{fmt}", n + 1, batch), 4), 1e-4) for n in candidates}

    def specpilot_config(self, engine_cfg: dict, batch: int, block: int) -> dict:
        """`engine_cfg` (a specpilot dict) with its verify-cost table and fixed per-round cost taken from
        this model: draft + tree (best-first at its largest budget; the chain's when none was measured)
        + commit + the switch overhead (`switch_overhead_ms`)."""
        fmt = program_variant(engine_cfg)
        cands = engine_cfg.get("budget_candidates") or [engine_cfg.get("tree_budget", 256)]
        pts = stage_points(engine_cfg, block)
        fixed = sum(self.curve_ms(*pts[s], batch) for s in ("draft", "commit"))
        if self.has("tree/best_first") or not self.has("tree/chain"):
            fixed += self.curve_ms(*pts["tree"], batch)
        else:  # no best-first tree measured yet: the chain's argmax is the nearest stand-in
            fixed += self.curve_ms("tree/chain", pts["tree"][1], batch)
        fixed += self.switch_overhead_ms(fmt, batch)
        return {**engine_cfg, "verify_cost_ms": self.verify_cost_table(batch, cands, fmt),
                "draft_cost_ms": round(fixed, 4)}

    def to_json(self) -> dict:
        out = {f"{c}@B{b}": [[x, y] for x, y in pts] for (c, b), pts in sorted(self.curves.items())}
        for v, b in sorted(self.switch):
            if not self.has(f"target_pass/{v}"):  # nothing to subtract: no overhead to report
                continue
            out[f"switch_overhead/{v}@B{b}"] = round(self.switch_overhead_ms(v, b), 4)
        return out


def _budget_mix(row: dict) -> dict[int, float]:
    """{budget: share} a measured `specpilot` row verified at ({} when unknown or another engine)."""
    if row.get("engine_cfg", {}).get("name") != "specpilot":
        return {}
    if row.get("nodes_mix"):
        return {int(n): float(w) for n, w in row["nodes_mix"].items()}
    return {int(row["nodes"]): 1.0} if row.get("nodes") is not None else {}


def observed_budgets(profile: dict, engine_cfg: dict) -> dict[int, float]:
    """{budget: share of the timed rounds} a `specpilot` engine chose: its profile's `chosen_budgets`, or, where a
    profile lacks them (one written before the engine recorded them), inferred from `verified_nodes` (a round that
    verified v nodes chose the smallest candidate ≥ v; a tree with fewer valid nodes than its budget reads as a
    smaller one). Empty for other engines."""
    if engine_cfg["name"] != "specpilot":
        return {}
    picked = [int(c) for c in profile.get("chosen_budgets") or []]
    if not picked:
        cands = sorted(int(c) for c in (engine_cfg.get("budget_candidates") or [engine_cfg.get("tree_budget", 256)]))
        picked = [next((c for c in cands if c >= v), cands[-1]) for v in profile.get("verified_nodes") or []]
    if not picked:
        return {}
    return {c: picked.count(c) / len(picked) for c in sorted(set(picked))}


def measured_row(profile: dict, engine_cfg: dict, block: int, nodes: int | None = None) -> dict:
    """A row `StepTimeModel.fit` reads, from an `Engine.profile` (or `FakeEngine.profile`) result."""
    return {
        "label": config_label(engine_cfg),
        "engine_cfg": engine_cfg,
        "batch": int(profile["batch"]),
        "stage_ms": dict(profile["stage_ms"]),
        **({"stage_ms_rounds": profile["stage_ms_rounds"]} if "stage_ms_rounds" in profile else {}),
        **({"dispatch_ms": profile["dispatch_ms"]} if "dispatch_ms" in profile else {}),
        **{k: profile[k] for k in ("stage_gpu_ms", "stage_gpu_kernels", "stage_gpu_launches", "stage_gpu_error")
           if k in profile},
        "round_ms": float(profile["round_ms"]),
        "tokens_per_round": float(profile["tokens_per_round"]),
        "points": {k: list(v) for k, v in stage_points(engine_cfg, block, nodes).items()},
        **({"nodes": nodes} if nodes is not None else {}),
        **({"nodes_mix": observed_budgets(profile, engine_cfg)} if observed_budgets(profile, engine_cfg) else {}),
    }


def leave_one_out(rows: list[dict], block: int) -> list[dict]:
    """Each measured configuration predicted by a model fitted on all the other rows: the honest test of
    the curves. Rows carry "engine_cfg", "batch", "stage_ms", "points" (and "nodes" when known); rows of
    role "calibration" (separate runs of the curves' anchor points, `measure.sweep`) are always fitted and
    never predicted themselves."""
    out = []
    for i, row in enumerate(rows):
        if row.get("role") == "calibration":
            continue
        model = StepTimeModel.fit(r for j, r in enumerate(rows) if j != i)
        measured = sum(row["stage_ms"].values())
        try:
            mix = {int(n): w for n, w in (row.get("nodes_mix") or {}).items()} or {row.get("nodes"): 1.0}
            pred = sum(w * model.predict_step(row["engine_cfg"], row["batch"], block, n) for n, w in mix.items())
        except KeyError as e:
            out.append({"label": row["label"], "batch": row["batch"], "measured_ms": measured, "predicted_ms": None,
                        "error": None, "note": f"not predictable without it: {e.args[0]}"})
            continue
        out.append({"label": row["label"], "batch": row["batch"], "measured_ms": measured, "predicted_ms": pred,
                    "error": (pred - measured) / measured if measured > 0 else None})
    return out


def on_kernel_time(rows: list[dict]) -> list[dict]:
    """The rows whose every stage was timed under CUPTI (`gpu_time`), their stage times and round replaced by their
    kernel times: `project` on them gives a model the host does not enter. The profiled wall is largely the host's
    (a stage call holds it 0.3-0.7 ms whatever it computes); on kernel time the lockstep model came within 6 % of the
    measured batch-8 speedups of stock and DDTree@64 (docs/results/2026-12-07-batched-order-gpu-time-h100/)."""
    return [{**r, "stage_ms": dict(r["stage_gpu_ms"]), "round_ms": sum(r["stage_gpu_ms"].values())}
            for r in rows if set(r.get("stage_gpu_ms") or ()) >= set(r["stage_ms"])]


def project(rows: list[dict], tau: TauProfile, block: int, fit_rows: list[dict] | None = None) -> list[dict]:
    """PROJECTED speedups of measured rows: τ from a profile measured elsewhere, t_AR and t_step from these
    rows (a `specpilot` row's step is re-predicted at the budget its policy would pick under that τ: the
    budget it picked with random drafts says nothing), by the model fitted on `fit_rows` (default: `rows`)."""
    model = StepTimeModel.fit(rows if fit_rows is None else fit_rows)
    # per batch and program variant (an AR+w12 row is not a bf16 stock's baseline); the configuration's own AR row
    # wins over a calibration one
    ar = {(r["batch"], program_variant(r["engine_cfg"])): r["round_ms"]
          for r in sorted(rows, key=lambda r: r.get("role") != "calibration") if r["engine_cfg"]["name"] == "ar"}
    out = []
    for r in rows:
        cfg, b = r["engine_cfg"], r["batch"]
        if cfg["name"] == "ar" or r.get("role") == "calibration":
            continue
        nodes = None
        t_step = r["round_ms"]
        if cfg["name"] == "specpilot":
            nodes = choose_budget(cfg, tau.ddtree)
            t_step = model.predict_step(cfg, b, block, nodes)
        t_ar = ar.get((b, program_variant(cfg)))
        if t_ar is None:
            t_ar = model.predict_step({"name": "ar", **{k: cfg[k] for k in ("weight_format", "attention") if k in cfg}},
                                      b, block)
        value, how = tau.lookup(cfg, nodes)
        if b in tau.lockstep:
            value, how = value * tau.lockstep[b], f"{how}, × {tau.lockstep[b]:.2f} in lockstep at batch {b}"
        out.append({"label": r["label"] + (f" (budget {nodes})" if nodes else ""), "batch": b, "tau": value,
                    "tau_how": how, "t_step_ms": t_step, "t_ar_ms": t_ar, "speedup": speedup(value, t_ar, t_step),
                    "kind": "projected"})
    return out


def with_kernel_projections(rows: list[dict], tau: TauProfile, block: int) -> list[dict]:
    """`project(rows, tau, block)`, each entry with `t_step_kernels_ms` and `model_speedup_kernels`: the same
    projection on the rows' CUPTI kernel times (`on_kernel_time`; None where the rows lack them). `specpilot` rows are
    projected but not fitted: CUPTI did not report the kernels of their verify's `lax.switch` branch
    (docs/results/2026-12-07-batched-order-gpu-time-h100/), and on kernel time a switch adds no work beyond its
    branch, so their verify is the target pass at the budget they would choose. Without those rows' curves (no
    other tree engine measured at a batch: `bench.py --engines ar specpilot --calibration off`) nothing is projected
    on kernel time."""
    kernel_rows = on_kernel_time(rows)
    fit = [r for r in kernel_rows if r["engine_cfg"]["name"] != "specpilot"]
    try:
        on_kernels = {(p["label"], p["batch"]): p for p in project(kernel_rows, tau, block, fit_rows=fit)}
    except KeyError:  # a curve only the specpilot rows had (`StepTimeModel.curve_ms` names it)
        on_kernels = {}
    out = []
    for p in project(rows, tau, block):
        k = on_kernels.get((p["label"], p["batch"]), {})
        out.append({**p, "t_step_kernels_ms": k.get("t_step_ms"), "model_speedup_kernels": k.get("speedup")})
    return out
