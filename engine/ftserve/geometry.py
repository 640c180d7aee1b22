"""The pool geometry, unit costs and budget an engine reports in `GET /v1/cache/status`.

ft serve 0.1.2 and 0.2.1 serve the same document (0.1.2's are captured in
tests/fixtures/freetoken-0.1.2/cache_status.*.json); the reference engine serves it too, plus an
`engine` object that says how it executes a rebuild. Parsing is strict: a field that is missing,
of the wrong type, or that would make a price meaningless (a unit cost of 0 means "unknown")
raises `engine.ftserve.fields.DocumentError` naming the field, and nothing else is ever raised,
whatever the input.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from engine.ftserve.fields import DocumentError, mapping, opt_str, req_int, req_str, required

__all__ = [
    "REFERENCE_ENGINE_NAME",
    "CacheStatus",
    "EngineModel",
    "Floors",
    "Geometry",
    "LastRebuild",
    "Limits",
    "ModelShape",
    "UnitCosts",
    "parse_cache_status",
]

REFERENCE_ENGINE_NAME = "moe-ladder-reference"

EngineKind = Literal["freetoken", "reference"]


@dataclass(frozen=True, slots=True)
class Geometry:
    """Pool sizes in the engine's own units: expert slots, usable KV pages, mamba slots."""

    moe_cache_size: int
    num_pages: int
    num_mamba_slots: int
    num_swa_pages: int = 0

    def with_sizes(
        self,
        *,
        moe_cache_size: int | None = None,
        num_pages: int | None = None,
        num_mamba_slots: int | None = None,
    ) -> Geometry:
        return replace(
            self,
            moe_cache_size=self.moe_cache_size if moe_cache_size is None else moe_cache_size,
            num_pages=self.num_pages if num_pages is None else num_pages,
            num_mamba_slots=self.num_mamba_slots if num_mamba_slots is None else num_mamba_slots,
        )

    def to_json(self) -> dict[str, int]:
        return {
            "moe_cache_size": self.moe_cache_size,
            "num_pages": self.num_pages,
            "num_mamba_slots": self.num_mamba_slots,
        }


@dataclass(frozen=True, slots=True)
class UnitCosts:
    """Bytes per unit of each pool, as measured by the engine at readiness."""

    kv_per_token: int
    moe_per_expert: int
    mamba_per_slot: int
    swa_per_token: int


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the model fixes: page size, expert count, and which pools exist."""

    page_size: int
    num_experts: int
    num_moe_layers: int
    swa_page_size: int
    has_mamba: bool
    has_swa: bool

    @property
    def max_expert_slots(self) -> int:
        """Slots beyond one per (layer, expert) can never hold anything."""
        return self.num_experts * self.num_moe_layers

    def pages_for_tokens(self, kv_tokens: int) -> int:
        """Usable pages that hold `kv_tokens`, rounded up as `ft ctl cache` does."""
        return math.ceil(kv_tokens / self.page_size)


@dataclass(frozen=True, slots=True)
class Floors:
    """The smallest size each pool may be rebuilt to (engine floors from `limits.*.min`)."""

    kv_tokens: int
    moe_slots: int
    mamba_slots: int


@dataclass(frozen=True, slots=True)
class Limits:
    """The engine's advertised single-pool `max` values (optimistic: other pools ignored)."""

    kv_tokens_max: int
    moe_experts_max: int
    mamba_slots_max: int


@dataclass(frozen=True, slots=True)
class LastRebuild:
    request_id: str | None
    status: str
    error: str | None


@dataclass(frozen=True, slots=True)
class EngineModel:
    """How the engine executes one rebuild call, which decides how the planner prices it.

    `freetoken`: pools resized in the order MoE, KV (+window), mamba; each frees only itself
    before allocating. `reference`: free-first and chunked inside one call, growing one chunk
    at a time. Both keep one dummy KV page and one sink mamba slot beyond the usable counts.
    """

    kind: EngineKind
    name: str
    chunk_bytes: int = 0
    serves_while_rebuilding: bool = False
    dummy_kv_pages: int = 1
    sink_mamba_slots: int = 1


FREETOKEN = EngineModel(kind="freetoken", name="ft serve")


@dataclass(frozen=True, slots=True)
class CacheStatus:
    """One parsed `/v1/cache/status` document."""

    state: str
    geometry: Geometry
    shape: ModelShape
    units: UnitCosts
    floors: Floors
    limits: Limits
    cache_budget_bytes: int
    last_rebuild: LastRebuild | None
    engine: EngineModel


def _unit(units: Mapping[str, Any], key: str, needed_for: str | None) -> int:
    value = req_int(units, key, "geometry.unit_bytes.")
    if needed_for is not None and value == 0:
        raise DocumentError(
            f"geometry.unit_bytes.{key}",
            f"0 means the engine does not know the cost of {needed_for}; "
            "sizes cannot be priced without it",
        )
    return value


def _limit(limits: Mapping[str, Any], pool: str, bound: str) -> int:
    entry = mapping(required(limits, pool, "geometry.limits."), f"geometry.limits.{pool}")
    return req_int(entry, bound, f"geometry.limits.{pool}.")


def _parse_engine(doc: Mapping[str, Any]) -> EngineModel:
    raw = doc.get("engine")
    if raw is None:
        return FREETOKEN
    engine = mapping(raw, "engine")
    name = req_str(engine, "name", "engine.")
    mode = required(engine, "rebuild_mode", "engine.")
    if mode not in ("incremental", "freetoken"):
        raise DocumentError(
            "engine.rebuild_mode", f"expected 'incremental' or 'freetoken', got {mode!r}"
        )
    if mode == "freetoken":
        return replace(FREETOKEN, name=name)
    return EngineModel(
        kind="reference",
        name=name,
        chunk_bytes=req_int(engine, "chunk_bytes", "engine.", minimum=1),
        serves_while_rebuilding=True,
    )


def _parse_last_rebuild(raw: Any) -> LastRebuild | None:
    if raw is None:
        return None
    last = mapping(raw, "last_rebuild")
    status = req_str(last, "status", "last_rebuild.")
    return LastRebuild(
        request_id=opt_str(last, "request_id", "last_rebuild."),
        status=status,
        error=opt_str(last, "error", "last_rebuild."),
    )


def parse_cache_status(doc: Any) -> CacheStatus:
    """Parse a decoded `/v1/cache/status` body; raise `DocumentError` naming the bad field."""
    top = mapping(doc, "document")
    state = req_str(top, "state", "")
    geo = mapping(required(top, "geometry", ""), "geometry")
    g = "geometry."
    page_size = req_int(geo, "page_size", g, minimum=1)
    num_experts = req_int(geo, "num_experts", g)
    num_moe_layers = req_int(geo, "num_moe_layers", g)
    geometry = Geometry(
        moe_cache_size=req_int(geo, "moe_cache_size", g),
        num_pages=req_int(geo, "num_pages", g, minimum=1),
        num_mamba_slots=req_int(geo, "num_mamba_slots", g),
        num_swa_pages=req_int(geo, "num_swa_pages", g) if "num_swa_pages" in geo else 0,
    )
    swa_page_size = req_int(geo, "swa_page_size", g) if "swa_page_size" in geo else 0
    has_moe = num_moe_layers > 0
    if has_moe and num_experts == 0:
        raise DocumentError("geometry.num_experts", "0 although num_moe_layers > 0")
    shape = ModelShape(
        page_size=page_size,
        num_experts=num_experts,
        num_moe_layers=num_moe_layers,
        swa_page_size=swa_page_size,
        has_mamba=geometry.num_mamba_slots > 0,
        has_swa=geometry.num_swa_pages > 0,
    )
    if shape.has_swa and swa_page_size == 0:
        raise DocumentError("geometry.swa_page_size", "0 although num_swa_pages > 0")
    units_doc = mapping(required(geo, "unit_bytes", g), "geometry.unit_bytes")
    units = UnitCosts(
        kv_per_token=_unit(units_doc, "kv_per_token", "a KV token"),
        moe_per_expert=_unit(units_doc, "moe_per_expert", "an expert slot" if has_moe else None),
        mamba_per_slot=_unit(
            units_doc, "mamba_per_slot", "a mamba slot" if shape.has_mamba else None
        ),
        swa_per_token=_unit(units_doc, "swa_per_token", "a window token" if shape.has_swa else None)
        if "swa_per_token" in units_doc or shape.has_swa
        else 0,
    )
    limits_doc = mapping(required(geo, "limits", g), "geometry.limits")
    floors = Floors(
        kv_tokens=max(1, _limit(limits_doc, "kv_tokens", "min")),
        moe_slots=_limit(limits_doc, "moe_experts", "min"),
        mamba_slots=_limit(limits_doc, "mamba_slots", "min"),
    )
    limits = Limits(
        kv_tokens_max=_limit(limits_doc, "kv_tokens", "max"),
        moe_experts_max=_limit(limits_doc, "moe_experts", "max"),
        mamba_slots_max=_limit(limits_doc, "mamba_slots", "max"),
    )
    return CacheStatus(
        state=state,
        geometry=geometry,
        shape=shape,
        units=units,
        floors=floors,
        limits=limits,
        cache_budget_bytes=req_int(geo, "cache_budget_bytes", g, minimum=1),
        last_rebuild=_parse_last_rebuild(top.get("last_rebuild")),
        engine=_parse_engine(top),
    )
