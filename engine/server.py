"""The reference engine's HTTP server: ft serve's control API plus completions and /metrics.

A thin aiohttp adapter over `ReferenceEngine`; every rule lives in the engine or in
`engine.control`. Bound to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from engine.metrics import EngineMetrics
from engine.runtime import AdmissionError, ReferenceEngine

__all__ = ["ENGINE_KEY", "MAX_BODY_BYTES", "make_app", "serve"]

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
    ctx = engine.config.max_seq_len
    return _json({"object": "list", "data": [{
        "id": name, "object": "model", "created": int(time.time()), "owned_by": "moe-ladder",
        "root": name, "max_model_len": ctx, "context_length": ctx,
        "supported_reasoning_efforts": None, "default_reasoning_effort": None}]})


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS_KEY].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def _error(exc: AdmissionError) -> web.Response:
    if exc.code is not None:
        return _json({"error": {"message": exc.message, "type": "invalid_request_error",
                                "code": exc.code}}, exc.http_status)
    return _json({"error": exc.message}, exc.http_status)


def _bad_request(message: str) -> web.Response:
    return _json({"error": {"message": message, "type": "invalid_request_error",
                            "code": None}}, 400)


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


async def _generation(request: web.Request, kind: str) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    body = await _body(request)
    if not isinstance(body, dict):
        return _bad_request("the body must be a JSON object")
    text = _prompt_of(body)
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens", 16))
    seed = body.get("seed", 0)
    if text is None or isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or (
            max_tokens < 1) or isinstance(seed, bool) or not isinstance(seed, int):
        return _bad_request("prompt (or messages) must be text, max_tokens a positive integer")
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
    completion_id = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    name = engine.config.served_model_name
    if not stream:
        ids = [] if first is None else [first] + [t async for t in tokens]
        text_out = engine.tokenizer.decode(ids)
        usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                 "total_tokens": len(prompt_ids) + len(ids)}
        if kind == "chat":
            return _json({"id": completion_id, "object": "chat.completion", "created": created,
                          "model": name, "choices": [{
                              "index": 0, "message": {"role": "assistant", "content": text_out},
                              "finish_reason": "length"}], "usage": usage})
        return _json({"id": completion_id, "object": "text_completion", "created": created,
                      "model": name, "choices": [{"index": 0, "text": text_out,
                                                  "finish_reason": "length",
                                                  "logprobs": None}], "usage": usage})
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
    await response.prepare(request)
    count = 0

    async def send(token: int) -> None:
        nonlocal count
        piece = engine.tokenizer.decode([token])
        piece = piece if count == 0 else " " + piece
        count += 1
        if kind == "generate":
            event: dict[str, Any] = {"text": piece}
        elif kind == "chat":
            event = {"id": completion_id, "object": "chat.completion.chunk", "created": created,
                     "model": name, "choices": [{"index": 0, "delta": {"content": piece},
                                                 "finish_reason": None}]}
        else:
            event = {"id": completion_id, "object": "text_completion", "created": created,
                     "model": name, "choices": [{"index": 0, "text": piece,
                                                 "finish_reason": None}]}
        await response.write(f"data: {json.dumps(event)}\n\n".encode())

    if first is not None:
        await send(first)
        async for token in tokens:
            await send(token)
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


async def serve(engine: ReferenceEngine, *, host: str = "127.0.0.1", port: int = 1919,
                api_key: str | None = None, stop: asyncio.Event | None = None,
                on_ready: Callable[[int], None] | None = None) -> None:
    """Serve until `stop` is set or SIGINT/SIGTERM arrives; `on_ready` gets the bound port."""
    runner = web.AppRunner(make_app(engine, api_key=api_key), handle_signals=False,
                           shutdown_timeout=1.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        bound = sockets[0].getsockname()[1] if sockets else port
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        if on_ready is not None:
            on_ready(bound)
        await stop.wait()
    finally:
        await asyncio.shield(runner.cleanup())
