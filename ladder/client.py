"""Thin aiohttp adapter for `ft serve`'s control routes; all meaning lives in `engine.ftserve.wire`.

Why it exists: the daemon needs one place that turns every way HTTP can go wrong into a small,
closed set of errors (`ClientError` and its subclasses), so the controller never sees a raw
aiohttp, json or KeyError exception, and never has to know how the API key travels. It holds
one `aiohttp.ClientSession` for its whole life, created inside the running
loop by `async with`, or injected and then left open for its owner to close.

The API key goes out as `Authorization: Bearer <key>` on every route but `/health` (ft serve
0.2.1 exempts it). It is never logged and never appears in `repr()`.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Final, TypeVar

import aiohttp
from yarl import URL

from engine.ftserve.fields import DocumentError
from engine.ftserve.geometry import CacheStatus, parse_cache_status
from engine.ftserve.wire import (
    Health,
    RebuildOutcome,
    RequestLog,
    Stats,
    build_rebuild_body,
    classify_rebuild,
    parse_health,
    parse_requests,
    parse_stats,
)

__all__ = [
    "DEFAULT_BASE_URL",
    "BadResponse",
    "ClientError",
    "EngineTimeout",
    "EngineUnreachable",
    "FtServeClient",
    "HttpStatusError",
    "Unauthorized",
]

log = logging.getLogger(__name__)

DEFAULT_BASE_URL: Final = "http://127.0.0.1:1919"
HEALTH_PATH: Final = "/health"
CACHE_STATUS_PATH: Final = "/v1/cache/status"
STATS_PATH: Final = "/v1/stats"
REQUESTS_PATH: Final = "/v1/requests"
REBUILD_PATH: Final = "/v1/cache/rebuild"
# The server's ring holds 512 entries and rejects larger pages (control_api.py:63-67).
MAX_REQUESTS_LIMIT: Final = 512

T = TypeVar("T")


class ClientError(Exception):
    """Base of everything `FtServeClient` raises about the engine; `path` is the route."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


class EngineUnreachable(ClientError):
    """No usable HTTP exchange: connection refused or reset, DNS, or no reply in time."""


class EngineTimeout(EngineUnreachable):
    """No complete reply within the timeout. After a rebuild POST the outcome is unknown:
    the server may still be rebuilding, so poll `/v1/cache/status` before acting."""


class HttpStatusError(ClientError):
    """A GET route answered outside 2xx; `error` is the server's message when it gave one."""

    def __init__(self, path: str, http_status: int, error: str | None) -> None:
        super().__init__(path, f"HTTP {http_status}" + (f": {error}" if error else ""))
        self.http_status = http_status
        self.error = error


class Unauthorized(HttpStatusError):
    """401 on a GET route: the API key is missing or wrong (ft serve 0.2.1)."""


class BadResponse(ClientError):
    """A reply the client cannot use: not JSON, truncated, or rejected by the parser."""

    def __init__(self, path: str, http_status: int | None, problem: str) -> None:
        prefix = f"HTTP {http_status}: " if http_status is not None else ""
        super().__init__(path, prefix + problem)
        self.http_status = http_status
        self.problem = problem


def _decode_json(raw: bytes) -> Any:
    """Decoded body, raising ValueError when it is not JSON (RecursionError folded in)."""
    try:
        return json.loads(raw)
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply") from exc


def _error_text(raw: bytes) -> str | None:
    """Best-effort server message from an error body (`error`, `detail` or `status`)."""
    try:
        doc = _decode_json(raw)
    except ValueError:
        return None
    if isinstance(doc, Mapping):
        for key in ("error", "detail", "status"):
            value = doc.get(key)
            if isinstance(value, str):
                return value
    return None


class FtServeClient:
    """Async client for one `ft serve` process.

    `timeout_s` bounds every GET (connect included). `rebuild` waits for the server's own
    `timeout` plus `timeout_s`, so the server gives up first and says so with a 504.
    """

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        *,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        url = URL(base_url)
        if not url.absolute or url.scheme not in ("http", "https"):
            raise ValueError(f"base_url must be an absolute http(s) URL, got {base_url!r}")
        if not math.isfinite(timeout_s) or timeout_s <= 0:
            raise ValueError(f"timeout_s must be a positive finite number, got {timeout_s!r}")
        if api_key is not None and (
            not api_key or any(c.isspace() or not c.isprintable() for c in api_key)
        ):
            # A header value with CR/LF or spaces would be refused deep inside aiohttp (or split
            # the header); refuse it here, without echoing the key.
            raise ValueError("api_key must be a non-empty string without whitespace")
        self._base_url = str(url).rstrip("/")
        self._api_key = api_key
        self._timeout_s = float(timeout_s)
        self._session = session
        self._owns_session = session is None

    def __repr__(self) -> str:
        key = "'<set>'" if self._api_key is not None else "None"
        return (
            f"{type(self).__name__}(base_url={self._base_url!r}, api_key={key}, "
            f"timeout_s={self._timeout_s!r})"
        )

    __str__ = __repr__

    @property
    def base_url(self) -> str:
        return self._base_url

    async def __aenter__(self) -> FtServeClient:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._timeout_s, connect=self._timeout_s)
            )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the session if this client created it; an injected one stays open."""
        if self._owns_session and self._session is not None:
            session, self._session = self._session, None
            await session.close()

    # -- routes -----------------------------------------------------------------------------

    async def health(self) -> Health:
        """`GET /health`, without the API key (the one route 0.2.1 leaves open)."""
        doc = await self._get_json(HEALTH_PATH, auth=False)
        return self._parse(HEALTH_PATH, parse_health, doc)

    async def cache_status(self) -> CacheStatus:
        """`GET /v1/cache/status`: the only trustworthy source of pool sizes and unit costs."""
        doc = await self._get_json(CACHE_STATUS_PATH)
        return self._parse(CACHE_STATUS_PATH, parse_cache_status, doc)

    async def stats(self) -> Stats:
        """`GET /v1/stats` (its `kv`/`mamba` sizes are stale; see `engine.ftserve.wire.KvUsage`)."""
        doc = await self._get_json(STATS_PATH)
        return self._parse(STATS_PATH, parse_stats, doc)

    async def requests(self, since: int | None = None, limit: int = 100) -> RequestLog:
        """`GET /v1/requests?since=&limit=`: finished requests after cursor `since`."""
        if since is not None and (isinstance(since, bool) or since < 0):
            raise ValueError(f"since must be a cursor >= 0, got {since!r}")
        if isinstance(limit, bool) or not 1 <= limit <= MAX_REQUESTS_LIMIT:
            raise ValueError(f"limit must be in 1..{MAX_REQUESTS_LIMIT}, got {limit!r}")
        params = {"limit": str(limit)}
        if since is not None:
            params["since"] = str(since)
        doc = await self._get_json(REQUESTS_PATH, params=params)
        return self._parse(REQUESTS_PATH, parse_requests, doc)

    async def rebuild(self, body: Mapping[str, Any], *, wait_s: float = 300.0) -> RebuildOutcome:
        """`POST /v1/cache/rebuild` and classify the reply; HTTP-level refusals are outcomes.

        `timeout` (= `wait_s`) and `mode` (`"if_idle"`) are added only when `body` lacks them;
        the HTTP wait is the server's wait plus `timeout_s`. Raises `DocumentError` (a ValueError)
        before any I/O for a key the server would ignore, `EngineTimeout` when no reply came
        (outcome unknown), `BadResponse` for a body that is not JSON.
        """
        payload = build_rebuild_body(body, wait_s=wait_s)
        total_s = float(payload["timeout"]) + self._timeout_s
        status, raw = await self._send(
            "POST",
            REBUILD_PATH,
            auth=True,
            total_s=total_s,
            data=json.dumps(payload, allow_nan=False).encode(),
        )
        try:
            doc = _decode_json(raw)
        except ValueError as exc:
            if status != 401:
                raise BadResponse(REBUILD_PATH, status, f"body is not JSON ({exc})") from exc
            doc = None  # a proxy's 401 page is still a 401
        outcome = classify_rebuild(status, doc)
        log.debug(
            "rebuild -> kind=%s http_status=%d request_id=%s",
            outcome.kind,
            status,
            outcome.request_id,
        )
        return outcome

    # -- plumbing ---------------------------------------------------------------------------

    def _require_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("FtServeClient used outside `async with` (no session)")
        return self._session

    async def _send(
        self,
        method: str,
        path: str,
        *,
        auth: bool,
        total_s: float,
        params: Mapping[str, str] | None = None,
        data: bytes | None = None,
    ) -> tuple[int, bytes]:
        """One exchange -> (HTTP status, body bytes); every transport failure is mapped."""
        session = self._require_session()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if auth and self._api_key is not None:
            headers["Authorization"] = "Bearer " + self._api_key
        # Per-request timeout so an injected session's defaults cannot stretch or cut it.
        timeout = aiohttp.ClientTimeout(total=total_s, connect=min(total_s, self._timeout_s))
        started = time.monotonic()
        try:
            async with session.request(
                method,
                self._base_url + path,
                params=params,
                data=data,
                headers=headers,
                timeout=timeout,
                # Redirects could carry the key elsewhere, and an injected session must not
                # turn statuses into exceptions.
                allow_redirects=False,
                raise_for_status=False,
            ) as response:
                status = response.status
                raw = await response.read()
        except TimeoutError as exc:
            raise EngineTimeout(path, f"no reply within {total_s:g} s") from exc
        except aiohttp.ClientPayloadError as exc:
            raise BadResponse(path, None, f"incomplete body ({exc})") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise EngineUnreachable(path, f"{type(exc).__name__}: {exc}") from exc
        log.debug("%s %s -> %d in %.3f s", method, path, status, time.monotonic() - started)
        return status, raw

    async def _get_json(
        self, path: str, *, auth: bool = True, params: Mapping[str, str] | None = None
    ) -> Any:
        status, raw = await self._send(
            "GET", path, auth=auth, total_s=self._timeout_s, params=params
        )
        if status == 401:
            raise Unauthorized(path, status, _error_text(raw))
        if not 200 <= status < 300:
            raise HttpStatusError(path, status, _error_text(raw))
        try:
            return _decode_json(raw)
        except ValueError as exc:
            raise BadResponse(path, status, f"body is not JSON ({exc})") from exc

    @staticmethod
    def _parse(path: str, parser: Callable[[Any], T], doc: Any) -> T:
        try:
            return parser(doc)
        except DocumentError as exc:
            raise BadResponse(path, None, str(exc)) from exc
