"""`ladder.client.FtServeClient` over real HTTP on loopback.

The server here is scripted, which is acceptable only because it replays the real ft serve
0.1.2 bytes (tests/fixtures/freetoken-0.1.2) with their recorded HTTP statuses; it also mimics
0.2.1's API-key middleware and produces the transport faults a live engine cannot be made to
produce on demand (slow replies, malformed JSON, dropped connections). Later tests drive the
real reference engine.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from engine.ftserve.fields import DocumentError
from engine.ftserve.geometry import CacheStatus
from engine.ftserve.wire import Health, RebuildOutcome, RequestLog, Stats
from ladder.client import (
    BadResponse,
    ClientError,
    EngineTimeout,
    EngineUnreachable,
    FtServeClient,
    HttpStatusError,
    Unauthorized,
)
from tests.conftest import CAPTURES, captured_manifest
from tests.engine.ftserve.test_wire import HEALTH_STATE, REBUILD_KIND

API_KEY = "sk-test-0123456789abcdef"


MANIFEST = captured_manifest()
CONTROL_ROUTES = {"/health", "/v1/cache/status", "/v1/stats", "/v1/requests", "/v1/cache/rebuild"}
CONTROL_FILES = sorted(
    name for name, e in MANIFEST.items() if e["path"].split("?", 1)[0] in CONTROL_ROUTES
)


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    query: dict[str, str]
    authorization: str | None
    body: bytes


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Script:
    """What the scripted engine answers per path, and what it was asked."""

    replies: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    handlers: dict[str, Handler] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    api_key: str | None = None
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def capture(self, name: str) -> None:
        """Serve capture `name` verbatim, with its recorded status, on its route."""
        entry = MANIFEST[name]
        path = entry["path"].split("?", 1)[0]
        self.replies[path] = (entry["http_status"], (CAPTURES / name).read_bytes())

    def reply(self, path: str, status: int, body: bytes | str | Any) -> None:
        if isinstance(body, str):
            body = body.encode()
        elif not isinstance(body, bytes):
            body = json.dumps(body).encode()
        self.replies[path] = (status, body)


SCRIPT = web.AppKey("script", Script)


@web.middleware
async def api_key_gate(request: web.Request, handler: Handler) -> web.StreamResponse:
    """ft serve 0.2.1's `_ApiKeyMiddleware`: every route but /health needs the key."""
    key = request.app[SCRIPT].api_key
    if key is not None and request.path != "/health":
        bearer = request.headers.get("Authorization") == f"Bearer {key}"
        if not bearer and request.headers.get("x-api-key") != key:
            return web.json_response({"error": "Unauthorized"}, status=401)
    return await handler(request)


async def scripted(request: web.Request) -> web.StreamResponse:
    script = request.app[SCRIPT]
    script.seen.append(
        Seen(
            method=request.method,
            path=request.path,
            query=dict(request.query),
            authorization=request.headers.get("Authorization"),
            body=await request.read(),
        )
    )
    if request.path in script.handlers:
        return await script.handlers[request.path](request)
    if request.path not in script.replies:
        return web.json_response({"detail": "Not Found"}, status=404)
    status, body = script.replies[request.path]
    return web.Response(status=status, body=body, content_type="application/json")


@dataclass
class Engine:
    script: Script
    server: TestServer

    @property
    def url(self) -> str:
        return str(self.server.make_url("/"))


@pytest.fixture
async def engine(aiohttp_server: Callable[..., Awaitable[TestServer]]) -> AsyncIterator[Engine]:
    script = Script()
    app = web.Application(middlewares=[api_key_gate])
    app[SCRIPT] = script
    app.router.add_route("*", "/{tail:.*}", scripted)
    server = await aiohttp_server(app)
    yield Engine(script, server)
    script.release.set()  # let parked slow handlers finish before the server shuts down


@pytest.fixture
async def client(engine: Engine) -> AsyncIterator[FtServeClient]:
    async with FtServeClient(engine.url, api_key=API_KEY, timeout_s=2.0) as c:
        yield c


# ------------------------------------------------------------------------ every capture


@pytest.mark.parametrize("name", CONTROL_FILES)
async def test_every_control_capture_parses_over_http(
    engine: Engine, client: FtServeClient, name: str
) -> None:
    engine.script.capture(name)
    route = MANIFEST[name]["path"].split("?", 1)[0]
    result: object
    if route == "/health":
        result = await client.health()
        assert isinstance(result, Health)
        assert result.state == HEALTH_STATE[name]
    elif route == "/v1/cache/status":
        result = await client.cache_status()
        assert isinstance(result, CacheStatus)
    elif route == "/v1/stats":
        result = await client.stats()
        assert isinstance(result, Stats)
    elif route == "/v1/requests":
        result = await client.requests()
        assert isinstance(result, RequestLog)
    else:
        outcome = await client.rebuild(MANIFEST[name]["request_body"] or {}, wait_s=5.0)
        assert isinstance(outcome, RebuildOutcome)
        assert (outcome.kind, outcome.http_status) == REBUILD_KIND[name]
    assert [s.path for s in engine.script.seen] == [route]


# ----------------------------------------------------------------------------- API key


async def test_api_key_on_every_route_but_health(engine: Engine, client: FtServeClient) -> None:
    engine.script.api_key = API_KEY
    for name in (
        "health.serving.json",
        "cache_status.boot.json",
        "stats.boot.json",
        "requests.boot.json",
        "rebuild.noop_empty_body.json",
    ):
        engine.script.capture(name)
    await client.health()
    await client.cache_status()
    await client.stats()
    await client.requests()
    assert (await client.rebuild({})).kind == "ok"
    auth = {s.path: s.authorization for s in engine.script.seen}
    assert auth == {
        "/health": None,
        "/v1/cache/status": f"Bearer {API_KEY}",
        "/v1/stats": f"Bearer {API_KEY}",
        "/v1/requests": f"Bearer {API_KEY}",
        "/v1/cache/rebuild": f"Bearer {API_KEY}",
    }


async def test_missing_key_is_unauthorized(engine: Engine) -> None:
    engine.script.api_key = API_KEY
    engine.script.capture("health.serving.json")
    engine.script.capture("stats.boot.json")
    engine.script.capture("cache_status.boot.json")
    engine.script.capture("requests.boot.json")
    engine.script.capture("rebuild.noop_empty_body.json")
    async with FtServeClient(engine.url, timeout_s=2.0) as keyless:
        assert (await keyless.health()).serving  # /health stays open
        for call in (keyless.stats, keyless.cache_status, keyless.requests):
            with pytest.raises(Unauthorized) as info:
                await call()
            assert info.value.http_status == 401
            assert info.value.error == "Unauthorized"
        outcome = await keyless.rebuild({"num_pages": 4})
        assert outcome.kind == "unauthorized"
        assert outcome.http_status == 401
    assert all(s.authorization is None for s in engine.script.seen)


async def test_wrong_key_is_unauthorized_and_never_echoed(engine: Engine) -> None:
    engine.script.api_key = API_KEY
    engine.script.capture("stats.boot.json")
    wrong = "sk-wrong-key-fedcba"
    async with FtServeClient(engine.url, api_key=wrong, timeout_s=2.0) as c:
        with pytest.raises(Unauthorized) as info:
            await c.stats()
        assert wrong not in str(info.value)
        assert wrong not in repr(info.value)


async def test_key_never_in_repr_or_str(engine: Engine, client: FtServeClient) -> None:
    assert API_KEY not in repr(client)
    assert API_KEY not in str(client)
    assert "<set>" in repr(client)
    assert "api_key=None" in repr(FtServeClient(engine.url))


async def test_key_never_logged(
    engine: Engine, client: FtServeClient, caplog: pytest.LogCaptureFixture
) -> None:
    engine.script.capture("stats.boot.json")
    engine.script.capture("wholecard.rebuild.while_generating.json")
    with caplog.at_level("DEBUG", logger="ladder.client"):
        await client.stats()
        await client.rebuild({"num_pages": 2_000_000})
    assert caplog.records
    assert all(API_KEY not in r.getMessage() for r in caplog.records)


def test_key_with_whitespace_is_refused_without_echo() -> None:
    with pytest.raises(ValueError, match="api_key") as info:
        FtServeClient(api_key="sk bad\r\n")
    assert "sk bad" not in str(info.value)


# ------------------------------------------------------------------------------ faults


async def test_connection_refused_is_unreachable(unused_tcp_port: int) -> None:
    port = unused_tcp_port
    async with FtServeClient(f"http://127.0.0.1:{port}", timeout_s=2.0) as c:
        for call in (c.health, c.stats, c.cache_status, c.requests):
            with pytest.raises(EngineUnreachable) as info:
                await call()
            assert not isinstance(info.value, EngineTimeout)
        with pytest.raises(EngineUnreachable):
            await c.rebuild({"num_pages": 4}, wait_s=1.0)


async def _parked(request: web.Request) -> web.StreamResponse:
    # Parks until the test ends, or answers after 0.5 s when the test asks for a slow reply.
    delay_s = float(request.query.get("delay_s", "0") or 0)
    if request.path == "/v1/cache/rebuild":
        delay_s = 0.5
    if delay_s:
        await asyncio.sleep(delay_s)
    else:
        await request.app[SCRIPT].release.wait()
    return web.Response(
        body=(CAPTURES / "rebuild.noop_empty_body.json").read_bytes()
        if request.path == "/v1/cache/rebuild"
        else (CAPTURES / "stats.boot.json").read_bytes(),
        content_type="application/json",
    )


async def test_slow_reply_beyond_timeout_is_unreachable(engine: Engine) -> None:
    engine.script.handlers["/v1/stats"] = _parked
    async with FtServeClient(engine.url, timeout_s=0.2) as c:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(EngineTimeout) as info:
            await c.stats()
        assert loop.time() - started < 1.5
    assert isinstance(info.value, EngineUnreachable)
    assert info.value.path == "/v1/stats"


async def test_rebuild_http_wait_covers_the_server_wait(engine: Engine) -> None:
    """A GET gives up after timeout_s; a rebuild waits wait_s + timeout_s for its reply."""
    engine.script.handlers["/v1/cache/rebuild"] = _parked
    async with FtServeClient(engine.url, timeout_s=0.25) as c:
        outcome = await c.rebuild({"num_pages": 4}, wait_s=1.0)  # answered after 0.5 s
        assert outcome.kind == "ok"
        with pytest.raises(EngineTimeout):
            await c.rebuild({"num_pages": 4, "timeout": 0.05})  # body's own wait wins
    posted = [json.loads(s.body) for s in engine.script.seen]
    assert [p["timeout"] for p in posted] == [1.0, 0.05]


async def test_dropped_connection_is_unreachable(engine: Engine, client: FtServeClient) -> None:
    async def drop(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.close()
        return web.Response()

    engine.script.handlers["/v1/cache/status"] = drop
    with pytest.raises(EngineUnreachable):
        await client.cache_status()


@pytest.mark.parametrize(
    "body", [b'{"status": "ok",', b"<html>502 Bad Gateway</html>", b"", b"\xff\xfe\x00"]
)
async def test_malformed_json_is_bad_response(
    engine: Engine, client: FtServeClient, body: bytes
) -> None:
    for path in ("/health", "/v1/stats", "/v1/cache/status", "/v1/requests", "/v1/cache/rebuild"):
        engine.script.reply(path, 200, body)
    calls: list[Callable[[], Awaitable[object]]] = [
        client.health,
        client.stats,
        client.cache_status,
        client.requests,
        lambda: client.rebuild({"num_pages": 4}),
    ]
    for call in calls:
        with pytest.raises(BadResponse) as info:
            await call()
        assert "not JSON" in str(info.value)
        assert info.value.http_status == 200


async def test_deeply_nested_json_is_bad_response(engine: Engine, client: FtServeClient) -> None:
    engine.script.reply("/v1/stats", 200, b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(BadResponse):
        await client.stats()


async def test_parse_errors_are_bad_response_naming_path_and_field(
    engine: Engine, client: FtServeClient
) -> None:
    stats = json.loads((CAPTURES / "stats.final.json").read_bytes())
    del stats["kv"]["total_pages"]
    engine.script.reply("/v1/stats", 200, stats)
    status = json.loads((CAPTURES / "cache_status.boot.json").read_bytes())
    status["geometry"]["unit_bytes"]["kv_per_token"] = 0
    engine.script.reply("/v1/cache/status", 200, status)
    engine.script.reply("/health", 200, {"status": "ok"})
    with pytest.raises(BadResponse, match=r"kv\.total_pages") as info:
        await client.stats()
    assert info.value.path == "/v1/stats"
    assert isinstance(info.value.__cause__, DocumentError)
    with pytest.raises(BadResponse, match=r"geometry\.unit_bytes\.kv_per_token") as info:
        await client.cache_status()
    assert info.value.path == "/v1/cache/status"
    with pytest.raises(BadResponse, match="instance_id"):
        await client.health()


async def test_non_2xx_get_raises_with_status(engine: Engine, client: FtServeClient) -> None:
    engine.script.reply("/v1/stats", 500, "Internal Server Error")
    engine.script.reply("/v1/cache/status", 503, {"error": "server unavailable"})
    with pytest.raises(HttpStatusError) as info:
        await client.stats()
    assert info.value.http_status == 500
    assert info.value.error is None
    with pytest.raises(HttpStatusError) as info:
        await client.cache_status()
    assert (info.value.http_status, info.value.error) == (503, "server unavailable")
    with pytest.raises(HttpStatusError) as info:
        await client.requests()  # not scripted: 404
    assert info.value.http_status == 404
    assert not isinstance(info.value, Unauthorized)


async def test_redirect_is_not_followed(engine: Engine, client: FtServeClient) -> None:
    async def redirect(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound("/elsewhere")

    engine.script.handlers["/v1/stats"] = redirect
    with pytest.raises(HttpStatusError) as info:
        await client.stats()
    assert info.value.http_status == 302
    assert [s.path for s in engine.script.seen] == ["/v1/stats"]


async def test_errors_are_one_hierarchy() -> None:
    for exc in (EngineUnreachable, EngineTimeout, BadResponse, HttpStatusError, Unauthorized):
        assert issubclass(exc, ClientError)


# ----------------------------------------------------------------------------- rebuild


async def test_rebuild_posts_timeout_and_mode(engine: Engine, client: FtServeClient) -> None:
    engine.script.capture("rebuild.grow_mamba.json")
    outcome = await client.rebuild({"num_mamba_slots": 12}, wait_s=42.0)
    assert outcome.kind == "ok"
    assert outcome.reply is not None
    assert outcome.reply.mamba_slots == 12
    (seen,) = engine.script.seen
    assert seen.method == "POST"
    assert json.loads(seen.body) == {"num_mamba_slots": 12, "timeout": 42.0, "mode": "if_idle"}


async def test_rebuild_keeps_callers_timeout_and_mode(
    engine: Engine, client: FtServeClient
) -> None:
    engine.script.capture("rebuild.invalid_mode_drain.json")
    outcome = await client.rebuild({"num_pages": 1_000_000, "mode": "drain", "timeout": 3})
    assert outcome.kind == "invalid"
    assert json.loads(engine.script.seen[0].body) == {
        "num_pages": 1_000_000,
        "mode": "drain",
        "timeout": 3,
    }


async def test_rebuild_refuses_a_key_the_server_would_ignore(
    engine: Engine, client: FtServeClient
) -> None:
    with pytest.raises(DocumentError, match="num_mamba_slots"):
        await client.rebuild({"mamba_slots": 12})
    assert engine.script.seen == []


async def test_rebuild_timeout_504_is_an_outcome(engine: Engine, client: FtServeClient) -> None:
    engine.script.capture("wholecard.rebuild.timeout_short_wait.json")
    outcome = await client.rebuild({"num_pages": 2_000_000}, wait_s=0.05)
    assert outcome.kind == "timeout"
    assert outcome.request_id == "fe160491-32b8-40ff-8825-3a1803681417"


async def test_rebuild_non_json_401_is_unauthorized(engine: Engine, client: FtServeClient) -> None:
    engine.script.reply("/v1/cache/rebuild", 401, "<html>401</html>")
    assert (await client.rebuild({})).kind == "unauthorized"


# ------------------------------------------------------------------------ requests()


async def test_requests_passes_cursor_and_limit(engine: Engine, client: FtServeClient) -> None:
    engine.script.capture("requests.since_2_limit_2.json")
    log = await client.requests(since=2, limit=2)
    assert log.next_cursor == 4
    assert len(log.entries) == 2
    await client.requests()
    assert [s.query for s in engine.script.seen] == [{"since": "2", "limit": "2"}, {"limit": "100"}]


@pytest.mark.parametrize(("since", "limit"), [(-1, 10), (None, 0), (None, 513), (True, 10)])
async def test_requests_refuses_bad_arguments(
    engine: Engine, client: FtServeClient, since: int | None, limit: int
) -> None:
    with pytest.raises(ValueError, match=r"since|limit"):
        await client.requests(since=since, limit=limit)
    assert engine.script.seen == []


# ------------------------------------------------------------------------ session life


async def test_injected_session_is_reused_and_left_open(engine: Engine) -> None:
    engine.script.capture("health.serving.json")
    async with aiohttp.ClientSession(raise_for_status=True) as session:
        async with FtServeClient(engine.url, session=session, timeout_s=2.0) as c:
            await c.health()
            engine.script.reply("/v1/stats", 500, "boom")
            # raise_for_status on the injected session must not leak aiohttp errors.
            with pytest.raises(HttpStatusError):
                await c.stats()
        assert not session.closed


async def test_owned_session_is_closed_on_exit(engine: Engine) -> None:
    engine.script.capture("health.serving.json")
    c = FtServeClient(engine.url)
    async with c:
        await c.health()
        await c.health()
    with pytest.raises(RuntimeError, match="async with"):
        await c.health()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"base_url": "127.0.0.1:1919"}, "base_url"),
        ({"base_url": "ftp://127.0.0.1"}, "base_url"),
        ({"timeout_s": 0.0}, "timeout_s"),
        ({"timeout_s": float("nan")}, "timeout_s"),
    ],
)
def test_constructor_validates(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FtServeClient(**kwargs)
