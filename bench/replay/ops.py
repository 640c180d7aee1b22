"""The chunk operations a reference-engine rebuild performs, counted without the memory.

Why: under live decode an incremental rebuild costs what its chunk operations cost, a slice of
them per decode round (the pause budget), so the replay needs each operation of a transition:
which pool, alloc, free or move, and how many bytes. This is the arithmetic of
`engine.reference.pools._ChunkedPool` (`_grow`, `_shrink`, `_shrink_tail`, `reallocate`) and of
`engine.reference.rebuild` (shrinking pools first, in the planner's pool order), replayed over
unit counts; tests/bench/replay/test_ops.py holds it to the real pools' event sequence.

What it cannot know is where live units sit, which decides the moves. `live_in(lo, hi)` says
how many of the pool's live units lie in units [lo, hi): KV pages and states are handed out
lowest first, so they are taken as packed at the front (`packed`); expert slots are freed by
LRU eviction all over the pool, so residents are taken as spread evenly (`spread`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from engine.ftserve.geometry import Geometry
from engine.ftserve.planner import POOL_ORDER, pool_size

__all__ = ["ChunkOp", "PoolLayout", "packed", "rebuild_ops", "resize_ops", "spread"]

LiveIn = Callable[[int, int], int]


@dataclass(frozen=True, slots=True)
class ChunkOp:
    """One operation; `usable_after` is the pool's usable units once it has run, `staged`
    marks the tail copy that goes through host memory (a D2H and an H2D copy)."""

    pool: str
    op: Literal["alloc", "free", "move"]
    nbytes: int
    usable_after: int
    staged: bool = False


@dataclass(frozen=True, slots=True)
class PoolLayout:
    unit_bytes: int
    chunk_bytes: int
    fixed_units: int  # the KV pool's dummy page, the state pool's sink slot

    @property
    def units_per_chunk(self) -> int:
        return max(1, self.chunk_bytes // self.unit_bytes)


def packed(fixed_units: int, live_units: int) -> LiveIn:
    """Live units at [fixed, fixed + live)."""
    def live_in(lo: int, hi: int) -> int:
        return max(0, min(hi, fixed_units + live_units) - max(lo, fixed_units))
    return live_in


def spread(total_units: int, live_units: int) -> LiveIn:
    """Live units spread evenly over [0, total)."""
    density = 0.0 if total_units <= 0 else min(1.0, live_units / total_units)

    def live_in(lo: int, hi: int) -> int:
        return round(density * max(0, hi - lo))
    return live_in


def _grow(name: str, layout: PoolLayout, physical: int, target: int) -> Iterator[ChunkOp]:
    upc, unit, fixed = layout.units_per_chunk, layout.unit_bytes, layout.fixed_units
    while physical < target:
        chunks = -(-physical // upc)
        tail = physical - (chunks - 1) * upc if chunks else upc
        if tail < upc:
            new_tail = min(upc, tail + target - physical)
            physical += new_tail - tail
            yield ChunkOp(name, "alloc", new_tail * unit, physical - fixed)
            yield ChunkOp(name, "free", tail * unit, physical - fixed)
        else:
            count = min(upc, target - physical)
            physical += count
            yield ChunkOp(name, "alloc", count * unit, physical - fixed)


def _shrink(name: str, layout: PoolLayout, physical: int, target: int,
            live_in: LiveIn) -> Iterator[ChunkOp]:
    upc, unit, fixed = layout.units_per_chunk, layout.unit_bytes, layout.fixed_units
    usable = target - fixed  # the limit drops to the target as the shrink starts
    chunks = -(-physical // upc)
    boundary = (target - 1) // upc
    for index in range(chunks - 1, boundary - 1, -1):
        lo, hi = max(index * upc, target), physical
        movers = live_in(lo, hi)
        if movers:
            yield ChunkOp(name, "move", movers * unit, usable)
        if index > boundary:
            tail = physical - index * upc
            physical -= tail
            yield ChunkOp(name, "free", tail * unit, usable)
    start = (-(-physical // upc) - 1) * upc
    keep, tail = target - start, physical - start
    if keep >= tail:
        return
    if live_in(start, target):
        yield ChunkOp(name, "free", tail * unit, usable)
        yield ChunkOp(name, "alloc", keep * unit, usable)
        yield ChunkOp(name, "move", keep * unit, usable, staged=True)
        return
    # Nothing live in the boundary chunk: the pool's limit drops to the chunk's start while
    # it is freed and reallocated, so for that moment fewer units are usable.
    yield ChunkOp(name, "free", tail * unit, max(0, start - fixed))
    yield ChunkOp(name, "alloc", keep * unit, usable)


def resize_ops(name: str, layout: PoolLayout, units: int, new_units: int,
               live_in: LiveIn) -> list[ChunkOp]:
    """One pool's `resize_steps(new_units)` from `units` usable units."""
    physical, target = units + layout.fixed_units, new_units + layout.fixed_units
    if target > physical:
        return list(_grow(name, layout, physical, target))
    if target < physical:
        return list(_shrink(name, layout, physical, target, live_in))
    return []


def reallocate_ops(name: str, layout: PoolLayout, units: int, new_units: int) -> list[ChunkOp]:
    """One pool's `reallocate(new_units)`: every chunk freed, then the new size allocated."""
    upc, unit = layout.units_per_chunk, layout.unit_bytes
    physical = units + layout.fixed_units
    ops: list[ChunkOp] = []
    while physical > 0:
        chunks = -(-physical // upc)
        tail = physical - (chunks - 1) * upc
        physical -= tail
        ops.append(ChunkOp(name, "free", tail * unit, 0))
    ops.extend(_grow(name, layout, 0, new_units + layout.fixed_units))
    return ops


def rebuild_ops(layouts: Mapping[str, PoolLayout], live: Geometry, target: Geometry,
                live_in: Mapping[str, LiveIn], *, freetoken: bool) -> list[ChunkOp]:
    """Every operation of one rebuild, in the engine's order: incremental shrinks the
    shrinking pools first, then grows; `freetoken` reallocates each touched pool in the
    planner's order (MoE, KV, mamba)."""
    changed = [p for p in POOL_ORDER if p in layouts and pool_size(live, p) != pool_size(
        target, p)]
    if freetoken:
        return [op for p in changed
                for op in reallocate_ops(p, layouts[p], pool_size(live, p), pool_size(target, p))]
    shrinks = [p for p in changed if pool_size(target, p) < pool_size(live, p)]
    return [op for p in shrinks + [p for p in changed if p not in shrinks]
            for op in resize_ops(p, layouts[p], pool_size(live, p), pool_size(target, p),
                                 live_in[p])]
