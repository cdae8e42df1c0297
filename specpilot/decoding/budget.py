"""Cost-aware tree budget (the `specpilot` engine): per round, pick the node budget that maximises
expected committed tokens per unit of step time.

Expected tokens for a best-first tree of n nodes, with the drafter's path probabilities as the
surrogate for acceptance: E(n) = 1 + Σ_{j<n} exp(score_j) (the root's bonus token is always
committed; node j is committed iff its whole path is, probability ≈ exp(path log-prob)). Nodes come
sorted by score, so E is a prefix sum. Step time t(n) = t_draft + t_verify(n), t_verify interpolated
(piecewise linear in n) from a table measured by the cost model (config until then); below the table's first size it
is the first time, above its last it follows the last segment's slope (never downward), so a candidate larger than
every measured size does not look as cheap as the largest measured one. A one-point table is flat. The batch shares
one verify shape, so the budget maximising Σ_b E_b(n) / t(n) is chosen, and only that size's verify
runs (one compiled verify per candidate: `spec.switch_in_place` under xla attention, a `lax.switch` under
pallas_tree).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class CostAwareBudget:
    candidates: tuple[int, ...]
    verify_points: tuple[tuple[int, float], ...]  # (nodes, ms) sorted by nodes
    draft_ms: float

    @classmethod
    def from_config(cls, engine_cfg: dict) -> "CostAwareBudget":
        max_budget = int(engine_cfg.get("tree_budget", 256))
        cands = tuple(sorted({int(c) for c in engine_cfg.get("budget_candidates", [max_budget]) if int(c) <= max_budget}))
        if not cands:
            raise ValueError(f"engine.budget_candidates: none is <= engine.tree_budget {max_budget}")
        table = engine_cfg.get("verify_cost_ms") or {1: 1.0}
        points = tuple(sorted((int(n), float(ms)) for n, ms in dict(table).items()))
        if any(ms <= 0 for _, ms in points):
            raise ValueError("engine.verify_cost_ms: times must be > 0")
        return cls(candidates=cands, verify_points=points, draft_ms=float(engine_cfg.get("draft_cost_ms", 0.0)))

    @property
    def max_budget(self) -> int:
        return max(self.candidates)

    def step_ms(self, n: int) -> float:
        xs, ys = zip(*self.verify_points)
        if n <= xs[-1] or len(xs) == 1:
            return self.draft_ms + float(np.interp(n, xs, ys))
        slope = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), 0.0)
        return self.draft_ms + ys[-1] + slope * (n - xs[-1])

    def choose(self, score: jax.Array, valid: jax.Array, live: jax.Array | None = None) -> jax.Array:
        """Index into `candidates` for this round. score, valid: [B, N] with nodes sorted by score; `live` [B]: the
        requests still decoding (a finished or padding row's tree does not vote)."""
        live = jnp.ones(score.shape[:1], bool) if live is None else live
        p = jnp.where(valid & live[:, None], jnp.exp(score), 0.0)
        expected = live[:, None] + jnp.cumsum(p, axis=-1)  # [B, N]: E(n) at n = index + 1; 0 for a finished row
        gains = jnp.stack([expected[:, c - 1].sum() / self.step_ms(c) for c in self.candidates])
        return jnp.argmax(gains).astype(jnp.int32)
