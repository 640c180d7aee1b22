"""The gate in front of the real reference engine, over loopback HTTP: what an OpenAI client
sees through it. Streams end as OpenAI's do, a `max_tokens` the context cannot hold is clipped
by the server and said in `finish_reason`/usage (never by the gate, never silently), and
`/v1/models` reports the largest context the gate can get served, not the live rung's."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from engine.reference.runtime import EngineConfig, ReferenceEngine
from engine.reference.server import make_app
from ladder.gate import Gate, GateSettings
from tests.engine.reference.test_server import assert_openai_stream, small_config, sse
from tests.kit.prompts import words
from tests.ladder.test_gate import StepController

GateClient = TestClient[web.Request, web.Application]
Start = Callable[..., Awaitable[tuple[GateClient, GateClient, ReferenceEngine]]]


@pytest.fixture
async def controller() -> AsyncIterator[StepController]:
    # Set by each test to the engine's live context; nothing here asks for a step up.
    ctl = StepController(capacity=0, top=0, auto_step=False)
    yield ctl
    await ctl.close()


@pytest.fixture
def start(aiohttp_server: Any, aiohttp_client: Any, controller: StepController) -> Start:
    """The engine on a loopback server and the gate in front of it; torn down by pytest."""

    async def run(config: EngineConfig) -> tuple[GateClient, GateClient, ReferenceEngine]:
        """(client of the gate, client of the engine itself, the engine)."""
        engine = ReferenceEngine(config)
        server: TestServer = await aiohttp_server(make_app(engine))
        gate = Gate(str(server.make_url("/")), controller,
                    settings=GateSettings(max_hold_s=2.0))
        return await aiohttp_client(gate.make_app()), await aiohttp_client(server), engine

    return run


def body_of(kind: str, prompt: str, **extra: Any) -> tuple[str, dict[str, Any]]:
    if kind == "chat":
        return "/v1/chat/completions", {
            "model": "tiny-moe", "messages": [{"role": "user", "content": prompt}], **extra}
    return "/v1/completions", {"model": "tiny-moe", "prompt": prompt, **extra}


@pytest.mark.parametrize("kind", ["chat", "completion"])
async def test_streams_reach_the_client_with_finish_reason_usage_and_done(
        start: Start, controller: StepController, kind: str) -> None:
    client, _, _ = await start(small_config())
    controller.set(capacity=1024)
    controller.top = 1024
    route, doc = body_of(kind, words(12), max_tokens=5, stream=True,
                         stream_options={"include_usage": True})
    resp = await client.post(route, data=json.dumps(doc).encode())
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    events = sse(await resp.text())
    assert len(assert_openai_stream(events, kind, include_usage=True)) == 5
    assert events[-2]["usage"] == {"prompt_tokens": 12, "completion_tokens": 5,
                                   "total_tokens": 17}


@pytest.mark.parametrize("stream", [False, True])
async def test_max_tokens_beyond_the_top_rung_is_clipped_by_the_server_and_said(
        start: Start, controller: StepController, stream: bool) -> None:
    # The engine holds 128 tokens and so does the top rung: prompt + max_tokens (600) cannot
    # fit anywhere. The gate forwards it unchanged, as ft serve would take it, and the answer
    # says it was cut: finish_reason "length" and 28 tokens in usage, not 500.
    client, _, engine = await start(small_config(num_pages=8))
    controller.set(capacity=128)
    controller.top = 128
    for kind in ("chat", "completion"):
        route, doc = body_of(kind, words(100), max_tokens=500, stream=stream,
                             stream_options={"include_usage": True})
        resp = await client.post(route, data=json.dumps(doc).encode())
        assert resp.status == 200, await resp.text()
        if stream:
            events = sse(await resp.text())
            pieces = assert_openai_stream(events, kind, include_usage=True)
            assert len(pieces) == 28
            usage = events[-2]["usage"]
        else:
            answer = await resp.json()
            assert answer["choices"][0]["finish_reason"] == "length"
            usage = answer["usage"]
        assert usage == {"prompt_tokens": 100, "completion_tokens": 28, "total_tokens": 128}
    assert controller.asked == []  # held for nothing: it was as large as it could get
    assert [e["completion_tokens"] for e in engine.requests_doc(None, 10)["entries"]] == [28, 28]


async def test_a_prompt_beyond_the_top_rung_gets_ft_serves_error_unchanged(
        start: Start, controller: StepController) -> None:
    client, direct_client, _ = await start(small_config(num_pages=8))
    controller.set(capacity=128)
    controller.top = 128
    route, doc = body_of("chat", words(200), max_tokens=4)
    data = json.dumps(doc).encode()
    resp = await client.post(route, data=data)
    assert resp.status == 400
    through_gate = await resp.json()
    direct = await (await direct_client.post(route, data=data)).json()
    assert through_gate == direct == {"error": {
        "message": "prompt is too long: 200 tokens > 128 maximum (prompt + generation); "
                   "shorten the prompt or increase the KV cache budget",
        "type": "invalid_request_error", "param": None, "code": "context_length_exceeded"}}


async def test_models_reports_what_the_gate_can_serve_not_the_live_rung(
        start: Start, controller: StepController) -> None:
    client, direct_client, _ = await start(small_config(max_seq_len=4096))
    direct = await (await direct_client.get("/v1/models")).json()
    for card in direct["data"]:
        card.pop("created")  # a second may pass between two reads
    assert direct["data"][0]["max_model_len"] == 4096  # ft serve's: the model's limit

    # The top rung holds 2048 tokens, the live one 512: a client can be served 2048 through
    # the gate (it holds the request for the step up), never 4096.
    controller.set(capacity=512)
    controller.top = 2048
    resp = await client.get("/v1/models")
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("application/json")
    ours = await resp.json()
    card = ours["data"][0]
    assert card["max_model_len"] == card["context_length"] == 2048
    card.pop("created")
    assert ours == {**direct, "data": [{**direct["data"][0], "max_model_len": 2048,
                                        "context_length": 2048}]}  # nothing else changed

    # Stable across transitions: the live rung moving does not move the answer.
    controller.set(capacity=2048)
    card = (await (await client.get("/v1/models")).json())["data"][0]
    assert card["max_model_len"] == 2048

    # The model's limit below the top rung, or no observation yet (capacity 0): the
    # server's document unchanged.
    for top in (8192, 0):
        controller.top = top
        ours = await (await client.get("/v1/models")).json()
        ours["data"][0].pop("created")
        assert ours == direct
