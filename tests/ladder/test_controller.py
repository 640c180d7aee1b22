"""The controller's demand behind the gate: requests forwarded and not answered count.

A request the gate lets through may sit in the server's queue with no KV page yet; the
controller must not shrink the pool under it (the H200 run's `pinned-0` arm stalled on this:
two agentic turns waited for pages a step down had just taken away).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from engine.reference.runtime import ReferenceEngine
from engine.reference.server import make_app
from ladder.config import merge
from ladder.controller import TransitionRecord, transition_cost_s
from ladder.daemon import build_daemon
from ladder.demo import demo_engine_config
from ladder.tokenizer_file import write_reference_tokenizer
from tests.kit.prompts import words


async def _complete(session: aiohttp.ClientSession, url: str, prompt_words: int,
                    max_tokens: int) -> tuple[int, int]:
    async with session.post(f"{url}/v1/completions", json={
            "prompt": words(prompt_words), "max_tokens": max_tokens}) as resp:
        body = await resp.json()
        return resp.status, body.get("usage", {}).get("completion_tokens", 0)


@pytest.mark.timeout(60)
async def test_a_request_queued_inside_the_server_keeps_its_rung(
        aiohttp_server: Any, tmp_path: Path) -> None:
    # One request runs at a time, so the second one forwarded waits inside the engine.
    engine = ReferenceEngine(replace(demo_engine_config(), max_running_requests=1))
    engine_url = str((await aiohttp_server(make_app(engine))).make_url("")).rstrip("/")
    tokenizer = tmp_path / "tokenizer.json"
    write_reference_tokenizer(tokenizer, 4096)
    config = merge({
        # gate_listen makes build_daemon build the gate; the test serves its app itself.
        "servers": [{"name": "s", "url": engine_url, "gate_listen": "127.0.0.1:9",
                     "policy": "pinned", "policy_options": {"rung": 0},
                     "tokenizer_path": str(tokenizer), "ladder": {"kv_floor_tokens": 512}}],
        "safeguards": {"cooldown_s": 0.0, "min_dwell_s": 0.0},
        "control": {"apply_poll_s": 0.01}})
    async with aiohttp.ClientSession() as session:
        daemon = build_daemon(config, session)
        controller, gate = daemon.controllers[0], daemon.gates["s"]
        gate_url = str((await aiohttp_server(gate.make_app())).make_url("")).rstrip("/")
        # The controller's loop is driven by hand here, one tick at a time.
        await controller.tick()
        assert controller.rung == 0
        # A 5,100-token request raises the ladder to the rung that holds it.
        raise_up = asyncio.create_task(_complete(session, gate_url, 5100, 1))
        while gate.stats().held_now == 0:
            await asyncio.sleep(0.005)
        await controller.tick()
        assert await raise_up == (200, 1)
        capacity = controller.capacity_tokens()
        assert capacity >= 5101
        # A long-running small request, then a large one queued behind it.
        small = asyncio.create_task(_complete(session, gate_url, 10, 1000))
        while not engine.running:
            await asyncio.sleep(0.005)
        large = asyncio.create_task(_complete(session, gate_url, 5000, 8))
        while not engine.waiting:
            await asyncio.sleep(0.005)
        assert gate.stats().held_now == 0  # both fit the live rung: forwarded, not held
        # The queued one holds no page yet.
        assert engine.kv.used_pages * engine.shape.page_size < 5008
        await controller.tick()
        # Counting only used pages, the pin would step down to a rung under 5,008 tokens
        # and the queued request would be refused for a context it was admitted against.
        assert controller.capacity_tokens() >= 5008
        assert controller.live_kv_tokens >= 1010 + 5008
        assert await large == (200, 8)
        assert await small == (200, 1000)
        await controller.tick()  # nothing in flight: back to the pin
        assert gate.forwarded_kv_tokens() == 0
        assert controller.rung == 0


def test_the_transition_cost_is_the_median_of_the_latest_reached_ones() -> None:
    def record(seconds: float, reached: bool = True) -> TransitionRecord:
        return TransitionRecord(0.0, seconds, 0, 1, "test", reached, {})

    assert transition_cost_s([], 1.0) == 1.0
    assert transition_cost_s([record(9.0, reached=False)], 1.0) == 1.0
    assert transition_cost_s([record(0.2), record(9.0, reached=False), record(0.4)], 1.0) == (
        pytest.approx(0.3))
    # Only the latest eight count: an old slow step stops setting the price.
    assert transition_cost_s([record(50.0)] + [record(0.1)] * 8, 1.0) == pytest.approx(0.1)


@pytest.mark.timeout(60)
async def test_policies_see_the_measured_transition_cost(aiohttp_server: Any) -> None:
    engine = ReferenceEngine(demo_engine_config())
    engine_url = str((await aiohttp_server(make_app(engine))).make_url("")).rstrip("/")
    config = merge({
        "servers": [{"name": "s", "url": engine_url, "policy": "pinned",
                     "policy_options": {"rung": 0}, "ladder": {"kv_floor_tokens": 512}}],
        "control": {"apply_poll_s": 0.01, "transition_estimate_s": 7.0}})
    async with aiohttp.ClientSession() as session:
        controller = build_daemon(config, session).controllers[0]
        await controller.observe()
        assert controller.ladder_view().transition_s == 7.0  # the prior: nothing measured
        await controller.tick()  # the demo engine boots off the ladder: one step onto rung 0
        assert controller.rung == 0
        [record] = controller.transitions
        assert record.reached
        assert controller.ladder_view().transition_s == record.seconds != 7.0
