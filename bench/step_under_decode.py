"""One rung step under decode: a KV -> experts conversion on a nearly full emulated card.

Builds a `ReferenceEngine` directly (no HTTP) on `--device cuda` with `device_memory_bytes` =
16 GiB (a driver filler outside torch, `engine.reference.memory.emulate_card`), a model whose
expert slot is 2 MiB (hidden 1024 x expert_hidden 256, fp32) and whose KV costs 16 KiB a token,
and a geometry whose KV fills the cache budget so that the card is ~99 % full. Then:

1. a decode workload: `--clients` concurrent requests through `engine.generate`, restarted as
   they finish; the expert hit rate is measured over a window of tokens before the transition;
2. `await engine.rebuild(...)` in `incremental` mode turns `--convert` bytes of KV pages into
   expert slots while the requests keep decoding. Free memory is sampled in the engine listener
   for every "chunk" event, every chunk pause is recorded, and each `ChunkEvent` (bytes moved,
   allocated, freed) is captured by wrapping the rebuild job's step iterator;
3. the hit rate over windows just after and later;
4. the same transition under the same decode workload on a fresh engine per pause budget of
   `--pause-budgets-ms` (default 0,2; `EngineConfig.rebuild_pause_budget_s`: chunk-operation
   time per decode round; 0 is one operation a round, the engine's behaviour before the
   budget), side by side under `pause_budgets`;
5. the same transition on a fresh engine in `freetoken` mode (ft serve's semantics: idle only,
   each pool dropped and reallocated whole), where the MoE pool must grow while the old KV is
   still held: at this fill it OOMs and rolls back.

Copy bandwidths (device-to-device and pinned host-to-device) are measured first, so the
transition time can be set against bytes moved / bandwidth. What is counted:

- `moved_bytes`: live content the shrink copied (KV pages of running requests relocated out of
  the chunks being released; expert slots relocated), i.e. the `move` events' bytes;
- `allocated_bytes`: bytes of the chunks the rebuild allocated (the new expert chunks, and a
  re-cut KV boundary chunk); `zeroed_bytes`: the part of those the pool zero-fills (mamba
  only); `copied_on_alloc_bytes`: content copied into a re-cut chunk;
- `ideal_copy_s` = (moved + copied_on_alloc) / D2D bandwidth: what the copies alone cost;
- `ideal_touch_s` = (moved + copied_on_alloc + allocated) / D2D bandwidth: as if every new byte
  were also written once (an upper bound for an allocator that zeroes);
- `expert_refill_s_est` = new slots x expert bytes / H2D bandwidth: filling every new slot from
  pinned host memory, a cost the workload pays later as misses, not part of the transition.

What each pause budget reports (why: the budget trades how long the step takes against how
long each decode round stalls, and both cost tokens):

- `wall_s`: the step, from the `engine.rebuild` call to its reply;
- `decode_rounds`: the step's scheduler rounds with requests running (the engine's
  `RebuildPause` records, one a round; the last may run no operation, only the completion);
  `ops_outside_decode_rounds` counts operations run while no request was running;
- `round_pauses`: p50/p99/max of those rounds' `RebuildPause.seconds`, what decode waited;
- `tokens_lost` = `baseline_decode_tps` x `wall_s` - `tokens_during`, where `tokens_during`
  counts the tokens the clients received from the call to the reply, and
  `baseline_decode_tps` = tokens received in the `baseline_window_s` = `wall_s` just before
  the call, divided by it (shorter only when the workload has not decoded that long, after its
  warm-up). A round decodes one token per client at once, so for a step of a few rounds the
  figure is only good to about +-`clients` tokens.

`--device cpu --small` runs the same code on a CPU with a tiny model (DeviceMemory caps the
pools), for CI-like smoke runs. Prints one JSON object; `--out FILE` writes it too. The figures
of the recorded H200 run are in README.md ("Results": rung step on the H200),
docs/gpu-allocation.md and bench/results/h200/transition.json.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import math
import os
import platform
import random
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from bench.output import report_json
from engine.reference.decoder import ModelSpec, TinyMoE
from engine.reference.memory import enable_expandable_segments
from engine.reference.pools import ChunkEvent
from engine.reference.runtime import (
    AdmissionError,
    ChunkPause,
    EngineConfig,
    RebuildPause,
    ReferenceEngine,
)

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class Plan:
    spec: ModelSpec
    card_bytes: int
    chunk_bytes: int
    slots_before: int
    slots_after: int
    mamba_slots: int
    clients: int
    prompt_len: int
    max_tokens: int
    window_tokens: int
    headroom_bytes: int
    bw_bytes: int


def make_plan(args: argparse.Namespace) -> Plan:
    if args.small:
        spec = ModelSpec(num_layers=4, num_experts=16, top_k=4, hidden=64, expert_hidden=128,
                         head_dim=32, page_size=16)
        card, chunk, bw = 32 * MIB, 256 * KIB, 32 * MIB
        window, prompt_len, max_tokens = 48, 24, 48
    else:
        spec = ModelSpec(num_layers=args.layers, num_experts=args.experts, top_k=4,
                         hidden=1024, expert_hidden=256, head_dim=args.head_dim, page_size=16)
        card, chunk, bw = args.card_gib * GIB, args.chunk_mib * MIB, 2 * GIB
        window, prompt_len, max_tokens = args.window_tokens, 48, 96
    total_experts = spec.num_layers * spec.num_experts
    before = max(spec.num_experts, total_experts // 8)
    if args.convert_gib is not None and not args.small:
        after = before + int(args.convert_gib * GIB) // spec.expert_bytes
    else:
        after = total_experts * 7 // 8
    return Plan(spec, card, chunk, before, after, mamba_slots=8, clients=args.clients,
                prompt_len=prompt_len, max_tokens=max_tokens, window_tokens=window,
                headroom_bytes=int(card * args.headroom), bw_bytes=bw)


# --- bandwidth --------------------------------------------------------------------------------


def _time_copies(dst: torch.Tensor, src: torch.Tensor, reps: int) -> float:
    """Seconds per copy, the best of `reps` (after one warm-up)."""
    cuda = dst.device.type == "cuda" or src.device.type == "cuda"
    dst.copy_(src, non_blocking=cuda)
    if cuda:
        torch.cuda.synchronize()
    best = math.inf
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - t0)
    return best


def measure_bandwidth(device: torch.device, nbytes: int) -> dict[str, Any]:
    """Bytes copied per second (each byte counted once, not read + write)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(7)
    dst = torch.empty_like(src)
    d2d = _time_copies(dst, src, reps=5)
    out: dict[str, Any] = {"bytes": nbytes, "d2d_s": d2d, "d2d_bytes_per_s": nbytes / d2d}
    del src, dst
    if device.type == "cuda":
        host = torch.empty(nbytes // 2, dtype=torch.uint8).pin_memory()
        dev = torch.empty(nbytes // 2, dtype=torch.uint8, device=device)
        h2d = _time_copies(dev, host, reps=5)
        out.update({"h2d_pinned_bytes": nbytes // 2, "h2d_pinned_s": h2d,
                    "h2d_pinned_bytes_per_s": (nbytes // 2) / h2d})
        del host, dev
        gc.collect()
        torch.cuda.empty_cache()
    else:
        out.update({"h2d_pinned_bytes": None, "h2d_pinned_s": None,
                    "h2d_pinned_bytes_per_s": None})
    return out


# --- engine sizing ----------------------------------------------------------------------------


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def engine_config(plan: Plan, device: torch.device, mode: str,
                  used_before: int) -> tuple[EngineConfig, dict[str, Any]]:
    """A geometry whose pools leave `headroom_bytes` of the emulated card free."""
    spec = plan.spec
    weights = spec.dense_weight_bytes
    if device.type == "cuda":
        # What the card holds before the pools: context (+ whatever else is on the device) and
        # the dense weights rounded to the allocator's pages; cuBLAS workspace and decode
        # temporaries come out of the headroom.
        fixed = used_before + _round_up(weights, 20 * MIB) + 2 * MIB
    else:
        fixed = weights  # the engine caps DeviceMemory at card - weights
    room = plan.card_bytes - fixed - plan.headroom_bytes
    page_bytes = spec.page_size * spec.kv_bytes_per_token
    moe = plan.slots_before * spec.expert_bytes
    mamba = (plan.mamba_slots + 1) * spec.state_bytes
    kv_pages = (room - moe - mamba) // page_bytes - 1
    if kv_pages < 64:
        raise ValueError(f"card too small for the plan: {kv_pages} KV pages")
    convert_pages = (plan.slots_after - plan.slots_before) * spec.expert_bytes // page_bytes
    config = EngineConfig(
        model=spec, device=str(device), device_memory_bytes=plan.card_bytes,
        cache_budget_bytes=room, moe_cache_size=plan.slots_before, num_pages=kv_pages,
        num_mamba_slots=plan.mamba_slots, max_running_requests=plan.clients,
        rebuild_mode=mode,  # type: ignore[arg-type]
        chunk_bytes=plan.chunk_bytes)
    sizing = {"fixed_bytes_estimate": fixed, "cache_budget_bytes": room,
              "kv_pages_before": kv_pages, "kv_pages_after": kv_pages - convert_pages,
              "moe_slots_before": plan.slots_before, "moe_slots_after": plan.slots_after,
              "convert_bytes": convert_pages * page_bytes, "page_bytes": page_bytes,
              "kv_share_of_budget": round((kv_pages + 1) * page_bytes / room, 4)}
    return config, sizing


class FreeMemory:
    """Free bytes of the (emulated) card: `cudaMemGetInfo` on CUDA, DeviceMemory's cap on CPU."""

    def __init__(self, engine: ReferenceEngine) -> None:
        self.engine = engine
        self.cuda = engine.device.type == "cuda"

    def __call__(self) -> int:
        if self.cuda:
            return int(torch.cuda.mem_get_info(self.engine.device)[0])
        free = self.engine.memory.free_bytes
        return -1 if free is None else free


class Sampler(threading.Thread):
    """Polls free memory from another thread while a blocking rebuild runs (freetoken)."""

    def __init__(self, free: FreeMemory, period_s: float = 2e-4) -> None:
        super().__init__(daemon=True)
        self.free, self.period_s = free, period_s
        self.samples: list[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.samples.append(self.free())
            time.sleep(self.period_s)


# --- workload ---------------------------------------------------------------------------------


@dataclass
class Record:
    client: int
    prompt: list[int]
    seed: int
    tokens: list[int] = field(default_factory=list)
    done: bool = False


class Workload:
    """`clients` requests decoding back to back; counts tokens as they arrive."""

    def __init__(self, engine: ReferenceEngine, plan: Plan) -> None:
        self.engine, self.plan = engine, plan
        self.tokens = 0
        self.token_times_s: list[float] = []  # perf_counter at each token's arrival
        self.stop = asyncio.Event()
        self.current: dict[int, Record] = {}
        self.finished: list[Record] = []
        self.refused = 0
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._client(i)) for i in range(self.plan.clients)]

    async def _client(self, index: int) -> None:
        rng = random.Random(1000 + index)
        n = 0
        while not self.stop.is_set():
            prompt = [rng.randrange(5, 4000) for _ in range(self.plan.prompt_len)]
            record = Record(index, prompt, seed=index * 10_000 + n)
            self.current[index] = record
            n += 1
            try:
                async for token in self.engine.generate(prompt, self.plan.max_tokens,
                                                        seed=record.seed):
                    record.tokens.append(token)
                    self.tokens += 1
                    self.token_times_s.append(time.perf_counter())
            except AdmissionError:
                self.refused += 1
                await asyncio.sleep(0.01)
                continue
            record.done = True
            self.finished.append(record)

    async def wait_tokens(self, n: int, timeout_s: float = 300.0) -> float:
        target, began = self.tokens + n, time.perf_counter()
        while self.tokens < target:
            if time.perf_counter() - began > timeout_s:
                raise TimeoutError(f"{n} tokens not decoded in {timeout_s}s")
            await asyncio.sleep(0.002)
        return time.perf_counter() - began

    def tokens_between(self, start_s: float, end_s: float) -> int:
        return sum(1 for t in self.token_times_s if start_s <= t < end_s)

    async def close(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)


class HitWindow:
    def __init__(self, engine: ReferenceEngine, workload: Workload) -> None:
        self.engine, self.workload = engine, workload
        self.hits0, self.misses0 = engine.experts.hits, engine.experts.misses
        self.tokens0, self.t0 = workload.tokens, time.perf_counter()

    def result(self) -> dict[str, Any]:
        hits = self.engine.experts.hits - self.hits0
        misses = self.engine.experts.misses - self.misses0
        seconds = time.perf_counter() - self.t0
        tokens = self.workload.tokens - self.tokens0
        return {"hit_rate": round(hits / (hits + misses), 4) if hits + misses else None,
                "lookups": hits + misses, "tokens": tokens, "seconds": round(seconds, 3),
                "decode_tps": round(tokens / seconds, 1) if seconds else None,
                "resident_experts": self.engine.experts.resident_count,
                "slots": self.engine.experts.num_slots}


def _stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"count": 0}
    ordered = sorted(values)

    def pct(q: float) -> float:
        return ordered[max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))]

    return {"count": len(values), "p50_ms": round(pct(50) * 1e3, 3),
            "p99_ms": round(pct(99) * 1e3, 3), "max_ms": round(ordered[-1] * 1e3, 3),
            "sum_ms": round(sum(values) * 1e3, 3)}


class RebuildProbe:
    """Engine listener: free memory per chunk event, pauses, and the rebuild's ChunkEvents."""

    def __init__(self, free: FreeMemory) -> None:
        self.free = free
        self.samples: list[int] = []
        self.pauses: list[ChunkPause] = []
        self.events: list[ChunkEvent] = []
        self.finished: tuple[str, float] | None = None

    def __call__(self, event: str, payload: Any) -> None:
        if event == "rebuild_started":
            payload.ops = self._record(payload.ops)
        elif event == "chunk":
            self.pauses.append(payload)
            self.samples.append(self.free())
        elif event == "rebuild_finished":
            _, status, seconds = payload
            self.finished = (status, seconds)

    def _record(self, ops: Iterator[Any]) -> Iterator[Any]:
        for event in ops:
            if isinstance(event, ChunkEvent):
                self.events.append(event)
            yield event


def byte_accounting(events: list[ChunkEvent], zero_fill_pools: set[str]) -> dict[str, int]:
    moved = sum(e.nbytes for e in events if e.op == "move")
    freed = sum(e.nbytes for e in events if e.op == "free")
    allocs = [e for e in events if e.op == "alloc"]
    allocated = sum(e.nbytes for e in allocs)
    zeroed = sum(e.nbytes for e in allocs if e.pool in zero_fill_pools)
    # A re-cut KV boundary chunk (or a grown partial tail) copies its live part on alloc: an
    # alloc directly followed by a free of the same pool is such a copy.
    copied_on_alloc = 0
    for first, second in itertools.pairwise(events):
        if first.op == "alloc" and second.op == "free" and first.pool == second.pool:
            copied_on_alloc += min(first.nbytes, second.nbytes)
    return {"moved_bytes": moved, "allocated_bytes": allocated, "freed_bytes": freed,
            "zeroed_bytes": zeroed, "copied_on_alloc_bytes": copied_on_alloc,
            "ops": len(events),
            "ops_by_kind": {f"{p}:{o}": sum(1 for e in events if (e.pool, e.op) == (p, o))
                            for p, o in sorted({(e.pool, e.op) for e in events})}}


class PauseProbe:
    """Engine listener: a step's per-round pauses and its number of chunk operations."""

    def __init__(self) -> None:
        self.rounds: list[RebuildPause] = []
        self.ops = 0

    def __call__(self, event: str, payload: Any) -> None:
        if event == "rebuild_pause":
            self.rounds.append(payload)
        elif event == "chunk":
            self.ops += 1


# --- the runs ---------------------------------------------------------------------------------


def park_ballast(engine: ReferenceEngine, plan: Plan) -> None:
    """Park the running requests' pages at the top of the KV pool, in the chunks the shrink
    releases, so that the rebuild has live content to move (pages are handed out lowest
    first; without this the shrink would only free chunks). `free_request("ballast")` undoes
    it just before the rebuild."""
    room = plan.clients * 2 * math.ceil((plan.prompt_len + plan.max_tokens) / plan.spec.page_size)
    engine.kv.allocate_pages("ballast", engine.kv.free_pages - room)


def convert_body(sizing: dict[str, Any], mode: str) -> dict[str, Any]:
    return {"moe_cache_size": sizing["moe_slots_after"], "num_pages": sizing["kv_pages_after"],
            "mode": mode, "timeout": 600}


async def run_incremental(engine: ReferenceEngine, plan: Plan, sizing: dict[str, Any],
                          bandwidth: dict[str, Any], ballast: bool) -> dict[str, Any]:
    free = FreeMemory(engine)
    out: dict[str, Any] = {"free_after_build_bytes": free(),
                           "allocated_after_build_bytes": engine.memory.allocated_bytes}
    out["card_fill_fraction"] = (round(1 - out["free_after_build_bytes"] / plan.card_bytes, 5)
                                 if free.cuda else
                                 round(1 - out["free_after_build_bytes"]
                                       / (engine.memory.capacity_bytes or 1), 5))
    if ballast:
        park_ballast(engine, plan)
    workload = Workload(engine, plan)
    workload.start()
    await workload.wait_tokens(plan.window_tokens // 2)  # warm the expert cache
    window = HitWindow(engine, workload)
    await workload.wait_tokens(plan.window_tokens)
    out["before"] = window.result()
    if ballast:
        engine.kv.free_request("ballast")
    probe = RebuildProbe(free)
    engine.listeners.append(probe)
    engine.memory.reset_peak()
    start_allocated = engine.memory.allocated_bytes
    start_free = free()
    live_at_start = [r for r in workload.current.values() if r.tokens and not r.done]
    window = HitWindow(engine, workload)
    began = time.perf_counter()
    status, body = await engine.rebuild(convert_body(sizing, "incremental"))
    wall = time.perf_counter() - began
    out["during"] = window.result()
    engine.listeners.remove(probe)
    window = HitWindow(engine, workload)
    await workload.wait_tokens(plan.window_tokens)
    out["just_after"] = window.result()
    await workload.wait_tokens(plan.window_tokens * 2)
    window = HitWindow(engine, workload)
    await workload.wait_tokens(plan.window_tokens)
    out["later"] = window.result()
    await workload.close()

    accounting = byte_accounting(probe.events, {"mamba"})
    d2d = bandwidth["d2d_bytes_per_s"]
    h2d = bandwidth["h2d_pinned_bytes_per_s"]
    copied = accounting["moved_bytes"] + accounting["copied_on_alloc_bytes"]
    op_s = sum(p.seconds for p in probe.pauses)
    new_slots = sizing["moe_slots_after"] - sizing["moe_slots_before"]
    out["transition"] = {
        "http_status": status, "status": body.get("status"), "error": body.get("error"),
        "geometry_after": engine.geometry().to_json(),
        "wall_s": round(wall, 4), "chunk_op_s": round(op_s, 4),
        "chunk_pauses": _stats([p.seconds for p in probe.pauses]),
        "chunk_pauses_by_op": {f"{pool}:{op}": _stats([p.seconds for p in probe.pauses
                                                       if (p.pool, p.op) == (pool, op)])
                               for pool, op in sorted({(p.pool, p.op) for p in probe.pauses})},
        "start_free_bytes": start_free,
        "min_free_bytes": min(probe.samples, default=start_free),
        "transient_free_drop_bytes": start_free - min(probe.samples, default=start_free),
        "free_samples": len(probe.samples),
        "peak_allocated_over_start_bytes": engine.memory.peak_bytes - start_allocated,
        **accounting,
        "d2d_bytes_per_s": d2d,
        "ideal_copy_s": copied / d2d,
        "ideal_touch_s": (copied + accounting["allocated_bytes"]) / d2d,
        "chunk_op_s_over_ideal_touch": round(op_s / ((copied + accounting["allocated_bytes"])
                                                     / d2d), 1)
        if copied + accounting["allocated_bytes"] else None,
        "expert_refill_s_est": (new_slots * plan.spec.expert_bytes / h2d) if h2d else None,
        "requests_live_at_start": len(live_at_start),
    }
    # Outputs never depend on what the pools did: replay one request that decoded through the
    # transition (its pages were moved if ballast was on) alone on the idle engine.
    replay = next((r for r in live_at_start if r.done), None)
    if replay is not None:
        tokens = [t async for t in engine.generate(replay.prompt, plan.max_tokens,
                                                   seed=replay.seed)]
        out["replay_tokens_match"] = tokens == replay.tokens
    else:
        out["replay_tokens_match"] = None
    out["requests_finished"] = len(workload.finished)
    out["requests_refused"] = workload.refused
    out["engine_state_after"] = engine.state
    return out


def baseline_history_s(inc: dict[str, Any], plan: Plan) -> float:
    """How long the workload decodes before a budget run's step, so that the baseline window
    (as long as the step) fits: the step at budget 0 takes one decode round per chunk
    operation, plus the completing one, of `clients` tokens each at the rate measured before
    the incremental run's step; 1.25x for noise. 0 when that run failed."""
    if "error" in inc or not inc["before"]["decode_tps"]:
        return 0.0
    round_s = plan.clients / float(inc["before"]["decode_tps"])
    return 1.25 * (int(inc["transition"]["ops"]) + 1) * round_s


async def run_pause_budget(engine: ReferenceEngine, plan: Plan, sizing: dict[str, Any],
                           ballast: bool, history_s: float) -> dict[str, Any]:
    """The incremental step under decode at the engine's pause budget (module docstring)."""
    if ballast:
        park_ballast(engine, plan)
    workload = Workload(engine, plan)
    workload.start()
    await workload.wait_tokens(plan.window_tokens // 2)  # warm the expert cache
    history_from = time.perf_counter()
    await workload.wait_tokens(plan.window_tokens)
    await asyncio.sleep(max(0.0, history_s - (time.perf_counter() - history_from)))
    if ballast:
        engine.kv.free_request("ballast")
    probe = PauseProbe()
    engine.listeners.append(probe)
    began = time.perf_counter()
    status, body = await engine.rebuild(convert_body(sizing, "incremental"))
    ended = time.perf_counter()
    engine.listeners.remove(probe)
    await workload.close()
    wall = ended - began
    window = min(wall, began - history_from)
    baseline_tps = workload.tokens_between(began - window, began) / window
    during = workload.tokens_between(began, ended)
    return {
        "budget_s": engine.config.rebuild_pause_budget_s,
        "http_status": status, "status": body.get("status"), "error": body.get("error"),
        "wall_s": round(wall, 4),
        "decode_rounds": len(probe.rounds),
        "chunk_ops": probe.ops,
        "ops_outside_decode_rounds": probe.ops - sum(r.ops for r in probe.rounds),
        "round_pauses": _stats([r.seconds for r in probe.rounds]),
        "baseline_window_s": round(window, 4),
        "baseline_decode_tps": round(baseline_tps, 1),
        "tokens_during": during,
        "tokens_lost": round(baseline_tps * wall - during, 1),
        "requests_refused": workload.refused,
    }


async def run_freetoken(engine: ReferenceEngine, sizing: dict[str, Any]) -> dict[str, Any]:
    free = FreeMemory(engine)
    start_free = free()
    engine.memory.reset_peak()
    start_allocated = engine.memory.allocated_bytes
    sampler = Sampler(free)
    sampler.start()
    began = time.perf_counter()
    status, body = await engine.rebuild(convert_body(sizing, "if_idle"))
    wall = time.perf_counter() - began
    sampler.stop.set()
    sampler.join()
    samples = sampler.samples
    out = {"http_status": status, "status": body.get("status"),
           "error": (body.get("error") or "")[:400] or None,
           "geometry_after": engine.geometry().to_json(), "wall_s": round(wall, 4),
           "start_free_bytes": start_free, "min_free_bytes": min(samples, default=start_free),
           "free_samples": len(samples),
           "peak_allocated_over_start_bytes": engine.memory.peak_bytes - start_allocated,
           "engine_state_after": engine.state}
    if engine.state == "serving":
        tokens = [t async for t in engine.generate([11, 12, 13], 8)]
        out["serves_after"] = len(tokens) == 8
    return out


def _machine(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(),
                            "date": time.strftime("%Y-%m-%d", time.gmtime()),
                            "device": str(device),
                            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update({"gpu": props.name, "gpu_total_bytes": props.total_memory,
                     "cuda_runtime": torch.version.cuda})
    return info


async def on_fresh_engine(config: EngineConfig, model: TinyMoE,
                          run: Callable[[ReferenceEngine], Awaitable[dict[str, Any]]]
                          ) -> dict[str, Any]:
    """`run` on a fresh engine of `config` that reuses `model`: the weights (on the device, and
    the pinned expert bank of GiBs) are the same, only the pools differ between runs."""
    try:
        engine = ReferenceEngine(config, model=model)
        await engine.start()
        try:
            return await run(engine)
        finally:
            await engine.close()
    except Exception as exc:  # noqa: BLE001 - keep what was measured, say what broke
        return {"error": "".join(traceback.format_exception(exc))[-3000:]}
    finally:
        gc.collect()
        if model.device.type == "cuda":
            torch.cuda.empty_cache()


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    plan = make_plan(args)
    report: dict[str, Any] = {"bench": "transition", "machine": _machine(device)}
    bandwidth = measure_bandwidth(device, plan.bw_bytes)
    report["bandwidth"] = {k: (round(v, 6) if isinstance(v, float) and v < 1 else
                               (round(v) if isinstance(v, float) else v))
                           for k, v in bandwidth.items()}
    used_before = 0
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        free_now, total = torch.cuda.mem_get_info(device)
        used_before = total - free_now
    config, sizing = engine_config(plan, device, "incremental", used_before)
    spec = plan.spec
    report["plan"] = {
        "card_bytes": plan.card_bytes, "chunk_bytes": plan.chunk_bytes,
        "headroom_target_bytes": plan.headroom_bytes,
        "model": {"layers": spec.num_layers, "experts": spec.num_experts, "top_k": spec.top_k,
                  "hidden": spec.hidden, "expert_hidden": spec.expert_hidden,
                  "head_dim": spec.head_dim, "page_size": spec.page_size,
                  "expert_bytes": spec.expert_bytes, "kv_bytes_per_token": spec.kv_bytes_per_token,
                  "state_bytes": spec.state_bytes, "dense_weight_bytes": spec.dense_weight_bytes},
        "clients": plan.clients, "max_tokens": plan.max_tokens,
        "window_tokens": plan.window_tokens, "used_before_engine_bytes": used_before,
        "pause_budget_s": config.rebuild_pause_budget_s, **sizing}

    t0 = time.perf_counter()
    engine = ReferenceEngine(config)
    report["plan"]["engine_build_s"] = round(time.perf_counter() - t0, 2)
    model = engine.model
    await engine.start()
    try:
        report["incremental"] = await run_incremental(engine, plan, sizing, bandwidth,
                                                      ballast=not args.no_ballast)
    except Exception as exc:  # noqa: BLE001 - keep what was measured, say what broke
        report["incremental"] = {"error": "".join(traceback.format_exception(exc))[-3000:]}
    finally:
        await engine.close()
    del engine
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        report["plan"]["free_between_runs_bytes"] = torch.cuda.mem_get_info(device)[0]

    inc = report["incremental"]
    history_s = baseline_history_s(inc, plan)
    report["pause_budgets"] = {
        f"{ms:g}": await on_fresh_engine(
            replace(config, rebuild_pause_budget_s=ms / 1e3), model,
            lambda engine: run_pause_budget(engine, plan, sizing, not args.no_ballast,
                                            history_s))
        for ms in args.pause_budgets_ms}
    if not args.skip_freetoken:
        # Same geometry, ft serve's execution.
        report["freetoken"] = await on_fresh_engine(
            replace(config, rebuild_mode="freetoken"), model,
            lambda engine: run_freetoken(engine, sizing))
    if "error" in inc:
        report["summary"] = {"error": "incremental run failed",
                             "freetoken_status": report.get("freetoken", {}).get("status")}
        return report
    tr = inc["transition"]
    report["summary"] = {
        "convert_bytes": sizing["convert_bytes"],
        "incremental_status": tr["status"], "incremental_wall_s": tr["wall_s"],
        "incremental_chunk_op_s": tr["chunk_op_s"],
        "pause_p50_ms": tr["chunk_pauses"].get("p50_ms"),
        "pause_p99_ms": tr["chunk_pauses"].get("p99_ms"),
        "min_free_bytes": tr["min_free_bytes"],
        "transient_free_drop_bytes": tr["transient_free_drop_bytes"],
        "moved_bytes": tr["moved_bytes"], "allocated_bytes": tr["allocated_bytes"],
        "ideal_touch_s": tr["ideal_touch_s"],
        "hit_rate_before": inc["before"]["hit_rate"],
        "hit_rate_just_after": inc["just_after"]["hit_rate"],
        "hit_rate_later": inc["later"]["hit_rate"],
        "replay_tokens_match": inc["replay_tokens_match"],
        "freetoken_status": report.get("freetoken", {}).get("status"),
        "freetoken_error": (report.get("freetoken", {}).get("error") or "")[:160] or None,
        "pause_budgets": {key: {"wall_s": run.get("wall_s"),
                                "decode_rounds": run.get("decode_rounds"),
                                "round_pause_p50_ms": run.get("round_pauses", {}).get("p50_ms"),
                                "round_pause_p99_ms": run.get("round_pauses", {}).get("p99_ms"),
                                "round_pause_max_ms": run.get("round_pauses", {}).get("max_ms"),
                                "tokens_lost": run.get("tokens_lost")}
                          for key, run in report["pause_budgets"].items()},
    }
    return report


def _budgets_ms(text: str) -> tuple[float, ...]:
    try:
        budgets = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MS[,MS...], got {text!r}") from None
    if not all(ms >= 0.0 for ms in budgets):  # NaN too
        raise argparse.ArgumentTypeError(f"budgets must be >= 0 ms, got {text}")
    return budgets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="tiny model and card (CPU smoke)")
    parser.add_argument("--card-gib", type=int, default=16)
    parser.add_argument("--chunk-mib", type=int, default=64)
    parser.add_argument("--convert-gib", type=float, default=None,
                        help="KV bytes to convert (default: experts from 1/8 to 7/8 resident)")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--window-tokens", type=int, default=128)
    parser.add_argument("--headroom", type=float, default=0.01,
                        help="fraction of the card left free after the pools are built")
    parser.add_argument("--alloc-conf", choices=("expandable", "default"), default="expandable")
    parser.add_argument("--no-ballast", action="store_true")
    parser.add_argument("--skip-freetoken", action="store_true")
    parser.add_argument("--pause-budgets-ms", type=_budgets_ms, default=(0.0, 2.0),
                        metavar="MS[,MS...]",
                        help="the step under decode once per rebuild pause budget (default 0,2)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and args.alloc_conf == "expandable":
        enable_expandable_segments()  # before torch initialises CUDA
    report = asyncio.run(bench(args))
    report_json(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
