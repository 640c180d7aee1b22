"""Executes a plan against a live server, one verified step at a time (`ladder apply`).

The rules that keep a server safe live here, once, for `apply` and for the controller:
- a step is sent only at a safe moment (state `serving`; for ft serve also no active request),
  and only after the previous step's geometry was read back and matched: a grow is never sent
  while the shrink before it is unconfirmed;
- `busy` (503) backs off and retries the same step, a bounded number of times;
- 409 and 504 mean a rebuild is still running: poll the status until it settles, then judge
  by the geometry actually served;
- `rejected` re-plans from the live geometry; `failed` stops and says a restart is needed;
- a new `instance_id` means the server restarted: stop, the old plan means nothing now;
- a geometry that moved under us (someone ran `ft ctl cache`) is re-planned from;
- re-plans, for either reason, are bounded by `max_replans` (default 2), then it stops.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.ftserve.budget import MemoryModel
from engine.ftserve.geometry import CacheStatus, Geometry
from engine.ftserve.planner import Plan, Step, plan_transition
from engine.ftserve.wire import RebuildOutcome
from ladder.client import ClientError, EngineTimeout, FtServeClient
from ladder.clock import Clock, SystemClock
from ladder.knobs import check_knobs, check_order, knob
from ladder.parsers import seconds, whole

__all__ = ["ApplyResult", "ApplySettings", "StepRecord", "apply_target"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ApplySettings:
    """How one transition is executed; the `[control]` table holds these knobs beside the
    control loop's (`ladder.controller.ControlSettings`), some under a `busy_` or `apply_`
    key that says what they time there."""

    poll_s: float = knob(0.5, seconds(positive=True), "Status polling while a rebuild runs, "
                         "seconds, > 0.", key="apply_poll_s")
    idle_wait_s: float = knob(600.0, seconds(), "Longest wait for a safe moment (no active "
                              "request) before giving up a step, seconds.")
    settle_wait_s: float = knob(600.0, seconds(), "Longest wait for the server to settle after "
                                "a step, seconds.")
    rebuild_wait_s: float = knob(300.0, seconds(), "Longest wait for a rebuild to finish "
                                 "(504/409), seconds.")
    busy_retries: int = knob(8, whole(), "Retries of a step answered `busy` (503).")
    backoff_base_s: float = knob(1.0, seconds(), "First wait after `busy`, seconds; doubles per "
                                 "retry.", key="busy_backoff_base_s")
    backoff_max_s: float = knob(30.0, seconds(), "Ceiling of that wait, seconds, >= "
                                "`busy_backoff_base_s`.", key="busy_backoff_max_s")
    max_replans: int = knob(2, whole(), "Re-plans from the live geometry after `rejected` or a "
                            "geometry that moved.")
    # The budget the plans are priced against: the server's ladder knobs (`LadderSpec`), which
    # the controller sets here; `ladder apply` sets them from its flags.
    fixed_bytes: int = 0
    reserve_bytes: int = 0

    def __post_init__(self) -> None:
        check_knobs(self)
        check_order(self, "backoff_base_s", "backoff_max_s")


@dataclass(frozen=True, slots=True)
class StepRecord:
    body: dict[str, int]
    kind: str
    http_status: int
    seconds: float
    planned_peak_bytes: int
    after: Geometry | None
    note: str = ""


@dataclass(frozen=True, slots=True)
class ApplyResult:
    reached: bool
    reason: str
    plan: Plan
    steps: tuple[StepRecord, ...] = ()
    final: Geometry | None = None
    needs_restart: bool = False
    replans: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "reached": self.reached, "reason": self.reason, "needs_restart": self.needs_restart,
            "replans": self.replans, "plan": self.plan.to_json(),
            "final": None if self.final is None else self.final.to_json(),
            "steps": [{"body": s.body, "kind": s.kind, "http_status": s.http_status,
                       "seconds": round(s.seconds, 4), "planned_peak_bytes": s.planned_peak_bytes,
                       "after": None if s.after is None else s.after.to_json(), "note": s.note}
                      for s in self.steps],
        }


class _Moved(Exception):
    """The served geometry is not where the next step was planned to start from."""

    def __init__(self, status: CacheStatus) -> None:
        super().__init__("geometry moved")
        self.status = status


class _Stop(Exception):
    def __init__(self, reason: str, *, needs_restart: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.needs_restart = needs_restart


def _same(a: Geometry, b: Geometry) -> bool:
    return a.to_json() == b.to_json()


@dataclass
class _Run:
    client: FtServeClient
    settings: ApplySettings
    clock: Clock
    on_event: Callable[[str, dict[str, Any]], None]
    instance_id: str = ""
    serves_while_rebuilding: bool = False
    records: list[StepRecord] = field(default_factory=list)

    def model(self, status: CacheStatus) -> MemoryModel:
        return MemoryModel.from_status(status, fixed_bytes=self.settings.fixed_bytes,
                                       reserve_bytes=self.settings.reserve_bytes)

    async def check_instance(self) -> None:
        health = await self.client.health()
        if self.instance_id and health.instance_id != self.instance_id:
            raise _Stop(f"the server restarted (instance {self.instance_id} -> "
                        f"{health.instance_id}); its geometry must be read afresh")
        self.instance_id = health.instance_id
        if health.state == "failed":
            raise _Stop("the server is latched in maintenance `failed`; restart it",
                        needs_restart=True)

    async def safe_moment(self, serves_while_rebuilding: bool) -> CacheStatus:
        """Wait until a rebuild may be sent: serving, and idle unless the engine needs not.

        The geometry is read last, right before the POST, so the step is checked against
        what is served at that moment, not against a read older than the other checks."""
        deadline = self.clock.monotonic() + self.settings.idle_wait_s
        while True:
            await self.check_instance()
            idle = serves_while_rebuilding or (await self.client.stats()).requests_active == 0
            status = await self.client.cache_status()
            if status.state == "serving" and idle:
                return status
            if self.clock.monotonic() >= deadline:
                raise _Stop(f"no safe moment within {self.settings.idle_wait_s:.0f} s "
                            f"(state {status.state}, requests still active)")
            await self.clock.sleep(self.settings.poll_s)

    async def settle(self) -> CacheStatus:
        """Poll until the server leaves `rebuilding` (after a 409, a 504 or a lost reply)."""
        deadline = self.clock.monotonic() + self.settings.settle_wait_s
        while True:
            try:
                status = await self.client.cache_status()
                if status.state != "rebuilding":
                    await self.check_instance()
                    return status
            except EngineTimeout:
                pass
            if self.clock.monotonic() >= deadline:
                raise _Stop(f"the server is still rebuilding after "
                            f"{self.settings.settle_wait_s:.0f} s")
            await self.clock.sleep(self.settings.poll_s)

    async def send(self, step: Step, start: Geometry) -> tuple[RebuildOutcome | None,
                                                              CacheStatus]:
        """POST one step, retrying `busy`; return the outcome and the geometry served after.

        The step is priced from `start`; if the server serves anything else at the moment of
        sending (someone resized it meanwhile), nothing is sent and `_Moved` says re-plan."""
        delay = self.settings.backoff_base_s
        for attempt in range(self.settings.busy_retries + 1):
            status = await self.safe_moment(self.serves_while_rebuilding)
            if not _same(status.geometry, start):
                raise _Moved(status)
            started = self.clock.monotonic()
            self.on_event("step_sent", {"body": dict(step.body), "attempt": attempt,
                                        "planned_peak_bytes": step.peak_bytes})
            try:
                outcome: RebuildOutcome | None = await self.client.rebuild(
                    step.body, wait_s=self.settings.rebuild_wait_s)
            except EngineTimeout:
                outcome = None  # unknown: the server may still be rebuilding
            after = await self.settle() if outcome is None or outcome.kind in (
                "timeout", "busy_rebuilding") else await self.client.cache_status()
            kind = "lost" if outcome is None else outcome.kind
            self.records.append(StepRecord(
                dict(step.body), kind, 0 if outcome is None else outcome.http_status,
                self.clock.monotonic() - started, step.peak_bytes, after.geometry,
                "" if outcome is None or outcome.error is None else outcome.error))
            self.on_event("step_done", {"body": dict(step.body), "kind": kind,
                                        "after": after.geometry.to_json()})
            if outcome is not None and outcome.kind == "busy_scheduler":
                await self.clock.sleep(delay)
                delay = min(self.settings.backoff_max_s, delay * 2)
                continue
            if outcome is not None and outcome.kind == "loading":
                await self.clock.sleep(delay)
                continue
            return outcome, after
        raise _Stop(f"the server stayed busy through {self.settings.busy_retries} retries")


async def apply_target(client: FtServeClient, target: Callable[[CacheStatus], Geometry], *,
                       settings: ApplySettings | None = None, clock: Clock | None = None,
                       on_event: Callable[[str, dict[str, Any]], None] | None = None,
                       ) -> ApplyResult:
    """Reach `target(live status)` safely, or stop with the reason (see module docstring)."""
    run = _Run(client, settings or ApplySettings(), clock or SystemClock(),
               on_event or (lambda _e, _p: None))
    try:
        status = await client.cache_status()
        await run.check_instance()
    except ClientError as exc:
        return ApplyResult(False, f"cannot read the server: {exc}", _empty_plan())
    except _Stop as stop:
        return ApplyResult(False, stop.reason, _empty_plan(), final=status.geometry,
                           needs_restart=stop.needs_restart)
    run.serves_while_rebuilding = status.engine.serves_while_rebuilding
    model = run.model(status)
    goal = target(status)
    plan = plan_transition(model, status.geometry, goal)
    first_plan = plan
    replans = 0
    if not plan.feasible:
        return ApplyResult(False, plan.reason, plan, final=status.geometry)
    try:
        while True:
            expected = plan.start
            for step in plan.steps:
                try:
                    outcome, status = await run.send(step, expected)
                except _Moved as moved:
                    status = moved.status
                    why = (f"geometry is {status.geometry.to_json()} before a step planned "
                           f"from {expected.to_json()}")
                    break
                expected = step.after
                if outcome is not None and outcome.kind == "failed":
                    raise _Stop(f"the server answered failed: {outcome.error}",
                                needs_restart=outcome.latched)
                if outcome is not None and outcome.kind in ("invalid", "unsupported",
                                                            "unauthorized", "unexpected"):
                    raise _Stop(f"the server refused the step ({outcome.kind}): "
                                f"{outcome.error}")
                if _same(status.geometry, step.after):
                    continue
                # Rejected, or the geometry moved under us: re-plan from what is served.
                why = (f"rejected: {outcome.error}" if outcome is not None
                       and outcome.kind == "rejected" else
                       f"geometry is {status.geometry.to_json()}, expected "
                       f"{step.after.to_json()}")
                break
            else:
                if _same(status.geometry, goal):
                    return ApplyResult(True, plan.reason, first_plan, tuple(run.records),
                                       status.geometry, replans=replans)
                why = "the geometry moved while the plan ran"
            replans += 1
            if replans > run.settings.max_replans:
                raise _Stop(f"gave up after {replans - 1} re-plans; last: {why}")
            run.on_event("replan", {"why": why, "from": status.geometry.to_json()})
            model = run.model(status)
            goal = target(status)
            plan = plan_transition(model, status.geometry, goal)
            if not plan.feasible:
                raise _Stop(f"re-planned after {why}, and the target is now infeasible: "
                            f"{plan.reason}")
    except _Stop as stop:
        return ApplyResult(False, stop.reason, first_plan, tuple(run.records),
                           status.geometry, needs_restart=stop.needs_restart, replans=replans)
    except ClientError as exc:
        return ApplyResult(False, f"lost the server: {exc}", first_plan, tuple(run.records),
                           status.geometry, replans=replans)


def _empty_plan() -> Plan:
    nothing = Geometry(0, 0, 0)
    return Plan(False, "freetoken", 0, nothing, nothing, (), 0, 0, "nothing was planned", 0, 0)
