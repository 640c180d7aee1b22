"""The reference engine's HTTP server: ft serve's control API plus completions and /metrics.

A thin aiohttp adapter over `ReferenceEngine`; every rule lives in the engine or in
`engine.ftserve.control`. Bound to 127.0.0.1 unless told otherwise.

The OpenAI routes follow ft serve 0.1.2 (server/openai_api.py), which follows OpenAI: a chat
stream opens with a `{"role": "assistant", "content": ""}` delta and every stream ends with a
chunk that carries `finish_reason` (an empty delta, or empty text), then a usage chunk with
`"choices": []` when `stream_options.include_usage` is set, then `data: [DONE]`
(`stream_chat_completion_chunks`, `stream_completion_chunks`). Without that last chunk a client
cannot tell a generation cut at the context (`finish_reason: "length"`) from one that ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from engine.reference.metrics import EngineMetrics
from engine.reference.runtime import AdmissionError, ReferenceEngine

__all__ = ["ENGINE_KEY", "MAX_BODY_BYTES", "make_app", "serve", "serving"]

ENGINE_KEY = web.AppKey("engine", ReferenceEngine)
METRICS_KEY = web.AppKey("metrics", EngineMetrics)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(body: Any, status: int = 200) -> web.Response:
    return web.json_response(body, status=status)


async def _body(request: web.Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def _auth_middleware(api_key: str) -> Any:
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        # As ft serve 0.2.1: every route but /health needs the key.
        if request.path != "/health":
            bearer = request.headers.get("Authorization", "")
            given = bearer[7:] if bearer.startswith("Bearer ") else request.headers.get(
                "x-api-key")
            if given != api_key:
                return _json({"error": "Unauthorized"}, 401)
        return await handler(request)

    return check


async def health(request: web.Request) -> web.Response:
    return _json(request.app[ENGINE_KEY].health_doc())


async def stats(request: web.Request) -> web.Response:
    return _json(request.app[ENGINE_KEY].stats_doc())


async def cache_status(request: web.Request) -> web.Response:
    return _json(request.app[ENGINE_KEY].status_doc())


async def requests_log(request: web.Request) -> web.Response:
    try:
        since = int(request.query["since"]) if "since" in request.query else None
        limit = int(request.query.get("limit", "100"))
    except ValueError:
        return _json({"detail": "since and limit must be integers"}, 422)
    if not 1 <= limit <= 512:
        return _json({"detail": "limit must be in 1..512"}, 422)
    return _json(request.app[ENGINE_KEY].requests_doc(since, limit))


async def rebuild(request: web.Request) -> web.Response:
    status, body = await request.app[ENGINE_KEY].rebuild(await _body(request))
    return _json(body, status)


async def models(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    name = engine.config.served_model_name
    # The model's own limit, as ft serve reports it (openai_api.py `_model_context_length`:
    # "the model ceiling, not min(ceiling, KV budget): a rebuild moves the latter, and agents
    # read this once at startup"); the same number as /v1/stats `model.ctx`. What one sequence
    # may hold now is `engine.max_seq_len()`, min(this, KV tokens), and moves with every rebuild.
    ctx = engine.config.max_seq_len
    return _json({"object": "list", "data": [{
        "id": name, "object": "model", "created": int(time.time()), "owned_by": "moe-ladder",
        "root": name, "max_model_len": ctx, "context_length": ctx,
        "supported_reasoning_efforts": None, "default_reasoning_effort": None}]})


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS_KEY].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def _error(exc: AdmissionError) -> web.Response:
    # ft serve's 400 shape (openai_api.py `create_error_response`); its 503s are a bare string.
    if exc.code is not None:
        return _json({"error": {"message": exc.message, "type": "invalid_request_error",
                                "param": None, "code": exc.code}}, exc.http_status)
    return _json({"error": exc.message}, exc.http_status)


def _bad_request(message: str) -> web.Response:
    return _json({"error": {"message": message, "type": "invalid_request_error",
                            "param": None, "code": None}}, 400)


def _prompt_of(body: dict[str, Any]) -> str | None:
    if "messages" in body:
        messages = body["messages"]
        if not isinstance(messages, list):
            return None
        parts = []
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):  # OpenAI content parts
                content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            if not isinstance(content, str):
                return None
            parts.append(content)
        return "\n".join(parts)
    prompt = body.get("prompt", "")
    return prompt if isinstance(prompt, str) else None


# The tiny decoder has no EOS token and no stop strings: every generation ends on its token
# budget, `max_tokens` or what the context left of it, which ft serve reports as "length"
# (scheduler.py `_process_last_data`: `hit_length = not req.can_decode`).
FINISH_REASON = "length"
# When the body names neither max_completion_tokens nor max_tokens. ft serve takes 32768 and
# clips it to the context (generation.py DEFAULT_MAX_OUTPUT_TOKENS); on a CPU engine that is
# minutes of decode, so the reference engine keeps a short default.
DEFAULT_MAX_TOKENS = 16


def _max_tokens_of(body: dict[str, Any]) -> Any:
    # ft serve: max_completion_tokens, when given, overrides max_tokens; null is "not given"
    # (api_models.py `_sync_max_completion_tokens`). The gate sizes in the same order.
    for key in ("max_completion_tokens", "max_tokens"):
        if body.get(key) is not None:
            return body[key]
    return DEFAULT_MAX_TOKENS


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


async def _generation(request: web.Request, kind: str) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    body = await _body(request)
    if not isinstance(body, dict):
        return _bad_request("the body must be a JSON object")
    text = _prompt_of(body)
    max_tokens = _max_tokens_of(body)
    seed = body.get("seed", 0)
    if text is None or isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or (
            max_tokens < 1) or isinstance(seed, bool) or not isinstance(seed, int):
        return _bad_request("prompt (or messages) must be text, max_tokens a positive integer")
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    prompt_ids = engine.tokenizer.encode(text)
    stream = kind == "generate" or bool(body.get("stream", False))
    tokens = engine.generate(prompt_ids, max_tokens, seed=seed, path=request.path,
                             stream=stream)
    try:
        first = await anext(tokens)
    except AdmissionError as exc:
        return _error(exc)
    except StopAsyncIteration:
        first = None
    completion_id = f"chatcmpl-{uuid.uuid4().hex}" if kind == "chat" else (
        f"cmpl-{uuid.uuid4().hex}")
    created = int(time.time())
    name = engine.config.served_model_name
    if not stream:
        ids = [] if first is None else [first] + [t async for t in tokens]
        text_out = engine.tokenizer.decode(ids)
        usage = _usage(len(prompt_ids), len(ids))
        if kind == "chat":
            return _json({"id": completion_id, "object": "chat.completion", "created": created,
                          "model": name, "choices": [{
                              "index": 0, "message": {"role": "assistant", "content": text_out},
                              "finish_reason": FINISH_REASON}], "usage": usage})
        return _json({"id": completion_id, "object": "text_completion", "created": created,
                      "model": name, "choices": [{"index": 0, "text": text_out,
                                                  "finish_reason": FINISH_REASON,
                                                  "logprobs": None}], "usage": usage})
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
    await response.prepare(request)
    # OpenAI's chunk objects; ft serve names completion chunks "text_completion.chunk", which
    # OpenAI does not, and no client reads it.
    chunk_object = "chat.completion.chunk" if kind == "chat" else "text_completion"

    async def event(payload: dict[str, Any]) -> None:
        await response.write(f"data: {json.dumps(payload)}\n\n".encode())

    async def chunk(choices: list[dict[str, Any]], **extra: Any) -> None:
        await event({"id": completion_id, "object": chunk_object, "created": created,
                     "model": name, "choices": choices, **extra})

    async def choice(piece: str | None, finish_reason: str | None) -> None:
        if kind == "chat":
            delta = {} if piece is None else {"content": piece}
            await chunk([{"index": 0, "delta": delta, "finish_reason": finish_reason}])
        else:
            await chunk([{"index": 0, "text": piece or "", "finish_reason": finish_reason,
                          "logprobs": None}])

    count = 0

    async def send(token: int) -> None:
        nonlocal count
        piece = engine.tokenizer.decode([token])
        piece = piece if count == 0 else " " + piece
        count += 1
        if kind == "generate":
            await event({"text": piece})  # ft serve's /generate: text events, then [DONE]
        else:
            await choice(piece, None)

    if kind == "chat":
        await chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                      "finish_reason": None}])
    if first is not None:
        await send(first)
        async for token in tokens:
            await send(token)
    if kind != "generate":
        await choice(None, FINISH_REASON)
        if include_usage:
            await chunk([], usage=_usage(len(prompt_ids), count))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generation(request, "completion")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generation(request, "chat")


async def generate(request: web.Request) -> web.StreamResponse:
    return await _generation(request, "generate")


# A 262k-token context at up to 64 bytes of JSON per token, with room to spare.
MAX_BODY_BYTES = 32 << 20


def make_app(engine: ReferenceEngine, *, api_key: str | None = None) -> web.Application:
    """The aiohttp application; the engine's scheduler starts and stops with it."""
    # aiohttp's 1 MiB default refuses a 200k-token prompt (~1.2 MB of text) with 413.
    app = web.Application(middlewares=[_auth_middleware(api_key)] if api_key else [],
                          client_max_size=MAX_BODY_BYTES)
    app[ENGINE_KEY] = engine
    app[METRICS_KEY] = EngineMetrics(engine)

    async def lifecycle(app: web.Application) -> Any:
        await engine.start()
        yield
        await engine.close()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/stats", stats)
    app.router.add_get("/v1/cache/status", cache_status)
    app.router.add_post("/v1/cache/rebuild", rebuild)
    app.router.add_get("/v1/requests", requests_log)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/generate", generate)
    return app


@contextlib.asynccontextmanager
async def serving(engine: ReferenceEngine, *, host: str = "127.0.0.1", port: int = 0,
                  api_key: str | None = None,
                  shutdown_timeout_s: float = 1.0) -> AsyncIterator[str]:
    """The engine served on `host:port` (0: a free port) for the block; yields its base URL.

    No signal handlers: the caller (a demo, a test, a bench) decides what stops it.
    """
    runner = web.AppRunner(make_app(engine, api_key=api_key), handle_signals=False,
                           shutdown_timeout=shutdown_timeout_s)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        shown = f"[{host}]" if ":" in host else host  # an IPv6 literal needs brackets
        yield f"http://{shown}:{runner.addresses[0][1]}"
    finally:
        await asyncio.shield(runner.cleanup())


async def serve(engine: ReferenceEngine, *, host: str = "127.0.0.1", port: int = 1919,
                api_key: str | None = None, stop: asyncio.Event | None = None,
                on_ready: Callable[[int], None] | None = None) -> None:
    """Serve until `stop` is set or SIGINT/SIGTERM arrives; `on_ready` gets the bound port."""
    async with serving(engine, host=host, port=port, api_key=api_key) as url:
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        if on_ready is not None:
            on_ready(int(url.rsplit(":", 1)[1]))
        await stop.wait()
