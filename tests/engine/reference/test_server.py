"""The reference engine over real HTTP on loopback: ft serve's wire shapes and semantics,
content-keeping resizes while decoding, exact accounting, and the report's two transitions."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from engine.reference.decoder import ModelSpec
from engine.reference.runtime import EngineConfig, RebuildMode, ReferenceEngine
from engine.reference.scenarios import report_config
from engine.reference.server import make_app
from tests.conftest import FIXTURES
from tests.kit.prompts import words

Client = TestClient[web.Request, web.Application]
MakeClient = Callable[..., Any]

CAPTURED = FIXTURES / "freetoken-0.1.2"


def small_config(mode: RebuildMode = "incremental", **overrides: Any) -> EngineConfig:
    spec = ModelSpec(num_layers=4, num_experts=16, top_k=2, hidden=32, expert_hidden=64,
                     head_dim=16, state_heads=2, page_size=16)
    values: dict[str, Any] = {
        "model": spec, "cache_budget_bytes": 8 << 20, "device_memory_bytes": 64 << 20,
        "moe_cache_size": 32, "num_pages": 64, "num_mamba_slots": 4,
        "max_running_requests": 4, "rebuild_mode": mode, "chunk_bytes": 64 << 10,
        "max_seq_len": 4096}
    values.update(overrides)
    return EngineConfig(**values)


@pytest.fixture
def serve(aiohttp_client: MakeClient) -> Callable[..., Any]:
    """Start an engine behind a real loopback server; pytest-aiohttp tears both down."""

    async def start(config: EngineConfig, **kwargs: Any) -> tuple[ReferenceEngine, Client]:
        engine = ReferenceEngine(config)
        client = await aiohttp_client(make_app(engine, **kwargs))
        return engine, client

    return start


async def complete(client: Client, prompt: str, max_tokens: int, **extra: Any) -> Any:
    resp = await client.post("/v1/completions",
                             json={"prompt": prompt, "max_tokens": max_tokens, **extra})
    assert resp.status == 200, await resp.text()
    return await resp.json()


def sse(text: str) -> list[Any]:
    """The events of a `text/event-stream` body: parsed JSON, and "[DONE]" as it is."""
    events: list[Any] = []
    for block in text.split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: "), block
        data = block.removeprefix("data: ")
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def assert_openai_stream(events: list[Any], kind: str, *, include_usage: bool) -> list[str]:
    """What OpenAI (and ft serve, openai_api.py `stream_chat_completion_chunks` and
    `stream_completion_chunks`) end a stream with; returns the text pieces."""
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    usage = chunks.pop() if include_usage else None
    last = chunks.pop()
    assert last["choices"][0]["finish_reason"] == "length"
    if kind == "chat":
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        chunks = chunks[1:]
        assert last["choices"][0]["delta"] == {}
        pieces = [c["choices"][0]["delta"]["content"] for c in chunks]
    else:
        assert last["choices"][0]["text"] == "" and last["choices"][0]["logprobs"] is None
        pieces = [c["choices"][0]["text"] for c in chunks]
    want_object = "chat.completion.chunk" if kind == "chat" else "text_completion"
    for chunk in [*chunks, last]:
        assert chunk["object"] == want_object and chunk["id"] == last["id"]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)
    if usage is not None:
        assert usage["choices"] == [] and usage["id"] == last["id"]
        assert usage["usage"]["completion_tokens"] == len(pieces)
        assert usage["usage"]["total_tokens"] == (usage["usage"]["prompt_tokens"]
                                                  + len(pieces))
    assert all("usage" not in c for c in [*chunks, last])
    return pieces


# ---- wire shapes ------------------------------------------------------------------------

def shape(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if value is None:
        return "null"
    return type(value).__name__


# Every deliberate difference from ft serve 0.1.2, and why:
DIFFERENCES = {
    # The reference engine says how it executes a rebuild, so the planner prices it right.
    "cache_status": {"engine"},
    # ft serve fills `reasoning` once its tokenizer is warm; the tiny engine has no gears.
    "cache_status.geometry.reasoning": {"type"},
    # ft serve leaves tokens and ttft null for /v1/completions and /generate; the reference
    # engine always counts them (the gate tightens its size bound from them).
    "requests.entries": {"ttft_ms", "prompt_tokens", "completion_tokens"},
}


def assert_same_shape(ours: Any, theirs: Any, path: str) -> None:
    allowed = DIFFERENCES.get(path, set())
    if isinstance(theirs, dict):
        assert isinstance(ours, dict), path
        missing = set(theirs) - set(ours)
        extra = set(ours) - set(theirs) - allowed
        assert not missing, f"{path}: keys missing {missing}"
        assert not extra, f"{path}: keys ft serve does not have {extra}"
        for key in theirs:
            if key in allowed or "type" in DIFFERENCES.get(f"{path}.{key}", set()):
                continue
            assert_same_shape(ours[key], theirs[key], f"{path}.{key}")
    elif isinstance(theirs, list):
        assert isinstance(ours, list), path
        if theirs and ours:
            assert_same_shape(ours[0], theirs[0], path)
    else:
        assert shape(ours) == shape(theirs) or "null" in (shape(theirs),), (
            f"{path}: {shape(ours)} vs ft serve's {shape(theirs)}")


def captured(name: str) -> Any:
    return json.loads((CAPTURED / name).read_text())


async def test_documents_have_ft_serve_keys_and_types(serve: Any) -> None:
    _, client = await serve(small_config())
    await complete(client, words(20), 4)
    resp = await client.post("/v1/cache/rebuild", json={"num_pages": 60})
    assert resp.status == 200
    assert_same_shape(await resp.json(), captured("rebuild.shrink_kv.json"), "rebuild")
    pairs = [
        ("/health", "health.serving.json", "health"),
        ("/v1/cache/status", "cache_status.after_resizes.json", "cache_status"),
        ("/v1/stats", "stats.after_generation.json", "stats"),
        ("/v1/requests", "requests.after_generation.json", "requests"),
        ("/v1/models", "models.json", "models"),
    ]
    for route, fixture, name in pairs:
        resp = await client.get(route)
        assert resp.status == 200
        assert_same_shape(await resp.json(), captured(fixture), name)
    body = await complete(client, words(5), 3)
    assert_same_shape(body, captured("completions.1.json"), "completions")
    resp = await client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 3})
    assert_same_shape(await resp.json(), captured("chat_completion.1.json"), "chat")


async def test_generate_streams_sse_like_ft_serve(serve: Any) -> None:
    _, client = await serve(small_config())
    resp = await client.post("/generate", json={"prompt": "hello world", "max_tokens": 5})
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    events = [line for line in (await resp.text()).split("\n\n") if line]
    assert events[-1] == "data: [DONE]"
    assert len(events) == 6
    first = json.loads(events[0].removeprefix("data: "))
    assert set(first) == {"text"} and first["text"].startswith("w")
    want = (CAPTURED / "generate.sse.txt").read_text().split("\n\n")[0]
    assert set(json.loads(want.removeprefix("data: "))) == set(first)


@pytest.mark.parametrize(
    ("body", "status", "fixture"),
    [
        ({"moe_cache_size": 1}, 503, "rebuild.invalid_moe_below_floor.json"),
        ({"num_pages": 0}, 503, "rebuild.invalid_num_pages_zero.json"),
        ({"num_pages": 10**9}, 503, "rebuild.invalid_over_budget.json"),
        ({"num_mamba_slots": 1}, 503, "rebuild.invalid_mamba_below_floor.json"),
        ({"num_swa_pages": 16}, 503, "rebuild.invalid_swa_no_window_pool.json"),
        ({"num_pages": 60, "mode": "drain"}, 422, "rebuild.invalid_mode_drain.json"),
        ({"num_swa_pages": 4, "swa_full_tokens_ratio": 0.5}, 422, "rebuild.invalid_swa_both.json"),
        ({"swa_full_tokens_ratio": 1.5}, 422, "rebuild.invalid_swa_ratio_range.json"),
        ({"num_pages": "lots"}, 422, "rebuild.invalid_type.json"),
        ({}, 200, "rebuild.noop_empty_body.json"),
    ],
)
async def test_rebuild_validation_matches_ft_serve(serve: Any, body: dict[str, Any],
                                                   status: int, fixture: str) -> None:
    engine, client = await serve(small_config())
    before = engine.geometry()
    resp = await client.post("/v1/cache/rebuild", json=body)
    assert resp.status == status
    ours, theirs = await resp.json(), captured(fixture)
    assert_same_shape(ours, theirs, "rebuild")
    if "status" in theirs:
        assert ours["status"] == theirs["status"]
    if theirs.get("error") and "> budget" in theirs["error"]:
        assert "old cache kept, still serving" in ours["error"]
    assert engine.geometry() == before


async def test_busy_409_504_and_state_while_rebuilding(serve: Any) -> None:
    engine, client = await serve(small_config("freetoken"))
    # A generation is running: freetoken mode refuses with 503 busy, as ft serve.
    gen = asyncio.create_task(complete(client, words(10), 60))
    while not engine.running:
        await asyncio.sleep(0.001)
    resp = await client.post("/v1/cache/rebuild", json={"num_pages": 50})
    assert resp.status == 503
    assert (await resp.json())["status"] == "busy"
    await gen
    # 504 with the server still rebuilding, then 409 for a second call. One chunk operation
    # a decode round keeps the rebuild in flight for as many rounds as it has operations.
    engine2, client2 = await serve(small_config(rebuild_pause_budget_s=0.0))
    long_gen = asyncio.create_task(complete(client2, words(10), 200))
    while not engine2.running:
        await asyncio.sleep(0.001)
    resp = await client2.post("/v1/cache/rebuild",
                              json={"moe_cache_size": 64, "num_pages": 40, "timeout": 0.0})
    assert resp.status == 504
    timeout_body = await resp.json()
    assert timeout_body["status"] == "timeout"
    status = await (await client2.get("/v1/cache/status")).json()
    assert status["state"] == "rebuilding"
    resp = await client2.post("/v1/cache/rebuild", json={"num_pages": 50})
    assert resp.status == 409
    assert await resp.json() == captured("rebuild.concurrent_busy.json")
    while (await (await client2.get("/v1/cache/status")).json())["state"] == "rebuilding":
        await asyncio.sleep(0.005)
    status = await (await client2.get("/v1/cache/status")).json()
    assert status["last_rebuild"]["request_id"] == timeout_body["request_id"]
    assert status["geometry"]["num_pages"] == 40
    await long_gen


async def test_freetoken_mode_refuses_generation_while_rebuilding(serve: Any) -> None:
    engine, client = await serve(small_config("freetoken"))
    engine.state = "rebuilding"  # the instant between the flip and the reply
    resp = await client.post("/generate", json={"prompt": "hi", "max_tokens": 2})
    assert resp.status == 503
    assert await resp.json() == captured("generate.during_rebuild.json")
    engine.state = "serving"


async def test_api_key_like_021(serve: Any) -> None:
    _, client = await serve(small_config(), api_key="sekret")
    assert (await client.get("/health")).status == 200
    resp = await client.get("/v1/cache/status")
    assert resp.status == 401
    assert await resp.json() == {"error": "Unauthorized"}
    ok = await client.get("/v1/cache/status", headers={"Authorization": "Bearer sekret"})
    assert ok.status == 200
    assert (await client.get("/v1/stats", headers={"x-api-key": "sekret"})).status == 200


async def test_context_limit_follows_kv_and_max_tokens_is_clipped(serve: Any) -> None:
    _, client = await serve(small_config(num_pages=8))  # 128 tokens
    resp = await client.post("/v1/completions", json={"prompt": words(200), "max_tokens": 4})
    assert resp.status == 400
    # ft serve's shape and phrase (openai_api.py create_error_response, scheduler.py
    # Scheduler._process_one_msg): agents match on "prompt is too long: N tokens > M".
    assert await resp.json() == {"error": {
        "message": "prompt is too long: 200 tokens > 128 maximum (prompt + generation); "
                   "shorten the prompt or increase the KV cache budget",
        "type": "invalid_request_error", "param": None, "code": "context_length_exceeded"}}
    # Prompt + max_tokens above the context is not refused (ft serve clips it), and the clip
    # is said: finish_reason "length", and usage counts the tokens really generated.
    body = await complete(client, words(100), 500)
    assert body["usage"]["completion_tokens"] == 128 - 100
    assert body["choices"][0]["finish_reason"] == "length"
    for route, doc in (("/v1/completions", {"prompt": words(100)}),
                       ("/v1/chat/completions",
                        {"messages": [{"role": "user", "content": words(100)}]})):
        resp = await client.post(route, json={**doc, "max_tokens": 500, "stream": True,
                                              "stream_options": {"include_usage": True}})
        assert resp.status == 200
        events = sse(await resp.text())
        kind = "chat" if "chat" in route else "completion"
        pieces = assert_openai_stream(events, kind, include_usage=True)
        assert len(pieces) == 128 - 100
        assert events[-2]["usage"] == {"prompt_tokens": 100, "completion_tokens": 28,
                                       "total_tokens": 128}


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("include_usage", [False, True])
async def test_openai_streams_end_with_finish_reason_usage_and_done(
        serve: Any, kind: str, include_usage: bool) -> None:
    _, client = await serve(small_config())
    route, doc = ("/v1/chat/completions",
                  {"messages": [{"role": "user", "content": words(12)}]}) if kind == "chat" else (
        "/v1/completions", {"prompt": words(12)})
    resp = await client.post(route, json={
        **doc, "max_tokens": 6, "seed": 5, "stream": True,
        "stream_options": {"include_usage": include_usage}})
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    events = sse(await resp.text())
    pieces = assert_openai_stream(events, kind, include_usage=include_usage)
    assert len(pieces) == 6
    if include_usage:
        assert events[-2]["usage"] == {"prompt_tokens": 12, "completion_tokens": 6,
                                       "total_tokens": 18}
    # The stream says what the non-streamed answer says.
    resp = await client.post(route, json={**doc, "max_tokens": 6, "seed": 5})
    whole = await resp.json()
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "length"
    assert "".join(pieces) == (choice["message"]["content"] if kind == "chat"
                               else choice["text"])


async def test_max_completion_tokens_overrides_max_tokens_as_in_ft_serve(serve: Any) -> None:
    _, client = await serve(small_config())
    body = await complete(client, words(5), 9, max_completion_tokens=3)
    assert body["usage"]["completion_tokens"] == 3
    body = await complete(client, words(5), 4, max_completion_tokens=None)
    assert body["usage"]["completion_tokens"] == 4


async def test_models_reports_the_model_limit_that_admission_applies(serve: Any) -> None:
    # KV holds 1024 tokens, the model 256: the model's limit is the one in force.
    _, client = await serve(small_config(max_seq_len=256))
    card = (await (await client.get("/v1/models")).json())["data"][0]
    assert card["max_model_len"] == card["context_length"] == 256
    stats = await (await client.get("/v1/stats")).json()
    assert stats["model"]["ctx"] == 256  # ft serve reports one number in both
    assert (await complete(client, words(250), 50))["usage"]["completion_tokens"] == 6
    resp = await client.post("/v1/completions", json={"prompt": words(256), "max_tokens": 1})
    assert resp.status == 400 and "> 256 maximum" in (await resp.json())["error"]["message"]
    # A KV shrink moves what one sequence may hold, not the model's limit: ft serve's
    # /v1/models reports the ceiling (openai_api.py `_model_context_length`), which agents
    # read once; the live limit is what admission says.
    resp = await client.post("/v1/cache/rebuild", json={"num_pages": 8})
    assert resp.status == 200, await resp.text()
    card = (await (await client.get("/v1/models")).json())["data"][0]
    assert card["max_model_len"] == card["context_length"] == 256
    resp = await client.post("/v1/completions", json={"prompt": words(128), "max_tokens": 1})
    assert resp.status == 400 and "> 128 maximum" in (await resp.json())["error"]["message"]


async def test_a_shrink_readmits_the_waiting_requests_against_the_new_context(
        serve: Any) -> None:
    # One request runs at a time, so the others wait in the FIFO while the KV pool shrinks
    # from 1024 tokens to 512 under them (the running one keeps its 26 pages).
    engine, client = await serve(small_config(max_running_requests=1))
    running = asyncio.create_task(complete(client, words(10), 400))
    while not engine.running:
        await asyncio.sleep(0.001)
    too_long = asyncio.create_task(client.post("/v1/completions", json={
        "prompt": words(600), "max_tokens": 4}))
    clipped = asyncio.create_task(complete(client, words(450), 100))
    fits = asyncio.create_task(complete(client, words(20), 8))
    while len(engine.waiting) < 3:
        await asyncio.sleep(0.001)
    assert running.done() is False  # the shrink happens while all three wait
    resp = await client.post("/v1/cache/rebuild",
                             json={"moe_cache_size": 32, "num_pages": 32, "num_mamba_slots": 4})
    assert resp.status == 200, await resp.text()
    refused = await too_long
    assert refused.status == 400  # what it would have got had it arrived now
    assert (await refused.json())["error"]["code"] == "context_length_exceeded"
    assert (await clipped)["usage"]["completion_tokens"] == 512 - 450
    assert (await fits)["usage"]["completion_tokens"] == 8  # not stuck behind the others
    assert (await running)["usage"]["completion_tokens"] == 400  # its pages were kept


async def test_long_prompt_bodies_are_read_not_refused_413(serve: Any) -> None:
    _, client = await serve(small_config())
    prompt = words(300_000)  # ~2 MB: a 200k-token agentic context is about 1.2 MB
    assert len(prompt) > 1 << 20
    body = io.BytesIO(json.dumps({"prompt": prompt, "max_tokens": 4}).encode())
    resp = await client.post("/v1/completions", data=body,
                             headers={"Content-Type": "application/json"})
    assert resp.status == 400  # read and tokenized: too long for this context, not too big
    assert (await resp.json())["error"]["code"] == "context_length_exceeded"


# ---- content-keeping resizes ------------------------------------------------------------

async def solo_tokens(prompt: str, max_tokens: int, seed: int) -> list[int]:
    engine = ReferenceEngine(small_config())
    await engine.start()
    try:
        ids = engine.tokenizer.encode(prompt)
        return [t async for t in engine.generate(ids, max_tokens, seed=seed)]
    finally:
        await engine.close()


async def test_resize_while_decoding_keeps_the_output(serve: Any) -> None:
    prompt_a, prompt_b = words(50, 1), words(150, 2)
    expected = await solo_tokens(prompt_a, 150, seed=7)
    engine, client = await serve(small_config())
    # B takes the low pages and ends soon, so A's pages sit above the shrink target.
    task_b = asyncio.create_task(complete(client, prompt_b, 30, seed=3))
    while not engine.running:
        await asyncio.sleep(0.001)
    task_a = asyncio.create_task(complete(client, prompt_a, 150, seed=7))
    while len(engine.running) < 2:
        await asyncio.sleep(0.001)
    await task_b
    while not engine.running:
        await asyncio.sleep(0.001)
    (rid,) = engine.running
    pages_before = list(engine.kv.page_table(rid))
    assert max(pages_before) >= 20
    resp = await client.post("/v1/cache/rebuild",
                             json={"moe_cache_size": 40, "num_pages": 20, "num_mamba_slots": 4})
    assert resp.status == 200, await resp.text()
    assert engine.kv.page_table(rid) != pages_before  # live pages really moved
    assert max(engine.kv.page_table(rid)) <= 20  # page 0 is the dummy page
    body = await task_a
    ours = engine.tokenizer.encode(body["choices"][0]["text"])
    assert ours == expected
    assert engine.rebuilds.chunk_pauses  # decode ran between chunk operations




async def test_accounting_matches_torch(serve: Any) -> None:
    engine, client = await serve(small_config())
    model = engine.memory_model
    for body in ({"num_pages": 40}, {"moe_cache_size": 64}, {"num_mamba_slots": 8},
                 {"moe_cache_size": 20, "num_pages": 100}, {"num_mamba_slots": 4}):
        resp = await client.post("/v1/cache/rebuild", json=body)
        assert resp.status == 200, await resp.text()
        assert engine.memory.allocated_bytes == engine.storage_bytes()
        # What the planner prices is what the pools hold, to the byte.
        assert engine.memory.allocated_bytes == model.total_bytes(engine.geometry())
    status = await (await client.get("/v1/cache/status")).json()
    assert status["engine"]["allocated_bytes"] == engine.storage_bytes()


async def test_close_mid_rebuild_frees_every_pool_byte(serve: Any) -> None:
    # One operation a round: the rebuild is surely still in flight when the test closes.
    engine, client = await serve(small_config(chunk_bytes=16 << 10, rebuild_pause_budget_s=0.0))
    gen = asyncio.create_task(complete(client, words(10), 400))
    while not engine.running:
        await asyncio.sleep(0.001)
    rebuild = asyncio.create_task(client.post("/v1/cache/rebuild",
                                              json={"moe_cache_size": 64, "num_pages": 40}))
    while not engine.rebuilds.chunk_pauses:
        await asyncio.sleep(0.001)
    await engine.close()
    # A traceback or a client task may outlive the engine; its device memory must not.
    assert engine.memory.allocated_bytes == 0
    assert engine.storage_bytes() == 0
    resp = await rebuild
    assert resp.status == 503
    assert "closed during the rebuild" in (await resp.json())["error"]
    gen.cancel()


async def test_a_prebuilt_model_is_reused_and_must_match() -> None:
    config = small_config()
    first = ReferenceEngine(config)
    second = ReferenceEngine(config, model=first.model)
    assert second.model is first.model
    prompt = list(range(5, 40))
    outputs = []
    for engine in (first, second):
        await engine.start()
        outputs.append([t async for t in engine.generate(prompt, 12, seed=3)])
        await engine.close()
    assert outputs[0] == outputs[1]
    other = replace(config, model=replace(config.model, num_layers=2))
    with pytest.raises(ValueError, match=r"must match config\.model"):
        ReferenceEngine(other, model=first.model)


async def test_metrics_endpoint(serve: Any) -> None:
    _, client = await serve(small_config())
    await complete(client, words(10), 5)
    await client.post("/v1/cache/rebuild", json={"num_pages": 40, "moe_cache_size": 40})
    text = await (await client.get("/metrics")).text()
    for name in ("reference_engine_pool_bytes{pool=\"kv\"}", "reference_engine_expert_lookups",
                 "reference_engine_decode_tokens_total", "reference_engine_rebuilds_total",
                 "reference_engine_chunk_pause_seconds_bucket",
                 "reference_engine_rebuild_pause_seconds_bucket",
                 "reference_engine_decode_tokens_per_second"):
        assert name in text


# ---- the report's transitions ---------------------------------------------------------

REPORT_TARGETS = [
    # --moe 1024 --kv 65536 on the report = 2x the expert floor, a quarter of the KV
    (lambda g: {"moe_cache_size": 2 * g["moe_cache_size"], "num_pages": g["num_pages"] // 4}),
    # --moe 1400 --kv 8192 --mamba 4 = 2.73x the floor, 1/32 of the KV, half the mamba slots
    (lambda g: {"moe_cache_size": round(g["moe_cache_size"] * 1400 / 512),
                "num_pages": max(1, g["num_pages"] // 32), "num_mamba_slots": 4}),
]


@pytest.mark.parametrize("target", REPORT_TARGETS)
async def test_report_transitions_oom_in_freetoken_mode_and_succeed_incrementally(
    serve: Any, target: Callable[[dict[str, int]], dict[str, int]],
) -> None:
    engine, client = await serve(report_config("freetoken", max_running_requests=4))
    before = (await (await client.get("/v1/cache/status")).json())["geometry"]
    body = target(before)
    resp = await client.post("/v1/cache/rebuild", json=body)
    assert resp.status == 503
    reply = await resp.json()
    assert reply["status"] == "rejected"
    assert reply["error"].startswith("rebuild failed and was rolled back: OutOfMemoryError")
    assert reply["moe_cache_size"] == before["moe_cache_size"]
    assert (await (await client.get("/health")).json())["maintenance"] == "serving"
    assert engine.memory.allocated_bytes == engine.storage_bytes()
    await complete(client, words(10), 4)  # still serving at the old sizes

    engine2, client2 = await serve(report_config("incremental", max_running_requests=4))
    resp = await client2.post("/v1/cache/rebuild", json=body)
    assert resp.status == 200, await resp.text()
    after = (await (await client2.get("/v1/cache/status")).json())["geometry"]
    assert after["moe_cache_size"] == body["moe_cache_size"]
    assert after["num_pages"] == body["num_pages"]
    assert engine2.memory.peak_bytes <= engine2.memory.capacity_bytes
