"""A simulated server with the reference engine's semantics, in virtual time.

Why: the replay must run the real daemon, so the server it talks to must answer the control
API exactly as the reference engine does (the same documents, the same rebuild verdicts, the
same admission), while its time comes from the calibrated cost model instead of a GPU. What
is shared with the reference engine is shared code, not a copy: the documents
(`engine.reference.documents`, from an `EngineSnapshot`), the rebuild verdict
(`engine.ftserve.control.rebuild_verdict`), admission (`engine.reference.admission`), the chunk
operations of a rebuild (bench/replay/ops.py, held to the real pools by tests) and the expert
cache (bench/replay/experts.py). What is simulated is only what things cost
(bench/replay/calibration.py) and what is resident: pages and slots are counts, experts are
keys in an LRU, nothing is computed.

The scheduler is the reference engine's: each round admits waiting requests (FIFO, against
the page ceiling of a shrink in flight; each admission blocks the round for its prefill),
advances a rebuild by a slice of chunk operations (the pause budget while requests run or
wait, at most `_IDLE_SLICE_S` otherwise; `freetoken` mode only when idle, all at once), then
decodes one token for every running request. A round's tokens reach their clients when the
round ends, as the engine's HTTP handlers run only once its scheduler yields.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from bench.replay.calibration import Costs
from bench.replay.experts import ExpertCache, RoutingBank, RoutingShape
from bench.replay.ops import ChunkOp, PoolLayout, packed, rebuild_ops, spread
from engine.ftserve.budget import MemoryModel
from engine.ftserve.control import Answered, Refused, rebuild_verdict, reply_body
from engine.ftserve.geometry import (
    REFERENCE_ENGINE_NAME,
    EngineModel,
    Floors,
    Geometry,
    ModelShape,
    UnitCosts,
    parse_cache_status,
)
from engine.reference import documents
from engine.reference.admission import (
    AdmissionError,
    ceiling,
    fits,
    fitted_max_tokens,
    state_refusal,
)
from ladder.client import FtServeClient

__all__ = ["Generation", "ServerSpec", "SimClient", "SimEngine"]

# As engine.reference.rebuild: an idle rebuild yields to the event loop after this much work.
_IDLE_SLICE_S = 0.05


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """What the simulated server is: its model's shape and unit costs, its budget, how it
    schedules and rebuilds, and the geometry it boots with."""

    served_model_name: str
    shape: ModelShape
    units: UnitCosts
    floors: Floors
    cache_budget_bytes: int
    routing: RoutingShape
    max_running_requests: int
    max_seq_len: int
    rebuild_mode: str
    chunk_bytes: int
    pause_budget_s: float
    boot: Geometry
    weights_bytes: int = 0
    # False: the engine from before it re-admitted waiting requests after a rebuild (a
    # request admitted before a KV shrink waits for pages that are gone).
    readmit_waiting: bool = True

    @classmethod
    def from_engine_config(cls, config: Any) -> ServerSpec:
        """The reference engine an `engine.reference.runtime.EngineConfig` builds."""
        m = config.model
        budget = config.cache_budget_bytes
        if budget is None:
            budget = int(config.memory_ratio * config.device_memory_bytes) - m.dense_weight_bytes
        return cls(
            served_model_name=config.served_model_name,
            shape=ModelShape(m.page_size, m.num_experts, m.num_layers, 0, has_mamba=True,
                             has_swa=False),
            units=UnitCosts(kv_per_token=m.kv_bytes_per_token, moe_per_expert=m.expert_bytes,
                            mamba_per_slot=m.state_bytes, swa_per_token=0),
            floors=Floors(kv_tokens=m.page_size, moe_slots=m.num_experts,
                          mamba_slots=config.max_running_requests),
            cache_budget_bytes=budget,
            routing=RoutingShape(m.num_layers, m.num_experts, m.top_k, m.routing_preset, m.seed),
            max_running_requests=config.max_running_requests, max_seq_len=config.max_seq_len,
            rebuild_mode=config.rebuild_mode, chunk_bytes=config.chunk_bytes,
            pause_budget_s=config.rebuild_pause_budget_s,
            boot=Geometry(config.moe_cache_size, config.num_pages, config.num_mamba_slots),
            weights_bytes=m.dense_weight_bytes)

    @classmethod
    def from_status(cls, doc: Mapping[str, Any], *, name: str, routing: RoutingShape,
                    max_running_requests: int, max_seq_len: int, chunk_bytes: int,
                    pause_budget_s: float) -> ServerSpec:
        """A server with the geometry and unit costs of a `/v1/cache/status` document."""
        status = parse_cache_status(doc)
        return cls(
            served_model_name=name, shape=status.shape, units=status.units,
            floors=Floors(kv_tokens=status.shape.page_size,
                          moe_slots=status.shape.num_experts,
                          mamba_slots=max_running_requests),
            cache_budget_bytes=status.cache_budget_bytes, routing=routing,
            max_running_requests=max_running_requests, max_seq_len=max_seq_len,
            rebuild_mode="incremental", chunk_bytes=chunk_bytes, pause_budget_s=pause_budget_s,
            boot=status.geometry)

    def in_mode(self, rebuild_mode: str) -> ServerSpec:
        return replace(self, rebuild_mode=rebuild_mode)


@dataclass(eq=False)
class Generation:
    """One generation on the simulated server, as its client sees it."""

    index: int
    prompt_tokens: int
    max_tokens: int
    need_pages: int
    started_s: float
    keys: list[list[int]]
    path: str = "/v1/completions"
    generated: int = 0
    first_token_s: float | None = None
    last_token_s: float | None = None
    # The engine's expert (hits, misses) when the first and the last token arrived.
    at_first: tuple[int, int] = (0, 0)
    at_last: tuple[int, int] = (0, 0)
    # Set at the first token, or when the generation ends without one.
    first_token: asyncio.Event | None = None
    done: asyncio.Future[AdmissionError | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


@dataclass
class _Pages:
    """What drive_arm and the documents read of the KV pool."""

    num_pages: int
    used_pages: int = 0


@dataclass
class _Job:
    request_id: str
    start: Geometry
    target: Geometry
    ops: collections.deque[ChunkOp]
    done: asyncio.Future[tuple[int, dict[str, Any]]]
    started_s: float


class SimEngine:
    """The simulated server (see the module docstring). `start()` runs its scheduler."""

    def __init__(self, spec: ServerSpec, costs: Costs, bank: RoutingBank, *,
                 instance_id: str = "replay") -> None:
        self.spec = spec
        self.costs = costs
        self.bank = bank
        self.instance_id = instance_id
        self.state = "serving"
        self.shape = spec.shape
        self.memory_model = MemoryModel(
            spec.shape, spec.units, spec.floors,
            EngineModel(kind="reference" if spec.rebuild_mode == "incremental" else "freetoken",
                        name=REFERENCE_ENGINE_NAME, chunk_bytes=spec.chunk_bytes,
                        serves_while_rebuilding=spec.rebuild_mode == "incremental"),
            spec.cache_budget_bytes)
        self.experts = ExpertCache(spec.boot.moe_cache_size)
        self.kv = _Pages(spec.boot.num_pages)
        self.mamba_slots = spec.boot.num_mamba_slots
        self.used_mamba_slots = 0
        self.layouts = {
            "moe": PoolLayout(spec.units.moe_per_expert, spec.chunk_bytes, 0),
            "kv": PoolLayout(spec.units.kv_per_token * spec.shape.page_size, spec.chunk_bytes,
                             1),
            "mamba": PoolLayout(spec.units.mamba_per_slot, spec.chunk_bytes, 1),
        }
        self.waiting: collections.deque[Generation] = collections.deque()
        self.running: list[Generation] = []
        self.served = documents.ServedRequests()
        self.last_rebuild: dict[str, Any] | None = None
        self.job: _Job | None = None
        self.listeners: list[Callable[[str, Any], None]] = []
        self.rebuilds = 0
        self._loop = asyncio.get_running_loop()
        self._started_s = self._loop.time()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # ---- lifecycle and views -------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._scheduler(), name="replay-engine")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def now(self) -> float:
        return self._loop.time()

    def geometry(self) -> Geometry:
        return Geometry(self.experts.capacity, self.kv.num_pages, self.mamba_slots)

    def max_seq_len(self) -> int:
        return min(self.spec.max_seq_len, self.kv.num_pages * self.shape.page_size)

    def snapshot(self) -> documents.EngineSnapshot:
        s = self.spec
        g = self.geometry()
        allocated = self.memory_model.total_bytes(g)
        return documents.EngineSnapshot(
            instance_id=self.instance_id, state=self.state,
            uptime_s=self.now() - self._started_s, served_model_name=s.served_model_name,
            max_seq_len=s.max_seq_len, geometry=g, shape=s.shape, units=s.units,
            floors=s.floors, cache_budget_bytes=s.cache_budget_bytes,
            last_rebuild=self.last_rebuild, rebuild_mode=s.rebuild_mode,
            chunk_bytes=s.chunk_bytes, pause_budget_s=s.pause_budget_s, device="replay",
            allocated_bytes=allocated, weights_bytes=s.weights_bytes,
            used_pages=self.kv.used_pages, used_mamba_slots=self.used_mamba_slots,
            active_requests=len(self.running) + len(self.waiting))

    def status_doc(self) -> dict[str, Any]:
        return documents.status_doc(self.snapshot())

    async def handle(self, method: str, path: str, params: Mapping[str, str] | None,
                     data: bytes | None) -> tuple[int, Any]:
        """The control API, as engine.reference.server routes it."""
        if method == "GET" and path == "/health":
            return 200, documents.health_doc(self.snapshot())
        if method == "GET" and path == "/v1/stats":
            return 200, documents.stats_doc(self.snapshot(), self.served, self.now())
        if method == "GET" and path == "/v1/cache/status":
            return 200, self.status_doc()
        if method == "GET" and path == "/v1/requests":
            query = params or {}
            since = int(query["since"]) if "since" in query else None
            return 200, self.served.requests_doc(since, int(query.get("limit", "100")))
        if method == "POST" and path == "/v1/cache/rebuild":
            return await self.rebuild(json.loads(data or b"{}"))
        return 404, {"detail": "Not Found"}

    # ---- generation ----------------------------------------------------------------------

    async def generate(self, index: int, prompt_tokens: int, max_tokens: int,
                       first_token: asyncio.Event | None = None) -> Generation:
        """Admit one request and wait for its last token; AdmissionError when refused (at
        once, or when a rebuild left too little context for it while it waited).
        `first_token` is set at its first token or its end."""
        refusal = state_refusal(self.state, self.spec.rebuild_mode)
        if refusal is not None:
            raise refusal
        fitted = fitted_max_tokens(prompt_tokens, max_tokens, self.max_seq_len())
        run = Generation(index, prompt_tokens, fitted,
                         self.shape.pages_for_tokens(prompt_tokens + fitted), self.now(),
                         self.bank.keys(index, fitted), first_token=first_token)
        self.waiting.append(run)
        self._emit("request_queued", run)
        self._wake.set()
        error = await run.done
        if error is not None:
            raise error
        return run

    def _admit_waiting(self) -> list[Generation]:
        job = self.job
        pages = ceiling(self.kv.num_pages, None if job is None else job.target.num_pages)
        slots = ceiling(self.mamba_slots, None if job is None else job.target.num_mamba_slots)
        admitted = []
        while self.waiting and len(self.running) < self.spec.max_running_requests:
            run = self.waiting[0]
            if not fits(run.need_pages, self.kv.used_pages, pages, self.used_mamba_slots,
                        slots):
                break  # FIFO: a large request is not overtaken
            self.waiting.popleft()
            self.kv.used_pages += run.need_pages
            self.used_mamba_slots += 1
            self.running.append(run)
            admitted.append(run)
        return admitted

    def _finish(self, run: Generation, error: AdmissionError | None) -> None:
        if run in self.running:
            self.running.remove(run)
            self.kv.used_pages -= run.need_pages
            self.used_mamba_slots -= 1
        now = self.now()
        ttft_ms = None if run.first_token_s is None else int(1000 * (run.first_token_s
                                                                     - run.started_s))
        self.served.finished(
            path=run.path, status=200 if error is None else error.http_status,
            model=self.spec.served_model_name, duration_ms=int(1000 * (now - run.started_s)),
            ttft_ms=ttft_ms, prompt_tokens=run.prompt_tokens, completion_tokens=run.generated,
            stream=True, error=None if error is None else error.message)
        if not run.done.done():
            run.done.set_result(error)
        if run.first_token is not None:
            run.first_token.set()
        self._wake.set()

    def _decode_cost(self) -> float:
        """One round: every running request's next token, looked up in order."""
        c = self.costs
        cost = c.round_s
        for run in self.running:
            misses = self.experts.token(run.keys[run.generated])
            context = run.prompt_tokens + run.generated
            cost += c.request_s + c.context_token_s * context + c.miss_s * misses
            run.generated += 1
        return cost

    async def _scheduler(self) -> None:
        while True:
            admitted = self._admit_waiting()
            if admitted:
                # Each admission prefills inside the round: nothing decodes meanwhile.
                prompts = sum(run.prompt_tokens for run in admitted)
                await asyncio.sleep(len(admitted) * self.costs.prefill_s
                                    + self.costs.prefill_token_s * prompts)
            progressed = self.job is not None and await self._advance()
            if not self.running:
                if not progressed:
                    self._wake.clear()
                    await self._wake.wait()
                continue
            await asyncio.sleep(self._decode_cost())
            now = self.now()
            counters = (self.experts.hits, self.experts.misses)
            for run in list(self.running):
                self.served.token(now)
                if run.first_token_s is None:
                    run.first_token_s, run.at_first = now, counters
                    if run.first_token is not None:
                        run.first_token.set()
                run.last_token_s, run.at_last = now, counters
                if run.generated >= run.max_tokens:
                    self._finish(run, None)

    # ---- rebuilds ------------------------------------------------------------------------

    def _emit(self, event: str, payload: Any) -> None:
        for listener in self.listeners:
            listener(event, payload)

    async def rebuild(self, raw: Any) -> tuple[int, dict[str, Any]]:
        """`POST /v1/cache/rebuild`, as `ReferenceEngine.rebuild` answers it."""
        verdict = rebuild_verdict(
            raw, state=self.state, mode=self.spec.rebuild_mode, live=self.geometry(),
            model=self.memory_model, used_pages=self.kv.used_pages,
            used_mamba_slots=self.used_mamba_slots, busy=bool(self.running or self.waiting))
        if isinstance(verdict, Answered):
            return verdict.http_status, verdict.body
        self.rebuilds += 1
        request_id = f"replay-rebuild-{self.rebuilds}"
        if isinstance(verdict, Refused):
            return self._reply(request_id, verdict.status, verdict.error, 503)
        live, target = self.geometry(), verdict.target
        freetoken = self.spec.rebuild_mode == "freetoken"
        resident = self.experts.resident
        ops = rebuild_ops(self.layouts, live, target, {
            "moe": spread(live.moe_cache_size, min(resident, target.moe_cache_size)),
            "kv": packed(1, self.kv.used_pages),
            "mamba": packed(1, self.used_mamba_slots)}, freetoken=freetoken)
        self.job = _Job(request_id, live, target, collections.deque(ops),
                        self._loop.create_future(), self.now())
        self.state = "rebuilding"
        self._emit("rebuild_started", self.job)
        self._wake.set()
        try:
            return await asyncio.wait_for(asyncio.shield(self.job.done),
                                          timeout=verdict.timeout_s)
        except TimeoutError:
            return 504, {"status": "timeout", "request_id": request_id}

    def _reply(self, request_id: str, status: str, error: str | None,
               http_status: int) -> tuple[int, dict[str, Any]]:
        body = reply_body(request_id, status, self.geometry(), error)
        self.last_rebuild = body
        return http_status, body

    def op_s(self, op: ChunkOp) -> float:
        c = self.costs
        if op.op == "alloc":
            return c.alloc_s
        if op.op == "free":
            return c.free_s
        if op.staged:
            return c.move_s + 2 * op.nbytes / c.h2d_bytes_per_s
        return c.move_s + op.nbytes / c.d2d_bytes_per_s

    def _apply(self, op: ChunkOp) -> None:
        if op.pool == "moe":
            self.experts.resize(op.usable_after)
        elif op.pool == "kv":
            self.kv.num_pages = op.usable_after
        else:
            self.mamba_slots = op.usable_after

    async def _advance(self) -> bool:
        """One slice of the rebuild in flight; False when nothing could run (`freetoken`
        waits until no request runs or waits)."""
        job = self.job
        assert job is not None
        busy = bool(self.running or self.waiting)
        if self.spec.rebuild_mode == "freetoken":
            if busy:
                return False
            # One blocking call; ft serve's own time when measured, else its operations'.
            spent = self.costs.freetoken_rebuild_s or sum(map(self.op_s, job.ops))
            await asyncio.sleep(spent)
            if job.target.moe_cache_size != job.start.moe_cache_size:
                self.experts.clear()  # the pool was reallocated: the cache restarts cold
            self.experts.resize(job.target.moe_cache_size)
            self.kv.num_pages = job.target.num_pages
            self.mamba_slots = job.target.num_mamba_slots
            job.ops.clear()
        else:
            budget = self.spec.pause_budget_s if busy else _IDLE_SLICE_S
            spent, ran = 0.0, []
            while job.ops:
                op = job.ops.popleft()
                ran.append(op)
                spent += self.op_s(op)
                if spent >= budget:
                    break
            await asyncio.sleep(spent)
            for op in ran:
                self._apply(op)
        if not job.ops:
            self._complete(job)
        return True

    def _complete(self, job: _Job) -> None:
        self.job = None
        self.state = "serving"
        if self.spec.readmit_waiting:
            self._readmit_waiting()
        result = self._reply(job.request_id, "ok", None, 200)
        self._emit("rebuild_finished", (job, "ok", self.now() - job.started_s))
        if not job.done.done():
            job.done.set_result(result)
        self._wake.set()

    def _readmit_waiting(self) -> None:
        """As `ReferenceEngine._readmit_waiting`: admission again against what the rebuild
        left, so a request admitted before a KV shrink cannot wait for pages that are gone."""
        for run in list(self.waiting):
            try:
                run.max_tokens = fitted_max_tokens(run.prompt_tokens, run.max_tokens,
                                                   self.max_seq_len())
            except AdmissionError as exc:
                self.waiting.remove(run)
                self._finish(run, exc)
                continue
            run.need_pages = self.shape.pages_for_tokens(run.prompt_tokens + run.max_tokens)


class SimClient(FtServeClient):
    """The daemon's real client, its transport answered by a `SimEngine` in-process: every
    document still goes through JSON and the client's own parsers and error mapping."""

    def __init__(self, engine: SimEngine, base_url: str, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self._engine = engine

    async def _send(self, method: str, path: str, *, auth: bool, total_s: float,
                    params: Mapping[str, str] | None = None,
                    data: bytes | None = None) -> tuple[int, bytes]:
        status, doc = await self._engine.handle(method, path, params, data)
        return status, json.dumps(doc).encode()

