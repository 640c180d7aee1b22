"""The reference engine: pools, decoder and scheduler behind ft serve's semantics.

One asyncio task runs the scheduler: it admits waiting requests, decodes one token for every
running request (each computed alone, so outputs never depend on batching), and, between
rounds, advances a rebuild. The engine answers `POST /v1/cache/rebuild` as ft serve does (state
checks, fit-check, reply, 503 `busy` in `freetoken` mode while requests run);
`engine.reference.rebuild` carries the accepted rebuild out over the pools, in either mode, and
`engine.reference.documents` builds the documents the engine serves.

All times are monotonic.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.ftserve.budget import MemoryModel
from engine.ftserve.control import Answered, Refused, rebuild_verdict, reply_body
from engine.ftserve.geometry import (
    REFERENCE_ENGINE_NAME,
    EngineModel,
    Floors,
    Geometry,
    ModelShape,
    UnitCosts,
)
from engine.reference import documents
from engine.reference.admission import (
    AdmissionError,
    ceiling,
    fits,
    fitted_max_tokens,
    state_refusal,
)
from engine.reference.decoder import DecodeRequest, ModelSpec, TinyMoE
from engine.reference.memory import DeviceMemory, emulate_card, enable_expandable_segments
from engine.reference.pools import ExpertSlotPool, PagedKVPool, StatePool
from engine.reference.rebuild import (
    ChunkPause,
    Pool,
    RebuildEnd,
    RebuildJob,
    RebuildMode,
    RebuildPause,
    RebuildRunner,
)
from engine.reference.tokenizer import Tokenizer

__all__ = ["AdmissionError", "ChunkPause", "EngineConfig", "RebuildMode", "RebuildPause",
           "ReferenceEngine", "SchedulerRound"]

log = logging.getLogger(__name__)


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


@dataclass(frozen=True, slots=True)
class SchedulerRound:
    """Where one decoding round's wall time went, host-side, for a profile of decode speed.

    The round began at `started_s` on the engine's clock. `yielded_s` is the time since the
    previous round handed the event loop over (other tasks ran: HTTP handlers, and whatever
    shares the loop: an in-process daemon or load generator), 0 after idle; then admission
    (prefill) and rebuild work, then `decode_s` for `tokens` tokens at `context_tokens`
    positions in all, read from `kv_runs` page runs (contiguous slices: a fragmented page
    table costs a copy a run), with `misses` expert misses, which made `miss_layers` layers
    wait for their copies. GPU work that admission or a rebuild queued without waiting for it
    ends inside the round's decode, which waits for its last token.
    """

    started_s: float
    yielded_s: float
    admit_s: float
    rebuild_s: float
    decode_s: float
    tokens: int
    context_tokens: int
    kv_runs: int
    misses: int
    miss_layers: int


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
        self.rebuilds = RebuildRunner(
            self._pools(), mode=config.rebuild_mode,
            pause_budget_s=config.rebuild_pause_budget_s, live=self.geometry, emit=self._emit,
            on_end=self._complete)
        self.waiting: collections.deque[_Running] = collections.deque()
        self.running: dict[str, _Running] = {}
        self.served = documents.ServedRequests()
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
        self.rebuilds.close()
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

    # ---- documents (built by `engine.reference.documents`) ------------------------------

    def snapshot(self) -> documents.EngineSnapshot:
        config = self.config
        return documents.EngineSnapshot(
            instance_id=self.instance_id, state=self.state,
            uptime_s=self.clock() - self.started_s, served_model_name=config.served_model_name,
            max_seq_len=config.max_seq_len, geometry=self.geometry(), shape=self.shape,
            units=self.units, floors=self.floors,
            cache_budget_bytes=self.memory_model.cache_budget_bytes,
            last_rebuild=self.last_rebuild, rebuild_mode=config.rebuild_mode,
            chunk_bytes=config.chunk_bytes, pause_budget_s=config.rebuild_pause_budget_s,
            device=str(self.device), allocated_bytes=self.memory.allocated_bytes,
            weights_bytes=self.weights_bytes, used_pages=self.kv.used_pages,
            used_mamba_slots=self.states.used_slots,
            active_requests=len(self.running) + len(self.waiting))

    def status_doc(self) -> dict[str, Any]:
        return documents.status_doc(self.snapshot())

    def health_doc(self) -> dict[str, Any]:
        return documents.health_doc(self.snapshot())

    def stats_doc(self) -> dict[str, Any]:
        return documents.stats_doc(self.snapshot(), self.served, self.clock())

    def requests_doc(self, since: int | None, limit: int) -> dict[str, Any]:
        return self.served.requests_doc(since, limit)

    # ---- generation --------------------------------------------------------------------

    async def generate(self, prompt_ids: list[int], max_tokens: int, *, seed: int = 0,
                       path: str = "/v1/completions", stream: bool = False
                       ) -> AsyncIterator[int]:
        """Admit one request and yield its tokens; raises AdmissionError when refused."""
        refusal = state_refusal(self.state, self.config.rebuild_mode)
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
        self._emit("request_queued", run)
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
        return fitted_max_tokens(prompt_tokens, max_tokens, self.max_seq_len())

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
        ttft_ms = None if run.first_token_s is None else int(1000 * (run.first_token_s -
                                                                     run.started_s))
        self.served.finished(
            path=run.path, status=status, model=self.config.served_model_name,
            duration_ms=int(1000 * (now - run.started_s)), ttft_ms=ttft_ms,
            prompt_tokens=len(run.decode.prompt_ids), completion_tokens=run.decode.generated,
            stream=run.stream, error=error)
        self._wake.set()

    def _admit(self) -> None:
        job = self.rebuilds.job
        pages = ceiling(self.kv.num_pages, None if job is None else job.target.num_pages)
        slots = ceiling(self.states.num_slots,
                        None if job is None else job.target.num_mamba_slots)
        while self.waiting and len(self.running) < self.config.max_running_requests:
            run = self.waiting[0]
            if not fits(run.need_pages, self.kv.used_pages, pages, self.states.used_slots,
                        slots):
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
            self.served.token(now)
            if run.first_token_s is None:
                run.first_token_s = now
            run.tokens.put_nowait(token)
            if run.decode.generated >= run.decode.max_tokens:
                run.tokens.put_nowait(None)
                self.running.pop(rid)
                self.kv.free_request(rid)
                self.states.release(rid)

    async def _scheduler(self) -> None:
        handed_over: float | None = None  # when the last decoding round yielded the loop
        while True:
            began, started_s = time.perf_counter(), self.clock()
            self._admit()
            admitted = time.perf_counter()
            if self.rebuilds.job is not None:
                self.rebuilds.advance(running=bool(self.running), waiting=bool(self.waiting))
            advanced = time.perf_counter()
            if not self.running and self.rebuilds.job is None:
                handed_over = None
                self._wake.clear()
                await self._wake.wait()
                continue
            decoding = [run.decode for run in self.running.values()]
            context, misses = sum(d.position for d in decoding), self.experts.misses
            self._decode_round()
            ended = time.perf_counter()
            if self.listeners and decoding:
                self._emit("scheduler_round", SchedulerRound(
                    started_s=started_s,
                    yielded_s=0.0 if handed_over is None else began - handed_over,
                    admit_s=admitted - began, rebuild_s=advanced - admitted,
                    decode_s=ended - advanced, tokens=len(decoding), context_tokens=context,
                    kv_runs=sum(d.kv_runs for d in decoding),
                    misses=self.experts.misses - misses,
                    miss_layers=sum(d.miss_layers for d in decoding)))
            handed_over = time.perf_counter() if self.running else None
            await asyncio.sleep(0)

    # ---- rebuilds ----------------------------------------------------------------------

    def _emit(self, event: str, payload: Any) -> None:
        for listener in self.listeners:
            listener(event, payload)

    async def rebuild(self, raw: Any) -> tuple[int, dict[str, Any]]:
        """Handle `POST /v1/cache/rebuild`: (HTTP status, body), as ft serve answers."""
        verdict = rebuild_verdict(
            raw, state=self.state, mode=self.config.rebuild_mode, live=self.geometry(),
            model=self.memory_model, used_pages=self.kv.used_pages,
            used_mamba_slots=self.states.used_slots, busy=bool(self.running or self.waiting))
        if isinstance(verdict, Answered):
            return verdict.http_status, verdict.body
        request_id = str(uuid.uuid4())
        if isinstance(verdict, Refused):
            return self._finish(request_id, verdict.status, verdict.error, 503)
        loop = asyncio.get_running_loop()
        job = self.rebuilds.begin(request_id, self.geometry(), verdict.target,
                                  loop.create_future(), self.clock())
        self.state = "rebuilding"
        self._emit("rebuild_started", job)
        self._wake.set()
        try:
            return await asyncio.wait_for(asyncio.shield(job.done), timeout=verdict.timeout_s)
        except TimeoutError:
            return 504, {"status": "timeout", "request_id": request_id}

    def _finish(self, request_id: str, status: str, error: str | None,
                http_status: int) -> tuple[int, dict[str, Any]]:
        body = reply_body(request_id, status, self.geometry(), error)
        self.last_rebuild = body
        self.transitions[(self.config.rebuild_mode, status)] += 1
        return http_status, body

    def _pools(self) -> dict[str, Pool]:
        return {"moe": self.experts, "kv": self.kv, "mamba": self.states}

    def _complete(self, job: RebuildJob, end: RebuildEnd) -> None:
        """The runner's report that `job` ended: reply, and serve again (or stay latched)."""
        # The pools left freed chunks in torch's cache for the rebuild's next steps (pools.py).
        self.memory.release_to_driver()
        self.state = "failed" if end.latch else "serving"
        self._readmit_waiting()
        result = self._finish(job.request_id, end.status, end.error, end.http_status)
        self._emit("rebuild_finished", (job, end.status, self.clock() - job.started_s))
        if not job.done.done():
            job.done.set_result(result)
        log.info("rebuild finished", extra={"status": end.status,
                                            "mode": self.config.rebuild_mode,
                                            "geometry": self.geometry().to_json()})
        self._wake.set()
