"""A fault-injecting HTTP proxy in front of an `ft serve` (or the reference engine).

Why it exists: the daemon's safety rules (ladder/executor.py) are only as good as their
handling of what real servers and networks do: 503 `busy`, 409, a 504 while the rebuild goes
on, rollbacks, latched failures, refused and reset connections, slow and hung replies, broken
JSON, renamed fields, restarts with another geometry, and someone else running `ft ctl cache`
mid-plan. The proxy produces each of these on command (`inject`, or `POST /_faults`) or at
random from a seed, over real loopback HTTP, so the daemon under test is the real one.

It is also the independent witness for the invariants. For every rebuild call the daemon
sends, it reads the upstream's true geometry first and prices the call with its own small
simulator of ft serve's order (MoE, then KV, then mamba; each pool frees only itself, then
allocates; physical = usable + 1 dummy KV page + 1 sink mamba slot). It shares no code with
the planner on purpose: a bug there must not hide itself here. It also flags a grow sent while
the previous shrink was not yet read back by a clean `GET /v1/cache/status`, counts calls per
(virtual) second, and counts wedges: the upstream latching `failed` in reply to a daemon call.

Time: every delay the proxy itself schedules (slow replies, the refused window, the
"still rebuilding" window after a 504) goes through the injected `Clock`, so a soak on a
virtual clock stays compressed. Only `hung` uses wall time, since the client's own timeout is
wall time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import uuid
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal, cast

import aiohttp
from aiohttp import web

from ladder.clock import Clock, SystemClock

__all__ = [
    "FAULT_KINDS",
    "CallRecord",
    "FaultProxy",
    "FaultSettings",
    "price_call",
]

log = logging.getLogger(__name__)

FaultKind = Literal[
    "busy", "conflict", "timeout", "rejected", "latched", "refused", "reset", "slow", "hung",
    "malformed", "partial", "missing_field", "renamed_field", "restart", "external_resize",
]
FAULT_KINDS: Final[tuple[str, ...]] = (
    "busy", "conflict", "timeout", "rejected", "latched", "refused", "reset", "slow", "hung",
    "malformed", "partial", "missing_field", "renamed_field", "restart", "external_resize",
)
Route = Literal["health", "status", "stats", "requests", "rebuild", "other"]

# Which faults make sense on which route; a fault queued for "any" waits for one of these.
_REBUILD_ONLY = frozenset({"busy", "conflict", "timeout", "rejected"})
_GET_ONLY = frozenset({"external_resize"})
_POOLS: Final = (("moe", "moe_cache_size"), ("kv", "num_pages"), ("mamba", "num_mamba_slots"))


def _route_of(method: str, path: str) -> Route:
    if method == "POST" and path == "/v1/cache/rebuild":
        return "rebuild"
    return {"/health": "health", "/v1/cache/status": "status", "/v1/stats": "stats",
            "/v1/requests": "requests"}.get(path, "other")  # type: ignore[return-value]


def _applies(kind: str, route: Route) -> bool:
    if route == "other":
        return False
    if kind in _REBUILD_ONLY:
        return route == "rebuild"
    if kind in _GET_ONLY:
        return route == "status"
    return True


def price_call(geometry: Mapping[str, Any], body: Mapping[str, Any]) -> tuple[int, int]:
    """(bytes held before, peak bytes) of one rebuild call under ft serve's order.

    `geometry` is a `/v1/cache/status` `geometry` object. Deliberately written from ft serve's
    order alone (README, "How a transition is priced"), not from engine.ftserve.planner: MoE,
    then KV, then mamba; while one pool is reallocated, the pools before it hold their new size
    and the pools after it their old size. Physical units: KV usable pages + 1 dummy, mamba
    usable slots + 1 sink.
    """
    units = geometry["unit_bytes"]
    page_bytes = int(geometry["page_size"]) * int(units["kv_per_token"])

    def pool_bytes(pool: str, size: int) -> int:
        if pool == "moe":
            return size * int(units["moe_per_expert"])
        if pool == "kv":
            return (size + 1) * page_bytes if size else 0
        return (size + 1) * int(units["mamba_per_slot"]) if size else 0

    sizes = {pool: int(geometry[key]) for pool, key in _POOLS}
    held = {pool: pool_bytes(pool, sizes[pool]) for pool in sizes}
    before = sum(held.values())
    peak = before
    for pool, key in _POOLS:
        new = body.get(key)
        if new is None or int(new) == sizes[pool]:
            continue
        # The pool frees itself (the instant after the free is lower), then allocates.
        held[pool] = pool_bytes(pool, int(new))
        peak = max(peak, sum(held.values()))
    return before, peak


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One rebuild call the daemon sent, priced on the geometry truly served just before."""

    seq: int
    at_s: float
    body: dict[str, Any]
    fault: str | None
    forwarded: bool
    before: dict[str, int] | None
    budget_bytes: int | None
    before_bytes: int | None
    peak_bytes: int | None
    risky: bool
    unconfirmed_grow: bool
    http_status: int | None
    reply_status: str | None
    wedged: bool


@dataclass(frozen=True, slots=True)
class FaultSettings:
    """How faults behave. Seconds are virtual (the injected clock) unless named `wall`."""

    seed: int = 0
    rate: float = 0.0
    # Rebuild calls are rare next to reads; a higher rate there keeps the soak on the
    # interesting path. None: the same as `rate`.
    rebuild_rate: float | None = None
    weights: Mapping[str, float] = field(default_factory=lambda: dict.fromkeys(FAULT_KINDS,
                                                                               1.0))
    max_random_faults: int | None = None
    slow_s: float = 3.0
    hang_wall_s: float = 0.3
    refused_s: float = 2.0
    rebuilding_hold_s: float = 3.0
    latch_requests: int = 12


def _sizes(geometry: Mapping[str, Any]) -> dict[str, int]:
    return {key: int(geometry[key]) for _, key in _POOLS}


class FaultProxy:
    """An aiohttp reverse proxy with faults; `start()` binds 127.0.0.1 and returns its URL.

    `restart`, when given, restarts the upstream for real (a new process or engine, a new
    `instance_id`, possibly another geometry) and returns its URL; without it a restart is
    virtual: the proxy rewrites `instance_id` so the daemon sees a new process.
    """

    def __init__(self, upstream_url: str, *, clock: Clock | None = None,
                 settings: FaultSettings | None = None,
                 restart: Callable[[], Awaitable[str]] | None = None) -> None:
        self.upstream_url = upstream_url.rstrip("/")
        self.clock = clock or SystemClock()
        self.settings = settings or FaultSettings()
        self._restart_hook = restart
        self._rng = random.Random(self.settings.seed)
        self._queue: deque[tuple[str, Route | None, dict[str, Any]]] = deque()
        self.records: list[CallRecord] = []
        self.injected: Counter[str] = Counter()
        self.random_faults = 0
        self.last_fault_s: float | None = None
        self.external_resizes: list[dict[str, Any]] = []
        self.restarts = 0
        self.wedges = 0
        self.rebuilds_while_latched = 0
        self.request_times_s: list[float] = []
        self.rebuild_times_s: list[float] = []
        self._seq = 0
        self._latched_left = 0
        self._epoch = 0
        self._rebuilding_until_s: float | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._shrink_unconfirmed = False
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._port = 0
        self._refusing = False

    # ---- lifecycle ---------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        self._runner = web.AppRunner(self.make_app(), handle_signals=False,
                                     shutdown_timeout=0.1, access_log=None)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await self._site.start()
        server = self._site._server
        sockets = getattr(server, "sockets", None) or []
        self._port = sockets[0].getsockname()[1] if sockets else port
        self._host = host
        return f"http://{host}:{self._port}"

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        for task in list(self._background):
            with contextlib.suppress(BaseException):
                await task
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 20)
        app.router.add_post("/_faults", self._control)
        app.router.add_delete("/_faults", self._control_clear)
        app.router.add_get("/_faults/report", self._control_report)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    # ---- commands ----------------------------------------------------------------------

    def inject(self, kind: str, count: int = 1, *, route: Route | None = None,
               **options: Any) -> None:
        """Queue `count` faults of `kind` for the next matching requests (FIFO)."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; known: {', '.join(FAULT_KINDS)}")
        for _ in range(count):
            self._queue.append((kind, route, dict(options)))

    async def _control(self, request: web.Request) -> web.Response:
        try:
            doc = await request.json()
            kind = doc["kind"]
            count = int(doc.get("count", 1))
            self.inject(kind, count, route=doc.get("route"), **doc.get("options", {}))
        except (ValueError, KeyError, TypeError) as exc:
            return web.json_response({"error": str(exc)}, status=422)
        return web.json_response({"queued": len(self._queue)})

    async def _control_clear(self, _: web.Request) -> web.Response:
        self._queue.clear()
        return web.json_response({"queued": 0})

    async def _control_report(self, _: web.Request) -> web.Response:
        return web.json_response(self.report())

    # ---- invariants ----------------------------------------------------------------------

    @property
    def faults_total(self) -> int:
        return sum(self.injected.values())

    @property
    def latched(self) -> bool:
        """Whether the proxy answers as a server latched in `failed` now."""
        return self._latched_left > 0

    def risky_calls(self) -> list[CallRecord]:
        return [r for r in self.records if r.risky]

    def unconfirmed_grows(self) -> list[CallRecord]:
        return [r for r in self.records if r.unconfirmed_grow]

    @staticmethod
    def max_in_window(times_s: Sequence[float], window_s: float) -> int:
        best, lo = 0, 0
        for hi, t in enumerate(times_s):
            while t - times_s[lo] >= window_s:
                lo += 1
            best = max(best, hi - lo + 1)
        return best

    def report(self) -> dict[str, Any]:
        return {
            "faults_injected": self.faults_total,
            "faults_by_kind": dict(sorted(self.injected.items())),
            "rebuild_calls": len(self.records),
            "risky_calls": len(self.risky_calls()),
            "unconfirmed_grows": len(self.unconfirmed_grows()),
            "wedges": self.wedges,
            "rebuilds_while_latched": self.rebuilds_while_latched,
            "restarts": self.restarts,
            "external_resizes": len(self.external_resizes),
            "max_rebuilds_per_10s": self.max_in_window(self.rebuild_times_s, 10.0),
            "max_requests_per_1s": self.max_in_window(self.request_times_s, 1.0),
            "last_fault_s": self.last_fault_s,
            "risky": [asdict(r) for r in self.risky_calls()[:5]],
        }

    # ---- the proxy -----------------------------------------------------------------------

    def _pick(self, route: Route) -> tuple[str, dict[str, Any]] | None:
        for i, (kind, want, options) in enumerate(self._queue):
            if (want is None or want == route) and _applies(kind, route):
                del self._queue[i]
                return kind, options
        s = self.settings
        rate = s.rate if route != "rebuild" or s.rebuild_rate is None else s.rebuild_rate
        if rate <= 0 or route == "other" or (
                s.max_random_faults is not None and self.random_faults >= s.max_random_faults):
            return None
        if self._rng.random() >= rate:
            return None
        kinds = [k for k in FAULT_KINDS if s.weights.get(k, 0) > 0 and _applies(k, route)]
        if not kinds:
            return None
        kind = self._rng.choices(kinds, weights=[s.weights[k] for k in kinds])[0]
        self.random_faults += 1
        return kind, {}

    async def _upstream(self, method: str, path_qs: str, headers: Mapping[str, str],
                        data: bytes | None) -> tuple[int, bytes]:
        assert self._session is not None
        forward = {k: v for k, v in headers.items()
                   if k.lower() in ("authorization", "content-type", "x-api-key", "accept")}
        async with self._session.request(method, self.upstream_url + path_qs, headers=forward,
                                         data=data, allow_redirects=False) as resp:
            return resp.status, await resp.read()

    async def _true_status(self, headers: Mapping[str, str]) -> dict[str, Any] | None:
        try:
            status, raw = await self._upstream("GET", "/v1/cache/status", headers, None)
            doc = json.loads(raw)
        except (aiohttp.ClientError, OSError, ValueError, TimeoutError):
            return None
        return doc if status == 200 and isinstance(doc, dict) else None

    @staticmethod
    def _json(doc: Any, status: int = 200) -> web.Response:
        resp = web.Response(body=json.dumps(doc).encode(), status=status,
                            content_type="application/json")
        # One connection per request, so a closed listener refuses the very next one.
        resp.force_close()
        return resp

    @staticmethod
    def _raw(body: bytes, status: int) -> web.Response:
        resp = web.Response(body=body, status=status, content_type="application/json")
        resp.force_close()
        return resp

    def _abort(self, request: web.Request) -> web.Response:
        if request.transport is not None:
            request.transport.abort()
        return self._raw(b"", 500)  # never reaches the client

    async def _refuse_for(self, seconds: float) -> None:
        if self._refusing or self._site is None:
            return
        self._refusing = True
        server = self._site._server
        if server is not None:
            cast(Any, server).close()  # typed differently across aiohttp versions
        try:
            await self.clock.sleep(seconds)
        finally:
            assert self._runner is not None
            self._site = web.TCPSite(self._runner, self._host, self._port, reuse_address=True)
            await self._site.start()
            self._refusing = False

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _do_restart(self) -> None:
        self.restarts += 1
        self._latched_left = 0
        self._rebuilding_until_s = None
        self._shrink_unconfirmed = False
        if self._restart_hook is not None:
            self.upstream_url = (await self._restart_hook()).rstrip("/")
        else:
            self._epoch += 1

    def _instance(self, doc: dict[str, Any]) -> None:
        if self._epoch and isinstance(doc.get("instance_id"), str):
            doc["instance_id"] = f"{doc['instance_id']}-r{self._epoch}"

    async def _external_resize(self, headers: Mapping[str, str],
                               body: Mapping[str, int] | None = None) -> None:
        """What an operator's `ft ctl cache` would do: one safe single call, not ours."""
        doc = await self._true_status(headers)
        if doc is None or doc.get("state") != "serving":
            return
        g = doc["geometry"]
        budget = int(g["cache_budget_bytes"])
        limits = g["limits"]
        page = int(g["page_size"])
        for _ in range(0 if body is not None else 20):
            if self._rng.random() < 0.6:
                low = max(1, -(-int(limits["kv_tokens"]["min"]) // page))
                body = {"num_pages": self._rng.randint(low, max(low, 2 * int(g["num_pages"])))}
            else:
                low = int(limits["moe_experts"]["min"])
                high = max(low, int(g["num_experts"]) * int(g["num_moe_layers"]))
                body = {"moe_cache_size": self._rng.randint(low, high)}
            _, peak = price_call(g, body)
            if peak <= budget and any(int(g[k]) != v for k, v in body.items()):
                break
        else:
            if body is None:
                return
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            status, _ = await self._upstream(
                "POST", "/v1/cache/rebuild", {"Content-Type": "application/json",
                                              **{k: v for k, v in headers.items()
                                                 if k.lower() == "authorization"}},
                json.dumps({**body, "mode": "if_idle", "timeout": 60}).encode())
            self.external_resizes.append({"body": body, "http_status": status,
                                          "at_s": self.clock.monotonic()})

    def _rebuilding_now(self) -> bool:
        if self._rebuilding_until_s is None:
            return False
        if self.clock.monotonic() < self._rebuilding_until_s or any(
                t.get_name() == "hidden-rebuild" for t in self._background):
            return True
        self._rebuilding_until_s = None
        return False

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        now = self.clock.monotonic()
        route = _route_of(request.method, request.path)
        self.request_times_s.append(now)
        data = await request.read() if request.can_read_body else None
        picked = self._pick(route)
        kind, options = picked if picked is not None else (None, {})
        if kind is not None:
            self.injected[kind] += 1
            self.last_fault_s = now
        if kind == "latched":
            self._latched_left = self.settings.latch_requests
            kind = None  # from here on the latch answers, like a latched server
        elif kind == "restart":
            await self._do_restart()
            kind = None  # the request then reaches the restarted server
        if self._latched_left > 0:
            self._latched_left -= 1
            if self._latched_left == 0:
                # Someone restarts the latched server; the next request sees a new instance.
                await self._do_restart()
        latched = self._latched_left > 0
        if route == "rebuild":
            return await self._rebuild(request, data, kind, options, latched)
        return await self._get(request, route, data, kind, options, latched)

    async def _transport_fault(self, request: web.Request, kind: str | None) -> bool:
        """Handle refused/reset/hung/slow; True when the request is already answered."""
        if kind == "refused":
            self._spawn(self._refuse_for(float(self.settings.refused_s)))
            self._abort(request)
            return True
        if kind == "reset":
            self._abort(request)
            return True
        if kind == "hung":
            await asyncio.sleep(self.settings.hang_wall_s)
            self._abort(request)
            return True
        if kind == "slow":
            await self.clock.sleep(self.settings.slow_s)
        return False

    async def _send_partial(self, request: web.Request, body: bytes, status: int
                            ) -> web.StreamResponse:
        resp = web.StreamResponse(status=status, headers={"Content-Type": "application/json"})
        resp.content_length = len(body) + 16
        resp.force_close()
        await resp.prepare(request)
        await resp.write(body[: max(1, len(body) // 2)])
        self._abort(request)
        return resp

    async def _get(self, request: web.Request, route: Route, data: bytes | None,
                   kind: str | None, options: Mapping[str, Any], latched: bool
                   ) -> web.StreamResponse:
        if await self._transport_fault(request, kind):
            return web.Response(status=500)
        if kind == "malformed":
            return self._raw(b'{"state": "serving", "geometry": {"num_pages": 4', 200)
        if kind == "external_resize":
            await self._external_resize(request.headers, options.get("body"))
        try:
            status, raw = await self._upstream(request.method, request.path_qs, request.headers,
                                               data)
        except (aiohttp.ClientError, OSError, TimeoutError):
            return self._abort(request)
        try:
            doc = json.loads(raw)
        except ValueError:
            return self._raw(raw, status)
        if not isinstance(doc, dict):
            return self._raw(raw, status)
        self._instance(doc)
        if route == "health" and latched:
            doc["maintenance"] = "failed"
        if route == "status":
            if latched:
                doc["state"] = "failed"
            elif self._rebuilding_now():
                doc["state"] = "rebuilding"
        if kind == "missing_field":
            _drop(doc, route, rename=False)
        elif kind == "renamed_field":
            _drop(doc, route, rename=True)
        body = json.dumps(doc).encode()
        if kind == "partial":
            return await self._send_partial(request, body, status)
        # A slow reply, or one that follows someone else's resize, is still the truth.
        if route == "status" and kind in (None, "slow", "external_resize") and status == 200 and (
                doc.get("state") not in ("rebuilding", None)) and not self._rebuilding_now():
            self._shrink_unconfirmed = False  # the daemon has now seen the geometry
        return self._raw(body, status)

    async def _rebuild(self, request: web.Request, data: bytes | None, kind: str | None,
                       options: Mapping[str, Any], latched: bool) -> web.StreamResponse:
        now = self.clock.monotonic()
        self.rebuild_times_s.append(now)
        self._seq += 1
        try:
            body = json.loads(data or b"null")
        except ValueError:
            body = None
        body = body if isinstance(body, dict) else {}
        truth = await self._true_status(request.headers)
        before = None if truth is None else _sizes(truth["geometry"])
        budget = None if truth is None else int(truth["geometry"]["cache_budget_bytes"])
        before_bytes = peak = None
        risky = grow = shrink = False
        if truth is not None:
            before_bytes, peak = price_call(truth["geometry"], body)
            risky = peak > int(budget or 0)
            assert before is not None
            for _, key in _POOLS:
                if body.get(key) is not None:
                    grow |= int(body[key]) > before[key]
                    shrink |= int(body[key]) < before[key]
        unconfirmed = grow and self._shrink_unconfirmed
        in_rebuild = self._rebuilding_now()
        if latched:
            self.rebuilds_while_latched += 1

        def record(forwarded: bool, http_status: int | None, reply: str | None,
                   wedged: bool = False) -> None:
            self.records.append(CallRecord(
                self._seq, now, dict(body), kind, forwarded, before, budget, before_bytes, peak,
                risky and forwarded, unconfirmed, http_status, reply, wedged))

        geometry = before or {"moe_cache_size": 0, "num_pages": 0, "num_mamba_slots": 0}
        reply = {"request_id": str(uuid.uuid4()), "moe_cache_size": geometry["moe_cache_size"],
                 "num_pages": geometry["num_pages"], "mamba_slots": geometry["num_mamba_slots"],
                 "num_swa_pages": 0}
        if latched:
            record(False, 503, "failed")
            return self._json({"status": "failed",
                               "error": "server latched in maintenance; restart required"}, 503)
        if in_rebuild or kind == "conflict":
            record(False, 409, "busy")
            return self._json({"status": "busy",
                               "error": "a cache rebuild is already in progress"}, 409)
        if kind == "busy":
            record(False, 503, "busy")
            return self._json({**reply, "status": "busy", "error": None}, 503)
        if kind == "rejected":
            record(False, 503, "rejected")
            return self._json({**reply, "status": "rejected", "error": (
                "rebuild failed and was rolled back: OutOfMemoryError('CUDA out of memory. "
                "Tried to allocate 800.00 MiB')")}, 503)
        if kind in ("refused", "reset"):
            # Reset before the body reached the server: nothing was sent upstream.
            record(False, None, None)
            await self._transport_fault(request, kind)
            return web.Response(status=500)
        if kind == "slow":
            await self.clock.sleep(self.settings.slow_s)
        if shrink:
            self._shrink_unconfirmed = True
        if kind in ("timeout", "hung"):
            # The server keeps rebuilding after the client stopped waiting: the reply is lost.
            task = asyncio.ensure_future(self._forward_rebuild(request.headers, data, record))
            task.set_name("hidden-rebuild")
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            if kind == "timeout":
                self._rebuilding_until_s = now + self.settings.rebuilding_hold_s
                return self._json({"status": "timeout", "request_id": reply["request_id"]}, 504)
            await asyncio.sleep(self.settings.hang_wall_s)
            return self._abort(request)
        result = await self._forward_rebuild(request.headers, data, record)
        if result is None:
            return self._abort(request)
        status, raw = result
        if kind == "malformed":
            return self._raw(raw[: max(1, len(raw) // 2)], status)
        if kind == "partial":
            return await self._send_partial(request, raw, status)
        if kind in ("missing_field", "renamed_field"):
            with contextlib.suppress(ValueError, AttributeError):
                doc = json.loads(raw)
                _drop(doc, "rebuild", rename=kind == "renamed_field")
                raw = json.dumps(doc).encode()
        return self._raw(raw, status)

    async def _forward_rebuild(self, headers: Mapping[str, str], data: bytes | None,
                               record: Callable[..., None]) -> tuple[int, bytes] | None:
        try:
            status, raw = await self._upstream("POST", "/v1/cache/rebuild", headers, data)
        except (aiohttp.ClientError, OSError, TimeoutError):
            record(True, None, None)
            return None
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = None
        reply = doc.get("status") if isinstance(doc, dict) else None
        wedged = status == 503 and reply == "failed" and isinstance(doc, dict) and (
            "request_id" in doc)
        if wedged:
            self.wedges += 1
            log.warning("a daemon call latched the server", extra={"body": data})
        record(True, status, reply, wedged)
        return status, raw


def _drop(doc: dict[str, Any], route: Route, *, rename: bool) -> None:
    """Remove (or rename to a wrong spelling) one field the parser needs."""
    where: dict[str, Any] = doc
    key = {"health": "instance_id", "stats": "instance_id", "requests": "next_cursor",
           "rebuild": "mamba_slots", "status": "num_mamba_slots"}.get(route, "status")
    if route == "status" and isinstance(doc.get("geometry"), dict):
        where = doc["geometry"]
    if key not in where:
        return
    value = where.pop(key)
    if rename:
        where[{"mamba_slots": "num_mamba_slots", "num_mamba_slots": "mamba_slots",
               "instance_id": "instance", "next_cursor": "cursor"}.get(key, key + "_")] = value
