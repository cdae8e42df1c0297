"""The offline proposer: no network, deterministic, driven by the gap report.

1. What memory knows: the configurations matching records validated (best measured first), then their
   deltas applied to the incumbent — remedies for the largest gap first (a record's measured gain
   times the share of the per-token gap that the stage it addresses has here).
2. Local search: every single-knob move from the incumbent (engine kinds, categorical flips, numeric
   knobs scaled ×0.5 … ×2), ranked by the share of the per-token gap the move targets; a move that
   raises τ targets the whole round (its share grows as τ falls).
3. When those run out (an AR incumbent has no knobs but the engine kind): the single-knob moves of the
   runners-up, the fastest token-forced configurations measured so far, so a round never goes empty
   while something near the best speculative configuration is untried (the H200 search of
   docs/results/2026-11-30-search-h200-a had empty rounds 2-3 without it).
Configurations already measured (or rejected) are never proposed again.
"""

from __future__ import annotations

from specpilot.agent.proposers import Proposal, ProposalBatch, ProposalContext
from specpilot.agent.space import SpaceError, config_key, describe_config


def addresses(cfg: dict, delta: dict, drafter_block: int) -> set[str]:
    """The round stages (or "tau") a move is expected to make cheaper per committed token."""
    engine = delta.get("engine")
    if engine == "ar":
        return {"draft", "tree", "level1"}
    if engine == "stock":
        return {"tree", "verify", "level1"}
    if engine == "ddtree":
        return {"tau"}
    if engine == "specpilot":
        return {"tau", "tree", "verify"}
    if engine == "tlv":
        return {"tau", "verify"}
    out: set[str] = set()
    for k, v in delta.items():
        cur = cfg.get(k)
        if k == "tree_budget":
            out |= {"tau"} if v > cur else {"tree", "verify", "level1"}
        elif k == "block_size":
            cur = cur or drafter_block
            out |= {"draft", "tree"} if (v or drafter_block) < cur else {"tau"}
        elif k == "weight_format":
            out |= {"verify", "draft"}
        elif k == "level1_format":
            out |= {"level1"}
        elif k == "budget_candidates":
            out |= {"tree", "verify"}
    return out


def gap_shares(gap_report: dict, tau: float) -> dict[str, float]:
    """Each stage's share of the per-token gap; "tau" weighs 1/(1+τ) (a short accepted chain makes every
    stage cost more per token)."""
    comps = gap_report.get("components", [])
    total = sum(c["gap_ms_per_token"] for c in comps) or 1.0
    shares = {c["stage"]: c["gap_ms_per_token"] / total for c in comps}
    shares["tau"] = 1.0 / (1.0 + max(tau, 0.0))
    return shares


class OfflineProposer:
    name = "offline"

    def propose(self, ctx: ProposalContext) -> ProposalBatch:
        space, inc = ctx.space, ctx.incumbent["config"]
        shares = gap_shares(ctx.gap_report, ctx.incumbent.get("tau") or 1.0)
        ranked = [c["stage"] for c in ctx.gap_report.get("components", [])]
        largest = ranked[0] if ranked else "none"
        taken = set(ctx.tried) | {config_key(inc)}
        out: list[Proposal] = []

        def take(delta: dict, hypothesis: str, source: str) -> bool:
            try:
                cfg = space.apply(inc, delta)
            except SpaceError:
                return False
            key = config_key(cfg)
            if key in taken:
                return False
            taken.add(key)
            out.append(Proposal(space.diff(inc, cfg), hypothesis, source))
            return len(out) >= ctx.k

        def stage_rank(stage: str) -> int:
            return ranked.index(stage) if stage in ranked else (len(ranked) if stage == "tau" else len(ranked) + 1)

        # 1. memory. (a) the configurations records measured, best first (on its own deployment a record's
        #    speedup over AR ranks it); (b) their deltas applied to this incumbent, ordered by the gain each
        #    measured times the share of the per-token gap its stage has here (the largest gap first)
        for rec in sorted(ctx.memory, key=lambda r: -r.gain.speedup_over_ar):
            try:
                space.check(rec.config)
                full = space.diff(inc, rec.config)
            except SpaceError:
                continue
            why = (f"memory: {rec.name} measured {rec.gain.speedup_over_ar:.2f}x AR on {rec.deployment.get('name')} "
                   f"as {describe_config(rec.config)}")
            if full and take(full, why, f"memory:{rec.name}"):
                return ProposalBatch(out)

        def expected(rec) -> float:
            return max(rec.gain.relative_gain, 0.0) * (shares.get(rec.addresses, 0.0) + 0.1)

        for rec in sorted(ctx.memory, key=lambda r: (-expected(r), stage_rank(r.addresses))):
            why = (f"memory: {rec.mechanism} gave {100 * rec.gain.relative_gain:+.0f}% on "
                   f"{rec.deployment.get('name')} (addresses {rec.addresses}; largest gap here: {largest})")
            if take(dict(rec.delta), why, f"memory:{rec.name}"):
                return ProposalBatch(out)

        # 2. local moves: first those leading to a config already measured faster than the incumbent (the
        #    AR baseline, when speculation costs more than it saves), then by the share of the gap targeted
        moves = space.moves(inc)
        scored = []
        for i, delta in enumerate(moves):
            target = addresses(inc, delta, space.drafter_block_size)
            s = max((shares.get(t, 0.0) for t in target), default=0.0) + 0.1 * sum(shares.get(t, 0.0) for t in target)
            known = ctx.measured.get(config_key(space.apply(inc, delta)))
            if known is not None and known > (ctx.incumbent.get("speedup") or 0.0):
                s += 10.0 + known
            scored.append((-s, i, delta, target, known))
        scored.sort(key=lambda x: (x[0], x[1]))
        for neg, _, delta, target, known in scored:
            best = max(target, key=lambda t: shares.get(t, 0.0)) if target else "none"
            moved = describe_config(space.apply(inc, delta))
            change = ", ".join(f"{k}={v}" for k, v in delta.items())
            if known is not None and -neg >= 10.0:
                why = (f"{moved} was measured at {known:.2f}x AR, the incumbent at "
                       f"{ctx.incumbent.get('speedup', 0.0):.2f}x: {change} removes the {best} cost")
            else:
                why = (f"largest gap {largest}; {change} targets {best} "
                       f"({100 * shares.get(best, 0.0):.0f}% of the per-token gap) -> {moved}")
            if take(delta, why, f"offline:{best}"):
                return ProposalBatch(out)

        # 3. the incumbent's neighbourhood is exhausted (e.g. AR, whose only moves are engine kinds): single-knob
        #    moves from the runners-up, the fastest token-forced configurations measured so far, best first
        runners = sorted((t for t in ctx.history if t.get("status") == "ok" and t.get("forcing", {}).get("passed")
                          and config_key(t["config"]) != config_key(inc)), key=lambda t: -t.get("speedup", 0.0))
        for t in runners:
            for delta in space.moves(t["config"]):
                if "engine" in delta:
                    continue  # engine kinds are the incumbent's own moves
                moved = space.apply(t["config"], delta)
                change = ", ".join(f"{k}={v}" for k, v in delta.items())
                why = (f"neighbourhood of the incumbent exhausted; {change} on runner-up {t['id']} "
                       f"({describe_config(t['config'])}, {t.get('speedup', 0.0):.2f}x AR) -> {describe_config(moved)}")
                if take(space.diff(inc, moved), why, f"offline:runner-up:{t['id']}"):
                    return ProposalBatch(out)
        return ProposalBatch(out)
