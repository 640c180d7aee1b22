"""What a geometry costs in bytes, and how many bytes the pools may hold at any instant.

Two prices, because they are different facts. The memory really held (`total_bytes`) includes
the KV dummy page and the mamba sink slot beyond the usable counts; the planner prices every
instant with it. ft serve's rebuild fit-check (`fit_check_bytes`) counts the sink slot
(`target_mamba = num_mamba_slots + 1`) but not the dummy page, and its boot sizes KV from a
free-memory reading rather than from `cache_budget_bytes`, so a server booted without
`--num-tokens` holds a page or more above the budget from its first second. Those bytes exist,
so an instant at or below what the live geometry holds is as safe as now (`ceiling_bytes`);
only bytes above it must fit the budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.ftserve.geometry import (
    CacheStatus,
    EngineModel,
    Floors,
    Geometry,
    ModelShape,
    UnitCosts,
)

__all__ = ["MemoryModel", "PoolBytes"]


@dataclass(frozen=True, slots=True)
class PoolBytes:
    """Physical bytes per pool, in ft serve's rebuild order (the window pool rides with KV)."""

    moe: int
    kv: int
    mamba: int

    @property
    def total(self) -> int:
        return self.moe + self.kv + self.mamba


@dataclass(frozen=True, slots=True)
class MemoryModel:
    """Everything needed to price a geometry: shape, unit costs, floors, budget, engine.

    `budget_bytes` is what the pools may hold together at every instant: the engine's
    `cache_budget_bytes` less the fixed costs its fit-check adds (`fixed_bytes`: window mapping,
    GDN extras not in `unit_bytes`) and the operator's safety `reserve_bytes`.
    """

    shape: ModelShape
    units: UnitCosts
    floors: Floors
    engine: EngineModel
    cache_budget_bytes: int
    fixed_bytes: int = 0
    reserve_bytes: int = 0

    @classmethod
    def from_status(
        cls, status: CacheStatus, *, fixed_bytes: int = 0, reserve_bytes: int = 0
    ) -> MemoryModel:
        return cls(
            shape=status.shape,
            units=status.units,
            floors=status.floors,
            engine=status.engine,
            cache_budget_bytes=status.cache_budget_bytes,
            fixed_bytes=fixed_bytes,
            reserve_bytes=reserve_bytes,
        )

    @property
    def budget_bytes(self) -> int:
        return self.cache_budget_bytes - self.fixed_bytes - self.reserve_bytes

    @property
    def kv_bytes_per_page(self) -> int:
        return self.shape.page_size * self.units.kv_per_token

    def moe_bytes(self, slots: int) -> int:
        return slots * self.units.moe_per_expert

    def kv_bytes(self, num_pages: int, num_swa_pages: int = 0) -> int:
        usable = num_pages + (self.engine.dummy_kv_pages if num_pages else 0)
        window = num_swa_pages * self.shape.swa_page_size * self.units.swa_per_token
        return usable * self.kv_bytes_per_page + window

    def mamba_bytes(self, slots: int) -> int:
        physical = slots + (self.engine.sink_mamba_slots if slots else 0)
        return physical * self.units.mamba_per_slot

    def pool_bytes(self, geometry: Geometry) -> PoolBytes:
        return PoolBytes(
            moe=self.moe_bytes(geometry.moe_cache_size),
            kv=self.kv_bytes(geometry.num_pages, geometry.num_swa_pages),
            mamba=self.mamba_bytes(geometry.num_mamba_slots),
        )

    def total_bytes(self, geometry: Geometry) -> int:
        return self.pool_bytes(geometry).total

    def fits(self, geometry: Geometry) -> bool:
        return self.total_bytes(geometry) <= self.budget_bytes

    def ceiling_bytes(self, live: Geometry) -> int:
        """The most any instant of a transition from `live` may hold: the budget, or what the
        live geometry already holds when that is more (those bytes are proven to exist)."""
        return max(self.budget_bytes, self.total_bytes(live))

    def over_budget_bytes(self, live: Geometry) -> int:
        """How far the live geometry is above the budget; 0 when it fits."""
        return max(0, self.total_bytes(live) - self.budget_bytes)

    def fit_check_bytes(self, geometry: Geometry) -> int:
        """What the engine's own fit-check prices: the dummy KV page is not counted, the mamba
        sink slot is (engine.py:780-806), and so are the fixed costs it adds."""
        dummy = self.engine.dummy_kv_pages if geometry.num_pages else 0
        return self.total_bytes(geometry) - dummy * self.kv_bytes_per_page + self.fixed_bytes

    def engine_accepts(self, geometry: Geometry) -> bool:
        """Whether the engine's fit-check lets a call end at `geometry` (else: `rejected`)."""
        return self.fit_check_bytes(geometry) <= self.cache_budget_bytes

    def boot_kv_pages(self, *, moe_slots: int, mamba_slots: int, drift_bytes: int = 0) -> int:
        """Usable KV pages ft serve's boot gives KV without `--num-tokens` (engine.py:343-345,
        `solve_num_pages`): what its budget leaves beside the experts and the physical GDN
        pool, over the bytes per page, the dummy page not counted. Its budget is a free-memory
        reading, `drift_bytes` off `cache_budget_bytes` (+2 MiB in issue 16's report)."""
        available = (self.cache_budget_bytes + drift_bytes - self.fixed_bytes
                     - self.moe_bytes(moe_slots) - self.mamba_bytes(mamba_slots))
        return max(1, available // self.kv_bytes_per_page)

    def max_moe_slots(self, *, kv_pages: int, mamba_slots: int, swa_pages: int = 0) -> int:
        """Most expert slots that fit beside the given KV and mamba pools (capped at E*L)."""
        if self.shape.max_expert_slots == 0:
            return 0
        free = self.budget_bytes - self.kv_bytes(kv_pages, swa_pages) - self.mamba_bytes(
            mamba_slots
        )
        if free < 0:
            return 0
        return min(self.shape.max_expert_slots, free // self.units.moe_per_expert)

    def max_kv_pages(self, *, moe_slots: int, mamba_slots: int, swa_pages: int = 0) -> int:
        """Most usable KV pages that fit beside the given expert and mamba pools."""
        window = swa_pages * self.shape.swa_page_size * self.units.swa_per_token
        free = self.budget_bytes - self.moe_bytes(moe_slots) - self.mamba_bytes(mamba_slots)
        pages = (free - window) // self.kv_bytes_per_page - self.engine.dummy_kv_pages
        return max(0, pages)

    def max_mamba_slots(self, *, moe_slots: int, kv_pages: int, swa_pages: int = 0) -> int:
        if not self.shape.has_mamba:
            return 0
        free = self.budget_bytes - self.moe_bytes(moe_slots) - self.kv_bytes(kv_pages, swa_pages)
        return max(0, free // self.units.mamba_per_slot - self.engine.sink_mamba_slots)
