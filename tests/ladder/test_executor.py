"""`ladder apply` against the real reference engine over loopback HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from engine.ftserve.geometry import CacheStatus, Geometry
from engine.reference.runtime import ReferenceEngine
from engine.reference.scenarios import report_config
from engine.reference.server import make_app
from ladder.client import FtServeClient
from ladder.executor import ApplySettings, apply_target

FAST = ApplySettings(poll_s=0.01, backoff_base_s=0.01, backoff_max_s=0.05, idle_wait_s=30,
                     settle_wait_s=30)


@pytest.fixture
async def report_engine(aiohttp_server: Callable[..., Any]
                        ) -> AsyncIterator[Callable[..., Any]]:
    async def start(mode: str = "freetoken") -> tuple[ReferenceEngine, FtServeClient]:
        engine = ReferenceEngine(report_config(mode))  # type: ignore[arg-type]
        server = await aiohttp_server(make_app(engine))
        client = FtServeClient(str(server.make_url("")).rstrip("/"), timeout_s=30)
        await client.__aenter__()
        clients.append(client)
        return engine, client

    clients: list[FtServeClient] = []
    yield start
    for client in clients:
        await client.aclose()


def report_targets(g: Geometry) -> list[Geometry]:
    return [
        Geometry(2 * g.moe_cache_size, g.num_pages // 4, g.num_mamba_slots),
        Geometry(round(g.moe_cache_size * 1400 / 512), max(1, g.num_pages // 32), 4),
    ]


@pytest.mark.parametrize("which", [0, 1])
async def test_apply_reaches_the_report_targets_where_one_call_ooms(
    report_engine: Any, which: int,
) -> None:
    engine, client = await report_engine("freetoken")
    target = report_targets(engine.geometry())[which]
    # The naive single call: OOM inside the engine, rolled back, still serving.
    outcome = await client.rebuild(target.to_json(), wait_s=30)
    assert outcome.kind == "rejected"
    assert "rolled back" in (outcome.error or "")
    events: list[tuple[str, dict[str, Any]]] = []
    result = await apply_target(client, lambda _s: target, settings=FAST,
                                on_event=lambda e, p: events.append((e, p)))
    assert result.reached, result.reason
    assert result.final is not None and result.final.to_json() == target.to_json()
    assert [s.kind for s in result.steps] == ["ok", "ok"]
    assert result.plan.single_call_peak_bytes > result.plan.budget_bytes >= result.plan.peak_bytes
    # The shrink went first and was confirmed before the grow was sent.
    first, second = (s.body for s in result.steps)
    assert "moe_cache_size" not in first and second == {"moe_cache_size": target.moe_cache_size}
    assert [e for e, _ in events] == ["step_sent", "step_done", "step_sent", "step_done"]
    assert engine.memory.peak_bytes <= engine.memory.capacity_bytes  # type: ignore[operator]
    assert engine.state == "serving"


async def test_apply_waits_for_idle_and_retries_busy(report_engine: Any) -> None:
    engine, client = await report_engine("freetoken")
    target = report_targets(engine.geometry())[0]
    prompt = engine.tokenizer.encode(" ".join(f"w{i}" for i in range(20)))

    async def generate() -> list[int]:
        return [t async for t in engine.generate(prompt, 40)]

    gen = asyncio.create_task(generate())
    while not engine.running:
        await asyncio.sleep(0.001)
    result = await apply_target(client, lambda _s: target, settings=FAST)
    assert result.reached, result.reason
    assert len(await gen) == 40  # the generation was never cut short


async def test_apply_incremental_is_one_call(report_engine: Any) -> None:
    engine, client = await report_engine("incremental")
    target = report_targets(engine.geometry())[1]
    result = await apply_target(client, lambda _s: target, settings=FAST)
    assert result.reached, result.reason
    assert len(result.steps) == 1
    assert result.plan.engine == "reference"


async def test_apply_refuses_infeasible_targets_without_sending(report_engine: Any) -> None:
    engine, client = await report_engine("freetoken")
    before = engine.transitions.copy()
    big = Geometry(engine.shape.max_expert_slots, engine.geometry().num_pages, 8)
    result = await apply_target(client, lambda _s: big, settings=FAST)
    assert not result.reached
    assert "over the budget" in result.reason
    assert result.steps == ()
    assert engine.transitions == before


async def test_apply_stops_on_latched_failure(report_engine: Any) -> None:
    engine, client = await report_engine("freetoken")
    engine.state = "failed"
    target = report_targets(engine.geometry())[0]
    result = await apply_target(client, lambda _s: target, settings=FAST)
    assert not result.reached
    assert result.needs_restart
    assert "restart" in result.reason


async def test_apply_replans_after_an_external_resize(report_engine: Any) -> None:
    engine, client = await report_engine("freetoken")
    g = engine.geometry()
    target = report_targets(g)[0]
    seen: list[CacheStatus] = []

    def goal(status: CacheStatus) -> Geometry:
        seen.append(status)
        return target

    async def meddle() -> None:
        # Someone else (`ft ctl cache`) shrinks KV while our plan runs.
        while not engine.transitions:
            await asyncio.sleep(0.001)
        await engine.rebuild({"num_pages": g.num_pages // 8})

    task = asyncio.create_task(meddle())
    result = await apply_target(client, goal, settings=FAST)
    await task
    assert result.reached, result.reason
    assert engine.geometry().to_json() == target.to_json()
