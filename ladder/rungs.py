"""The ladder: precomputed geometries (rungs) the daemon steps between, all verified up front.

Rungs are ordered by KV capacity. Each gives what the KV and mamba pools leave of the budget to
expert slots (capped at `num_experts * num_moe_layers`), so rung 0 decodes fastest and the top
rung holds the longest context. Every transition between any two rungs is planned here, once,
and a rung that cannot be reached safely from every other is dropped with its reason: the
controller never has to discover at run time that a step is impossible.

Default spacing (why geometric, ratio sqrt(2), floor 4k, steps of at most 16k): the cost of a
rung is its unused KV, which becomes expert slots. Public LRU measurements price an extra 32k
reserved tokens at ~2 points of hit rate (0.36-0.75 ms/token) at 20-30 % residency, and 2-3x
more below 15 %; a ratio-r ladder wastes at most (r - 1) of the live context, so the waste stays
proportional to the context instead of a fixed 32k that dominates short chats (ShareGPT
contexts: median 821, p99 2.5k tokens). Above ~40k tokens a sqrt(2) step would pass 16k, just
where slots are fewest and each costs most (the 16 GB H200 bench: an uncapped geometric
ladder's 131k -> 187k -> 226k steps left 95-190k agentic turns 1.3-3.7x fewer slots than 32k
steps did), so steps stop growing at `kv_step_tokens`. Why 16k and not PR #300's 32k: on the
calibrated replay (30 seeds of each workload, docs/results.md) a 32k step let a turn miss a
rung by a few hundred tokens and land 32k higher than it needed, which put the default policy
below grow-only on its worst seeds (0.959x on mixed); 16k steps keep the worst seed at or
above 0.99x and raise the median, and 8-12k buy under half a point more for 15-20 % more
crossings. An agentic session growing from 64k to 200k crosses about 9 rungs; each crossing
costs warm-up (64-160 tokens at a degraded hit rate) and, on ft serve, a cold cache and ~1 s
of refused requests, which the replay prices (but not ft serve's prefix-cache wipe).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from engine.ftserve.budget import MemoryModel
from engine.ftserve.geometry import Geometry, Limits
from engine.ftserve.planner import SIZE_FIELD, Plan, plan_transition, pool_size
from ladder.knobs import KnobError, check_knobs, knob
from ladder.parsers import byte_size, choice, optional, ratio, tokens, whole
from policies.api import LadderView, RungView

__all__ = [
    "MIN_USEFUL_RUNGS",
    "DroppedRung",
    "Ladder",
    "LadderSpec",
    "PoolRange",
    "Rung",
    "SmallBudgetHint",
    "build_ladder",
    "kv_levels",
    "reachable_ranges",
    "small_budget_hint",
]

log = logging.getLogger(__name__)

Spacing = Literal["geometric", "linear"]


@dataclass(frozen=True, slots=True)
class LadderSpec:
    """How to lay out the rungs; every field has the default argued in the module docstring.

    The budget knobs (`reserve_bytes`, `fixed_bytes`) also price the server's memory model,
    which the controller builds from them; `build_ladder` takes `reserve_bytes` from here and
    `fixed_bytes` from the model it is given."""

    kv_floor_tokens: int = knob(4096, tokens(), "KV capacity of the lowest rung, tokens, >= 1.",
                                flag="--kv-floor")
    kv_max_tokens: int | None = knob(
        None, optional(tokens()), "Cap on the top rung's KV, tokens; unset: whatever the "
        "budget allows. Below `kv_floor_tokens` is an \"impossible ladder\".", flag="--kv-max")
    spacing: Spacing = knob(
        "geometric", choice("geometric", "linear"), "`geometric` (each rung `kv_step_ratio` "
        "times the last, at most `kv_step_tokens` more) or `linear` (+`kv_step_tokens`).",
        flag="--spacing")
    kv_step_ratio: float = knob(
        math.sqrt(2), ratio(low=1.0, high=16.0, low_open=True, high_open=False),
        "Geometric ratio, in (1, 16].", flag="--kv-ratio", shown="`1.41421356…` (sqrt 2)")
    kv_step_tokens: int = knob(
        16384, tokens(), "Linear step, or with geometric spacing the largest step, tokens, "
        ">= 1.", flag="--kv-step")
    reserve_bytes: int = knob(0, byte_size(), "Budget held back from every rung, bytes.",
                              flag="--reserve")
    fixed_bytes: int = knob(0, byte_size(), "Memory outside the cache pools the plan must count "
                            "(weights, workspace), bytes.", flag="--fixed-bytes")
    mamba_slots: int | None = knob(None, optional(whole()), "Mamba state slots on every rung; "
                                   "unset: keep the live count.")
    min_moe_slots: int | None = knob(None, optional(whole()), "Fewest expert slots a rung may "
                                     "have; unset: the engine's floor.")

    def __post_init__(self) -> None:
        check_knobs(self)
        if self.kv_max_tokens is not None and self.kv_max_tokens < self.kv_floor_tokens:
            raise KnobError("kv_max_tokens", f"impossible ladder: kv_max_tokens "
                                             f"{self.kv_max_tokens} is below kv_floor_tokens "
                                             f"{self.kv_floor_tokens}")


@dataclass(frozen=True, slots=True)
class Rung:
    index: int
    geometry: Geometry
    kv_tokens: int
    total_bytes: int

    def to_json(self) -> dict[str, int]:
        return {"index": self.index, "kv_tokens": self.kv_tokens,
                "total_bytes": self.total_bytes, **self.geometry.to_json()}


@dataclass(frozen=True, slots=True)
class DroppedRung:
    kv_tokens: int
    reason: str


@dataclass(frozen=True, slots=True)
class Ladder:
    model: MemoryModel
    rungs: tuple[Rung, ...]
    dropped: tuple[DroppedRung, ...]
    transitions: Mapping[tuple[int, int], Plan]

    def rung_holding(self, kv_tokens: int) -> Rung | None:
        """The lowest rung whose KV holds `kv_tokens`, or None when none does."""
        return next((r for r in self.rungs if r.kv_tokens >= kv_tokens), None)

    def index_of(self, geometry: Geometry) -> int | None:
        return next((r.index for r in self.rungs if r.geometry.to_json() == geometry.to_json()),
                    None)

    @property
    def top(self) -> Rung:
        return self.rungs[-1]

    def view(self, transition_s: float) -> LadderView:
        """What a policy sees of this ladder: sizes per rung, no bytes, no plans."""
        return LadderView(tuple(RungView(r.index, r.kv_tokens, r.geometry.moe_cache_size,
                                         r.geometry.num_mamba_slots) for r in self.rungs),
                          transition_s=transition_s)


def _round_up(tokens: int, page_size: int) -> int:
    return math.ceil(tokens / page_size) * page_size


def kv_levels(spec: LadderSpec, *, page_size: int, kv_max_tokens: int) -> list[int]:
    """KV token counts of the rungs, page-aligned, from the floor up to `kv_max_tokens`."""
    top = kv_max_tokens // page_size * page_size
    level = _round_up(spec.kv_floor_tokens, page_size)
    levels: list[int] = []
    while level < top:
        levels.append(level)
        raw = float(level + spec.kv_step_tokens)
        if spec.spacing == "geometric":
            raw = min(raw, level * spec.kv_step_ratio)
        level = max(level + page_size, _round_up(math.ceil(raw), page_size))
    if top >= page_size:
        levels.append(top)
    return levels


# Fewer rungs than this and there is little to step between: the ladder is mostly one size.
MIN_USEFUL_RUNGS = 4


@dataclass(frozen=True, slots=True)
class SmallBudgetHint:
    """A floor that gives a small budget a ladder worth stepping on, and the growth reserve
    that suits it for the `headroom` policy (the default `pinned` reserves none)."""

    top_kv_tokens: int
    kv_floor_tokens: int
    growth_tokens: int

    def flags(self) -> str:
        return f"--kv-floor {self.kv_floor_tokens}"

    def message(self, rungs: int) -> str:
        return (f"this budget holds at most {self.top_kv_tokens:,} KV tokens, so the "
                f"{rungs}-rung ladder leaves the daemon little to step between: for `ladder "
                f"run`, try {self.flags()} (with --policy headroom, also --policy-option "
                f"growth_tokens={self.growth_tokens}: its default 8k reserve never fits)")


def small_budget_hint(ladder: Ladder, spec: LadderSpec) -> SmallBudgetHint | None:
    """For a budget too small for `spec`'s floor to leave `MIN_USEFUL_RUNGS` rungs (a scaled
    reference card, a big model on a small card): a floor 1/16 of the top rung, as a power of
    two, and a growth reserve of twice that. None when the ladder is fine or cannot go lower."""
    if not ladder.rungs or len(ladder.rungs) >= MIN_USEFUL_RUNGS:
        return None
    top = ladder.rungs[-1].kv_tokens
    page = ladder.model.shape.page_size
    floor = max(page, 1 << max(0, (top // 16).bit_length() - 1))
    if floor >= spec.kv_floor_tokens:
        return None
    return SmallBudgetHint(top, floor, 2 * floor)


def build_ladder(model: MemoryModel, live: Geometry, spec: LadderSpec) -> Ladder:
    """The rungs for this engine and budget, each transition planned and verified."""
    if spec.reserve_bytes != model.reserve_bytes:
        model = MemoryModel(model.shape, model.units, model.floors, model.engine,
                            model.cache_budget_bytes, model.fixed_bytes, spec.reserve_bytes)
    # Rungs leave room for the one chunk a chunked engine may hold while it re-chunks a
    # partial tail; transitions are then priced against the whole budget.
    rung_model = MemoryModel(model.shape, model.units, model.floors, model.engine,
                             model.cache_budget_bytes, model.fixed_bytes,
                             model.reserve_bytes + model.engine.chunk_bytes)
    shape = model.shape
    mamba = live.num_mamba_slots if spec.mamba_slots is None else spec.mamba_slots
    moe_floor = max(model.floors.moe_slots, spec.min_moe_slots or 0)
    budget_kv_pages = rung_model.max_kv_pages(moe_slots=moe_floor, mamba_slots=mamba,
                                              swa_pages=live.num_swa_pages)
    kv_max = budget_kv_pages * shape.page_size
    if spec.kv_max_tokens is not None:
        kv_max = min(kv_max, spec.kv_max_tokens)
    dropped: list[DroppedRung] = []
    candidates: list[Geometry] = []
    for kv_tokens in kv_levels(spec, page_size=shape.page_size, kv_max_tokens=kv_max):
        if kv_tokens < model.floors.kv_tokens:
            dropped.append(DroppedRung(kv_tokens, f"below the engine's KV floor of "
                                                  f"{model.floors.kv_tokens} tokens"))
            continue
        pages = kv_tokens // shape.page_size
        moe = (rung_model.max_moe_slots(kv_pages=pages, mamba_slots=mamba,
                                        swa_pages=live.num_swa_pages)
               if shape.max_expert_slots else live.moe_cache_size)
        if shape.max_expert_slots and moe < moe_floor:
            dropped.append(DroppedRung(kv_tokens, f"leaves room for {moe} expert slots, below "
                                                  f"the floor of {moe_floor}"))
            continue
        candidates.append(Geometry(moe, pages, mamba, live.num_swa_pages))
    if not candidates:
        dropped.append(DroppedRung(kv_max, "no KV size fits the budget with the pool floors"))
    transitions: dict[tuple[int, int], Plan] = {}
    while True:
        transitions = {}
        bad: dict[int, str] = {}
        for i, a in enumerate(candidates):
            for j, b in enumerate(candidates):
                if i == j:
                    continue
                plan = plan_transition(model, a, b)
                transitions[(i, j)] = plan
                if not plan.feasible and j not in bad:
                    bad[j] = (f"unreachable from {a.num_pages * shape.page_size} KV tokens: "
                              f"{plan.reason}")
        if not bad:
            break
        for j in sorted(bad, reverse=True):
            dropped.append(DroppedRung(candidates[j].num_pages * shape.page_size, bad[j]))
            del candidates[j]
    for d in dropped:
        log.info("rung dropped", extra={"kv_tokens": d.kv_tokens, "reason": d.reason})
    rungs = tuple(Rung(i, g, g.num_pages * shape.page_size, model.total_bytes(g))
                  for i, g in enumerate(candidates))
    return Ladder(model, rungs, tuple(sorted(dropped, key=lambda d: d.kv_tokens)), transitions)


@dataclass(frozen=True, slots=True)
class PoolRange:
    """How far one pool can be resized live, honestly: every size from `minimum` to a maximum
    is one that `plan` sends.

    `max_keeping_others`: the largest such size with the other pools as they are. It is the
    current size or more when the live geometry passes the engine's fit-check, and can be
    less when it does not (ft serve's default boot): a shrink too small to bring the geometry
    under the fit-check is refused. `max_with_others_at_floor`: the largest size once the
    other pools shrink to their floors, which the planner reaches safely (shrinks first).
    Either is None when not even the floor is plannable. `advertised_max` is the engine's own
    single-pool `limits.*.max`, which ignores the other pools. KV sizes are in tokens.
    """

    pool: str
    unit: str
    minimum: int
    current: int
    max_keeping_others: int | None
    max_with_others_at_floor: int | None
    advertised_max: int


def _largest(lo: int, hi: int, ok: Callable[[int], bool]) -> int | None:
    """The largest n in [lo, hi] with ok(n), given ok holds on a prefix of the range."""
    if lo > hi or not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _largest_plannable(model: MemoryModel, live: Geometry, base: Geometry, pool: str,
                       floor: int, cap: int) -> int | None:
    """The largest size of `pool` on top of `base` such that `plan_transition` from `live`
    accepts every size from `floor` up to it.

    Plannable shrinks are a prefix (smaller always costs less) and so are grows above the live
    size (feasible up to the first that no longer fits), so binary searches find the answer
    without planning every size. Standing still is plannable even where a slightly smaller
    size is not; the search never reports it past such a gap.
    """
    current = pool_size(live, pool)

    def ok(size: int) -> bool:
        return plan_transition(model, live, base.with_sizes(**{SIZE_FIELD[pool]: size})).feasible

    # A grow that plans proves the sizes below it pass the fit-check too: no gap under it.
    grown = _largest(current + 1, cap, ok)
    if grown is not None:
        return grown
    return _largest(floor, min(current, cap), ok)


def reachable_ranges(model: MemoryModel, live: Geometry, limits: Limits) -> tuple[PoolRange, ...]:
    """Per pool, the sizes `plan` would send from `live` (see `PoolRange`)."""
    shape, floors = model.shape, model.floors
    page = shape.page_size
    floor_sizes = {
        "moe": floors.moe_slots if shape.max_expert_slots else live.moe_cache_size,
        "kv": max(1, math.ceil(floors.kv_tokens / page)),
        "mamba": floors.mamba_slots if shape.has_mamba else live.num_mamba_slots,
    }
    # The planner caps KV at nothing but the budget; the budget caps it at what fits alone.
    caps = {"moe": shape.max_expert_slots,
            "kv": max(live.num_pages, model.max_kv_pages(
                moe_slots=0, mamba_slots=0, swa_pages=live.num_swa_pages)),
            "mamba": max(live.num_mamba_slots, model.max_mamba_slots(
                moe_slots=0, kv_pages=0, swa_pages=live.num_swa_pages))}
    pools = []
    if shape.max_expert_slots:
        pools.append(("moe", "slots", floors.moe_slots, limits.moe_experts_max))
    pools.append(("kv", "tokens", floors.kv_tokens, limits.kv_tokens_max))
    if shape.has_mamba:
        pools.append(("mamba", "slots", floors.mamba_slots, limits.mamba_slots_max))
    ranges = []
    for pool, unit, minimum, advertised in pools:
        scale = page if pool == "kv" else 1
        at_floor = live.with_sizes(**{SIZE_FIELD[p]: floor_sizes[p] for p in SIZE_FIELD
                                      if p != pool})
        keeping = _largest_plannable(model, live, live, pool, floor_sizes[pool], caps[pool])
        lowered = _largest_plannable(model, live, at_floor, pool, floor_sizes[pool], caps[pool])
        current = pool_size(live, pool)
        ranges.append(PoolRange(
            pool, unit, minimum, current * scale,
            None if keeping is None else keeping * scale,
            None if lowered is None else lowered * scale, advertised))
    return tuple(ranges)
