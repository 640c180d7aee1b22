"""One trace on every arm, in virtual time: the policy bench with the GPU replaced by a model.

Why this is still the bench: the arms are bench/policy_arms.py's (same ladders, same policy
options, same daemon config on the compressed clock), and each is driven by the same
`drive_arm` (closed-loop sessions, the oracle's send rule, the timeline and transition
records), through the real daemon: `ladder.daemon.build_daemon` builds the controller, its
safeguards, executor and policy (entry points included) and the gate, and only its client is
the replay's (`SimClient`). The gate's own hold (`Gate.forward_when_fits`) admits each
request. The run document is `bench.policy_bench.run_doc`'s, so `bench/policy_report.py` derives
the ratios, targets and miss model exactly as for a measured run.

Replay-only arm: `no-miss`, the static-full arm on a machine where a miss costs nothing,
the ceiling no ladder can pass (every lookup a hit, on any rung).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.policy_arms import (
    ARMS,
    DAEMON_ARMS,
    ArmResult,
    BenchOptions,
    RequestRow,
    arm_start,
    base_arm,
    daemon_config,
    drive_arm,
    engine_mode,
    settle,
)
from bench.policy_bench import oracle_plan_for, run_doc
from bench.replay.calibration import Costs
from bench.replay.experts import RoutingBank
from bench.replay.server import Generation, ServerSpec, SimClient, SimEngine
from bench.replay.vloop import LoopClock, run_virtual
from bench.traces import TraceRequest
from engine.reference.admission import AdmissionError
from ladder.daemon import build_daemon
from ladder.gate import REBUILD_IN_PROGRESS, REBUILD_RACE, GateRefusal, RebuildRace
from ladder.sizing import RequestSize

__all__ = ["ARM_LIMIT_S", "NO_MISS", "REPLAY_ARMS", "World", "replay_arm", "replay_trace"]

NO_MISS = "no-miss"
REPLAY_ARMS = (*ARMS, NO_MISS)
_URL = "http://replay.invalid:1919"
_GATE_LISTEN = "127.0.0.1:1920"  # never bound: the replay calls the gate's hold directly
# An arm's virtual-time limit: the bench's arms finish in minutes; one still running after an
# hour is stalled, and is reported as such (`VirtualTimeExceeded`), not waited out.
ARM_LIMIT_S = 3600.0


@dataclass(frozen=True)
class World:
    """The machine a trace is replayed on: the server and what its time costs."""

    name: str
    spec: ServerSpec
    costs: Costs


async def replay_arm(arm: str, trace: Sequence[TraceRequest], opts: BenchOptions,
                     world: World, bank: RoutingBank,
                     oracle_rungs: Sequence[int] | None = None, *,
                     forwarded_demand: bool = True) -> ArmResult:
    """One arm on a fresh simulated server, in the running (virtual-time) loop.

    `forwarded_demand` False replays the daemon from before the gate counted forwarded,
    unanswered requests as live demand (bench/results/h200's earlier records)."""
    costs = world.costs.with_misses_free() if arm == NO_MISS else world.costs
    engine = SimEngine(world.spec.in_mode(engine_mode(arm)), costs, bank,
                       instance_id=f"replay-{world.name}-{arm}")
    engine.start()
    stop = asyncio.Event()
    controller_task = None
    try:
        ladder, start = await arm_start("static-full" if arm == NO_MISS else arm, engine, opts)
        controller = gate = None
        if base_arm(arm) in DAEMON_ARMS:
            daemon = build_daemon(daemon_config(arm, _URL, _GATE_LISTEN, None, opts), None,
                                  clock=LoopClock(),
                                  client_factory=lambda server: SimClient(engine, server.url))
            controller, gate = daemon.controllers[0], daemon.gates[arm]
            if not forwarded_demand:
                controller.forwarded_kv_tokens = lambda: 0
            controller_task = asyncio.create_task(controller.run(stop))
            await settle(arm, controller, opts)

        async def send(row: RequestRow, via_gate: bool, first_token: asyncio.Event | None) -> None:
            loop = asyncio.get_running_loop()
            started = loop.time()

            async def forward() -> Generation | AdmissionError | RebuildRace:
                try:
                    return await engine.generate(row.index, row.prompt_tokens, row.max_tokens,
                                                 first_token)
                except AdmissionError as exc:
                    if via_gate and exc.http_status == 503 and REBUILD_IN_PROGRESS in (
                            exc.message):
                        return REBUILD_RACE
                    return exc

            try:
                if via_gate:
                    assert gate is not None
                    result = await gate.forward_when_fits(
                        "/v1/completions",
                        RequestSize(row.prompt_tokens, row.max_tokens, exact=True), forward)
                else:
                    result = await forward()
            except GateRefusal as refusal:
                row.status, row.error = refusal.status, refusal.message
                return
            finally:
                if first_token is not None:
                    first_token.set()
            if isinstance(result, AdmissionError | RebuildRace):
                row.status = result.http_status if isinstance(result, AdmissionError) else 503
                row.error = str(result)[:200]
                return
            assert isinstance(result, Generation)
            row.status = 200
            row.completion_tokens = result.generated
            if result.first_token_s is not None and result.last_token_s is not None:
                row.ttft_s = result.first_token_s - started
                row.decode_s = result.last_token_s - result.first_token_s
                row.window_hits = result.at_last[0] - result.at_first[0]
                row.window_misses = result.at_last[1] - result.at_first[1]

        return await drive_arm(arm, trace, opts, engine, ladder, start, controller, send,
                               asyncio.Event(), oracle_rungs)
    finally:
        stop.set()
        if controller_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await controller_task
        await engine.close()


def replay_trace(trace_kind: str, trace: Sequence[TraceRequest], opts: BenchOptions,
                 world: World, arms: Sequence[str], *, priced_oracle: bool = True,
                 forwarded_demand: bool = True) -> dict[str, Any]:
    """Every arm of `arms` on `trace`, the oracle last (it is priced by the others), each in
    its own virtual-time loop: the run document of bench/policy_bench.py.

    `priced_oracle` False replays the bench's first oracle (the lowest rung holding each
    request, no schedule), which the earlier H200 records ran."""
    logging.getLogger("ladder").setLevel(logging.WARNING)
    bank = RoutingBank(world.spec.routing, opts.seed)
    miss_us = world.costs.miss_s * 1e6
    results: dict[str, ArmResult] = {}
    plan = None
    for arm in sorted(arms, key=lambda a: a == "oracle"):
        if arm == "oracle" and priced_oracle:
            run = run_doc(trace_kind, opts.seed, trace, results, None, miss_us, None)
            plan = oracle_plan_for(trace, run, page_size=world.spec.shape.page_size,
                                   lookups_per_token=world.spec.routing.lookups_per_token,
                                   copy_us=miss_us)
        rungs = plan["rungs"] if arm == "oracle" and plan else None
        results[arm] = run_virtual(replay_arm(arm, trace, opts, world, bank, rungs,
                                              forwarded_demand=forwarded_demand),
                                   limit_s=ARM_LIMIT_S)
    return run_doc(trace_kind, opts.seed, trace, results, None, miss_us, plan)
