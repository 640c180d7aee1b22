"""The simulated server answers the daemon's real client as the reference engine would, and
charges exactly the calibrated costs: decode per round, incremental rebuilds that keep the
resident experts, freetoken rebuilds that wait for idle, refuse with 503 and start cold."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from bench.policy_arms import gpu_engine_config
from bench.replay.calibration import DEFAULT_CALIBRATION, load_profile
from bench.replay.experts import RoutingBank
from bench.replay.server import ServerSpec, SimClient, SimEngine
from bench.replay.vloop import run_virtual
from engine.reference.admission import AdmissionError

SPEC = ServerSpec.from_engine_config(gpu_engine_config())
COSTS, _ = load_profile(DEFAULT_CALIBRATION, "h200-bench")


def _engine(mode: str = "incremental", **costs: float) -> SimEngine:
    return SimEngine(SPEC.in_mode(mode), replace(COSTS, **costs),
                     RoutingBank(SPEC.routing, 0))


def test_status_through_the_real_client_is_the_boot_geometry() -> None:
    async def main() -> None:
        engine = _engine()
        engine.start()
        async with SimClient(engine, "http://replay.invalid") as client:
            status = await client.cache_status()
            assert status.geometry == SPEC.boot
            assert status.cache_budget_bytes == SPEC.cache_budget_bytes
            assert (await client.health()).status == "ok"
        await engine.close()

    run_virtual(main())


def test_decode_time_is_the_calibrated_rounds() -> None:
    """One request alone: each token after the first costs round + request + its context
    (misses free here), to the float."""
    async def main() -> tuple[float, float]:
        engine = _engine(miss_s=0.0)
        engine.start()
        run = await engine.generate(0, prompt_tokens=1000, max_tokens=20)
        await engine.close()
        assert run.generated == 20 and run.last_token_s is not None
        assert run.first_token_s is not None
        return run.first_token_s - run.started_s, run.last_token_s - run.first_token_s

    ttft, decode = run_virtual(main())
    c = COSTS
    expected = sum(c.round_s + c.request_s + c.context_token_s * (1000 + i)
                   for i in range(1, 20))
    assert decode == pytest.approx(expected, rel=1e-9)
    assert ttft == pytest.approx(c.prefill_s + c.prefill_token_s * 1000 + c.round_s
                                 + c.request_s + c.context_token_s * 1000, rel=1e-9)


def test_a_prompt_longer_than_the_context_is_refused() -> None:
    async def main() -> None:
        engine = _engine()
        engine.start()
        with pytest.raises(AdmissionError, match="prompt is too long") as info:
            await engine.generate(0, prompt_tokens=SPEC.boot.num_pages * 16, max_tokens=5)
        assert info.value.http_status == 400
        await engine.close()

    run_virtual(main())


def test_incremental_rebuild_under_decode_keeps_the_experts() -> None:
    async def main() -> None:
        engine = _engine()
        engine.start()
        generation = asyncio.create_task(engine.generate(0, 200, 400))
        await asyncio.sleep(2.0)
        before = engine.experts.resident
        assert before == SPEC.boot.moe_cache_size
        async with SimClient(engine, "http://replay.invalid") as client:
            outcome = await client.rebuild({"moe_cache_size": 512})
        assert outcome.kind == "ok"
        assert not generation.done()  # it kept decoding through the rebuild
        assert engine.geometry().moe_cache_size == 512
        assert engine.experts.resident >= before  # nothing evicted by a grow
        run = await generation
        assert run.generated == 400
        await engine.close()

    run_virtual(main())


def test_freetoken_rebuild_waits_for_idle_refuses_meanwhile_and_starts_cold() -> None:
    async def main() -> None:
        engine = _engine("freetoken", freetoken_rebuild_s=0.6)
        engine.start()
        generation = asyncio.create_task(engine.generate(0, 200, 100))
        await asyncio.sleep(0.5)
        async with SimClient(engine, "http://replay.invalid") as client:
            busy = await client.rebuild({"moe_cache_size": 512})
            assert busy.kind == "busy_scheduler"
            await generation
            assert engine.experts.resident > 0
            loop = asyncio.get_running_loop()
            rebuild = asyncio.create_task(client.rebuild({"moe_cache_size": 512}))
            await asyncio.sleep(0.1)
            with pytest.raises(AdmissionError, match="rebuild in progress") as info:
                await engine.generate(1, 200, 10)
            assert info.value.http_status == 503
            started = loop.time()
            assert (await rebuild).kind == "ok"
            assert loop.time() - started == pytest.approx(0.5, abs=0.06)
        assert engine.geometry().moe_cache_size == 512
        assert engine.experts.resident == 0  # the pool was reallocated
        await engine.close()

    run_virtual(main())


def test_a_queued_request_is_announced_and_a_refused_one_is_not() -> None:
    """The oracle's sender prices the next request once this one is on the engine's books
    (`request_queued`), before its admission."""
    async def main() -> None:
        engine = _engine()
        queued: list[int] = []
        engine.listeners.append(lambda event, run: event == "request_queued"
                                and queued.append(run.index))
        engine.start()
        with pytest.raises(AdmissionError, match="prompt is too long"):
            await engine.generate(0, prompt_tokens=SPEC.boot.num_pages * 16, max_tokens=5)
        assert queued == []
        generation = asyncio.create_task(engine.generate(1, 200, 10))
        await asyncio.sleep(0)
        assert queued == [1] and generation.done() is False
        assert [run.index for run in engine.waiting] == [1]  # queued, not yet admitted
        await generation
        await engine.close()

    run_virtual(main())
