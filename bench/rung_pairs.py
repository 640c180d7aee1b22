"""Every ordered pair of rungs on four geometries: does one `ft serve` call survive it, and
does moe-ladder's plan?

Why: ft serve resizes MoE, then KV, then mamba inside one rebuild call, each pool freeing only
itself, and its fit-check prices only the final geometry (README, "How a transition is
priced"). A ladder is only worth having if every transition between its rungs is safe on a
nearly full card, so this bench takes four geometries (the motivating report's RTX 5080 and
three built from the published figures, bench/geometries/*.json, each with a `_note` citing
its sources), builds the ladder with the budget filled to 90, 95, 99 and 100 %, and prices
every ordered rung pair with the real parser, ladder builder and planner; then it runs a sample
of the same transitions on the reference engine with real allocations, over loopback HTTP, in
both rebuild modes.

What "budget filled to X %" means here:
- the ladder is built with `reserve_bytes = cache_budget_bytes - floor(X * cache_budget_bytes)`,
  so every rung's pools total at most X % of `cache_budget_bytes` (rungs give what KV and mamba
  leave to expert slots), and moe-ladder's plans are priced against that same reduced budget,
  as `ladder run --reserve` would price them;
- the card's physical room for the pools is `cache_budget_bytes + headroom_bytes` whatever the
  fill: the headroom is what ft serve's `(1 - memory_ratio)` leaves beyond the budget, less the
  non-cache allocations that live there (graph pool, capture buffer, workspaces).
  For the report it is the 511.5 MiB its OOM message found free; for the others it is
  `(1 - memory_ratio) * (total - context) - non_budget`, inputs in each file's `_bench`;
- a single ft serve call *completes* when its worst instant fits in budget + headroom (the
  real OOM condition: the fit-check passes, every rung fits the budget); it *OOMs* otherwise,
  rolling back cleanly when the first instant over the card is the MoE allocation, latching
  `failed` (#526) when it is the KV or mamba one. moe-ladder's plan must keep every instant
  within `cache_budget_bytes` itself (it keeps them within X % of it).

Modes (both print ONE JSON object; `--out FILE` writes it too):
- `--mode plan`: pure and fast; per geometry x fill x ordered pair and aggregated.
- `--mode engine --device cpu|cuda`: a geometry scaled onto the tiny reference model (slots
  counted from the floor: `num_experts` real slots = `experts` tiny slots; every byte figure
  scaled by the same factor), ladder built from the engine's own `/v1/cache/status` at 99 %
  fill, and for each sampled pair: (a) the single call in `freetoken` mode, (b) moe-ladder's
  plan through `ladder.executor.apply_target`, also in `freetoken` mode, (c) the single call in
  `incremental` mode. On CPU `DeviceMemory` caps the pools at budget + headroom; on CUDA the
  engine's driver filler makes the GPU a 16 GiB card (larger when a scaled geometry's pools
  need it; `--card-gib` sets it), a stand-in for the model's weights is
  allocated first so that what is left for the pools is the scaled budget + headroom, and the
  OOMs are the driver's. Real peaks: `engine.memory.peak_bytes` (exact pool bytes) and, on
  CUDA, `torch.cuda.max_memory_allocated()` minus the bytes allocated before the transition.

    python bench/rung_pairs.py --mode plan
    python bench/rung_pairs.py --mode engine --device cpu
    python bench/rung_pairs.py --mode engine --device cuda --out transitions-h200.json

The figures of the recorded runs are in README.md ("Results": transitions) and bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from engine.reference.runtime import RebuildMode

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.output import report_json
from engine.ftserve.budget import MemoryModel
from engine.ftserve.geometry import CacheStatus, Geometry, parse_cache_status
from engine.ftserve.planner import call_instants, plan_transition
from ladder.rungs import Ladder, LadderSpec, build_ladder

ROOT = Path(__file__).resolve().parent.parent
GEOMETRY_DIR = Path(__file__).resolve().parent / "geometries"
REPORT_FIXTURE = ROOT / "tests" / "fixtures" / "seed-rtx5080-status.json"
GIB = 1 << 30
MIB = 1 << 20
FILLS = (0.90, 0.95, 0.99, 1.00)
ENGINE_FILL = 0.99
# The report's server: --max-seq-len-override 262144 --memory-ratio 0.95.
REPORT_BENCH = {"card": "RTX 5080 16 GB", "memory_ratio": 0.95, "kv_max_tokens": 262144,
                "headroom_bytes": int(511.5 * MIB),
                "headroom_source": "511.5 MiB free beyond the pools at the report's OOM "
                                   "(= engine.reference.scenarios.REPORT.free_at_oom_bytes; "
                                   "not imported here because that module pulls in torch)"}
# The report's two `ft ctl cache` calls (moe, kv tokens, mamba or None = unchanged).
REPORT_CASES = ((1024, 65536, None), (1400, 8192, 4))


# ---- geometries -----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class BenchGeometry:
    """One card: the parsed status, the physical headroom beyond its budget, its context."""

    name: str
    path: str
    status: CacheStatus
    headroom_bytes: int
    kv_max_tokens: int
    memory_ratio: float
    headroom_source: str

    @property
    def budget_bytes(self) -> int:
        return self.status.cache_budget_bytes

    @property
    def capacity_bytes(self) -> int:
        """What the pools may physically hold together before the driver says OOM."""
        return self.status.cache_budget_bytes + self.headroom_bytes


def _headroom_bytes(bench: dict[str, Any]) -> int:
    if "headroom_bytes" in bench:
        return int(bench["headroom_bytes"])
    usable = bench["total_capacity_bytes"] - bench["context_bytes"]
    return int((1.0 - bench["memory_ratio"]) * usable) - int(bench["non_budget_bytes"])


def load_geometry(path: Path, bench: dict[str, Any] | None = None) -> BenchGeometry:
    doc = json.loads(path.read_text())
    bench = bench if bench is not None else doc["_bench"]
    name = path.stem if path != REPORT_FIXTURE else "rtx5080-report-16gb"
    rel = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    return BenchGeometry(name=name, path=rel, status=parse_cache_status(doc),
                         headroom_bytes=_headroom_bytes(bench),
                         kv_max_tokens=int(bench["kv_max_tokens"]),
                         memory_ratio=float(bench["memory_ratio"]),
                         headroom_source=str(bench["headroom_source"]))


def load_geometries(names: Sequence[str] | None = None) -> list[BenchGeometry]:
    found = [load_geometry(REPORT_FIXTURE, REPORT_BENCH)]
    found += [load_geometry(p) for p in sorted(GEOMETRY_DIR.glob("*.json"))]
    if names:
        unknown = set(names) - {g.name for g in found}
        if unknown:
            raise SystemExit(f"unknown geometry {sorted(unknown)}; known: "
                             f"{[g.name for g in found]}")
        found = [g for g in found if g.name in names]
    return found


def reserve_for_fill(budget_bytes: int, fill: float) -> int:
    """The ladder reserve that leaves `fill` of the budget to the rungs."""
    if not 0.0 < fill <= 1.0:
        raise ValueError(f"fill must be in (0, 1], got {fill}")
    return budget_bytes - math.floor(fill * budget_bytes)


def fill_ladder(status: CacheStatus, fill: float, spec: LadderSpec) -> Ladder:
    reserve = reserve_for_fill(status.cache_budget_bytes, fill)
    model = MemoryModel.from_status(status, reserve_bytes=reserve)
    return build_ladder(model, status.geometry, replace(spec, reserve_bytes=reserve))


# ---- plan mode ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Direction:
    grows_moe: bool
    shrinks_kv: bool
    shrinks_mamba: bool

    @classmethod
    def of(cls, start: Geometry, target: Geometry) -> Direction:
        return cls(target.moe_cache_size > start.moe_cache_size,
                   target.num_pages < start.num_pages,
                   target.num_mamba_slots < start.num_mamba_slots)

    @property
    def risky(self) -> bool:
        """Grows MoE while shrinking KV or mamba: the new experts are allocated while the old
        KV or mamba is still held, the one shape a single call on a full card cannot do."""
        return self.grows_moe and (self.shrinks_kv or self.shrinks_mamba)


@dataclass(frozen=True, slots=True)
class PairResult:
    src: int
    dst: int
    start: dict[str, int]
    target: dict[str, int]
    grows_moe: bool
    shrinks_kv_or_mamba: bool
    risky: bool
    target_bytes: int
    moe_growth_bytes: int
    single_call_peak_bytes: int
    single_call_over_budget: bool
    single_call_ooms: bool
    single_call_outcome: str
    plan_feasible: bool
    plan_calls: int
    plan_peak_bytes: int
    plan_reason: str


def single_call_outcome(model: MemoryModel, start: Geometry, target: Geometry,
                        capacity_bytes: int) -> str:
    """What one ft serve call does: `ok`, or which pool's allocation hits the card first."""
    engine_model = MemoryModel(model.shape, model.units, model.floors, model.engine,
                               model.cache_budget_bytes)
    if not engine_model.fits(target):
        return "rejected_by_fit_check"
    for instant in call_instants(engine_model, start, target):
        if instant.total_bytes > capacity_bytes:
            pool = instant.what.split()[0]
            return "oom_rolled_back" if pool == "moe" else "oom_latched_failed"
    return "ok"


def price_pair(model: MemoryModel, ladder: Ladder, src: int, dst: int,
               capacity_bytes: int) -> PairResult:
    a, b = ladder.rungs[src].geometry, ladder.rungs[dst].geometry
    plan = ladder.transitions[(src, dst)]
    direction = Direction.of(a, b)
    outcome = single_call_outcome(model, a, b, capacity_bytes)
    return PairResult(
        src=src, dst=dst, start=a.to_json(), target=b.to_json(),
        grows_moe=direction.grows_moe,
        shrinks_kv_or_mamba=direction.shrinks_kv or direction.shrinks_mamba,
        risky=direction.risky, target_bytes=model.total_bytes(b),
        moe_growth_bytes=max(0, model.moe_bytes(b.moe_cache_size)
                             - model.moe_bytes(a.moe_cache_size)),
        single_call_peak_bytes=plan.single_call_peak_bytes,
        single_call_over_budget=plan.single_call_peak_bytes > model.cache_budget_bytes,
        single_call_ooms=outcome.startswith("oom"), single_call_outcome=outcome,
        plan_feasible=plan.feasible, plan_calls=len(plan.steps), plan_peak_bytes=plan.peak_bytes,
        plan_reason=plan.reason)


def aggregate(pairs: Sequence[PairResult], budget_bytes: int) -> dict[str, Any]:
    risky = {(p.src, p.dst) for p in pairs if p.risky}
    ooms = {(p.src, p.dst) for p in pairs if p.single_call_ooms}
    feasible = [p for p in pairs if p.plan_feasible]
    risky_ok = [p for p in pairs if p.risky and not p.single_call_ooms]
    return {
        "pairs": len(pairs),
        "risky_pairs": len(risky),
        "single_call_over_budget": sum(p.single_call_over_budget for p in pairs),
        "single_call_failures": len(ooms),
        "single_call_outcomes": dict(Counter(p.single_call_outcome for p in pairs)),
        "plan_failures": len(pairs) - len(feasible),
        "plan_calls": {str(k): v for k, v in sorted(Counter(p.plan_calls for p in feasible)
                                                    .items())},
        "plan_calls_total": sum(p.plan_calls for p in feasible),
        "max_plan_peak_over_budget": round(max((p.plan_peak_bytes for p in feasible),
                                               default=0) / budget_bytes, 6),
        "plan_peaks_within_budget": all(p.plan_peak_bytes <= budget_bytes for p in feasible),
        "max_single_call_peak_over_budget": round(max((p.single_call_peak_bytes
                                                       for p in pairs), default=0)
                                                  / budget_bytes, 6),
        # The expectation, checked rather than asserted.
        "failures_exactly_risky": ooms == risky,
        "risky_but_completes": len(risky_ok),
        "fails_but_not_risky": len(ooms - risky),
        # A risky call OOMs once the MoE it adds exceeds what the card has beyond the start.
        "risky_completes_max_moe_growth_bytes": max(
            (p.moe_growth_bytes for p in risky_ok), default=None),
        "risky_fails_min_moe_growth_bytes": min(
            (p.moe_growth_bytes for p in pairs if p.single_call_ooms), default=None),
    }


def run_plan_mode(geometries: Sequence[BenchGeometry], fills: Sequence[float],
                  *, include_pairs: bool) -> dict[str, Any]:
    results = []
    table = []
    for geo in geometries:
        spec = LadderSpec(kv_max_tokens=geo.kv_max_tokens)
        per_fill = []
        for fill in fills:
            ladder = fill_ladder(geo.status, fill, spec)
            pairs = [price_pair(ladder.model, ladder, i, j, geo.capacity_bytes)
                     for i in range(len(ladder.rungs)) for j in range(len(ladder.rungs))
                     if i != j]
            summary = aggregate(pairs, geo.budget_bytes)
            entry = {"fill": fill, "reserve_bytes": ladder.model.reserve_bytes,
                     "rungs": [r.to_json() for r in ladder.rungs],
                     "dropped_rungs": [asdict(d) for d in ladder.dropped],
                     "max_rung_bytes_over_budget": round(
                         max(r.total_bytes for r in ladder.rungs) / geo.budget_bytes, 6),
                     "summary": summary}
            if include_pairs:
                entry["pairs"] = [asdict(p) for p in pairs]
            per_fill.append(entry)
            table.append({"geometry": geo.name, "fill": fill, "rungs": len(ladder.rungs),
                          **{k: summary[k] for k in (
                              "pairs", "risky_pairs", "single_call_over_budget",
                              "single_call_failures", "plan_failures", "plan_calls",
                              "max_plan_peak_over_budget", "failures_exactly_risky",
                              "risky_but_completes", "fails_but_not_risky")}})
        results.append({"geometry": geo.name, "path": geo.path,
                        "budget_bytes": geo.budget_bytes, "headroom_bytes": geo.headroom_bytes,
                        "capacity_bytes": geo.capacity_bytes,
                        "headroom_source": geo.headroom_source,
                        "memory_ratio": geo.memory_ratio, "kv_max_tokens": geo.kv_max_tokens,
                        "live": geo.status.geometry.to_json(),
                        "report_cases": report_cases(geo) if geo.path.endswith(
                            REPORT_FIXTURE.name) else [],
                        "fills": per_fill})
    at_99 = [row for row in table if row["fill"] == ENGINE_FILL]
    return {"table": table, "geometries": results,
            "target_at_99": {
                "plan_failures": sum(r["plan_failures"] for r in at_99),
                "all_plan_peaks_within_budget": all(
                    r["max_plan_peak_over_budget"] <= 1.0 for r in at_99),
                "single_call_failures": sum(r["single_call_failures"] for r in at_99),
                "pairs": sum(r["pairs"] for r in at_99),
                "failures_exactly_risky_everywhere": all(
                    r["failures_exactly_risky"] for r in at_99)}}


def report_cases(geo: BenchGeometry) -> list[dict[str, Any]]:
    """The report's two `ft ctl cache` calls from its live geometry: a check on the pricing."""
    model = MemoryModel.from_status(geo.status)
    live = geo.status.geometry
    out = []
    for moe, kv_tokens, mamba in REPORT_CASES:
        target = live.with_sizes(moe_cache_size=moe,
                                 num_pages=geo.status.shape.pages_for_tokens(kv_tokens),
                                 num_mamba_slots=mamba)
        plan = plan_transition(model, live, target)
        out.append({"target": target.to_json(), "single_call_peak_bytes":
                    plan.single_call_peak_bytes,
                    "single_call_outcome": single_call_outcome(model, live, target,
                                                               geo.capacity_bytes),
                    "plan_feasible": plan.feasible, "plan_calls": len(plan.steps),
                    "plan_bodies": [dict(s.body) for s in plan.steps],
                    "plan_peak_bytes": plan.peak_bytes})
    return out


# ---- engine mode ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class EngineSizes:
    """The tiny model a geometry is scaled onto, and the ladder's KV floor at that scale."""

    layers: int
    experts: int
    hidden: int
    expert_hidden: int
    head_dim: int
    page_size: int
    chunk_bytes: int
    kv_floor_tokens: int
    max_running_requests: int = 4


SIZES = {
    # The smallest that still shows the report's shape (tests).
    "tiny": EngineSizes(layers=4, experts=32, hidden=32, expert_hidden=64, head_dim=16,
                        page_size=16, chunk_bytes=256 << 10, kv_floor_tokens=128),
    # CI: engine.reference.scenarios.report_config's model (8 x 64 experts of 64 KiB).
    "ci": EngineSizes(layers=8, experts=64, hidden=64, expert_hidden=128, head_dim=32,
                      page_size=16, chunk_bytes=MIB, kv_floor_tokens=256),
    # CUDA: 8 MiB experts, 4 x 64 of them (a 2 GiB pinned host bank), 16 KiB KV tokens.
    "cuda": EngineSizes(layers=4, experts=64, hidden=2048, expert_hidden=512, head_dim=512,
                        page_size=16, chunk_bytes=2 * MIB * 16, kv_floor_tokens=2048),
}


@dataclass(frozen=True, slots=True)
class ScaledGeometry:
    """A bench geometry at the tiny model's scale: same byte proportions, tiny units."""

    source: str
    scale: float
    spec: Any  # engine.reference.decoder.ModelSpec (imported lazily: torch)
    budget_bytes: int
    headroom_bytes: int
    kv_max_tokens: int
    mamba_slots: int
    max_running_requests: int
    chunk_bytes: int
    kv_floor_tokens: int


def scale_geometry(geo: BenchGeometry, sizes: EngineSizes) -> ScaledGeometry:
    """`num_experts` real slots become `sizes.experts` tiny slots; bytes keep their ratios.

    The tiny model gets at least as many layers as the budget holds layers' worth of experts
    (`sizes.layers` at the least): with fewer, its `layers x experts` slot cap would stop
    every rung short of the budget, and nothing would be near full.
    """
    from engine.reference.decoder import ModelSpec

    units, shape = geo.status.units, geo.status.shape
    layers_worth = geo.budget_bytes / (units.moe_per_expert * shape.num_experts)
    probe = ModelSpec(num_layers=max(sizes.layers, math.ceil(layers_worth)),
                      num_experts=sizes.experts, top_k=2,
                      hidden=sizes.hidden, expert_hidden=sizes.expert_hidden,
                      head_dim=sizes.head_dim, page_size=sizes.page_size)
    scale = (probe.expert_bytes * sizes.experts) / (units.moe_per_expert * shape.num_experts)
    has_mamba = geo.status.geometry.num_mamba_slots > 0
    per_head = probe.num_layers * sizes.head_dim ** 2 * 4
    heads = max(1, round(units.mamba_per_slot * scale / per_head)) if has_mamba else 1
    spec = replace(probe, state_heads=heads)
    kv_tokens_per_real = units.kv_per_token * scale / spec.kv_bytes_per_token
    # A model without a mamba pool still gets the reference engine's floor of states (tiny).
    mamba = geo.status.geometry.num_mamba_slots if has_mamba else sizes.max_running_requests
    return ScaledGeometry(
        source=geo.name, scale=scale, spec=spec,
        budget_bytes=int(geo.budget_bytes * scale),
        headroom_bytes=int(geo.headroom_bytes * scale),
        kv_max_tokens=max(sizes.kv_floor_tokens,
                          int(geo.kv_max_tokens * kv_tokens_per_real)),
        mamba_slots=max(mamba, sizes.max_running_requests),
        max_running_requests=sizes.max_running_requests,
        chunk_bytes=sizes.chunk_bytes, kv_floor_tokens=sizes.kv_floor_tokens)


@dataclass(frozen=True, slots=True)
class EngineRun:
    """One transition executed on a fresh engine."""

    how: str
    mode: str
    reached: bool
    calls: int
    ooms: int
    outcome: str
    seconds: float
    final_state: str
    predicted_peak_bytes: int
    real_peak_bytes: int
    cuda_peak_delta_bytes: int | None
    cuda_peak_bytes: int | None
    start_bytes: int
    capacity_bytes: int
    peak_within_capacity: bool
    peak_within_budget: bool
    measured_headroom_bytes: int | None
    note: str


def _config(scaled: ScaledGeometry, geometry: Geometry, mode: str, device: str,
            card_bytes: int) -> Any:
    from engine.reference.runtime import EngineConfig

    if device == "cpu":
        # DeviceMemory caps the pools at card - weights = budget + headroom.
        card = scaled.spec.dense_weight_bytes + scaled.budget_bytes + scaled.headroom_bytes
    else:
        card = card_bytes
    return EngineConfig(model=scaled.spec, device=device, device_memory_bytes=card,
                        cache_budget_bytes=scaled.budget_bytes,
                        moe_cache_size=geometry.moe_cache_size, num_pages=geometry.num_pages,
                        num_mamba_slots=geometry.num_mamba_slots,
                        max_running_requests=scaled.max_running_requests,
                        rebuild_mode=cast("RebuildMode", mode), chunk_bytes=scaled.chunk_bytes,
                        max_seq_len=4 * scaled.kv_max_tokens)


def engine_ladder(scaled: ScaledGeometry) -> tuple[CacheStatus, Ladder]:
    """The ladder built from the engine's own status document (a CPU probe, freetoken mode)."""
    from engine.reference.runtime import ReferenceEngine

    probe_geometry = Geometry(scaled.spec.num_experts, 1, scaled.mamba_slots)
    config = replace(_config(scaled, probe_geometry, "freetoken", "cpu", 0),
                     device_memory_bytes=None)
    probe = ReferenceEngine(config)
    status = parse_cache_status(probe.status_doc())
    del probe
    spec = LadderSpec(kv_floor_tokens=scaled.kv_floor_tokens, kv_max_tokens=scaled.kv_max_tokens)
    return status, fill_ladder(status, ENGINE_FILL, spec)


def sample_pairs(ladder: Ladder, how_many: int | None) -> list[tuple[int, int]]:
    """Every ordered pair among `how_many` rungs spread evenly from bottom to top (both
    included), or among all rungs when `how_many` is None."""
    n = len(ladder.rungs)
    if how_many is None or how_many >= n:
        picks = list(range(n))
    else:
        last = max(1, how_many - 1)
        picks = sorted({round(k * (n - 1) / last) for k in range(how_many)})
    return [(i, j) for i in picks for j in picks if i != j]


class _Cuda:
    """CUDA measurement helpers; a no-op on CPU."""

    def __init__(self, device: str) -> None:
        self.on = device.startswith("cuda")
        self.device = device
        if self.on:
            import torch

            self.torch = torch

    def sync(self) -> None:
        if self.on:
            self.torch.cuda.synchronize()

    def reset_peak(self) -> int | None:
        if not self.on:
            return None
        self.sync()
        self.torch.cuda.reset_peak_memory_stats()
        return int(self.torch.cuda.memory_allocated())

    def peak_delta(self, before: int | None) -> int | None:
        if not self.on or before is None:
            return None
        self.sync()
        return int(self.torch.cuda.max_memory_allocated()) - before

    def free_bytes(self) -> int | None:
        if not self.on:
            return None
        return int(self.torch.cuda.mem_get_info(self.device)[0])

    def standin(self, scaled: ScaledGeometry, card_bytes: int) -> Any:
        """Device bytes that stand for the real model's weights, so that the emulated card
        leaves the pools about budget + headroom (the filler takes the rest of the GPU)."""
        if not self.on:
            return None
        torch = self.torch
        gc.collect()
        torch.cuda.empty_cache()
        torch.empty(1, device=self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        used = total - free
        # `used` already holds the model's weights: it is built before the stand-in.
        nbytes = card_bytes - used - scaled.budget_bytes - scaled.headroom_bytes
        if nbytes <= 0:
            raise SystemExit(f"the scaled geometry ({scaled.budget_bytes} B budget) does not "
                             f"fit a {card_bytes}-byte card with {used} B already used")
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def release(self) -> None:
        if self.on:
            gc.collect()
            self.torch.cuda.empty_cache()


def _oom(text: str | None) -> bool:
    return text is not None and "OutOfMemoryError" in text


async def run_one(scaled: ScaledGeometry, start: Geometry, target: Geometry, *, how: str,
                  mode: str, device: str, card_bytes: int, reserve_bytes: int,
                  model: Any) -> EngineRun:
    """One transition on a fresh engine (`model`'s weights) served over loopback HTTP; real
    peaks measured."""
    from engine.reference.runtime import ReferenceEngine
    from engine.reference.server import serving
    from ladder.client import FtServeClient
    from ladder.executor import ApplySettings, apply_target

    cuda = _Cuda(device)
    standin = cuda.standin(scaled, card_bytes)
    engine = ReferenceEngine(_config(scaled, start, mode, device, card_bytes), model=model)
    try:
        async with serving(engine) as url, FtServeClient(url, timeout_s=120) as client:
            status = await client.cache_status()
            model = MemoryModel.from_status(status)
            # One call's own instants: ft serve's order in freetoken mode, chunk phases
            # (shrinks first) in incremental mode; the status names the engine model.
            single_peak = max(i.total_bytes for i in call_instants(model, start, target))
            start_bytes = model.total_bytes(start)
            measured_headroom = None
            free = cuda.free_bytes()
            if free is not None:
                measured_headroom = free - (scaled.budget_bytes - engine.memory.allocated_bytes)
            body = {k: v for k, v in target.to_json().items()
                    if v != start.to_json()[k]}
            engine.memory.reset_peak()
            pool_bytes_before = engine.memory.allocated_bytes
            before = cuda.reset_peak()
            began = time.perf_counter()
            if how == "single":
                outcome = await client.rebuild(body, wait_s=300)
                calls, ooms = 1, int(_oom(outcome.error))
                kind: str = outcome.kind
                note = outcome.error or ""
                predicted = single_peak
            else:
                settings = ApplySettings(poll_s=0.01, backoff_base_s=0.01, backoff_max_s=0.05,
                                         idle_wait_s=60, settle_wait_s=120,
                                         reserve_bytes=reserve_bytes)
                result = await apply_target(client, lambda _s: target, settings=settings)
                calls = len(result.steps)
                ooms = sum(_oom(s.note) for s in result.steps)
                kind, note = ("reached" if result.reached else "not_reached"), result.reason
                predicted = result.plan.peak_bytes
            seconds = time.perf_counter() - began
            real_peak = engine.memory.peak_bytes
            cuda_delta = cuda.peak_delta(before)
            final = engine.geometry()
            state = engine.state
    finally:
        # The app holds the engine, the engine its pools and filler: drop every reference
        # before the next engine measures the card.
        del engine, standin
        cuda.release()
    capacity = scaled.budget_bytes + scaled.headroom_bytes
    return EngineRun(
        how=how, mode=mode, reached=final.to_json() == target.to_json(), calls=calls, ooms=ooms,
        outcome=kind, seconds=round(seconds, 4), final_state=state,
        predicted_peak_bytes=predicted, real_peak_bytes=real_peak,
        cuda_peak_delta_bytes=cuda_delta,
        cuda_peak_bytes=None if cuda_delta is None else pool_bytes_before + cuda_delta,
        start_bytes=start_bytes, capacity_bytes=capacity,
        peak_within_capacity=real_peak <= capacity,
        peak_within_budget=real_peak <= scaled.budget_bytes,
        measured_headroom_bytes=measured_headroom, note=note[:300])


RUNS = (("single", "freetoken"), ("plan", "freetoken"), ("single", "incremental"))


def default_card_bytes(capacity_bytes: int) -> int:
    """16 GiB, or the whole GiBs that hold the pools plus 2 GiB for the model and the CUDA
    context: the stand-in fills the rest, so only the pools' room (budget + headroom) counts."""
    return max(16 * GIB, -(-(capacity_bytes + 2 * GIB) // GIB) * GIB)


async def run_engine_mode(geo: BenchGeometry, sizes: EngineSizes, *, device: str,
                          card_bytes: int | None, pair_sample: int | None,
                          pairs: Sequence[tuple[int, int]] | None = None) -> dict[str, Any]:
    scaled = scale_geometry(geo, sizes)
    status, ladder = engine_ladder(scaled)
    chosen = list(pairs) if pairs is not None else sample_pairs(ladder, pair_sample)
    capacity = scaled.budget_bytes + scaled.headroom_bytes
    card_bytes = default_card_bytes(capacity) if card_bytes is None else card_bytes
    import torch

    from engine.reference.decoder import TinyMoE

    # One model per geometry: its host expert bank is GiBs on CUDA, the pools are the subject.
    model = TinyMoE(scaled.spec, torch.device(device))
    rows: list[dict[str, Any]] = []
    for src, dst in chosen:
        a, b = ladder.rungs[src].geometry, ladder.rungs[dst].geometry
        direction = Direction.of(a, b)
        runs: dict[str, dict[str, Any]] = {}
        for how, mode in RUNS:
            run = await run_one(scaled, a, b, how=how, mode=mode, device=device,
                                card_bytes=card_bytes, reserve_bytes=ladder.model.reserve_bytes,
                                model=model)
            runs[f"{how}_{mode}"] = asdict(run)
        rows.append({"src": src, "dst": dst, "start": a.to_json(), "target": b.to_json(),
                     "risky": direction.risky,
                     "predicted_single_call_outcome": single_call_outcome(
                         ladder.model, a, b, capacity),
                     "runs": runs})
    summary: dict[str, Any] = {}
    for how, mode in RUNS:
        key = f"{how}_{mode}"
        runs_ = [r["runs"][key] for r in rows]
        summary[key] = {
            "transitions": len(runs_), "reached": sum(r["reached"] for r in runs_),
            "real_ooms": sum(r["ooms"] for r in runs_),
            "calls": sum(r["calls"] for r in runs_),
            "latched_failed": sum(r["final_state"] == "failed" for r in runs_),
            "seconds": round(sum(r["seconds"] for r in runs_), 3),
            "max_real_peak_over_budget": round(max((r["real_peak_bytes"] for r in runs_),
                                                   default=0) / scaled.budget_bytes, 6),
            "all_peaks_within_capacity": all(r["peak_within_capacity"] for r in runs_),
            "real_peak_equals_prediction": sum(
                r["real_peak_bytes"] == r["predicted_peak_bytes"] for r in runs_),
            # Completed calls only: an OOM stops below its prediction by construction.
            "max_real_minus_predicted_bytes": max(
                (r["real_peak_bytes"] - r["predicted_peak_bytes"] for r in runs_
                 if r["ooms"] == 0), default=None),
            "max_cuda_peak_minus_predicted_bytes": max(
                (r["cuda_peak_bytes"] - r["predicted_peak_bytes"] for r in runs_
                 if r["ooms"] == 0 and r["cuda_peak_bytes"] is not None), default=None),
        }
    summary["ooms_match_prediction"] = all(
        (r["runs"]["single_freetoken"]["ooms"] > 0) == r["predicted_single_call_outcome"]
        .startswith("oom") for r in rows)
    return {"device": device, "geometry": geo.name, "fill": ENGINE_FILL,
            "scale": scaled.scale, "budget_bytes": scaled.budget_bytes,
            "headroom_bytes": scaled.headroom_bytes, "capacity_bytes": capacity,
            "chunk_bytes": scaled.chunk_bytes,
            "card_bytes": card_bytes if device != "cpu" else None,
            "model": asdict(scaled.spec), "unit_bytes": asdict(status.units),
            "rungs": [r.to_json() for r in ladder.rungs], "summary": summary,
            "transitions": rows}


# ---- command line ---------------------------------------------------------------------------

def _parse_fills(text: str) -> list[float]:
    return [float(x) / 100 if float(x) > 1 else float(x) for x in text.split(",")]


def main(argv: Iterable[str] | None = None,
         emit: Callable[[str], None] = print) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("plan", "engine", "both"), default="plan")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] (engine mode)")
    parser.add_argument("--geometry", action="append",
                        help="geometry name (repeatable); default: all four")
    parser.add_argument("--fills", default="90,95,99,100", help="percent, comma-separated")
    parser.add_argument("--sizes", choices=sorted(SIZES), default=None,
                        help="engine model sizes (default: ci on cpu, cuda on cuda)")
    parser.add_argument("--pair-sample", type=int, default=4,
                        help="rungs sampled for engine mode (all ordered pairs among them); "
                             "0 = every rung")
    parser.add_argument("--card-gib", type=float, default=None,
                        help="emulated card (cuda); default 16, more if the pools need it")
    parser.add_argument("--pairs", action="store_true", help="include every pair in plan mode")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(list(argv) if argv is not None else None)

    started = time.perf_counter()
    out: dict[str, Any] = {"bench": "transitions", "fill_definition": FILL_DEFINITION}
    if args.mode in ("plan", "both"):
        out["plan"] = run_plan_mode(load_geometries(args.geometry), _parse_fills(args.fills),
                                    include_pairs=args.pairs)
    if args.mode in ("engine", "both"):
        if args.device.startswith("cuda"):
            from engine.reference.memory import enable_expandable_segments

            enable_expandable_segments()
        sizes = SIZES[args.sizes or ("ci" if args.device == "cpu" else "cuda")]
        out["engine"] = [asyncio.run(run_engine_mode(
            geo, sizes, device=args.device,
            card_bytes=None if args.card_gib is None else int(args.card_gib * GIB),
            pair_sample=args.pair_sample or None)) for geo in load_geometries(args.geometry)]
    out["seconds"] = round(time.perf_counter() - started, 3)
    report_json(out, args.out, indent=1, emit=emit)
    return out


FILL_DEFINITION = (
    "fill X: the ladder is built with reserve = cache_budget - floor(X * cache_budget), so its "
    "rungs hold at most X of cache_budget_bytes and moe-ladder's plans are priced against that; "
    "the card's room for the pools stays cache_budget + headroom (what (1 - memory_ratio) leaves "
    "beyond the budget, less non-cache allocations). A single ft serve call completes when its "
    "worst instant fits budget + headroom (else it OOMs: rolled back if the MoE allocation hits, "
    "latched failed if KV or mamba does); the plan must keep every instant within the budget.")


if __name__ == "__main__":
    main()
