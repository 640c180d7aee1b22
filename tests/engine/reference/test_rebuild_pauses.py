"""The rebuild's pause budget: how many chunk operations share a decode round.

Why: one operation a round stretched an N-chunk rebuild over N decode rounds and queued
requests behind it; the budget packs operations into a round up to a few ms. These tests hold
the structure (rounds, operations, what is recorded) and the outputs, never wall times, which
a loaded 2-core box cannot promise.
"""

from __future__ import annotations

import asyncio
import math

import pytest

from engine.reference import rebuild
from engine.reference.runtime import EngineConfig, ReferenceEngine
from engine.reference.server import make_app
from tests.engine.reference.test_server import MakeClient, small_config

PROMPT = list(range(5, 40))
# 16 KiB chunks: growing 32 -> 64 expert slots and shrinking 64 -> 40 KV pages of the small
# model takes tens of chunk operations.
SMALL_CHUNK_BYTES = 16 << 10
TARGET = {"moe_cache_size": 64, "num_pages": 40}


def config(budget_s: float) -> EngineConfig:
    return small_config(chunk_bytes=SMALL_CHUNK_BYTES, rebuild_pause_budget_s=budget_s)


async def alone(prompt: list[int], max_tokens: int, seed: int) -> list[int]:
    engine = ReferenceEngine(config(0.0))
    await engine.start()
    try:
        return [t async for t in engine.generate(prompt, max_tokens, seed=seed)]
    finally:
        await engine.close()


async def decoding(engine: ReferenceEngine, max_tokens: int,
                   seed: int) -> tuple[asyncio.Task[None], list[int]]:
    """One request decoding in the background, once it has made a few tokens: its task and
    its tokens so far."""
    tokens: list[int] = []

    async def consume() -> None:
        async for token in engine.generate(PROMPT, max_tokens, seed=seed):
            tokens.append(token)  # noqa: PERF401 - read while they stream

    task = asyncio.create_task(consume())
    while len(tokens) < 3:
        await asyncio.sleep(0.001)
    return task, tokens


async def rebuild_under_decode(budget_s: float) -> ReferenceEngine:
    """A fresh engine at `budget_s`, rebuilt to TARGET while one request decodes; the rebuild
    must succeed with the request still running when it returns. The engine, closed."""
    engine = ReferenceEngine(config(budget_s))
    await engine.start()
    try:
        task, _ = await decoding(engine, max_tokens=400, seed=1)
        status, _ = await engine.rebuild({**TARGET, "timeout": 60})
        still_running = bool(engine.running)
        await task
    finally:
        await engine.close()
    assert status == 200 and still_running
    return engine


async def test_budget_zero_runs_one_chunk_operation_a_round() -> None:
    engine = await rebuild_under_decode(0.0)
    ops = len(engine.rebuilds.chunk_pauses)
    assert ops >= 20
    assert [p.ops for p in engine.rebuilds.rebuild_pauses if p.ops] == [1] * ops
    # The round that finds the operations exhausted completes the rebuild; decode waits for
    # that too (the pools return freed chunks to the driver), so it is recorded.
    assert [p.ops for p in engine.rebuilds.rebuild_pauses if not p.ops] == [0]
    assert sum(p.nbytes for p in engine.rebuilds.rebuild_pauses) > 0


async def test_a_large_budget_finishes_a_rebuild_in_one_or_two_decode_rounds() -> None:
    engine = await rebuild_under_decode(10.0)
    assert len(engine.rebuilds.chunk_pauses) >= 20
    assert 1 <= len(engine.rebuilds.rebuild_pauses) <= 2
    assert sum(p.ops for p in engine.rebuilds.rebuild_pauses) == len(engine.rebuilds.chunk_pauses)


@pytest.mark.parametrize("budget_s", [0.0, 0.002, 10.0])
async def test_a_running_request_decodes_the_same_tokens_at_any_budget(
        budget_s: float) -> None:
    max_tokens, seed = 200, 5
    expected = await alone(PROMPT, max_tokens, seed)
    engine = ReferenceEngine(config(budget_s))
    await engine.start()
    try:
        # Park the request's pages above the KV target, so the shrink moves them.
        engine.kv.allocate_pages("ballast", 45)
        task, tokens = await decoding(engine, max_tokens, seed)
        (rid,) = engine.running
        pages_before = list(engine.kv.page_table(rid))
        assert min(pages_before) > TARGET["num_pages"]
        engine.kv.free_request("ballast")
        status, _ = await engine.rebuild({**TARGET, "timeout": 60})
        assert status == 200
        assert engine.kv.page_table(rid) != pages_before  # live pages really moved
        await task
    finally:
        await engine.close()
    assert tokens == expected


async def test_an_idle_rebuild_runs_through_many_chunks_and_records_no_round() -> None:
    engine = ReferenceEngine(config(0.0))
    await engine.start()
    try:
        status, body = await engine.rebuild({**TARGET, "timeout": 60})
        geometry = engine.geometry()
        served = [t async for t in engine.generate(PROMPT, 4)]
    finally:
        await engine.close()
    assert status == 200 and body["status"] == "ok"
    assert (geometry.moe_cache_size, geometry.num_pages) == (TARGET["moe_cache_size"],
                                                            TARGET["num_pages"])
    assert len(engine.rebuilds.chunk_pauses) >= 20
    assert not engine.rebuilds.rebuild_pauses  # no request was running: no one waited
    assert len(served) == 4


async def test_an_idle_rebuild_yields_to_the_event_loop_between_slices(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A zero slice makes each operation its own slice, so the yields are countable.
    monkeypatch.setattr(rebuild, "_IDLE_SLICE_S", 0.0)
    engine = ReferenceEngine(config(0.0))
    await engine.start()
    seen_ops: set[int] = set()
    try:
        task = asyncio.create_task(engine.rebuild({**TARGET, "timeout": 60}))
        while not task.done():
            seen_ops.add(len(engine.rebuilds.chunk_pauses))
            await asyncio.sleep(0)
        status, _ = await task
    finally:
        await engine.close()
    assert status == 200
    assert len(engine.rebuilds.chunk_pauses) >= 20
    # Another task ran between the operations, not only before and after the rebuild.
    assert len(seen_ops) > len(engine.rebuilds.chunk_pauses) // 2


async def test_pauses_are_on_metrics_and_the_budget_on_status(
        aiohttp_client: MakeClient) -> None:
    engine = ReferenceEngine(config(0.0005))
    client = await aiohttp_client(make_app(engine))
    task = asyncio.create_task(client.post("/v1/completions",
                                           json={"prompt": "w1 w2 w3", "max_tokens": 400}))
    while not engine.running:
        await asyncio.sleep(0.001)
    resp = await client.post("/v1/cache/rebuild", json=TARGET)
    assert resp.status == 200, await resp.text()
    status = await (await client.get("/v1/cache/status")).json()
    assert status["engine"]["pause_budget_s"] == 0.0005
    text = await (await client.get("/metrics")).text()
    count = next(line for line in text.splitlines()
                 if line.startswith("reference_engine_rebuild_pause_seconds_count"))
    assert float(count.split()[-1]) == len(engine.rebuilds.rebuild_pauses) >= 1
    assert (await task).status == 200


@pytest.mark.parametrize("budget_s", [-0.001, -math.inf, math.nan])
def test_a_negative_budget_is_rejected(budget_s: float) -> None:
    with pytest.raises(ValueError, match="rebuild_pause_budget_s"):
        config(budget_s)
