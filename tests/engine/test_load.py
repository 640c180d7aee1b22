"""The reference engine under load while incremental rebuilds go back and forth.

Why: the incremental mode promises that resizing never changes what a request generates,
never loses a byte of accounting and never leaks. The reduced form runs seconds; the
"compressed 30 minutes" form is `python bench/engine_load.py`.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from engine.runtime import ReferenceEngine
from engine.scenarios import report_config

PROMPTS = [[(7 * i + j) % 50 + 3 for j in range(5 + i % 7)] for i in range(12)]


def storage_bytes(engine: ReferenceEngine) -> int:
    tensors = [t for pool in (engine.experts, engine.kv, engine.states)
               for t in pool.chunk_tensors()]
    return sum(t.untyped_storage().nbytes() for t in tensors)


def rss_bytes() -> int:
    # psutil may be absent; statm's second field is resident pages.
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def run_load(rounds: int, *, rebuild: bool, max_tokens: int = 24
                   ) -> tuple[list[list[int]], ReferenceEngine, int, list[int]]:
    """Outputs of `rounds` waves of concurrent requests; rebuilds between chunks if asked."""
    engine = ReferenceEngine(report_config("incremental"))
    await engine.start()
    g = engine.geometry()
    bodies = [{"moe_cache_size": 2 * g.moe_cache_size, "num_pages": g.num_pages // 2},
              {"moe_cache_size": g.moe_cache_size, "num_pages": g.num_pages}]
    outputs: list[list[int]] = []
    rebuilds = 0
    drift: list[int] = []
    stop = asyncio.Event()

    async def flip() -> None:
        nonlocal rebuilds
        i = 0
        while not stop.is_set():
            status, _ = await engine.rebuild(bodies[i % 2])
            if status == 200:
                rebuilds += 1
                i += 1
            drift.append(engine.memory.allocated_bytes - storage_bytes(engine))
            await asyncio.sleep(0.002)

    async def one(prompt: list[int], seed: int) -> list[int]:
        return [t async for t in engine.generate(prompt, max_tokens, seed=seed)]

    flipper = asyncio.ensure_future(flip()) if rebuild else None
    try:
        for wave in range(rounds):
            outputs += await asyncio.gather(*(one(p, seed=wave * 100 + i)
                                              for i, p in enumerate(PROMPTS)))
    finally:
        stop.set()
        if flipper is not None:
            await flipper
        await engine.close()
    return outputs, engine, rebuilds, drift


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_outputs_accounting_and_memory_under_transitions() -> None:
    baseline, _, _, _ = await run_load(3, rebuild=False)
    await run_load(1, rebuild=True)  # warm-up: allocator and caches settle first
    before = rss_bytes()
    outputs, engine, rebuilds, drift = await run_load(3, rebuild=True)
    after = rss_bytes()
    assert rebuilds >= 4, "the transitions must really run during the load"
    assert outputs == baseline  # same seeds, same tokens, resized or not
    assert set(drift) == {0}
    assert engine.memory.allocated_bytes == storage_bytes(engine)
    assert after <= before * 1.05, (before, after)
