"""One test per fault kind: what `apply_target` (and the controller) must do, over real HTTP.

The reference engine runs in `freetoken` mode (ft serve's order, idle-only rebuilds) behind
`tests.kit.faults.FaultProxy`; every test ends with the invariants the proxy witnessed: no risky
call, no grow before the shrink was read back, no wedge, and the executor never raising.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from engine.ftserve.geometry import Geometry
from engine.reference.runtime import ReferenceEngine
from engine.reference.scenarios import report_config
from ladder.client import FtServeClient
from ladder.clock import VirtualClock
from ladder.controller import ServerController
from ladder.executor import ApplyResult, ApplySettings, apply_target
from ladder.rungs import LadderSpec
from ladder.safeguards import Safeguards, SafeguardSettings
from policies.pinned import Pinned
from tests.kit.faults import FaultProxy, FaultSettings, price_call
from tests.kit.serving import EngineFleet

SETTINGS = ApplySettings(poll_s=0.5, backoff_base_s=0.5, backoff_max_s=4, idle_wait_s=60,
                         settle_wait_s=60, rebuild_wait_s=0.6)
CLIENT_TIMEOUT_S = 0.3


@dataclasses.dataclass
class Rig:
    engine: ReferenceEngine
    proxy: FaultProxy
    client: FtServeClient
    clock: VirtualClock
    fleet: EngineFleet

    @property
    def engines(self) -> list[ReferenceEngine]:
        return self.fleet.engines

    def target(self) -> Geometry:
        # The report's first transition: MoE x2 with KV / 4, which needs two calls.
        g = self.engine.geometry()
        return Geometry(2 * g.moe_cache_size, g.num_pages // 4, g.num_mamba_slots)

    async def apply(self, target: Geometry, **kw: Any) -> ApplyResult:
        return await apply_target(self.client, lambda _s: target, settings=SETTINGS,
                                  clock=self.clock, **kw)

    def assert_invariants(self) -> None:
        assert self.proxy.risky_calls() == [], self.proxy.report()
        assert self.proxy.unconfirmed_grows() == [], self.proxy.report()
        assert self.proxy.wedges == 0
        assert self.fleet.latched() == 0
        assert self.proxy.max_in_window(self.proxy.rebuild_times_s, 1.0) <= 6


@pytest.fixture
async def rig() -> AsyncIterator[Callable[..., Any]]:
    async with contextlib.AsyncExitStack() as stack:

        async def build(settings: FaultSettings | None = None) -> Rig:
            fleet = await stack.enter_async_context(EngineFleet(report_config("freetoken")))
            url = await fleet.start()
            clock = VirtualClock()
            proxy = FaultProxy(url, clock=clock, settings=settings or FaultSettings(
                hang_wall_s=CLIENT_TIMEOUT_S + SETTINGS.rebuild_wait_s + 0.3),
                restart=fleet.restart)
            client = FtServeClient(await proxy.start(), timeout_s=CLIENT_TIMEOUT_S)
            await client.__aenter__()
            stack.push_async_callback(proxy.close)
            stack.push_async_callback(client.aclose)
            return Rig(fleet.engines[0], proxy, client, clock, fleet)

        yield build


async def test_virtual_clock_advances_with_two_concurrent_sleepers() -> None:
    clock = VirtualClock()
    await asyncio.wait_for(asyncio.gather(clock.sleep(1), clock.sleep(2)), timeout=1.0)
    assert clock.monotonic() == 2


async def test_price_call_is_ft_serves_order() -> None:
    g = {"moe_cache_size": 2, "num_pages": 3, "num_mamba_slots": 1, "page_size": 2,
         "unit_bytes": {"kv_per_token": 5, "moe_per_expert": 100, "mamba_per_slot": 7}}
    # Held: 200 MoE + (3+1)*10 KV + (1+1)*7 mamba.
    assert price_call(g, {}) == (254, 254)
    # MoE grows first while the old KV is still held, then KV shrinks.
    assert price_call(g, {"moe_cache_size": 4, "num_pages": 1}) == (254, 454)
    assert price_call(g, {"num_pages": 1}) == (254, 254)


async def test_busy_is_retried_with_backoff(rig: Any) -> None:
    r: Rig = await rig()
    r.proxy.inject("busy", 2, route="rebuild")
    result = await r.apply(r.target())
    assert result.reached, result.reason
    kinds = [s.kind for s in result.steps]
    assert kinds[:2] == ["busy_scheduler", "busy_scheduler"] and kinds[2:] == ["ok", "ok"]
    # Backoff: the retries are spread over virtual time, not sent back to back.
    sent = r.proxy.rebuild_times_s
    assert sent[1] - sent[0] >= SETTINGS.backoff_base_s
    r.assert_invariants()


async def test_conflict_409_waits_and_replans(rig: Any) -> None:
    r: Rig = await rig()
    r.proxy.inject("conflict", route="rebuild")
    result = await r.apply(r.target())
    assert result.reached, result.reason
    assert result.steps[0].kind == "busy_rebuilding"
    assert result.replans == 1
    r.assert_invariants()


async def test_504_while_still_rebuilding_is_settled_by_polling(rig: Any) -> None:
    r: Rig = await rig()
    r.proxy.inject("timeout", route="rebuild")
    result = await r.apply(r.target())
    assert result.reached, result.reason
    assert result.steps[0].kind == "timeout"
    # Nothing was sent while the server still said `rebuilding` (no 409 from the proxy), and
    # the shrink behind the 504 was really applied once, then confirmed before the grow.
    assert [(c.fault, c.http_status) for c in r.proxy.records] == [("timeout", 200),
                                                                    (None, 200)]
    assert r.engine.transitions[("freetoken", "ok")] == 2
    r.assert_invariants()


async def test_rejected_after_rollback_replans_once(rig: Any) -> None:
    r: Rig = await rig()
    r.proxy.inject("rejected", route="rebuild")
    result = await r.apply(r.target())
    assert result.reached, result.reason
    assert result.steps[0].kind == "rejected" and result.replans == 1
    r.assert_invariants()


async def test_latched_failed_stops_without_sending(rig: Any) -> None:
    r: Rig = await rig()
    r.proxy.inject("latched")
    result = await r.apply(r.target())
    assert not result.reached and result.needs_restart
    assert "restart" in result.reason
    assert r.proxy.records == []  # not one rebuild call to a latched server
    r.assert_invariants()


@pytest.mark.parametrize("kind", ["refused", "reset"])
@pytest.mark.parametrize("route", ["status", "rebuild"])
async def test_refused_and_reset_end_the_attempt_cleanly(rig: Any, kind: str,
                                                         route: str) -> None:
    r: Rig = await rig()
    target = r.target()
    r.proxy.inject(kind, route=route)  # type: ignore[arg-type]
    first = await r.apply(target)
    assert r.proxy.injected[kind] == 1
    if not first.reached:
        # A reason naming the lost server, never an exception; aiohttp may also retry an
        # idempotent GET on a fresh connection by itself, and then the plan just goes on.
        assert "server" in first.reason
        await r.clock.sleep(5)  # the refused window closes
        again = await r.apply(target)
        assert again.reached, again.reason
    assert r.engine.geometry().to_json() == target.to_json()
    r.assert_invariants()


async def test_slow_replies_are_waited_for(rig: Any) -> None:
    r: Rig = await rig()
    r.proxy.inject("slow", 3)
    result = await r.apply(r.target())
    assert result.reached, result.reason
    r.assert_invariants()


async def test_hung_rebuild_reply_is_judged_by_the_geometry(rig: Any) -> None:
    r: Rig = await rig()
    r.proxy.inject("hung", route="rebuild")
    result = await r.apply(r.target())
    assert result.reached, result.reason
    assert result.steps[0].kind == "lost"  # EngineTimeout: outcome unknown, then polled
    assert r.engine.transitions[("freetoken", "ok")] == 2  # the lost step was not resent
    r.assert_invariants()


async def test_hung_status_read_times_out_cleanly(rig: Any) -> None:
    r: Rig = await rig(FaultSettings(hang_wall_s=CLIENT_TIMEOUT_S + 0.1))
    r.proxy.inject("hung", route="status")
    first = await r.apply(r.target())
    assert not first.reached and "cannot read the server" in first.reason
    again = await r.apply(r.target())
    assert again.reached, again.reason
    r.assert_invariants()


@pytest.mark.parametrize("kind", ["malformed", "partial", "missing_field", "renamed_field"])
@pytest.mark.parametrize("route", ["status", "health", "stats", "rebuild"])
async def test_broken_bodies_never_raise_and_never_skip_a_read(rig: Any, kind: str,
                                                                route: str) -> None:
    r: Rig = await rig()
    target = r.target()
    # Let the first step through clean so the broken body hits the middle of the plan.
    r.proxy.inject(kind, route=route)  # type: ignore[arg-type]
    first = await r.apply(target)
    if not first.reached:
        assert first.reason  # a reason, never an exception
        again = await r.apply(target)
        assert again.reached, again.reason
    assert r.engine.geometry().to_json() == target.to_json()
    r.assert_invariants()


async def test_restart_mid_plan_stops_and_sends_nothing_to_the_new_instance(rig: Any) -> None:
    r: Rig = await rig()

    def on_event(event: str, _payload: dict[str, Any]) -> None:
        if event == "step_done" and r.proxy.restarts == 0:
            r.proxy.inject("restart")

    result = await r.apply(r.target(), on_event=on_event)
    assert not result.reached and "restarted" in result.reason
    assert len(r.engines) == 2
    assert r.engines[1].transitions == {}  # the old plan means nothing to the new process
    assert len(r.proxy.records) == 1
    r.assert_invariants()


async def test_controller_rebuilds_its_ladder_after_a_restart_with_another_geometry(
        rig: Any) -> None:
    r: Rig = await rig()
    controller = ServerController(
        "s", r.client, Pinned(rung=0), Safeguards(SafeguardSettings(
            cooldown_s=0, min_dwell_s=0, backoff_base_s=1, breaker_open_s=5)),
        spec=LadderSpec(kv_floor_tokens=256), apply_settings=SETTINGS, clock=r.clock)
    await controller.tick()
    await controller.tick()
    assert controller.rung == 0
    old_ladder = controller.ladder
    r.proxy.inject("restart")
    for _ in range(4):
        await controller.tick()
        await r.clock.sleep(1)
    assert controller.instance_id == r.engines[1].instance_id
    assert controller.ladder is not old_ladder
    assert controller.ladder is not None
    assert r.engines[1].geometry().to_json() == controller.ladder.rungs[0].geometry.to_json()
    r.assert_invariants()


async def test_external_resize_seen_at_the_confirmation_read_is_replanned(rig: Any) -> None:
    r: Rig = await rig()
    g = r.engine.geometry()

    def on_event(event: str, _payload: dict[str, Any]) -> None:
        if event == "step_sent" and not r.proxy.external_resizes:
            # `ft ctl cache` regrows KV while our shrink is in flight.
            r.proxy.inject("external_resize", body={"num_pages": g.num_pages})

    result = await r.apply(r.target(), on_event=on_event)
    assert r.proxy.external_resizes
    assert result.reached, result.reason
    assert result.replans >= 1
    r.assert_invariants()


async def _resize_before_the_grow(r: Rig) -> ApplyResult:
    g = r.engine.geometry()

    def on_event(event: str, _payload: dict[str, Any]) -> None:
        if event == "step_done" and not r.proxy.external_resizes:
            # After our shrink was confirmed, someone regrows KV; the daemon's very next read
            # (before it sends the MoE grow) shows it.
            r.proxy.inject("external_resize", body={"num_pages": g.num_pages})

    return await r.apply(r.target(), on_event=on_event)


async def test_external_resize_before_the_grow_still_converges_without_a_wedge(
        rig: Any) -> None:
    r: Rig = await rig()
    result = await _resize_before_the_grow(r)
    assert r.proxy.external_resizes
    assert result.reached, result.reason
    assert r.proxy.wedges == 0 and r.engine.state == "serving"


async def test_external_resize_before_the_grow_sends_no_risky_call(rig: Any) -> None:
    r: Rig = await rig()
    await _resize_before_the_grow(r)
    assert r.proxy.risky_calls() == [], r.proxy.report()


async def test_control_route_queues_faults(rig: Any) -> None:
    r: Rig = await rig()
    assert r.client._session is not None
    url = r.client.base_url + "/_faults"
    async with r.client._session.post(url, json={"kind": "busy", "count": 1,
                                                 "route": "rebuild"}) as resp:
        assert resp.status == 200 and (await resp.json())["queued"] == 1
    async with r.client._session.post(url, json={"kind": "nope"}) as resp:
        assert resp.status == 422
    result = await r.apply(r.target())
    assert result.reached and result.steps[0].kind == "busy_scheduler"
    async with r.client._session.get(url + "/report") as resp:
        report = await resp.json()
    assert report["faults_by_kind"] == {"busy": 1} and report["risky_calls"] == 0
