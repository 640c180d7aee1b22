"""The engine's report of each decoding round (`scheduler_round` events).

Why: the bench's profile of where decode time went (bench/round_profile.py) is only as good as
these reports: every token in exactly one round, the positions it decoded at, the page runs its
history came from, and the rebuild work that shared its round. Durations are checked for sign
and for where they land, never for size (a loaded 2-core box promises none).
"""

from __future__ import annotations

import asyncio
from typing import Any

from engine.reference.runtime import ReferenceEngine, SchedulerRound
from tests.engine.reference.test_server import small_config

PROMPT = list(range(5, 60))  # 55 tokens: 54 prefilled, the last read by the first decode


async def rounds_of(engine: ReferenceEngine, *requests: tuple[list[int], int]) -> list[Any]:
    reported: list[SchedulerRound] = []
    engine.listeners.append(lambda event, payload: event == "scheduler_round"
                            and reported.append(payload))
    await engine.start()
    try:
        async def one(prompt: list[int], max_tokens: int) -> None:
            async for _ in engine.generate(prompt, max_tokens):
                pass

        await asyncio.gather(*(one(p, n) for p, n in requests))
    finally:
        await engine.close()
    return reported


async def test_one_request_is_reported_token_by_token_at_its_positions() -> None:
    engine = ReferenceEngine(small_config())
    rounds = await rounds_of(engine, (PROMPT, 20))
    assert [r.tokens for r in rounds] == [1] * 20
    assert [r.context_tokens for r in rounds] == list(range(54, 74))
    # The first round admitted (prefilled) the request after idle: nothing ran before it.
    assert rounds[0].yielded_s == 0.0 and rounds[0].admit_s > 0
    assert all(r.admit_s < rounds[0].admit_s for r in rounds[1:])
    assert all(r.decode_s > 0 and r.yielded_s >= 0 and r.rebuild_s >= 0 for r in rounds)
    starts = [r.started_s for r in rounds]
    assert starts == sorted(starts)
    # Misses are the expert pool's, and each layer with one counts once.
    assert sum(r.misses for r in rounds) == engine.experts.misses > 0
    assert all(0 < r.miss_layers <= min(r.misses, 4) for r in rounds if r.misses)
    assert all(r.miss_layers == 0 for r in rounds if not r.misses)


async def test_the_runs_count_the_chunks_a_history_spans() -> None:
    # The small model's pages are 8 KiB (16 tokens): 64 KiB chunks hold the whole 74-token
    # history in one run. 16 KiB chunks hold 2 pages, the first the dummy page 0, so pages
    # 1-4 (55 tokens) are 3 runs, 1-5 as many, and 1-6 (from position 80) 4.
    one_chunk = await rounds_of(ReferenceEngine(small_config()), (PROMPT, 20))
    engine = ReferenceEngine(small_config(chunk_bytes=16 << 10))
    assert engine.kv.page_bytes == 8 << 10 and engine.kv.units_per_chunk == 2
    split = await rounds_of(engine, (PROMPT, 40))
    assert {r.kv_runs for r in one_chunk} == {1}
    assert [r.kv_runs for r in split] == [(r.context_tokens // 16 + 1) // 2 + 1 for r in split]
    assert split[0].kv_runs == 3 and split[-1].kv_runs == 4


async def test_requests_decoding_together_share_rounds() -> None:
    rounds = await rounds_of(ReferenceEngine(small_config()), (PROMPT, 30), (PROMPT[:20], 30))
    assert sum(r.tokens for r in rounds) == 60
    assert max(r.tokens for r in rounds) == 2
    together = [r for r in rounds if r.tokens == 2]
    assert all(r.context_tokens > 54 for r in together)


async def test_rebuild_work_under_decode_is_reported_in_its_round() -> None:
    engine = ReferenceEngine(small_config(chunk_bytes=16 << 10, rebuild_pause_budget_s=0.0))
    reported: list[SchedulerRound] = []
    engine.listeners.append(lambda event, payload: event == "scheduler_round"
                            and reported.append(payload))
    await engine.start()
    try:
        tokens: list[int] = []

        async def consume() -> None:
            async for token in engine.generate(PROMPT, 300):
                tokens.append(token)  # noqa: PERF401 - read while they stream

        task = asyncio.create_task(consume())
        while len(tokens) < 3:
            await asyncio.sleep(0.001)
        status, _ = await engine.rebuild({"moe_cache_size": 64, "num_pages": 40,
                                          "timeout": 60})
        await task
    finally:
        await engine.close()
    assert status == 200
    ops = len(engine.rebuilds.chunk_pauses)
    # One chunk operation a round at budget 0: that many rounds carried rebuild work.
    assert sum(r.rebuild_s > 0 for r in reported) >= ops
    assert sum(r.tokens for r in reported) == 300


async def test_a_request_is_announced_when_it_joins_the_waiting_queue() -> None:
    engine = ReferenceEngine(small_config())
    seen: list[tuple[str, int]] = []
    engine.listeners.append(lambda event, payload: seen.append(
        (event, len(engine.waiting) + len(engine.running))))
    await engine.start()
    try:
        async for _ in engine.generate(PROMPT, 3):
            pass
    finally:
        await engine.close()
    events = [event for event, _ in seen]
    # Once, first, while the request waits: before any round decoded it.
    assert events.count("request_queued") == 1 and events[0] == "request_queued"
    assert seen[0][1] == 1 and events.count("scheduler_round") == 3
