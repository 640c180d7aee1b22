"""The free-first planner: from the live geometry to a target, in steps whose every instant fits.

ft serve resizes inside one rebuild call in the order MoE, KV (+window), mamba, each pool
freeing only itself before allocating, and its fit-check prices only the final geometry. So
one call that grows MoE while shrinking KV holds the old KV and the new experts at once. The
planner prices every instant of every call under the engine's own order and splits the
transition into the fewest calls that are safe (never more than two when the target fits:
all shrinks, then all grows), preferring calls that leave KV and mamba alone, because those
also wipe ft serve's prefix cache. The reference engine orders free-first inside one call, so
its plans are a single call whose instants are the chunk phases.

Safety rule: no instant may hold more than `MemoryModel.ceiling_bytes(start)`, the budget or
what the live geometry already holds when that is more. ft serve booted without `--num-tokens`
sizes KV from a free-memory reading and lands a little above `cache_budget_bytes`; those bytes
exist, so shrinking from there is as safe as standing still, and growing needs the budget.
Every call must also end where the engine's own fit-check accepts it, or ft serve answers
`rejected`.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from engine.ftserve.budget import MemoryModel
from engine.ftserve.geometry import EngineKind, Geometry

__all__ = ["POOL_ORDER", "SIZE_FIELD", "Instant", "Plan", "Step", "call_instants",
           "plan_transition", "pool_size", "validate_target"]

# ft serve's order inside one call; the window pool is resized together with KV.
POOL_ORDER = ("moe", "kv", "mamba")
# The rebuild body key, which is also the `Geometry` field, of each pool.
SIZE_FIELD = {"moe": "moe_cache_size", "kv": "num_pages", "mamba": "num_mamba_slots"}


@dataclass(frozen=True, slots=True)
class Instant:
    """One moment inside a call and the bytes all pools hold then."""

    what: str
    total_bytes: int


@dataclass(frozen=True, slots=True)
class Step:
    """One engine call: the exact rebuild body, the geometry after it, and its priced instants."""

    body: Mapping[str, int]
    after: Geometry
    peak_bytes: int
    instants: tuple[Instant, ...]

    @property
    def touches_kv(self) -> bool:
        """A call that resizes KV, mamba or the window pool wipes ft serve's prefix cache."""
        return any(key in self.body for key in ("num_pages", "num_mamba_slots", "num_swa_pages"))

    def to_json(self) -> dict[str, Any]:
        return {
            "body": dict(self.body),
            "peak_bytes": self.peak_bytes,
            "after": self.after.to_json(),
            "instants": [{"what": i.what, "total_bytes": i.total_bytes} for i in self.instants],
        }


@dataclass(frozen=True, slots=True)
class Plan:
    feasible: bool
    engine: EngineKind
    budget_bytes: int
    start: Geometry
    target: Geometry
    steps: tuple[Step, ...]
    peak_bytes: int
    single_call_peak_bytes: int
    reason: str
    live_bytes: int
    ceiling_bytes: int

    @property
    def live_over_budget_bytes(self) -> int:
        return max(0, self.live_bytes - self.budget_bytes)

    def to_json(self) -> dict[str, Any]:
        return {
            "feasible": self.feasible,
            "engine": self.engine,
            "budget_bytes": self.budget_bytes,
            "live_bytes": self.live_bytes,
            "live_over_budget_bytes": self.live_over_budget_bytes,
            "ceiling_bytes": self.ceiling_bytes,
            "from": self.start.to_json(),
            "to": self.target.to_json(),
            "steps": [step.to_json() for step in self.steps],
            "peak_bytes": self.peak_bytes,
            "single_call_peak_bytes": self.single_call_peak_bytes,
            "reason": self.reason,
        }


def pool_size(geometry: Geometry, pool: str) -> int:
    """A pool's size in its engine unit: slots, or pages for KV."""
    return int(getattr(geometry, SIZE_FIELD[pool]))


def _with(geometry: Geometry, pools: Iterable[str], source: Geometry) -> Geometry:
    sizes = {SIZE_FIELD[p]: pool_size(source, p) for p in pools}
    return geometry.with_sizes(**sizes)


def _bytes(model: MemoryModel, geometry: Geometry, pool: str) -> int:
    pools = model.pool_bytes(geometry)
    return {"moe": pools.moe, "kv": pools.kv, "mamba": pools.mamba}[pool]


def _describe(model: MemoryModel, pool: str, size: int) -> str:
    if pool == "kv":
        return f"{size * model.shape.page_size} KV tokens"
    return f"{size} {'expert' if pool == 'moe' else 'mamba'} slots"


def call_instants(model: MemoryModel, before: Geometry, after: Geometry) -> tuple[Instant, ...]:
    """Every instant of one rebuild call from `before` to `after` under the engine's order.

    ft serve: while pool p is reallocated the card holds the new size of the pools before it,
    p's new size, and the old size of the pools after it. The reference engine releases the
    chunks of every shrinking pool first, then adds chunks to the growing ones; totals move
    monotonically inside each phase. A shrink cuts a partial last chunk through host memory,
    so its phase never exceeds its start; a grow copies a partial tail into a larger chunk
    and briefly holds both, so a grow phase is priced at its end plus one chunk.
    """
    changed = [p for p in POOL_ORDER if pool_size(before, p) != pool_size(after, p)]
    instants = [Instant("start", model.total_bytes(before))]
    if model.engine.kind == "reference":
        shrinks = [p for p in changed if pool_size(after, p) < pool_size(before, p)]
        order = shrinks + [p for p in changed if p not in shrinks]
    else:
        order = changed
    current = before
    for pool in order:
        previous, current = current, _with(current, [pool], after)
        verb = "freed to" if pool_size(after, pool) < pool_size(before, pool) else "allocated at"
        total = model.total_bytes(current)
        if model.engine.kind == "reference":
            if pool_size(after, pool) < pool_size(before, pool):
                total = model.total_bytes(previous)
            else:
                total += min(model.engine.chunk_bytes, _bytes(model, current, pool))
        instants.append(
            Instant(f"{pool} {verb} {_describe(model, pool, pool_size(after, pool))}", total))
    return tuple(instants)


def _step(model: MemoryModel, before: Geometry, pools: Iterable[str], target: Geometry) -> Step:
    pools = tuple(pools)
    after = _with(before, pools, target)
    instants = call_instants(model, before, after)
    body = {SIZE_FIELD[p]: pool_size(after, p) for p in POOL_ORDER if p in pools}
    return Step(
        body=body,
        after=after,
        peak_bytes=max(i.total_bytes for i in instants),
        instants=instants,
    )


def validate_target(model: MemoryModel, start: Geometry, target: Geometry) -> str:
    """Why `target` can never be reached from `start`, or "" when nothing forbids it."""
    shape, floors = model.shape, model.floors
    if target.moe_cache_size != start.moe_cache_size:
        if shape.max_expert_slots == 0:
            return "the model has no MoE layers; moe_cache_size cannot change"
        if target.moe_cache_size < floors.moe_slots:
            return (
                f"moe_cache_size {target.moe_cache_size} is below the floor of "
                f"{floors.moe_slots} slots (one per routed expert)"
            )
        if target.moe_cache_size > shape.max_expert_slots:
            return (
                f"moe_cache_size {target.moe_cache_size} is above the "
                f"{shape.max_expert_slots} experts the model has "
                f"({shape.num_experts} x {shape.num_moe_layers} layers)"
            )
    if target.num_pages != start.num_pages:
        kv_tokens = target.num_pages * shape.page_size
        if target.num_pages < 1 or kv_tokens < floors.kv_tokens:
            return f"{kv_tokens} KV tokens is below the floor of {floors.kv_tokens} tokens"
    if target.num_mamba_slots != start.num_mamba_slots:
        if not shape.has_mamba:
            return "the model has no mamba pool; num_mamba_slots cannot change"
        if target.num_mamba_slots < floors.mamba_slots:
            return (
                f"num_mamba_slots {target.num_mamba_slots} is below the floor of "
                f"{floors.mamba_slots} slots"
            )
    ceiling = model.ceiling_bytes(start)
    target_bytes = model.total_bytes(target)
    if target_bytes > ceiling:
        return f"the target needs {target_bytes} B, over {_ceiling_words(model, start)}"
    if not model.engine_accepts(target):
        return (f"the engine's fit-check would reject the target: it prices it at "
                f"{model.fit_check_bytes(target)} B, over the cache budget of "
                f"{model.cache_budget_bytes} B")
    return ""


def _ceiling_words(model: MemoryModel, start: Geometry) -> str:
    if model.over_budget_bytes(start):
        return (f"the {model.ceiling_bytes(start)} B the live geometry holds "
                f"(itself above the budget of {model.budget_bytes} B)")
    return f"the budget of {model.budget_bytes} B"


def _candidates(
    model: MemoryModel, start: Geometry, target: Geometry, changed: tuple[str, ...]
) -> Iterable[tuple[Step, ...]]:
    yield (_step(model, start, changed, target),)
    if model.engine.kind == "reference":
        return
    for size in range(1, len(changed)):
        for first in itertools.combinations(changed, size):
            step1 = _step(model, start, first, target)
            rest = tuple(p for p in changed if p not in first)
            yield step1, _step(model, step1.after, rest, target)


def plan_transition(model: MemoryModel, start: Geometry, target: Geometry) -> Plan:
    """The safest, cheapest sequence of calls from `start` to `target` (see module docstring)."""
    # The window pool is never resized by a rung change: it keeps its live size.
    target = Geometry(
        target.moe_cache_size, target.num_pages, target.num_mamba_slots, start.num_swa_pages
    )
    budget = model.budget_bytes
    ceiling = model.ceiling_bytes(start)
    changed = tuple(p for p in POOL_ORDER if pool_size(start, p) != pool_size(target, p))
    start_bytes = model.total_bytes(start)

    def plan(feasible: bool, steps: tuple[Step, ...], peak: int, single: int,
             reason: str) -> Plan:
        return Plan(feasible, model.engine.kind, budget, start, target, steps, peak, single,
                    reason, start_bytes, ceiling)

    if not changed:
        return plan(True, (), start_bytes, start_bytes, "already at the target")
    single = _step(model, start, changed, target)
    reason = validate_target(model, start, target)
    if reason:
        return plan(False, (), 0, single.peak_bytes, reason)
    safe = [steps for steps in _candidates(model, start, target, changed)
            if all(step.peak_bytes <= ceiling and model.engine_accepts(step.after)
                   for step in steps)]
    if not safe:
        return plan(False, (), 0, single.peak_bytes,
                    f"no sequence of calls keeps every instant within "
                    f"{_ceiling_words(model, start)}")
    best = min(safe, key=lambda steps: (
        len(steps), sum(s.touches_kv for s in steps), max(s.peak_bytes for s in steps)))
    peak = max(s.peak_bytes for s in best)
    if len(best) == 1:
        why = "one call: every instant fits in the engine's order"
    else:
        worst = max(single.instants, key=lambda i: i.total_bytes)
        why = (
            f"{len(best)} calls, shrinks first: one call would peak at {single.peak_bytes} B "
            f"> {ceiling} B ({worst.what} while the other pools still hold their old size)"
        )
    return plan(True, best, peak, single.peak_bytes, why)
