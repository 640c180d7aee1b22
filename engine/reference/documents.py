"""The ft serve documents the reference engine serves, and the record of requests behind them.

`/health`, `/v1/stats`, `/v1/cache/status` and `/v1/requests` keep ft serve 0.1.2's fields and
shapes (tests/fixtures/freetoken-0.1.2/), so that the daemon's parsers (`engine.ftserve.wire`,
`engine.ftserve.geometry`) read the reference engine and a real ft serve alike; the one
deliberate addition is the `engine` block of `/v1/cache/status`. They are built here, from an
`EngineSnapshot` of the engine's state at the moment of the call, so that `runtime` only
serves and bench/replay's simulated server serves the very same documents.

The wall clock is read only for the request log's timestamps; every duration is monotonic.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from engine.ftserve.geometry import REFERENCE_ENGINE_NAME, Floors, Geometry, ModelShape, UnitCosts

__all__ = ["VERSION", "EngineSnapshot", "ServedRequests", "health_doc", "stats_doc",
           "status_doc"]

VERSION = "0.1.0"
# ft serve keeps the last 512 finished requests for `/v1/requests`.
_RING = 512
# ft serve's `throughput.decode_tps` is a sliding window of this length; it decays to 0 idle.
_TPS_WINDOW_S = 5.0


@dataclass(slots=True)
class ServedRequests:
    """What `/v1/stats` and `/v1/requests` report of finished requests and decoded tokens."""

    ring: list[dict[str, Any]] = field(default_factory=list)
    # Cursor of `ring[0]`: cursors keep counting while old entries fall out of the ring.
    ring_base: int = 0
    completed: int = 0
    prompt_tokens_total: int = 0
    completion_tokens_total: int = 0
    durations_ms: collections.deque[int] = field(
        default_factory=lambda: collections.deque(maxlen=256))
    ttft_ms: collections.deque[int] = field(default_factory=lambda: collections.deque(maxlen=256))
    token_times_s: collections.deque[float] = field(default_factory=collections.deque)

    def token(self, now_s: float) -> None:
        self.token_times_s.append(now_s)

    def finished(self, *, path: str, status: int, model: str, duration_ms: int,
                 ttft_ms: int | None, prompt_tokens: int, completion_tokens: int, stream: bool,
                 error: str | None) -> None:
        self.completed += 1
        self.durations_ms.append(duration_ms)
        if ttft_ms is not None:
            self.ttft_ms.append(ttft_ms)
        self.prompt_tokens_total += prompt_tokens
        self.completion_tokens_total += completion_tokens
        self.ring.append({
            "ts": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "method": "POST",
            "path": path, "status": status, "model": model,
            "duration_ms": duration_ms, "ttft_ms": ttft_ms,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens, "stream": stream, "error": error})
        if len(self.ring) > _RING:
            del self.ring[0]
            self.ring_base += 1

    def decode_tps(self, now_s: float) -> float:
        while self.token_times_s and self.token_times_s[0] < now_s - _TPS_WINDOW_S:
            self.token_times_s.popleft()
        if not self.token_times_s:
            return 0.0
        span = max(now_s - self.token_times_s[0], 1e-3)
        return round(len(self.token_times_s) / span, 1)

    def requests_doc(self, since: int | None, limit: int) -> dict[str, Any]:
        total = self.ring_base + len(self.ring)
        start = max(self.ring_base, since if since is not None else total - limit)
        start = min(start, total)
        entries = self.ring[start - self.ring_base: start - self.ring_base + limit]
        return {"entries": entries, "next_cursor": start + len(entries)}


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """What the documents report of an engine at one instant.

    Why a value and not the engine: the reference engine and bench/replay's simulated server
    serve the same documents from the same function, so the daemon reads both alike.
    """

    instance_id: str
    state: str
    uptime_s: float
    served_model_name: str
    max_seq_len: int
    geometry: Geometry
    shape: ModelShape
    units: UnitCosts
    floors: Floors
    cache_budget_bytes: int
    last_rebuild: dict[str, Any] | None
    rebuild_mode: str
    chunk_bytes: int
    pause_budget_s: float
    device: str
    allocated_bytes: int
    weights_bytes: int
    used_pages: int
    used_mamba_slots: int
    active_requests: int


def _limits_doc(s: EngineSnapshot) -> dict[str, Any]:
    budget = s.cache_budget_bytes
    u = s.units
    return {
        "kv_tokens": {"min": s.floors.kv_tokens, "max": budget // u.kv_per_token},
        "moe_experts": {"min": s.floors.moe_slots,
                        "max": min(s.shape.max_expert_slots, budget // u.moe_per_expert)},
        "mamba_slots": {"min": s.floors.mamba_slots, "max": budget // u.mamba_per_slot},
        "swa_tokens": {"min": 0, "max": 0},
    }


def status_doc(s: EngineSnapshot) -> dict[str, Any]:
    """`GET /v1/cache/status`."""
    g = s.geometry
    u = s.units
    return {
        "state": s.state,
        "last_rebuild": s.last_rebuild,
        "geometry": {
            "num_pages": g.num_pages, "page_size": s.shape.page_size,
            "moe_cache_size": g.moe_cache_size, "num_mamba_slots": g.num_mamba_slots,
            "num_experts": s.shape.num_experts,
            "num_moe_layers": s.shape.num_moe_layers, "moe_cache_policy": "lru",
            "unit_bytes": {"kv_per_token": u.kv_per_token,
                           "moe_per_expert": u.moe_per_expert,
                           "mamba_per_slot": u.mamba_per_slot, "swa_per_token": 0},
            "swa_full_tokens_ratio": 0.0, "swa_page_size": 0, "num_swa_pages": 0,
            "cache_budget_bytes": s.cache_budget_bytes,
            "reasoning": None,
            "limits": _limits_doc(s),
        },
        # Deliberate difference: ft serve has no such block. It tells a client how this
        # engine executes a rebuild, so the planner prices it correctly.
        "engine": {"name": REFERENCE_ENGINE_NAME, "version": VERSION,
                   "rebuild_mode": s.rebuild_mode,
                   "chunk_bytes": s.chunk_bytes,
                   "pause_budget_s": s.pause_budget_s,
                   "device": s.device,
                   "allocated_bytes": s.allocated_bytes},
    }


def health_doc(s: EngineSnapshot) -> dict[str, Any]:
    """`GET /health`."""
    return {"status": "ok", "model": s.served_model_name,
            "instance_id": s.instance_id,
            "uptime_s": int(s.uptime_s),
            "maintenance": s.state, "version": VERSION}


def stats_doc(s: EngineSnapshot, served: ServedRequests, now_s: float) -> dict[str, Any]:
    """`GET /v1/stats`; `served` answers for the finished requests and decoded tokens."""
    durations = sorted(served.durations_ms)
    p95 = durations[min(len(durations) - 1, math.ceil(0.95 * len(durations)) - 1)] if (
        durations) else 0
    ttft = int(sum(served.ttft_ms) / len(served.ttft_ms)) if served.ttft_ms else 0
    g = s.geometry
    return {
        "instance_id": s.instance_id,
        "model": {"id": s.served_model_name, "ctx": s.max_seq_len,
                  "attn": "hybrid_linear", "moe": True, "sampling": {"temperature": 0.0}},
        "uptime_s": int(s.uptime_s),
        "kv": {"used_pages": s.used_pages, "total_pages": g.num_pages,
               "page_size": s.shape.page_size},
        "mamba": {"used_slots": s.used_mamba_slots,
                  "total_slots": g.num_mamba_slots},
        "swa": None,
        "vram_bytes": s.allocated_bytes + s.weights_bytes,
        "throughput": {"decode_tps": served.decode_tps(now_s), "prefill_tps": 0.0},
        "requests": {"active": s.active_requests,
                     "completed": served.completed, "p95_ms": p95, "ttft_mean_ms": ttft,
                     "prompt_tokens_total": served.prompt_tokens_total,
                     "completion_tokens_total": served.completion_tokens_total},
    }
