"""The admission gate: a reverse proxy that holds requests the live rung cannot serve whole.

Why it exists: ft serve admits a request against `max_seq_len = min(model ctx, KV tokens)` of
the geometry it runs *now*. After the ladder shrank the KV pool for expert slots, a long prompt
is refused with `context_length_exceeded` and `max_tokens` is clipped to what is left, which the
client learns only from `finish_reason: "length"` (ft serve's scheduler.py
`Scheduler._process_one_msg`); and while a rebuild runs, every generation gets 503 (captured in
tests/fixtures/freetoken-0.1.2, `chat_completion.during_rebuild.json`). The gate sits in front
of the OpenAI and Anthropic routes, sizes each request (`ladder.sizing`), asks the controller to
step up when the live rung is too small, holds the request until it fits, and only then
forwards it, byte for byte. Requests that arrive during a transition are held the same way, and
a 503 "cache rebuild in progress" that races a transition's start is retried after it instead
of being passed on.

Decisions:

* A request larger than the top rung (`max_capacity_tokens`) is still held for the top rung,
  and then forwarded unchanged: its prompt may fit there even if prompt + `max_tokens` does
  not. The gate neither refuses nor rewrites it, because ft serve does not refuse it either: its
  scheduler (scheduler.py `Scheduler._process_one_msg`) refuses only a prompt that fills the
  context (400 `context_length_exceeded`) and clips `max_tokens` to what is left, and the
  answer says so (`finish_reason: "length"`, `usage.completion_tokens`; streamed in the last
  chunk). A 400 from the gate would break clients that send a large `max_tokens` by habit and
  work against ft serve directly. Only when the prompt alone was counted exactly and cannot fit
  even the top rung is it forwarded at once: the server refuses it with its own error, and the
  gate does not pretend.
* `GET /v1/models`: ft serve reports the model's limit (openai_api.py `_model_context_length`),
  which agents read once at startup to decide when to compact. Through the gate a context is
  served up to the top rung, not the live one (held requests wait for a step up), so the gate
  lowers `max_model_len` and `context_length` to `max_capacity_tokens()` where they exceed it,
  and passes the document through byte for byte otherwise. Not the live rung: it moves with
  every transition, and reporting it would make a client compact a session the gate would
  have served. Before the controller's first observation (capacity 0), or for a body it cannot
  read (compressed, not JSON, over 64 KiB), the document passes through unchanged.
* A body that is valid JSON but cannot be sized (wrong field types) is forwarded unheld: the
  server answers it with its own validation error.
* Holds are bounded in time (`max_hold_s`, one budget per request, retries included) and in
  number (`max_held`); beyond either, a 503 with `Retry-After` and an error `type` of
  `gate_hold_timeout` or `gate_overloaded`.
* Streaming responses are relayed chunk by chunk as they arrive, the server's last chunk
  (`finish_reason`, the usage chunk of `stream_options.include_usage`) and `data: [DONE]`
  included; the upstream body is never decoded (`auto_decompress=False`), so
  `Content-Encoding`/`Content-Length` stay true.
* Security: bodies above `max_body_bytes` get 413 before they are read, more than
  `max_headers` headers 431. API keys (`Authorization`, `x-api-key`) are forwarded and never
  logged: no log call here receives a header. `/v1/admin/*` (loopback-only on ft serve) is
  refused for non-loopback peers, since through the proxy every caller would look local.
  Binding is the caller's choice; the daemon binds 127.0.0.1 by default.

Concurrency: `capacity_tokens` is a per-sequence limit and the KV pool is shared, so several
long requests at once may queue inside the server. The gate guarantees admission, not that all
of them run at the same time; what it forwarded and the server has not answered counts as live
demand (`forwarded_kv_tokens`), so the controller never shrinks the pool under a queued one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from ipaddress import ip_address
from types import MappingProxyType
from typing import Any, Final, Protocol, TypeVar

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from engine.ftserve.wire import RequestEntry
from ladder.sizing import (
    DEFAULT_MAX_TOKENS,
    GENERATION_PATHS,
    RequestSize,
    SizingError,
    size_request,
)
from ladder.token_bound import ForwardRecord, SizedPrompt, TokenBound, match_observations
from ladder.tokenizer_file import load_tokenizer

__all__ = [
    "REBUILD_IN_PROGRESS",
    "REBUILD_RACE",
    "CapacityController",
    "ChangeNotifier",
    "Gate",
    "GateRefusal",
    "GateSettings",
    "GateStats",
    "RebuildRace",
]

log = logging.getLogger(__name__)

R = TypeVar("R")

# The body text of ft serve's 503 during a rebuild (openai_api.py:90-104).
REBUILD_IN_PROGRESS: Final = "cache rebuild in progress"

# RFC 9110 §7.6.1 hop-by-hop headers, plus what the proxy itself recomputes.
_HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Host names the gate, Content-Length is recomputed from the bytes sent, the server side has
# already decoded a compressed request body, and Expect was answered by the gate.
_REQUEST_DROP: Final = _HOP_BY_HOP | {"host", "content-length", "content-encoding", "expect"}
# Headers aiohttp's client would add on its own; the upstream should see only the client's.
_SKIP_AUTO_HEADERS: Final = frozenset({"User-Agent", "Accept", "Accept-Encoding", "Content-Type"})
_READ_CHUNK_BYTES: Final = 64 * 1024
# A 503 body is read whole to check for the rebuild message; ft serve's are tiny.
_MAX_503_PEEK_BYTES: Final = 64 * 1024
_MAX_RECORDS: Final = 512
_ANTHROPIC_PATH: Final = "/v1/messages"
_MODELS_PATH: Final = "/v1/models"
# The context-length keys of ft serve's ModelCard (api_models.py): vLLM's and everyone else's.
_CONTEXT_KEYS: Final = ("max_model_len", "context_length")


# ---------------------------------------------------------------------------------------------
# The controller seam


class CapacityController(Protocol):
    """What the gate needs from the ladder controller. All methods run on the gate's loop.

    `capacity_tokens()`: tokens one sequence may occupy on the live rung right now, i.e. ft
        serve's `max_seq_len = min(model ctx, num_pages * page_size)` of the geometry being
        served (prompt + max_tokens must fit). Cheap, non-blocking, no I/O.
    `max_capacity_tokens()`: the same for the top rung the controller is allowed to reach
        (at most the model context). Cheap, non-blocking.
    `transition_running()`: true from just before the controller's rebuild POST until it
        knows the server is `serving` again (ft serve answers every generation 503 then).
    `request_capacity(tokens)`: a held request needs `tokens`; step up to a rung that holds at
        least `min(tokens, max_capacity_tokens())`. Must return quickly (schedule the step,
        do not await it) and must not raise. May be called again for the same need; the
        controller should deduplicate and should not step down below pending needs.
    `wait_changed(timeout_s)`: return as soon as `capacity_tokens()` or `transition_running()`
        may have changed, or after `timeout_s`, whichever is first; never raise on timeout.
        Spurious returns are fine (the gate re-checks). To be free of lost wake-ups, the
        controller must change its state and wake waiters in one synchronous step (no await
        between them), and `wait_changed` must register its waiter before its first
        suspension; `ChangeNotifier` does both.
    """

    def capacity_tokens(self) -> int: ...

    def max_capacity_tokens(self) -> int: ...

    def transition_running(self) -> bool: ...

    async def request_capacity(self, tokens: int) -> None: ...

    async def wait_changed(self, timeout_s: float) -> None: ...


class ChangeNotifier:
    """Wake-all notification with no lost wake-ups, for implementing `wait_changed`.

    `notify()` wakes every current waiter; a waiter that registered after it waits for the
    next one. Each `notify` swaps in a fresh event, so nothing has to be cleared.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout_s: float) -> None:
        event = self._event  # registered before the first suspension
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, timeout_s)):
                await event.wait()


# ---------------------------------------------------------------------------------------------
# Settings and counters


@dataclass(frozen=True, slots=True)
class GateSettings:
    """Limits and sizing knobs. `tokenizer_path` makes prompt counts exact (`load_tokenizer`)."""

    max_body_bytes: int = 8 * 1024 * 1024
    max_headers: int = 100
    max_hold_s: float = 120.0
    max_held: int = 64
    retry_after_s: int = 5
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    tokenizer_path: str | None = None
    # Longest silence between upstream bytes (a long generation streams for much longer).
    upstream_timeout_s: float = 600.0
    upstream_connect_timeout_s: float = 10.0
    # Pause before re-sending after an upstream 503 the controller has not noticed yet.
    rebuild_retry_interval_s: float = 0.5
    bound: TokenBound = field(default_factory=TokenBound)
    observation_window: int = 256
    match_tolerance_s: float = 1.0

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_headers", "max_held", "default_max_tokens",
                     "observation_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_hold_s", "upstream_timeout_s", "upstream_connect_timeout_s",
                     "rebuild_retry_interval_s", "match_tolerance_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if self.retry_after_s < 0:
            raise ValueError(f"retry_after_s must be >= 0, got {self.retry_after_s}")


@dataclass(frozen=True, slots=True)
class GateStats:
    """A snapshot of the gate's counters (monotonic except `held_now`) for Prometheus.

    `refused_total` by reason: body_too_large, too_many_headers, invalid_json, forbidden,
    gate_overloaded, gate_hold_timeout, upstream_unreachable, upstream_timeout.
    `retried_total` counts re-sends after an upstream 503 "cache rebuild in progress".
    """

    forwarded_total: int
    held_total: int
    held_now: int
    hold_seconds_sum: float
    hold_seconds_count: int
    retried_total: int
    refused_total: Mapping[str, int]
    letter_tokens_per_byte: float


class GateRefusal(Exception):
    """A request the gate answers itself; carries the reply (`status`, `reason`, `message`)."""

    def __init__(self, status: int, reason: str, message: str, *, retry_after: bool) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after


@dataclass(slots=True)
class _HoldState:
    """One request's hold across retries: counted once, timed in total."""

    held: bool = False
    seconds: float = 0.0


class RebuildRace:
    """Marker: the upstream answered 503 "cache rebuild in progress"; nothing was generated."""


REBUILD_RACE: Final = RebuildRace()


def _is_loopback(remote: str | None) -> bool:
    if remote is None:
        return False
    try:
        return ip_address(remote).is_loopback
    except ValueError:
        return False  # a unix socket or odd peer: not provably local


def _connection_tokens(headers: Mapping[str, str]) -> set[str]:
    # Headers named in Connection are hop-by-hop too (RFC 9110 §7.6.1).
    value = headers.get("Connection", "")
    return {token.strip().lower() for token in value.split(",") if token.strip()}


def _filtered(headers: CIMultiDictProxy[str], drop: frozenset[str]) -> CIMultiDict[str]:
    extra = _connection_tokens(headers)
    return CIMultiDict(
        (name, value) for name, value in headers.items()
        if name.lower() not in drop and name.lower() not in extra
    )


def _clamped_models(body: bytes, limit_tokens: int) -> bytes | None:
    """A `/v1/models` body with every context length above `limit_tokens` lowered to it; None
    when nothing is above it or the body is not a model list (then it passes unchanged)."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    cards = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(cards, list):
        return None
    changed = False
    for card in cards:
        if not isinstance(card, dict):
            continue
        for key in _CONTEXT_KEYS:
            value = card.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > limit_tokens:
                card[key] = limit_tokens
                changed = True
    return json.dumps(doc, ensure_ascii=False).encode() if changed else None


# ---------------------------------------------------------------------------------------------
# The gate


class Gate:
    """Reverse proxy in front of `upstream_url` (ft serve); see the module docstring.

    `session`: reused for every upstream call; when omitted the app creates one on startup and
    closes it on cleanup. `tokenizer` overrides `settings.tokenizer_path` (tests, embedding).
    """

    def __init__(
        self,
        upstream_url: str,
        controller: CapacityController,
        *,
        settings: GateSettings | None = None,
        session: aiohttp.ClientSession | None = None,
        tokenizer: Callable[[str], int] | None = None,
    ) -> None:
        self._settings = settings if settings is not None else GateSettings()
        self._upstream = str(URL(upstream_url)).rstrip("/")
        self._controller = controller
        self._session = session
        if tokenizer is None and self._settings.tokenizer_path is not None:
            tokenizer = load_tokenizer(self._settings.tokenizer_path)
        self._tokenizer = tokenizer
        self._bound = self._settings.bound
        self._timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=self._settings.upstream_connect_timeout_s,
            sock_read=self._settings.upstream_timeout_s,
        )
        self._records: deque[ForwardRecord] = deque(maxlen=_MAX_RECORDS)
        self._observations: deque[SizedPrompt] = deque(maxlen=self._settings.observation_window)
        self._forwarded_total = 0
        self._forwarded_now_tokens = 0
        self._held_total = 0
        self._held_now = 0
        self._hold_seconds_sum = 0.0
        self._hold_seconds_count = 0
        self._retried_total = 0
        self._refused: Counter[str] = Counter()

    @property
    def settings(self) -> GateSettings:
        return self._settings

    @property
    def bound(self) -> TokenBound:
        """The bound in use now (tightened by `observe_request_log`)."""
        return self._bound

    def stats(self) -> GateStats:
        return GateStats(
            forwarded_total=self._forwarded_total,
            held_total=self._held_total,
            held_now=self._held_now,
            hold_seconds_sum=self._hold_seconds_sum,
            hold_seconds_count=self._hold_seconds_count,
            retried_total=self._retried_total,
            refused_total=MappingProxyType(dict(self._refused)),
            letter_tokens_per_byte=self._bound.letter_tokens_per_byte,
        )

    def forwarded_kv_tokens(self) -> int:
        """Prompt + max_tokens of every sized request forwarded and not yet answered.

        The server may hold these without any KV page yet: queued behind its running
        requests, or admitted by a server that grows pages as it decodes. A controller that
        counted only used pages could shrink the pool under them; a request queued for a
        context the server no longer has waits there (or is clipped) instead of running.
        """
        return self._forwarded_now_tokens

    def observe_request_log(self, entries: Sequence[RequestEntry]) -> int:
        """Tighten the bound from new `/v1/requests` entries; returns how many were matched.

        The controller already polls the request log; it hands each new page here. Matched
        records are consumed so one forward never counts twice.
        """
        records = list(self._records)
        pairs = match_observations(records, entries, tolerance_s=self._settings.match_tolerance_s)
        if not pairs:
            return 0
        used = {index for index, _ in pairs}
        self._records = deque(
            (r for i, r in enumerate(records) if i not in used), maxlen=_MAX_RECORDS
        )
        self._observations.extend(obs for _, obs in pairs)
        self._bound = self._settings.bound.tightened(self._observations)
        log.info("gate bound from %d observations: %.3f tokens per letter byte",
                 len(self._observations), self._bound.letter_tokens_per_byte)
        return len(pairs)

    def make_app(self) -> web.Application:
        """The aiohttp app; every path is proxied, generation routes through the hold logic."""
        app = web.Application(
            client_max_size=self._settings.max_body_bytes,
            # The parser's own cap stays above ours, so the common case gets a clear 431.
            handler_args={"max_headers": max(128, 2 * self._settings.max_headers)},
        )
        if self._session is None:
            app.cleanup_ctx.append(self._session_ctx)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def _session_ctx(self, _app: web.Application) -> AsyncIterator[None]:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        try:
            yield
        finally:
            await self._session.close()
            self._session = None

    # -----------------------------------------------------------------------------------------
    # Request handling

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            if len(request.headers) > self._settings.max_headers:
                raise GateRefusal(431, "too_many_headers",
                               f"more than {self._settings.max_headers} request headers",
                               retry_after=False)
            if request.path.startswith("/v1/admin/") and not _is_loopback(request.remote):
                raise GateRefusal(403, "forbidden", "admin routes are loopback-only",
                               retry_after=False)
            body = await self._read_body(request)
            if request.method == "POST" and request.path in GENERATION_PATHS:
                return await self._generation(request, body)
            models = request.method == "GET" and request.path == _MODELS_PATH
            result = await self._forward(request, body, generation=None, models=models)
            assert not isinstance(result, RebuildRace)
            return result
        except GateRefusal as refusal:
            self._refused[refusal.reason] += 1
            return self._error(request, refusal)

    async def _read_body(self, request: web.Request) -> bytes:
        limit = self._settings.max_body_bytes
        too_large = GateRefusal(413, "body_too_large", f"request body larger than {limit} bytes",
                             retry_after=False)
        if request.content_length is not None and request.content_length > limit:
            raise too_large
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.content.iter_chunked(_READ_CHUNK_BYTES):
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
        return b"".join(chunks)

    def _size(self, request: web.Request, body: bytes) -> tuple[RequestSize | None, bool]:
        """(size, stream) of a generation body; size None when it cannot be sized."""
        try:
            doc = json.loads(body)
        except json.JSONDecodeError as exc:
            raise GateRefusal(400, "invalid_json", f"request body is not valid JSON: {exc.msg}",
                           retry_after=False) from exc
        except UnicodeDecodeError as exc:
            raise GateRefusal(400, "invalid_json", "request body is not UTF-8 JSON",
                           retry_after=False) from exc
        if not isinstance(doc, Mapping):
            raise GateRefusal(400, "invalid_json", "request body must be a JSON object",
                           retry_after=False)
        stream = doc.get("stream") is True or request.path == "/generate"
        try:
            size = size_request(
                request.path, doc, tokenizer=self._tokenizer, bound=self._bound,
                default_max_tokens=self._settings.default_max_tokens,
            )
        except SizingError as exc:
            log.info("gate forwards %s unsized (%s); the server will judge it", request.path, exc)
            return None, stream
        return size, stream

    async def _generation(self, request: web.Request, body: bytes) -> web.StreamResponse:
        size, stream = self._size(request, body)
        return await self.forward_when_fits(
            request.path, size, lambda: self._forward(request, body, generation=(size, stream)))

    def hold_target(self, size: RequestSize | None) -> int | None:
        """The tokens a generation of `size` is held for; None: forwarded at once (unsized,
        or a prompt counted exactly that cannot fit even the top rung)."""
        if size is None:
            return None
        top = self._controller.max_capacity_tokens()
        if size.exact and size.prompt_tokens >= top:
            return None
        return min(size.total_tokens, top)

    async def forward_when_fits(self, path: str, size: RequestSize | None,
                                forward: Callable[[], Awaitable[R | RebuildRace]]) -> R:
        """Hold a generation until the live rung holds it and no transition runs, then
        `forward()` it; again after a `REBUILD_RACE` (the upstream answered 503 "cache rebuild
        in progress"). Raises `GateRefusal` when the hold times out or too many are held.

        The HTTP handler and bench/replay's simulated clients share this one hold."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.max_hold_s
        target = self.hold_target(size)
        hold = _HoldState()
        try:
            while True:
                await self._hold(path, target, deadline, hold)
                # Counted in the same synchronous step as the fit check that let it go, so
                # a controller deciding after the check sees it (see `forwarded_kv_tokens`).
                committed = target or 0
                self._forwarded_now_tokens += committed
                try:
                    result = await forward()
                finally:
                    self._forwarded_now_tokens -= committed
                if not isinstance(result, RebuildRace):
                    return result
                # A transition began between our check and the forward; the controller may
                # not know yet, so pause before re-checking instead of re-sending at once.
                self._retried_total += 1
                log.info("gate: upstream rebuilding, holding %s again", path)
                await self._hold(path, target, deadline, hold, pause=True)
        finally:
            if hold.held:
                self._hold_seconds_sum += hold.seconds
                self._hold_seconds_count += 1

    def _fits(self, target: int | None) -> bool:
        if self._controller.transition_running():
            return False
        return target is None or self._controller.capacity_tokens() >= target

    async def _hold(self, path: str, target: int | None, deadline: float, hold: _HoldState,
                    *, pause: bool = False) -> None:
        """Wait until `target` fits and no transition runs, adding the wait to `hold`."""
        if not pause and self._fits(target):
            return
        if self._held_now >= self._settings.max_held:
            raise GateRefusal(503, "gate_overloaded",
                           f"too many requests held ({self._settings.max_held}) while the "
                           "server resizes its cache; retry later", retry_after=True)
        loop = asyncio.get_running_loop()
        started = loop.time()
        self._held_now += 1
        if not hold.held:
            hold.held = True
            self._held_total += 1
        try:
            if pause:
                remaining = deadline - loop.time()
                await self._controller.wait_changed(
                    min(self._settings.rebuild_retry_interval_s, max(0.0, remaining)))
                if loop.time() >= deadline:
                    raise self._hold_timeout(path, target)
            asked: tuple[bool, int] | None = None
            while True:
                transitioning = self._controller.transition_running()
                capacity = self._controller.capacity_tokens()
                if not transitioning and (target is None or capacity >= target):
                    return
                state = (transitioning, capacity)
                if target is not None and capacity < target and (
                        asked is None or (not transitioning and state != asked)):
                    if asked is None:
                        log.info("gate holds %s: needs %d tokens, live rung holds %d",
                                 path, target, capacity)
                    asked = state
                    await self._controller.request_capacity(target)
                    continue
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise self._hold_timeout(path, target)
                await self._controller.wait_changed(remaining)
        finally:
            self._held_now -= 1
            hold.seconds += loop.time() - started

    def _hold_timeout(self, path: str, target: int | None) -> GateRefusal:
        log.warning("gate gave up on %s after %.1f s (needs %s tokens, live rung holds %d, "
                    "transition running: %s)", path, self._settings.max_hold_s, target,
                    self._controller.capacity_tokens(), self._controller.transition_running())
        return GateRefusal(503, "gate_hold_timeout",
                        "the server could not be resized to hold this request within "
                        f"{self._settings.max_hold_s:g} s; retry later", retry_after=True)

    async def _forward(
        self,
        request: web.Request,
        body: bytes,
        *,
        generation: tuple[RequestSize | None, bool] | None,
        models: bool = False,
    ) -> web.StreamResponse | RebuildRace:
        session = self._session
        if session is None:
            raise RuntimeError("Gate has no ClientSession: run make_app() under a runner")
        url = URL(self._upstream + request.raw_path, encoded=True)
        headers = _filtered(request.headers, _REQUEST_DROP)
        try:
            async with session.request(
                request.method, url, data=body if body else None, headers=headers,
                skip_auto_headers=_SKIP_AUTO_HEADERS, allow_redirects=False,
                auto_decompress=False, timeout=self._timeout,
            ) as upstream:
                prefix = b""
                if generation is not None and upstream.status == 503:
                    prefix = await self._peek(upstream)
                    if REBUILD_IN_PROGRESS.encode() in prefix:
                        return REBUILD_RACE
                clamped = None
                if models and upstream.status == 200 and (
                        "Content-Encoding" not in upstream.headers):
                    prefix = await self._peek(upstream)
                    limit = self._controller.max_capacity_tokens()
                    if upstream.content.at_eof() and limit > 0:
                        clamped = _clamped_models(prefix, limit)
                if clamped is not None:
                    headers = _filtered(upstream.headers, _HOP_BY_HOP)
                    headers.popall("Content-Length", None)  # recomputed from the new body
                    response: web.StreamResponse = web.Response(
                        status=upstream.status, reason=upstream.reason, headers=headers,
                        body=clamped)
                else:
                    response = await self._relay(request, upstream, prefix)
        except TimeoutError as exc:
            raise GateRefusal(504, "upstream_timeout", "the server did not answer in time",
                           retry_after=True) from exc
        except aiohttp.ClientError as exc:
            raise GateRefusal(502, "upstream_unreachable",
                           f"cannot reach the server: {type(exc).__name__}",
                           retry_after=True) from exc
        self._forwarded_total += 1
        if generation is not None and 200 <= response.status < 300:
            size, stream = generation
            if size is not None:
                self._records.append(ForwardRecord(
                    path=request.path, stream=stream, finished_at=datetime.now(UTC),
                    text=size.text, messages=size.messages, tools=size.tools))
        return response

    @staticmethod
    async def _peek(upstream: aiohttp.ClientResponse) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while size < _MAX_503_PEEK_BYTES:
            chunk = await upstream.content.read(_MAX_503_PEEK_BYTES - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)

    async def _relay(self, request: web.Request, upstream: aiohttp.ClientResponse,
                     prefix: bytes) -> web.StreamResponse:
        response = web.StreamResponse(
            status=upstream.status, reason=upstream.reason,
            headers=_filtered(upstream.headers, _HOP_BY_HOP),
        )
        await response.prepare(request)
        try:
            if prefix:
                await response.write(prefix)
            # iter_any yields whatever has arrived: SSE events go out as the server emits them.
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
        except ConnectionResetError:
            log.info("gate: client went away during %s", request.path)
        except (TimeoutError, aiohttp.ClientError) as exc:
            # Headers are out; the only honest signal left is a broken connection.
            log.warning("gate: upstream failed mid-response on %s: %s", request.path,
                        type(exc).__name__)
            if request.transport is not None:
                request.transport.close()
        return response

    def _error(self, request: web.Request, refusal: GateRefusal) -> web.Response:
        headers = {"Retry-After": str(self._settings.retry_after_s)} if refusal.retry_after else {}
        payload: dict[str, Any]
        if request.path == _ANTHROPIC_PATH:
            payload = {"type": "error",
                       "error": {"type": refusal.reason, "message": refusal.message}}
        else:
            payload = {"error": {"message": refusal.message, "type": refusal.reason,
                                 "code": refusal.reason}}
        return web.json_response(payload, status=refusal.status, headers=headers)
