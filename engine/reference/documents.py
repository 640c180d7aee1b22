"""The ft serve documents the reference engine serves, and the record of requests behind them.

`/health`, `/v1/stats`, `/v1/cache/status` and `/v1/requests` keep ft serve 0.1.2's fields and
shapes (tests/fixtures/freetoken-0.1.2/), so that the daemon's parsers (`engine.ftserve.wire`,
`engine.ftserve.geometry`) read the reference engine and a real ft serve alike; the one
deliberate addition is the `engine` block of `/v1/cache/status`. They are built here, from the
engine's state at the moment of the call, so that `runtime` only serves.

The wall clock is read only for the request log's timestamps; every duration is monotonic.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from engine.ftserve.geometry import REFERENCE_ENGINE_NAME

if TYPE_CHECKING:
    from engine.reference.runtime import ReferenceEngine

__all__ = ["VERSION", "ServedRequests", "health_doc", "stats_doc", "status_doc"]

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


def _limits_doc(engine: ReferenceEngine) -> dict[str, Any]:
    budget = engine.memory_model.cache_budget_bytes
    u = engine.units
    return {
        "kv_tokens": {"min": engine.floors.kv_tokens, "max": budget // u.kv_per_token},
        "moe_experts": {"min": engine.floors.moe_slots,
                        "max": min(engine.shape.max_expert_slots, budget // u.moe_per_expert)},
        "mamba_slots": {"min": engine.floors.mamba_slots, "max": budget // u.mamba_per_slot},
        "swa_tokens": {"min": 0, "max": 0},
    }


def status_doc(engine: ReferenceEngine) -> dict[str, Any]:
    """`GET /v1/cache/status`."""
    g = engine.geometry()
    u = engine.units
    config = engine.config
    return {
        "state": engine.state,
        "last_rebuild": engine.last_rebuild,
        "geometry": {
            "num_pages": g.num_pages, "page_size": engine.shape.page_size,
            "moe_cache_size": g.moe_cache_size, "num_mamba_slots": g.num_mamba_slots,
            "num_experts": engine.shape.num_experts,
            "num_moe_layers": engine.shape.num_moe_layers, "moe_cache_policy": "lru",
            "unit_bytes": {"kv_per_token": u.kv_per_token,
                           "moe_per_expert": u.moe_per_expert,
                           "mamba_per_slot": u.mamba_per_slot, "swa_per_token": 0},
            "swa_full_tokens_ratio": 0.0, "swa_page_size": 0, "num_swa_pages": 0,
            "cache_budget_bytes": engine.memory_model.cache_budget_bytes,
            "reasoning": None,
            "limits": _limits_doc(engine),
        },
        # Deliberate difference: ft serve has no such block. It tells a client how this
        # engine executes a rebuild, so the planner prices it correctly.
        "engine": {"name": REFERENCE_ENGINE_NAME, "version": VERSION,
                   "rebuild_mode": config.rebuild_mode,
                   "chunk_bytes": config.chunk_bytes,
                   "pause_budget_s": config.rebuild_pause_budget_s,
                   "device": str(engine.device),
                   "allocated_bytes": engine.memory.allocated_bytes},
    }


def health_doc(engine: ReferenceEngine) -> dict[str, Any]:
    """`GET /health`."""
    return {"status": "ok", "model": engine.config.served_model_name,
            "instance_id": engine.instance_id,
            "uptime_s": int(engine.clock() - engine.started_s),
            "maintenance": engine.state, "version": VERSION}


def stats_doc(engine: ReferenceEngine) -> dict[str, Any]:
    """`GET /v1/stats`."""
    served = engine.served
    durations = sorted(served.durations_ms)
    p95 = durations[min(len(durations) - 1, math.ceil(0.95 * len(durations)) - 1)] if (
        durations) else 0
    ttft = int(sum(served.ttft_ms) / len(served.ttft_ms)) if served.ttft_ms else 0
    config = engine.config
    return {
        "instance_id": engine.instance_id,
        "model": {"id": config.served_model_name, "ctx": config.max_seq_len,
                  "attn": "hybrid_linear", "moe": True, "sampling": {"temperature": 0.0}},
        "uptime_s": int(engine.clock() - engine.started_s),
        "kv": {"used_pages": engine.kv.used_pages, "total_pages": engine.kv.num_pages,
               "page_size": engine.shape.page_size},
        "mamba": {"used_slots": engine.states.used_slots,
                  "total_slots": engine.states.num_slots},
        "swa": None,
        "vram_bytes": engine.memory.allocated_bytes + engine.weights_bytes,
        "throughput": {"decode_tps": served.decode_tps(engine.clock()), "prefill_tps": 0.0},
        "requests": {"active": len(engine.running) + len(engine.waiting),
                     "completed": served.completed, "p95_ms": p95, "ttft_mean_ms": ttft,
                     "prompt_tokens_total": served.prompt_tokens_total,
                     "completion_tokens_total": served.completion_tokens_total},
    }
