"""The fault soak: the real controller against the reference engine behind `FaultProxy`.

Why: single-fault tests show each rule once; a soak shows they compose. Thousands of seeded
faults hit a daemon that keeps moving between the ladder's ends, on a virtual clock (real
loopback HTTP, virtual sleeps), and the proxy, not the daemon, counts what matters: risky
calls, wedges (the engine latched by a daemon call), daemon crashes, and how long after the
last fault the daemon sits on the rung its policy wants.

    python bench/soak.py [--faults 10000] [--seed 1]      # prints one JSON object
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.reference.scenarios import report_config
from ladder.client import FtServeClient
from ladder.clock import VirtualClock
from ladder.controller import ControlSettings, ServerController
from ladder.executor import ApplySettings
from ladder.rungs import LadderSpec
from ladder.safeguards import Safeguards, SafeguardSettings
from policies.api import Decision, LadderView, Observation
from tests.kit.faults import FaultProxy, FaultSettings
from tests.kit.serving import EngineFleet

# Cheap faults dominate, so 10,000 of them fit in minutes; wall-time faults (hung) are rare.
WEIGHTS = {"busy": 3, "conflict": 2, "timeout": 1, "rejected": 2, "latched": 0.3,
           "refused": 0.5, "reset": 2, "slow": 2, "hung": 0.1, "malformed": 2, "partial": 1,
           "missing_field": 1.5, "renamed_field": 1.5, "restart": 0.2, "external_resize": 1}


class Alternating:
    """Wants the top rung and the bottom rung in turn (`period_s` each), then `final` once
    `settle` is set: the most transitions a ladder allows, and a known end state."""

    name = "alternating"

    def __init__(self, period_s: float) -> None:
        self.period_s = period_s
        self.settle = False

    def wanted(self, ladder: LadderView) -> int:
        return len(ladder.rungs) // 2

    def decide(self, observation: Observation, ladder: LadderView) -> Decision:
        top = len(ladder.rungs) - 1
        if self.settle:
            return Decision(self.wanted(ladder), "settle")
        up = int(observation.now_s // self.period_s) % 2 == 1
        return Decision(top if up else 0, "alternate")


@dataclasses.dataclass(frozen=True, slots=True)
class SoakResult:
    faults_injected: int
    risky_calls: int
    unconfirmed_grows: int
    wedges: int
    daemon_crashes: int
    recovered: bool
    recovery_s: float | None
    virtual_s: float
    wall_s: float
    rebuild_calls: int
    transitions: int
    max_rebuilds_per_10s: int
    restarts: int
    external_resizes: int
    faults_by_kind: dict[str, int]


async def run_soak(faults: int, *, seed: int = 1, rate: float = 0.2, rebuild_rate: float = 0.5,
                   recover_limit_s: float = 900.0) -> SoakResult:
    started = time.perf_counter()
    clock = VirtualClock()
    fleet = EngineFleet(report_config("freetoken"))
    proxy = FaultProxy(await fleet.start(), clock=clock, restart=fleet.restart,
                       settings=FaultSettings(
                           seed=seed, rate=rate, rebuild_rate=rebuild_rate, weights=WEIGHTS,
                           max_random_faults=faults, slow_s=2.0, hang_wall_s=0.3,
                           refused_s=3.0, rebuilding_hold_s=2.0, latch_requests=16))
    client = FtServeClient(await proxy.start(), timeout_s=0.25)
    await client.__aenter__()
    policy = Alternating(period_s=30.0)
    apply_settings = ApplySettings(poll_s=0.5, idle_wait_s=30, settle_wait_s=30,
                                   busy_retries=4, backoff_base_s=0.5, backoff_max_s=4,
                                   rebuild_wait_s=1.0, max_replans=2)
    controller = ServerController(
        "soak", client, policy, Safeguards(SafeguardSettings(
            cooldown_s=5, min_dwell_s=10, max_transitions_per_hour=720, backoff_base_s=2,
            backoff_max_s=20, breaker_failures=5, breaker_open_s=30)),
        spec=LadderSpec(kv_floor_tokens=256), settings=ControlSettings(poll_s=1.0),
        apply_settings=apply_settings, clock=clock, policy_name="alternating")
    stop = asyncio.Event()
    crashes = 0
    task = asyncio.ensure_future(controller.run(stop))

    def supervise() -> asyncio.Task[None]:
        nonlocal crashes, task
        if task.done():
            crashes += 1  # a daemon loop that ended on its own is a crash
            exc = task.exception()
            logging.getLogger(__name__).error("controller crashed: %r", exc)
            task = asyncio.ensure_future(controller.run(stop))
        return task

    recovery_s: float | None = None
    try:
        while proxy.random_faults < faults:
            await asyncio.sleep(0.02)
            supervise()
        policy.settle = True
        last = proxy.last_fault_s or clock.monotonic()
        while clock.monotonic() - last < recover_limit_s:
            await asyncio.sleep(0.01)
            supervise()
            ladder = controller.ladder
            live = fleet.engines[-1]
            if ladder is None or live.state != "serving" or proxy.latched:
                continue
            want = ladder.rungs[policy.wanted(controller.ladder_view())].geometry
            if (live.geometry().to_json() == want.to_json() and controller.rung is not None
                    and controller.instance_id == live.instance_id):
                recovery_s = max(0.0, clock.monotonic() - last)
                break
    finally:
        stop.set()
        await asyncio.wait({task}, timeout=5)
        await client.aclose()
        await proxy.close()
        await fleet.aclose()
    report = proxy.report()
    wedges = proxy.wedges + fleet.latched()
    return SoakResult(
        faults_injected=report["faults_injected"], risky_calls=report["risky_calls"],
        unconfirmed_grows=report["unconfirmed_grows"], wedges=wedges,
        daemon_crashes=crashes, recovered=recovery_s is not None,
        recovery_s=None if recovery_s is None else round(recovery_s, 2),
        virtual_s=round(clock.monotonic(), 1), wall_s=round(time.perf_counter() - started, 1),
        rebuild_calls=report["rebuild_calls"], transitions=len(controller.transitions),
        max_rebuilds_per_10s=report["max_rebuilds_per_10s"], restarts=report["restarts"],
        external_resizes=report["external_resizes"], faults_by_kind=report["faults_by_kind"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=0.2,
                        help="probability that a read gets a fault")
    parser.add_argument("--rebuild-rate", type=float, default=0.5,
                        help="probability that a rebuild call gets a fault")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    result = asyncio.run(run_soak(args.faults, seed=args.seed, rate=args.rate,
                                     rebuild_rate=args.rebuild_rate))
    print(json.dumps(dataclasses.asdict(result), indent=2))
    ok = result.risky_calls == result.wedges == result.daemon_crashes == 0 and result.recovered
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
