"""What a geometry costs in bytes, and how many bytes the pools may hold at any instant.

The engine's fit-check prices only usable units; the memory really held also includes the KV
dummy page and the mamba sink slot (ftserve-control-plane.md §1.3, §2.1), so the planner prices
physical bytes: a plan that fits here fits in the engine's own check too.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.geometry import CacheStatus, EngineModel, Floors, Geometry, ModelShape, UnitCosts

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
