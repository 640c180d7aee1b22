"""The admission gate over real loopback HTTP: a scripted OpenAI-like upstream, a small
controller that steps up after a delay, and the gate between them."""

from __future__ import annotations

import asyncio
import functools
import gzip
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from engine.ftserve.wire import RequestEntry
from ladder.gate import ChangeNotifier, Gate, GateSettings, _is_loopback
from ladder.sizing import size_request
from ladder.token_bound import TokenBound

REBUILD_503 = {"error": {"message": "server unavailable: cache rebuild in progress",
                         "type": "server_error"}}
SECRET = "sk-test-do-not-log-4242"


# ---------------------------------------------------------------------------------------------
# The upstream: just enough of an OpenAI server


@dataclass
class Seen:
    method: str
    path_qs: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Upstream:
    seen: list[Seen] = field(default_factory=list)
    unavailable_next: int = 0
    on_unavailable: Callable[[], None] | None = None
    rebuilding_until_s: float = 0.0
    last_ok_s: float = 0.0
    release_stream: asyncio.Event = field(default_factory=asyncio.Event)
    stream_finished: bool = False
    stream_aborted: bool = False

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append(Seen(request.method, request.path_qs, dict(request.headers), body))
        if request.path == "/v1/models":
            return web.json_response({"data": [{"id": "m"}]})
        if request.path == "/compressed":
            return web.Response(body=gzip.compress(b"squeezed " * 100),
                                headers={"Content-Encoding": "gzip"})
        if request.path == "/v1/admin/prepare-stop":
            return web.json_response({"status": "stopping"})
        if self.unavailable_next > 0:
            self.unavailable_next -= 1
            if self.on_unavailable is not None:
                self.on_unavailable()
            return web.json_response(REBUILD_503, status=503)
        now = asyncio.get_running_loop().time()
        if now < self.rebuilding_until_s:
            return web.json_response(REBUILD_503, status=503)
        self.last_ok_s = now
        doc = json.loads(body)
        if doc.get("stream"):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b'data: {"n": 1}\n\n')
            await self.release_stream.wait()
            if doc.get("die"):
                assert request.transport is not None
                request.transport.close()
                return response
            try:
                for n in (2, 3):
                    await asyncio.sleep(0.01)
                    await response.write(f'data: {{"n": {n}}}\n\n'.encode())
                    # Give the gate time to notice a client that left and hang up on us.
                    await asyncio.sleep(0.02)
                await response.write(b"data: [DONE]\n\n")
            except (ConnectionResetError, asyncio.CancelledError):
                # A client that hangs up either fails our write or cancels this handler.
                self.stream_aborted = True
                raise
            self.stream_finished = True
            await response.write_eof()
            return response
        return web.json_response({"object": "chat.completion", "echo_max_tokens":
                                  doc.get("max_tokens")}, headers={"X-Upstream": "yes"})


# ---------------------------------------------------------------------------------------------
# The controller: capacity moves after a delay once asked


class StepController:
    def __init__(self, capacity: int, top: int, *, step_delay_s: float = 0.05,
                 auto_step: bool = True) -> None:
        self.capacity = capacity
        self.top = top
        self.transitioning = False
        self.step_delay_s = step_delay_s
        self.auto_step = auto_step
        self.asked: list[int] = []
        self._notifier = ChangeNotifier()
        self._tasks: set[asyncio.Task[None]] = set()

    def capacity_tokens(self) -> int:
        return self.capacity

    def max_capacity_tokens(self) -> int:
        return self.top

    def transition_running(self) -> bool:
        return self.transitioning

    async def request_capacity(self, tokens: int) -> None:
        self.asked.append(tokens)
        if self.auto_step and not self._tasks:
            task = asyncio.create_task(self._step(min(tokens, self.top)))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def wait_changed(self, timeout_s: float) -> None:
        await self._notifier.wait(timeout_s)

    def set(self, *, capacity: int | None = None, transitioning: bool | None = None) -> None:
        if capacity is not None:
            self.capacity = capacity
        if transitioning is not None:
            self.transitioning = transitioning
        self._notifier.notify()

    async def _step(self, tokens: int) -> None:
        self.set(transitioning=True)
        await asyncio.sleep(self.step_delay_s)
        # Rungs come in 1024-token steps; the controller picks the first that holds the need.
        self.set(capacity=-(-tokens // 1024) * 1024, transitioning=False)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


# ---------------------------------------------------------------------------------------------
# Fixtures

MakeGate = Callable[..., Awaitable[tuple[TestClient[web.Request, web.Application], Gate]]]


@pytest.fixture
async def upstream(aiohttp_server: Any) -> AsyncIterator[tuple[Upstream, TestServer]]:
    state = Upstream()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", state.handle)
    server = await aiohttp_server(app)
    yield state, server
    state.release_stream.set()


@pytest.fixture
async def controller() -> AsyncIterator[StepController]:
    ctl = StepController(capacity=1024, top=32768)
    yield ctl
    await ctl.close()


@pytest.fixture
def make_gate(aiohttp_client: Any, upstream: tuple[Upstream, TestServer],
              controller: StepController) -> MakeGate:
    async def make(**settings: Any) -> tuple[TestClient[web.Request, web.Application], Gate]:
        settings.setdefault("max_hold_s", 5.0)
        settings.setdefault("rebuild_retry_interval_s", 0.02)
        gate = Gate(str(upstream[1].make_url("/")), controller,
                    settings=GateSettings(**settings))
        return await aiohttp_client(gate.make_app()), gate
    return make


def chat(content: str = "hello", *, max_tokens: int = 16, stream: bool = False) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "stream": stream}


def raw(doc: dict[str, Any]) -> bytes:
    # Unusual spacing on purpose: the gate must forward the bytes, not a re-serialisation.
    return json.dumps(doc, indent=3).encode()


async def wait_for(predicate: Callable[[], bool], timeout_s: float = 2.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.005)


# ---------------------------------------------------------------------------------------------
# Tests


async def test_request_that_fits_passes_straight_through(
        make_gate: MakeGate, upstream: tuple[Upstream, TestServer],
        controller: StepController) -> None:
    client, gate = await make_gate()
    body = raw(chat())
    resp = await client.post("/v1/chat/completions?trace=1", data=body,
                             headers={"Content-Type": "application/json"})
    assert resp.status == 200
    assert resp.headers["X-Upstream"] == "yes"
    assert (await resp.json())["echo_max_tokens"] == 16
    seen = upstream[0].seen[-1]
    assert seen.body == body and seen.path_qs == "/v1/chat/completions?trace=1"
    assert seen.headers["Content-Type"] == "application/json"
    assert controller.asked == []
    stats = gate.stats()
    assert (stats.forwarded_total, stats.held_total, stats.held_now) == (1, 0, 0)


async def test_big_request_is_held_until_the_step_up_then_forwarded_unchanged(
        make_gate: MakeGate, upstream: tuple[Upstream, TestServer],
        controller: StepController) -> None:
    client, gate = await make_gate()
    doc = chat("x" * 3000, max_tokens=2000)
    expected = size_request("/v1/chat/completions", doc, tokenizer=None, bound=TokenBound())
    assert expected.total_tokens > controller.capacity
    body = raw(doc)
    resp = await client.post("/v1/chat/completions", data=body)
    assert resp.status == 200
    assert controller.asked == [expected.total_tokens]
    assert controller.capacity >= expected.total_tokens
    # Nothing was clipped: the upstream got the client's bytes, max_tokens included.
    assert upstream[0].seen[-1].body == body
    assert json.loads(upstream[0].seen[-1].body)["max_tokens"] == 2000
    assert (await resp.json())["echo_max_tokens"] == 2000
    stats = gate.stats()
    assert stats.held_total == 1 and stats.held_now == 0 and stats.hold_seconds_count == 1
    assert stats.hold_seconds_sum >= controller.step_delay_s * 0.5


async def test_requests_during_a_transition_wait_for_its_end(
        make_gate: MakeGate, upstream: tuple[Upstream, TestServer],
        controller: StepController) -> None:
    client, gate = await make_gate()
    controller.set(transitioning=True)
    sent = asyncio.create_task(client.post("/v1/chat/completions", data=raw(chat())))
    await wait_for(lambda: gate.stats().held_now == 1)
    assert upstream[0].seen == []
    assert controller.asked == []  # it fits; it only waits for the rebuild to end
    controller.set(transitioning=False)
    resp = await sent
    assert resp.status == 200 and len(upstream[0].seen) == 1


async def test_other_paths_are_not_held(
        make_gate: MakeGate, upstream: tuple[Upstream, TestServer],
        controller: StepController) -> None:
    client, _ = await make_gate()
    controller.set(transitioning=True)
    resp = await client.get("/v1/models?x=1")
    assert resp.status == 200 and (await resp.json())["data"][0]["id"] == "m"
    assert upstream[0].seen[-1].path_qs == "/v1/models?x=1"


async def test_sse_streams_incrementally(
        make_gate: MakeGate, upstream: tuple[Upstream, TestServer]) -> None:
    client, _ = await make_gate()
    resp = await client.post("/v1/chat/completions", data=raw(chat(stream=True)))
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    async with asyncio.timeout(2.0):
        first = await resp.content.readuntil(b"\n\n")
    assert first == b'data: {"n": 1}\n\n'
    assert not upstream[0].stream_finished  # the gate did not wait for the whole body
    upstream[0].release_stream.set()
    rest = await resp.read()
    assert rest == b'data: {"n": 2}\n\ndata: {"n": 3}\n\ndata: [DONE]\n\n'
    assert upstream[0].stream_finished


async def test_hold_timeout_is_a_clear_503_with_retry_after(
        make_gate: MakeGate, upstream: tuple[Upstream, TestServer],
        controller: StepController) -> None:
    controller.auto_step = False
    client, gate = await make_gate(max_hold_s=0.1, retry_after_s=7)
    resp = await client.post("/v1/chat/completions", data=raw(chat(max_tokens=5000)))
    assert resp.status == 503
    assert resp.headers["Retry-After"] == "7"
    error = (await resp.json())["error"]
    assert error["type"] == "gate_hold_timeout" and "0.1 s" in error["message"]
    assert upstream[0].seen == []
    assert gate.stats().refused_total == {"gate_hold_timeout": 1}
    assert gate.stats().held_now == 0


async def test_too_many_held_is_refused_at_once(
        make_gate: MakeGate, upstream: tuple[Upstream, TestServer],
        controller: StepController) -> None:
    client, gate = await make_gate(max_held=1)
    controller.set(transitioning=True)
    first = asyncio.create_task(client.post("/v1/chat/completions", data=raw(chat())))
    await wait_for(lambda: gate.stats().held_now == 1)
    resp = await client.post("/v1/chat/completions", data=raw(chat()))
    assert resp.status == 503 and "Retry-After" in resp.headers
    assert (await resp.json())["error"]["type"] == "gate_overloaded"
    controller.set(transitioning=False)
    assert (await first).status == 200
    assert gate.stats().refused_total == {"gate_overloaded": 1}


async def test_limits_body_headers_and_json(
        make_gate: MakeGate, upstream: tuple[Upstream, TestServer]) -> None:
    client, gate = await make_gate(max_body_bytes=1024, max_headers=20)
    resp = await client.post("/v1/chat/completions", data=raw(chat("y" * 2000)))
    assert resp.status == 413
    many = {f"X-Pad-{i}": "v" for i in range(25)}
    resp = await client.post("/v1/chat/completions", data=raw(chat()), headers=many)
    assert resp.status == 431
    resp = await client.post("/v1/chat/completions", data=b"{not json")
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert error["type"] == "invalid_json" and "\n" not in error["message"]
    resp = await client.post("/v1/chat/completions", data=b"[1, 2]")
    assert resp.status == 400
    assert upstream[0].seen == []
    assert gate.stats().refused_total == {"body_too_large": 1, "too_many_headers": 1,
                                          "invalid_json": 2}


async def test_api_keys_are_forwarded_and_never_logged(
        make_gate: MakeGate, upstream: tuple[Upstream, TestServer],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    client, _ = await make_gate()
    headers = {"Authorization": f"Bearer {SECRET}", "x-api-key": SECRET,
               "Connection": "keep-alive, X-Hop", "X-Hop": "drop me"}
    # Held (too big for the live rung) so the gate's hold logging runs too.
    resp = await client.post("/v1/chat/completions", data=raw(chat(max_tokens=3000)),
                             headers=headers)
    assert resp.status == 200
    seen = upstream[0].seen[-1].headers
    assert seen["Authorization"] == f"Bearer {SECRET}" and seen["x-api-key"] == SECRET
    assert "X-Hop" not in seen  # named in Connection: hop-by-hop
    assert caplog.records, "expected the hold to be logged"
    for record in caplog.records:
        assert SECRET not in record.getMessage()
        assert SECRET not in repr(record.args)


async def test_upstream_rebuild_503_is_retried_after_the_transition(
        make_gate: MakeGate, upstream: tuple[Upstream, TestServer],
        controller: StepController) -> None:
    client, gate = await make_gate()
    loop = asyncio.get_running_loop()
    ended: list[float] = []

    def rebuild_started() -> None:
        # ft serve rebuilds for 0.12 s; the controller notices a little late and clears the
        # flag once the server serves again.
        upstream[0].rebuilding_until_s = loop.time() + 0.12
        loop.call_later(0.03, functools.partial(controller.set, transitioning=True))
        loop.call_later(0.13, functools.partial(controller.set, transitioning=False))
        loop.call_later(0.13, lambda: ended.append(loop.time()))

    upstream[0].unavailable_next = 1
    upstream[0].on_unavailable = rebuild_started
    body = raw(chat())
    resp = await client.post("/v1/chat/completions", data=body)
    assert resp.status == 200
    assert (await resp.json())["object"] == "chat.completion"
    assert len(upstream[0].seen) >= 2 and {s.body for s in upstream[0].seen} == {body}
    assert ended and upstream[0].last_ok_s >= ended[0]  # forwarded after the transition
    stats = gate.stats()
    assert stats.retried_total >= 1 and stats.held_total == 1 and stats.forwarded_total == 1
    assert stats.refused_total == {}


async def test_upstream_rebuild_503_past_the_hold_budget_is_the_gate_503(
        make_gate: MakeGate, upstream: tuple[Upstream, TestServer]) -> None:
    client, _ = await make_gate(max_hold_s=0.1)
    upstream[0].unavailable_next = 1000
    resp = await client.post("/v1/chat/completions", data=raw(chat()))
    assert resp.status == 503 and "Retry-After" in resp.headers
    assert (await resp.json())["error"]["type"] == "gate_hold_timeout"


async def test_anthropic_messages_are_sized_and_errors_keep_their_shape(
        make_gate: MakeGate, upstream: tuple[Upstream, TestServer],
        controller: StepController) -> None:
    client, _ = await make_gate()
    doc = {"model": "m", "system": "s" * 1500, "max_tokens": 600,
           "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    expected = size_request("/v1/messages", doc, tokenizer=None, bound=TokenBound())
    resp = await client.post("/v1/messages", data=raw(doc), headers={"x-api-key": SECRET})
    assert resp.status == 200
    assert controller.asked == [expected.total_tokens]
    assert expected.prompt_tokens >= 1502 and expected.max_tokens == 600

    controller.auto_step = False
    client, _ = await make_gate(max_hold_s=0.05)
    doc["max_tokens"] = 20000
    resp = await client.post("/v1/messages", data=raw(doc))
    assert resp.status == 503
    payload = await resp.json()
    assert payload["type"] == "error" and payload["error"]["type"] == "gate_hold_timeout"


async def test_larger_than_the_top_rung_is_held_for_the_top_then_forwarded(
        make_gate: MakeGate, upstream: tuple[Upstream, TestServer],
        controller: StepController) -> None:
    client, _ = await make_gate()
    resp = await client.post("/v1/chat/completions", data=raw(chat(max_tokens=100_000)))
    assert resp.status == 200
    assert controller.asked == [controller.top]
    assert json.loads(upstream[0].seen[-1].body)["max_tokens"] == 100_000


async def test_exact_prompt_beyond_the_top_rung_is_left_to_the_server(
        aiohttp_client: Any, upstream: tuple[Upstream, TestServer],
        controller: StepController) -> None:
    controller.top = 2048
    gate = Gate(str(upstream[1].make_url("/")), controller,
                tokenizer=lambda text: len(text.split()))
    client = await aiohttp_client(gate.make_app())
    resp = await client.post("/v1/chat/completions", data=raw(chat("w " * 5000)))
    assert resp.status == 200  # the scripted upstream accepts; ft serve would refuse
    assert controller.asked == [] and gate.stats().held_total == 0


async def test_unreachable_upstream_is_a_502(
        aiohttp_client: Any, unused_tcp_port: int, controller: StepController) -> None:
    gate = Gate(f"http://127.0.0.1:{unused_tcp_port}", controller)
    client = await aiohttp_client(gate.make_app())
    resp = await client.post("/v1/chat/completions", data=raw(chat()))
    assert resp.status == 502
    assert (await resp.json())["error"]["type"] == "upstream_unreachable"


async def test_injected_session_is_used_and_left_open(
        aiohttp_client: Any, upstream: tuple[Upstream, TestServer],
        controller: StepController) -> None:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        gate = Gate(str(upstream[1].make_url("/")), controller, session=session)
        client = await aiohttp_client(gate.make_app())
        assert (await client.get("/v1/models")).status == 200
        await client.close()
        assert not session.closed


async def test_request_log_tightens_the_bound(
        make_gate: MakeGate, upstream: tuple[Upstream, TestServer]) -> None:
    client, gate = await make_gate()
    settings = gate.settings
    text = "the quick brown fox jumps over the lazy dog " * 10
    for _ in range(settings.bound.min_observations):
        resp = await client.post("/v1/chat/completions", data=raw(chat(text, max_tokens=1)))
        assert resp.status == 200
        # One at a time, so each log entry pairs with exactly one forward.
        now = datetime.now(UTC).isoformat()
        entry = RequestEntry(ts=now, method="POST", path="/v1/chat/completions", status=200,
                             duration_ms=5.0, ttft_ms=1.0, prompt_tokens=100,
                             completion_tokens=1, stream=False, error=None)
        assert gate.observe_request_log([entry]) == 1
    assert gate.bound.letter_tokens_per_byte < 0.5
    assert gate.stats().letter_tokens_per_byte == gate.bound.letter_tokens_per_byte


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="max_hold_s"):
        GateSettings(max_hold_s=0)
    with pytest.raises(ValueError, match="max_held"):
        GateSettings(max_held=0)


async def test_upstream_failure_mid_stream_breaks_the_client_stream(
        make_gate: MakeGate, upstream: tuple[Upstream, TestServer],
        caplog: pytest.LogCaptureFixture) -> None:
    client, _ = await make_gate()
    doc = chat(stream=True) | {"die": True}
    resp = await client.post("/v1/chat/completions", data=raw(doc))
    assert await resp.content.readuntil(b"\n\n") == b'data: {"n": 1}\n\n'
    upstream[0].release_stream.set()
    # A truncated stream must not look complete: the client sees a broken transfer.
    with pytest.raises(aiohttp.ClientPayloadError):
        await resp.read()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_client_leaving_mid_stream_is_quiet(
        make_gate: MakeGate, upstream: tuple[Upstream, TestServer],
        caplog: pytest.LogCaptureFixture) -> None:
    client, _ = await make_gate()
    resp = await client.post("/v1/chat/completions", data=raw(chat(stream=True)))
    assert await resp.content.readuntil(b"\n\n") == b'data: {"n": 1}\n\n'
    resp.close()
    upstream[0].release_stream.set()
    # The gate hangs up on the upstream too, so ft serve can stop generating.
    await wait_for(lambda: upstream[0].stream_aborted)
    assert not upstream[0].stream_finished
    assert not [r for r in caplog.records
                if r.name.startswith("ladder") and r.levelno >= logging.WARNING]
    assert (await client.get("/v1/models")).status == 200  # the gate still serves


async def test_compressed_bodies_pass_through_undecoded(
        make_gate: MakeGate, upstream: tuple[Upstream, TestServer]) -> None:
    client, _ = await make_gate()
    resp = await client.get("/compressed")
    assert resp.headers["Content-Encoding"] == "gzip"
    assert int(resp.headers["Content-Length"]) == len(gzip.compress(b"squeezed " * 100))
    assert await resp.read() == b"squeezed " * 100  # the test client decodes it


async def test_admin_routes_pass_for_loopback_peers_only(
        make_gate: MakeGate, upstream: tuple[Upstream, TestServer]) -> None:
    client, _ = await make_gate()
    resp = await client.post("/v1/admin/prepare-stop")
    assert resp.status == 200 and (await resp.json())["status"] == "stopping"
    assert _is_loopback("127.0.0.1") and _is_loopback("::1")
    assert not _is_loopback("10.0.0.7") and not _is_loopback(None)
    assert not _is_loopback("not-an-ip")
