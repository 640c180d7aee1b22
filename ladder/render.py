"""Human tables for the CLI, in the style of `ft ctl cache`. Pure: values in, text out."""

from __future__ import annotations

import json
from collections.abc import Sequence

from engine.ftserve.budget import MemoryModel
from engine.ftserve.geometry import CacheStatus, Geometry
from engine.ftserve.planner import Plan
from ladder.rungs import Ladder, PoolRange, SmallBudgetHint
from ladder.units import format_bytes

__all__ = ["geometry_line", "render_ladder", "render_plan", "render_pools"]


def _table(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return [indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in rows]


def geometry_line(model: MemoryModel, g: Geometry) -> str:
    parts = []
    if model.shape.max_expert_slots:
        parts.append(f"{g.moe_cache_size} slots")
    parts.append(f"{g.num_pages * model.shape.page_size} tok")
    if model.shape.has_mamba:
        parts.append(f"{g.num_mamba_slots} mamba")
    return ", ".join(parts)


def _span(minimum: int, maximum: int | None) -> str:
    return "none" if maximum is None else f"{minimum}..{maximum}"


def render_pools(status: CacheStatus, model: MemoryModel, ranges: Sequence[PoolRange]) -> str:
    """The live pools, with the honest reachable ranges next to the engine's advertised ones."""
    g, shape = status.geometry, status.shape
    pools = model.pool_bytes(g)
    lines = [f"state={status.state}, {format_bytes(pools.total)} allocated "
             f"(budget {format_bytes(model.budget_bytes)}, engine {status.engine.name})"]
    over = model.over_budget_bytes(g)
    if over:
        lines.append(f"live geometry is {format_bytes(over)} ({over} B) above the budget, as "
                     "ft serve boots without --num-tokens: shrinks are safe once they pass the "
                     "engine's fit-check, grows must fit the budget")
    by_pool = {r.pool: r for r in ranges}
    rows = [["pool", "size", "vram", "reachable now", "after shrinking others",
             "advertised"]]

    def add(pool: str, size: str, nbytes: int) -> None:
        r = by_pool[pool]
        rows.append([pool, size, format_bytes(nbytes), _span(r.minimum, r.max_keeping_others),
                     _span(r.minimum, r.max_with_others_at_floor),
                     f"{r.minimum}..{r.advertised_max}"])

    if shape.max_expert_slots:
        share = 100 * g.moe_cache_size / shape.max_expert_slots
        add("moe", f"{g.moe_cache_size} slots (lru, {share:.1f}%)", pools.moe)
    add("kv", f"{g.num_pages * shape.page_size} tok ({g.num_pages} x {shape.page_size})", pools.kv)
    if shape.has_mamba:
        add("mamba", f"{g.num_mamba_slots} slots", pools.mamba)
    lines += _table(rows)
    return "\n".join(lines)


def render_ladder(ladder: Ladder, live: Geometry, hint: SmallBudgetHint | None = None) -> str:
    model = ladder.model
    live_index = ladder.index_of(live)
    lines = [f"{len(ladder.rungs)} rungs within a budget of {format_bytes(model.budget_bytes)} "
             f"(reserve {format_bytes(model.reserve_bytes)})"]
    rows = [["", "rung", "kv tokens", "pages", "expert slots", "mamba slots", "bytes"]]
    for rung in ladder.rungs:
        g = rung.geometry
        rows.append(["*" if rung.index == live_index else "", str(rung.index),
                     str(rung.kv_tokens), str(g.num_pages), str(g.moe_cache_size),
                     str(g.num_mamba_slots), format_bytes(rung.total_bytes)])
    lines += _table(rows)
    if live_index is None:
        lines.append(f"  live geometry ({geometry_line(model, live)}) is not on the ladder")
    for dropped in ladder.dropped:
        lines.append(f"  dropped {dropped.kv_tokens} KV tokens: {dropped.reason}")
    if hint is not None:
        lines.append(f"  {hint.message(len(ladder.rungs))}")
    return "\n".join(lines)


def render_plan(plan: Plan, model: MemoryModel) -> str:
    budget = plan.budget_bytes
    lines = [f"plan ({plan.engine}): {geometry_line(model, plan.start)}  ->  "
             f"{geometry_line(model, plan.target)}",
             f"budget {format_bytes(budget)} ({budget} B)"]
    over = plan.live_over_budget_bytes
    if over:
        lines.append(f"live geometry holds {format_bytes(plan.live_bytes)} ({plan.live_bytes} B), "
                     f"{format_bytes(over)} ({over} B) above the budget: no instant may exceed "
                     f"what it holds, and a grow must fit the budget")
    if plan.steps:
        rows = [["step", "body", "peak", "after"]]
        for n, step in enumerate(plan.steps, 1):
            rows.append([str(n), json.dumps(dict(step.body)),
                         f"{format_bytes(step.peak_bytes)} ({step.peak_bytes} B)",
                         geometry_line(model, step.after)])
        lines += _table(rows)
    single = plan.single_call_peak_bytes
    ceiling = plan.ceiling_bytes
    if single > ceiling:
        verdict = (f"over {'the live bytes' if over else 'the budget'} by "
                   f"{format_bytes(single - ceiling)}: it can OOM and roll back")
    else:
        # Within the bytes, but an infeasible plan here means the target itself is refused.
        verdict = "fits" if plan.feasible else "within the budget, but see below"
    lines.append(f"as one call: peak {format_bytes(single)} ({single} B), {verdict}")
    lines.append(("feasible: " if plan.feasible else "infeasible: ") + plan.reason)
    return "\n".join(lines)
