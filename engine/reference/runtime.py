"""The reference engine: pools, decoder, scheduler and rebuilds, with ft serve's semantics.

One asyncio task runs the scheduler: it admits waiting requests, decodes one token for every
running request (each computed alone, so outputs never depend on batching), and, between
rounds, advances a rebuild. Two rebuild modes, so benchmarks compare them on one engine:

- `incremental` (default): free-first and chunked, content-keeping, while serving. Shrinking
  pools move their live content into kept chunks and release chunks one at a time; growing
  pools then add chunks one at a time. While requests run, each scheduler round spends up to
  `rebuild_pause_budget_s` on chunk operations and then decodes: one operation a round would
  stretch an N-chunk rebuild over N decode rounds, and requests queue behind it, while a
  pause of a few ms a round costs decode little. With no request running or waiting, nothing
  waits for the rebuild to step aside: it runs to its end, yielding to the event loop only so
  that HTTP handlers stay responsive.
- `freetoken`: what ft serve 0.1.2 does. Idle only (503 `busy` otherwise), MoE then KV then
  mamba, each pool dropped whole and reallocated, contents lost. An OOM rolls back and replies
  `rejected`; an OOM in the KV or mamba step leaves the rollback broken and latches `failed`,
  as FreeToken #526 describes.

All times are monotonic; the wall clock is used only for the request log's timestamps.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable, Generator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import torch

from engine.ftserve.budget import MemoryModel
from engine.ftserve.control import (
    RebuildRequest,
    fit_check_error,
    geometry_error,
    parse_rebuild_body,
    reply_body,
)
from engine.ftserve.geometry import (
    REFERENCE_ENGINE_NAME,
    EngineModel,
    Floors,
    Geometry,
    ModelShape,
    UnitCosts,
)
from engine.reference.decoder import DecodeRequest, ModelSpec, TinyMoE
from engine.reference.memory import DeviceMemory, emulate_card, enable_expandable_segments
from engine.reference.pools import ChunkEvent, ExpertSlotPool, PagedKVPool, StatePool
from engine.reference.tokenizer import Tokenizer

__all__ = ["AdmissionError", "ChunkPause", "EngineConfig", "RebuildMode", "RebuildPause",
           "ReferenceEngine"]

log = logging.getLogger(__name__)

RebuildMode = Literal["incremental", "freetoken"]
VERSION = "0.1.0"
_RING = 512
_TPS_WINDOW_S = 5.0
# Idle rebuilds yield to the event loop after this much work: long enough that yielding costs
# nothing measurable, short enough that /v1/cache/status or a new request is answered without
# a delay a human or the daemon's status poll (0.5 s apart while a rebuild runs) would notice.
_IDLE_SLICE_S = 0.05


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How to build the engine. Sizes in the engine's units, memory in bytes."""

    model: ModelSpec = field(default_factory=ModelSpec)
    device: str = "cpu"
    device_memory_bytes: int | None = None
    memory_ratio: float = 0.9
    cache_budget_bytes: int | None = None
    moe_cache_size: int = 128
    # None: sized as ft serve boots without --num-tokens (`MemoryModel.boot_kv_pages`), which
    # lands up to a page above the budget, plus `boot_drift_bytes` as its free-memory reading.
    num_pages: int | None = 256
    boot_drift_bytes: int = 0
    num_mamba_slots: int = 8
    max_running_requests: int = 4
    max_seq_len: int = 1 << 20
    rebuild_mode: RebuildMode = "incremental"
    chunk_bytes: int = 2 << 20
    # Chunk-operation time per decode round while requests run; at least one operation runs
    # each round, so 0 is one operation a round.
    rebuild_pause_budget_s: float = 0.002
    served_model_name: str = "tiny-moe"

    def __post_init__(self) -> None:
        if self.rebuild_mode not in ("incremental", "freetoken"):
            raise ValueError("rebuild_mode must be 'incremental' or 'freetoken'")
        if not 0.0 < self.memory_ratio <= 1.0:
            raise ValueError("memory_ratio must be in (0, 1]")
        if self.max_running_requests < 1:
            raise ValueError("max_running_requests must be at least 1")
        if not self.rebuild_pause_budget_s >= 0.0:  # NaN too
            raise ValueError("rebuild_pause_budget_s must be >= 0")
        if self.boot_drift_bytes and self.num_pages is not None:
            raise ValueError("a boot drift applies only to KV sized at boot (--kv-tokens auto)")


class AdmissionError(Exception):
    """A generation the engine refuses, with ft serve's HTTP status and message."""

    def __init__(self, http_status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.http_status = http_status
        self.message = message
        self.code = code


@dataclass(slots=True)
class _Running:
    decode: DecodeRequest
    # Tokens, then None at the end; an AdmissionError instead when a rebuild took away the
    # context the waiting request was admitted against (`_readmit_waiting`).
    tokens: asyncio.Queue[int | AdmissionError | None]
    need_pages: int
    path: str
    stream: bool
    started_s: float
    first_token_s: float | None = None
    admitted: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(slots=True)
class _RebuildJob:
    request_id: str
    start: Geometry
    target: Geometry
    ops: Generator[ChunkEvent | None, None, None]
    done: asyncio.Future[tuple[int, dict[str, Any]]]
    started_s: float


@dataclass(frozen=True, slots=True)
class ChunkPause:
    """One chunk operation of an incremental rebuild: how long it took."""

    pool: str
    op: str
    seconds: float


@dataclass(frozen=True, slots=True)
class RebuildPause:
    """One scheduler round's rebuild work while requests were running: how long their decode
    waited, for how many chunk operations, touching how many bytes (moved, allocated and
    freed, as the operations' `ChunkEvent.nbytes`)."""

    ops: int
    nbytes: int
    seconds: float


class ReferenceEngine:
    """Real torch pools behind ft serve's control semantics (see module docstring)."""

    def __init__(self, config: EngineConfig, *,
                 clock: Callable[[], float] = time.monotonic,
                 model: TinyMoE | None = None) -> None:
        self.config = config
        self.clock = clock
        self.instance_id = str(uuid.uuid4())
        self.state = "loading"
        self.started_s = clock()
        self.device = torch.device(config.device)
        if self.device.type == "cuda":
            # Freed chunks must go back to the driver page by page (docs/gpu-allocation.md).
            enable_expandable_segments()
        spec = config.model
        self.tokenizer = Tokenizer(spec.output_vocab)
        if model is not None and (model.spec != spec or model.device != self.device):
            raise ValueError("model: a prebuilt TinyMoE must match config.model and the device")
        # A benchmark that builds engine after engine passes one model: building the host
        # expert bank (GiBs, pinned) dominates an engine's start, and the weights are the same.
        self.model = model if model is not None else TinyMoE(spec, self.device)
        self.weights_bytes = spec.dense_weight_bytes
        assert self.weights_bytes == sum(t.numel() * t.element_size()
                                         for t in self.model.dense_weights())
        card = config.device_memory_bytes
        self.filler = None
        if card is not None and self.device.type == "cuda":
            self.filler = emulate_card(card, self.device)
        pool_cap = None if card is None or self.device.type == "cuda" else max(
            0, card - self.weights_bytes)
        self.memory = DeviceMemory(self.device, capacity_bytes=pool_cap)
        if config.cache_budget_bytes is not None:
            budget = config.cache_budget_bytes
        elif card is not None:
            budget = int(config.memory_ratio * card) - self.weights_bytes
        else:
            raise ValueError("give device_memory_bytes or cache_budget_bytes")
        self.units = UnitCosts(kv_per_token=spec.kv_bytes_per_token,
                               moe_per_expert=spec.expert_bytes,
                               mamba_per_slot=spec.state_bytes, swa_per_token=0)
        self.shape = ModelShape(spec.page_size, spec.num_experts, spec.num_layers, 0,
                                has_mamba=True, has_swa=False)
        self.floors = Floors(kv_tokens=spec.page_size, moe_slots=spec.num_experts,
                             mamba_slots=config.max_running_requests)
        engine_model = EngineModel(
            kind="reference" if config.rebuild_mode == "incremental" else "freetoken",
            name=REFERENCE_ENGINE_NAME, chunk_bytes=config.chunk_bytes,
            serves_while_rebuilding=config.rebuild_mode == "incremental")
        self.memory_model = MemoryModel(self.shape, self.units, self.floors, engine_model,
                                        budget)
        self.experts = ExpertSlotPool(
            self.memory, num_layers=spec.num_layers, num_experts=spec.num_experts,
            expert_bytes=spec.expert_bytes, num_slots=config.moe_cache_size,
            chunk_bytes=config.chunk_bytes)
        num_pages = config.num_pages
        if num_pages is None:
            num_pages = self.memory_model.boot_kv_pages(
                moe_slots=config.moe_cache_size, mamba_slots=config.num_mamba_slots,
                drift_bytes=config.boot_drift_bytes)
        self.kv = PagedKVPool(self.memory, page_size=spec.page_size,
                              kv_bytes_per_token=spec.kv_bytes_per_token,
                              num_pages=num_pages, chunk_bytes=config.chunk_bytes)
        self.states = StatePool(self.memory, state_bytes=spec.state_bytes,
                                num_slots=config.num_mamba_slots, chunk_bytes=config.chunk_bytes)
        self.last_rebuild: dict[str, Any] | None = None
        self.rebuild_job: _RebuildJob | None = None
        self.waiting: collections.deque[_Running] = collections.deque()
        self.running: dict[str, _Running] = {}
        self.ring: list[dict[str, Any]] = []
        self.ring_base = 0
        self.completed = 0
        self.prompt_tokens_total = 0
        self.completion_tokens_total = 0
        self.durations_ms: collections.deque[int] = collections.deque(maxlen=256)
        self.ttft_ms: collections.deque[int] = collections.deque(maxlen=256)
        self.token_times: collections.deque[float] = collections.deque()
        self.chunk_pauses: collections.deque[ChunkPause] = collections.deque(maxlen=4096)
        self.rebuild_pauses: collections.deque[RebuildPause] = collections.deque(maxlen=4096)
        self.transitions: collections.Counter[tuple[str, str]] = collections.Counter()
        self.listeners: list[Callable[[str, Any], None]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.state = "serving"

    # ---- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._scheduler(), name="reference-engine")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for run in list(self.running.values()) + list(self.waiting):
            run.tokens.put_nowait(None)
        self.running.clear()
        self.waiting.clear()
        # The pools go now, not when the last reference to the engine does: a client task or
        # a traceback that outlives the engine must not keep GiBs of device memory.
        job, self.rebuild_job = self.rebuild_job, None
        if job is not None:
            job.ops.close()  # the pool being resized settles (its `finally`)
            if not job.done.done():
                job.done.set_result((503, {"status": "failed", "request_id": job.request_id,
                                           "error": "engine closed during the rebuild"}))
        for pool in self._pools().values():
            pool.close()
        self.memory.release_to_driver()
        self.state = "stopping"
        if self.filler is not None:
            self.filler.release()

    # ---- views -------------------------------------------------------------------------

    def geometry(self) -> Geometry:
        return Geometry(self.experts.num_slots, self.kv.num_pages, self.states.num_slots)

    def storage_bytes(self) -> int:
        """What torch itself reports for every chunk the pools hold, to check the count."""
        return sum(t.untyped_storage().nbytes() for pool in (self.experts, self.kv, self.states)
                   for t in pool.chunk_tensors())

    def max_seq_len(self) -> int:
        return min(self.config.max_seq_len, self.kv.num_pages * self.shape.page_size)

    def limits_doc(self) -> dict[str, Any]:
        budget = self.memory_model.cache_budget_bytes
        u = self.units
        return {
            "kv_tokens": {"min": self.floors.kv_tokens, "max": budget // u.kv_per_token},
            "moe_experts": {"min": self.floors.moe_slots,
                            "max": min(self.shape.max_expert_slots, budget // u.moe_per_expert)},
            "mamba_slots": {"min": self.floors.mamba_slots, "max": budget // u.mamba_per_slot},
            "swa_tokens": {"min": 0, "max": 0},
        }

    def status_doc(self) -> dict[str, Any]:
        g = self.geometry()
        u = self.units
        return {
            "state": self.state,
            "last_rebuild": self.last_rebuild,
            "geometry": {
                "num_pages": g.num_pages, "page_size": self.shape.page_size,
                "moe_cache_size": g.moe_cache_size, "num_mamba_slots": g.num_mamba_slots,
                "num_experts": self.shape.num_experts,
                "num_moe_layers": self.shape.num_moe_layers, "moe_cache_policy": "lru",
                "unit_bytes": {"kv_per_token": u.kv_per_token,
                               "moe_per_expert": u.moe_per_expert,
                               "mamba_per_slot": u.mamba_per_slot, "swa_per_token": 0},
                "swa_full_tokens_ratio": 0.0, "swa_page_size": 0, "num_swa_pages": 0,
                "cache_budget_bytes": self.memory_model.cache_budget_bytes,
                "reasoning": None,
                "limits": self.limits_doc(),
            },
            # Deliberate difference: ft serve has no such block. It tells a client how this
            # engine executes a rebuild, so the planner prices it correctly.
            "engine": {"name": REFERENCE_ENGINE_NAME, "version": VERSION,
                       "rebuild_mode": self.config.rebuild_mode,
                       "chunk_bytes": self.config.chunk_bytes,
                       "pause_budget_s": self.config.rebuild_pause_budget_s,
                       "device": str(self.device),
                       "allocated_bytes": self.memory.allocated_bytes},
        }

    def health_doc(self) -> dict[str, Any]:
        return {"status": "ok", "model": self.config.served_model_name,
                "instance_id": self.instance_id,
                "uptime_s": int(self.clock() - self.started_s),
                "maintenance": self.state, "version": VERSION}

    def _decode_tps(self) -> float:
        now = self.clock()
        while self.token_times and self.token_times[0] < now - _TPS_WINDOW_S:
            self.token_times.popleft()
        if not self.token_times:
            return 0.0
        span = max(now - self.token_times[0], 1e-3)
        return round(len(self.token_times) / span, 1)

    def stats_doc(self) -> dict[str, Any]:
        durations = sorted(self.durations_ms)
        p95 = durations[min(len(durations) - 1, math.ceil(0.95 * len(durations)) - 1)] if (
            durations) else 0
        ttft = int(sum(self.ttft_ms) / len(self.ttft_ms)) if self.ttft_ms else 0
        return {
            "instance_id": self.instance_id,
            "model": {"id": self.config.served_model_name, "ctx": self.config.max_seq_len,
                      "attn": "hybrid_linear", "moe": True, "sampling": {"temperature": 0.0}},
            "uptime_s": int(self.clock() - self.started_s),
            "kv": {"used_pages": self.kv.used_pages, "total_pages": self.kv.num_pages,
                   "page_size": self.shape.page_size},
            "mamba": {"used_slots": self.states.used_slots,
                      "total_slots": self.states.num_slots},
            "swa": None,
            "vram_bytes": self.memory.allocated_bytes + self.weights_bytes,
            "throughput": {"decode_tps": self._decode_tps(), "prefill_tps": 0.0},
            "requests": {"active": len(self.running) + len(self.waiting),
                         "completed": self.completed, "p95_ms": p95, "ttft_mean_ms": ttft,
                         "prompt_tokens_total": self.prompt_tokens_total,
                         "completion_tokens_total": self.completion_tokens_total},
        }

    def requests_doc(self, since: int | None, limit: int) -> dict[str, Any]:
        total = self.ring_base + len(self.ring)
        start = max(self.ring_base, since if since is not None else total - limit)
        start = min(start, total)
        entries = self.ring[start - self.ring_base: start - self.ring_base + limit]
        return {"entries": entries, "next_cursor": start + len(entries)}

    # ---- generation --------------------------------------------------------------------

    def _refusal(self) -> AdmissionError | None:
        if self.state == "serving" or (
                self.state == "rebuilding" and self.config.rebuild_mode == "incremental"):
            return None
        if self.state == "failed":
            return AdmissionError(503, "server unavailable: maintenance failed (restart required)")
        if self.state == "loading":
            return AdmissionError(503, "model is still loading")
        return AdmissionError(503, "server unavailable: cache rebuild in progress")

    async def generate(self, prompt_ids: list[int], max_tokens: int, *, seed: int = 0,
                       path: str = "/v1/completions", stream: bool = False
                       ) -> AsyncIterator[int]:
        """Admit one request and yield its tokens; raises AdmissionError when refused."""
        refusal = self._refusal()
        if refusal is not None:
            raise refusal
        if not prompt_ids:
            prompt_ids = [self.tokenizer.bos_id]
        max_tokens = self._fitted_max_tokens(len(prompt_ids), max_tokens)
        request_id = uuid.uuid4().hex
        run = _Running(
            decode=self.model.new_request(request_id, prompt_ids, max_tokens, seed),
            tokens=asyncio.Queue(),
            need_pages=self.shape.pages_for_tokens(len(prompt_ids) + max_tokens),
            path=path, stream=stream, started_s=self.clock())
        self.waiting.append(run)
        self._wake.set()
        status, error = 200, None
        try:
            while True:
                token = await run.tokens.get()
                if isinstance(token, AdmissionError):
                    status, error = token.http_status, token.message
                    raise token
                if token is None:
                    break
                yield token
        except BaseException:
            if status == 200:
                status, error = 499, "client disconnected"
            raise
        finally:
            self._forget(run, status, error)

    def _fitted_max_tokens(self, prompt_tokens: int, max_tokens: int) -> int:
        """Admission against the live context, as ft serve's (scheduler.py
        `Scheduler._process_one_msg`): a prompt it cannot hold is refused with
        `context_length_exceeded` and ft serve's message (the phrase agents match on), and
        prompt + max_tokens above it is not refused: max_tokens is clipped to what is left.
        The clip is not silent on the wire: the generation ends on its budget and reports
        `finish_reason: "length"` with the tokens it really made in `usage`, streamed too."""
        limit = self.max_seq_len()
        if prompt_tokens >= limit:
            raise AdmissionError(
                400, f"prompt is too long: {prompt_tokens} tokens > {limit} maximum (prompt + "
                     "generation); shorten the prompt or increase the KV cache budget",
                code="context_length_exceeded")
        return max(1, min(max_tokens, limit - prompt_tokens))

    def _readmit_waiting(self) -> None:
        """Admission again for the requests still waiting, against the geometry a rebuild
        left: one admitted before a KV shrink would otherwise wait at the head of the FIFO
        for pages that no longer exist, and every request behind it with it."""
        for run in list(self.waiting):
            prompt_tokens = len(run.decode.prompt_ids)
            try:
                run.decode.max_tokens = self._fitted_max_tokens(prompt_tokens,
                                                                run.decode.max_tokens)
            except AdmissionError as exc:
                self.waiting.remove(run)
                run.tokens.put_nowait(exc)
                continue
            run.need_pages = self.shape.pages_for_tokens(prompt_tokens + run.decode.max_tokens)

    def _forget(self, run: _Running, status: int, error: str | None) -> None:
        rid = run.decode.request_id
        if run in self.waiting:
            self.waiting.remove(run)
        if self.running.pop(rid, None) is not None:
            self.kv.free_request(rid)
            self.states.release(rid)
        now = self.clock()
        duration_ms = int(1000 * (now - run.started_s))
        self.completed += 1
        self.durations_ms.append(duration_ms)
        ttft = None if run.first_token_s is None else int(1000 * (run.first_token_s -
                                                                  run.started_s))
        if ttft is not None:
            self.ttft_ms.append(ttft)
        self.prompt_tokens_total += len(run.decode.prompt_ids)
        self.completion_tokens_total += run.decode.generated
        self.ring.append({
            "ts": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "method": "POST",
            "path": run.path, "status": status, "model": self.config.served_model_name,
            "duration_ms": duration_ms, "ttft_ms": ttft,
            "prompt_tokens": len(run.decode.prompt_ids),
            "completion_tokens": run.decode.generated, "stream": run.stream, "error": error})
        if len(self.ring) > _RING:
            del self.ring[0]
            self.ring_base += 1
        self._wake.set()

    def _page_ceiling(self) -> int:
        """Usable pages admission may fill: during a KV shrink, the target's."""
        job = self.rebuild_job
        if job is not None and job.target.num_pages < self.kv.num_pages:
            return job.target.num_pages
        return self.kv.num_pages

    def _slot_ceiling(self) -> int:
        job = self.rebuild_job
        if job is not None and job.target.num_mamba_slots < self.states.num_slots:
            return job.target.num_mamba_slots
        return self.states.num_slots

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.config.max_running_requests:
            run = self.waiting[0]
            if (self.kv.used_pages + run.need_pages > self._page_ceiling()
                    or self.states.used_slots + 1 > self._slot_ceiling()):
                return  # FIFO: a large request is not overtaken (no starvation)
            self.waiting.popleft()
            rid = run.decode.request_id
            self.kv.allocate_pages(rid, run.need_pages)
            self.states.acquire(rid)
            self.model.prefill(run.decode, self.kv, self.states)
            self.running[rid] = run

    def _decode_round(self) -> None:
        for rid, run in list(self.running.items()):
            token = self.model.decode_step(run.decode, self.kv, self.experts, self.states)
            now = self.clock()
            self.token_times.append(now)
            if run.first_token_s is None:
                run.first_token_s = now
            run.tokens.put_nowait(token)
            if run.decode.generated >= run.decode.max_tokens:
                run.tokens.put_nowait(None)
                self.running.pop(rid)
                self.kv.free_request(rid)
                self.states.release(rid)

    async def _scheduler(self) -> None:
        while True:
            self._admit()
            if self.rebuild_job is not None:
                self._advance_rebuild()
            if not self.running and self.rebuild_job is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            self._decode_round()
            await asyncio.sleep(0)

    # ---- rebuilds ----------------------------------------------------------------------

    def _emit(self, event: str, payload: Any) -> None:
        for listener in self.listeners:
            listener(event, payload)

    async def rebuild(self, raw: Any) -> tuple[int, dict[str, Any]]:
        """Handle `POST /v1/cache/rebuild`: (HTTP status, body), as ft serve answers."""
        parsed = parse_rebuild_body(raw, modes=("if_idle", "incremental"))
        if isinstance(parsed, tuple):
            return parsed
        if self.state == "loading":
            return 503, {"status": "loading",
                         "error": "model is still loading; cannot rebuild cache yet"}
        if self.state == "failed":
            return 503, {"status": "failed",
                         "error": "server latched in maintenance; restart required"}
        if self.state == "rebuilding":
            return 409, {"status": "busy", "error": "a cache rebuild is already in progress"}
        if self.state == "stopping":
            return 409, {"status": "busy", "error": "engine stop is in progress"}
        request_id = str(uuid.uuid4())
        live = self.geometry()
        target = parsed.target(live)
        error = geometry_error(parsed, self.memory_model) or fit_check_error(
            target, self.memory_model) or self._live_content_error(target)
        if error is not None:
            return self._finish(request_id, "rejected", error, 503)
        if self.config.rebuild_mode == "freetoken" and (self.running or self.waiting):
            # ft serve's scheduler answers `busy` with no error text (a full reply, 503).
            return self._finish(request_id, "busy", None, 503)
        loop = asyncio.get_running_loop()
        job = _RebuildJob(request_id, live, target, self._ops(live, target, parsed),
                          loop.create_future(), self.clock())
        self.rebuild_job = job
        self.state = "rebuilding"
        self._emit("rebuild_started", job)
        self._wake.set()
        try:
            return await asyncio.wait_for(asyncio.shield(job.done), timeout=parsed.timeout_s)
        except TimeoutError:
            return 504, {"status": "timeout", "request_id": request_id}

    def _live_content_error(self, target: Geometry) -> str | None:
        if target.num_pages < self.kv.used_pages:
            return (f"kv: {self.kv.used_pages} pages are live in running requests; cannot "
                    f"shrink to {target.num_pages}")
        if target.num_mamba_slots < self.states.used_slots:
            return (f"mamba: {self.states.used_slots} slots are live in running requests; "
                    f"cannot shrink to {target.num_mamba_slots}")
        return None

    def _finish(self, request_id: str, status: str, error: str | None,
                http_status: int) -> tuple[int, dict[str, Any]]:
        body = reply_body(request_id, status, self.geometry(), error)
        self.last_rebuild = body
        self.transitions[(self.config.rebuild_mode, status)] += 1
        return http_status, body

    def _pools(self) -> dict[str, ExpertSlotPool | PagedKVPool | StatePool]:
        return {"moe": self.experts, "kv": self.kv, "mamba": self.states}

    @staticmethod
    def _size(g: Geometry, pool: str) -> int:
        return {"moe": g.moe_cache_size, "kv": g.num_pages, "mamba": g.num_mamba_slots}[pool]

    def _ops(self, live: Geometry, target: Geometry,
             request: RebuildRequest) -> Generator[ChunkEvent | None, None, None]:
        if self.config.rebuild_mode == "freetoken":
            return self._freetoken_ops(live, target)
        return self._incremental_ops(live, target)

    def _incremental_ops(self, live: Geometry,
                         target: Geometry) -> Generator[ChunkEvent, None, None]:
        pools = self._pools()
        changed = [p for p in ("moe", "kv", "mamba")
                   if self._size(live, p) != self._size(target, p)]
        shrinks = [p for p in changed if self._size(target, p) < self._size(live, p)]
        for pool in shrinks + [p for p in changed if p not in shrinks]:
            yield from pools[pool].resize_steps(self._size(target, pool))

    def _freetoken_ops(self, live: Geometry, target: Geometry) -> Generator[None, None, None]:
        # One blocking call, as ft serve's scheduler runs it: nothing interleaves.
        pools = self._pools()
        touched: list[str] = []
        for pool in ("moe", "kv", "mamba"):
            if self._size(live, pool) == self._size(target, pool):
                continue
            touched.append(pool)
            try:
                pools[pool].reallocate(self._size(target, pool))
            except torch.OutOfMemoryError as exc:
                oom = f"OutOfMemoryError({str(exc)!r})"
                if pool != "moe":
                    # #526: KV and mamba pools read their shape from the buffer they nulled.
                    raise _Latched(f"{oom}; rollback to the prior geometry also failed: "
                                   "AttributeError(\"'NoneType' object has no attribute "
                                   "'shape'\")") from exc
                for done in touched:
                    pools[done].reallocate(self._size(live, done))
                raise _RolledBack(f"rebuild failed and was rolled back: {oom}") from exc
        yield None

    def _advance_rebuild(self) -> None:
        """Chunk operations for one scheduler round, at least one: up to the pause budget while
        requests run or wait, up to `_IDLE_SLICE_S` when none do. Only a round with requests
        running is recorded as a `RebuildPause`: theirs is the decode that waited."""
        job = self.rebuild_job
        assert job is not None
        if self.config.rebuild_mode == "freetoken" and (self.running or self.waiting):
            return  # requests admitted before the flip are served first
        decoding = bool(self.running)
        slice_s = (self.config.rebuild_pause_budget_s if decoding or self.waiting
                   else _IDLE_SLICE_S)
        began = time.perf_counter()
        ops = nbytes = 0
        while True:
            op_bytes = self._rebuild_op(job)
            if op_bytes is None:
                break
            ops += 1
            nbytes += op_bytes
            if time.perf_counter() - began >= slice_s:
                break
        if decoding:
            pause = RebuildPause(ops, nbytes, time.perf_counter() - began)
            self.rebuild_pauses.append(pause)
            self._emit("rebuild_pause", pause)

    def _rebuild_op(self, job: _RebuildJob) -> int | None:
        """Run the rebuild's next operation: its bytes, or None once the rebuild has ended
        (completed, rolled back or latched)."""
        began = time.perf_counter()
        try:
            event = next(job.ops)
        except StopIteration:
            self._complete(job, "ok", None, 200)
            return None
        except _RolledBack as exc:
            self._complete(job, "rejected", str(exc), 503)
            return None
        except _Latched as exc:
            self._complete(job, "failed", str(exc), 503, latch=True)
            return None
        except torch.OutOfMemoryError as exc:
            self._roll_back_incremental(job)
            self._complete(job, "rejected",
                           f"rebuild failed and was rolled back: OutOfMemoryError({str(exc)!r})",
                           503)
            return None
        if event is None:  # freetoken's one blocking step
            return 0
        pause = ChunkPause(event.pool, event.op, time.perf_counter() - began)
        self.chunk_pauses.append(pause)
        self._emit("chunk", pause)
        return event.nbytes

    def _roll_back_incremental(self, job: _RebuildJob) -> None:
        pools = self._pools()
        live = self.geometry()
        grown = [p for p in pools if self._size(live, p) > self._size(job.start, p)]
        shrunk = [p for p in pools if self._size(live, p) < self._size(job.start, p)]
        for pool in grown + shrunk:
            for _ in pools[pool].resize_steps(self._size(job.start, pool)):
                pass

    def _complete(self, job: _RebuildJob, status: str, error: str | None, http_status: int,
                  *, latch: bool = False) -> None:
        self.rebuild_job = None
        # The pools left freed chunks in torch's cache for the rebuild's next steps (pools.py).
        self.memory.release_to_driver()
        self.state = "failed" if latch else "serving"
        self._readmit_waiting()
        result = self._finish(job.request_id, status, error, http_status)
        self._emit("rebuild_finished", (job, status, self.clock() - job.started_s))
        if not job.done.done():
            job.done.set_result(result)
        log.info("rebuild finished", extra={"status": status, "mode": self.config.rebuild_mode,
                                            "geometry": self.geometry().to_json()})
        self._wake.set()


class _RolledBack(Exception):
    pass


class _Latched(Exception):
    pass
