"""The control loop for one server: observe, ask the policy, pass the safeguards, step.

Everything that decides is pure and lives elsewhere (policies, `ladder.safeguards`, the
planner); this module only sequences I/O around it: one observation per poll (`/health`,
`/v1/cache/status`, `/v1/stats`, `/v1/requests`), one transition at a time through the same
executor as `ladder apply`. It also implements the gate's `CapacityController` protocol, so a
request too large for the live rung wakes the loop at once instead of waiting for the poll.

State kept here survives nothing on purpose: after a daemon restart the loop starts from the
live geometry, whatever the last run left behind.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engine.ftserve.budget import MemoryModel
from engine.ftserve.geometry import CacheStatus, Geometry
from engine.ftserve.wire import RequestEntry
from ladder.client import ClientError, FtServeClient, Unauthorized
from ladder.clock import Clock, SystemClock
from ladder.executor import ApplyResult, ApplySettings, apply_target
from ladder.gate import ChangeNotifier
from ladder.knobs import check_knobs, knob
from ladder.logs import LogSettings, LogThrottle
from ladder.metrics import DaemonMetrics
from ladder.parsers import seconds
from ladder.rungs import Ladder, LadderSpec, build_ladder, small_budget_hint
from ladder.safeguards import Safeguards
from policies.api import Decision, LadderView, Observation, Policy

__all__ = ["ControlSettings", "ServerController", "TransitionRecord", "transition_cost_s"]

log = logging.getLogger(__name__)

# How long a satisfied capacity request still counts as demand: long enough for the gate to
# forward the held request and the server to admit it (then it shows as live KV). Stepping
# down needs the policy's dwell on top, so clearing it early cannot strand the request.
_PENDING_GRACE_S = 2.0


# How many of the latest reached transitions price the next one: enough that one slow step
# (a cold start, a step that waited for an idle moment) does not set the price alone.
_PRICED_TRANSITIONS = 8


@dataclass(frozen=True, slots=True)
class ControlSettings:
    """The loop's knobs; the `[control]` table holds them beside `ApplySettings`'."""

    poll_s: float = knob(2.0, seconds(positive=True), "Control-loop tick: how often each server "
                         "is observed, seconds, > 0.", flag="--poll-s")
    transition_estimate_s: float = knob(
        1.0, seconds(), f"What policies assume a transition costs, seconds, until the server "
        f"has reached one; then the median wall time of its latest {_PRICED_TRANSITIONS} "
        f"reached transitions.")
    history_requests: int = 64

    def __post_init__(self) -> None:
        check_knobs(self)


@dataclass(frozen=True, slots=True)
class TransitionRecord:
    started_s: float
    seconds: float
    from_rung: int | None
    to_rung: int
    reason: str
    reached: bool
    result: dict[str, Any]


@dataclass
class _Measured:
    """Decode tokens/s per rung, from the server's completion-token counter."""

    tokens: dict[int, float] = field(default_factory=dict)
    seconds: dict[int, float] = field(default_factory=dict)

    def add(self, rung: int, tokens: float, seconds: float) -> None:
        self.tokens[rung] = self.tokens.get(rung, 0.0) + tokens
        self.seconds[rung] = self.seconds.get(rung, 0.0) + seconds

    def view(self) -> dict[int, tuple[float, float]]:
        return {r: (self.tokens[r] / s, s) for r, s in self.seconds.items() if s > 0}


def transition_cost_s(records: Iterable[TransitionRecord], prior_s: float) -> float:
    """What the next transition is expected to cost: the median wall time of the latest
    reached ones, `prior_s` before any (policies weigh a step's gain against it)."""
    reached = [r.seconds for r in records if r.reached][-_PRICED_TRANSITIONS:]
    return statistics.median(reached) if reached else prior_s


class ServerController:
    """One server's loop; several run side by side in one daemon (one TaskGroup)."""

    def __init__(self, name: str, client: FtServeClient, policy: Policy, safeguards: Safeguards,
                 *, spec: LadderSpec, settings: ControlSettings | None = None,
                 apply_settings: ApplySettings | None = None, log: LogSettings | None = None,
                 clock: Clock | None = None, metrics: DaemonMetrics | None = None,
                 policy_name: str = "") -> None:
        self.name = name
        self.client = client
        self.policy = policy
        self.policy_name = policy_name or getattr(policy, "name", type(policy).__name__)
        self.safeguards = safeguards
        self.spec = spec
        self.settings = settings or ControlSettings()
        # Plans are priced against this server's budget, whatever settings came in.
        self.apply_settings = replace(apply_settings or ApplySettings(),
                                      fixed_bytes=spec.fixed_bytes,
                                      reserve_bytes=spec.reserve_bytes)
        self.clock = clock or SystemClock()
        self.metrics = metrics or DaemonMetrics()
        self.status: CacheStatus | None = None
        self.model: MemoryModel | None = None
        self.ladder: Ladder | None = None
        self.instance_id: str | None = None
        self.rung: int | None = None
        self.live_kv_tokens = 0
        self.active_requests = 0
        self.decode_tps: float | None = None
        self.pending_kv_tokens = 0
        self.last_decision: Decision | None = None
        self.last_verdict: str = ""
        self.last_observation_s: float | None = None
        self.last_error: str | None = None
        self.transitions: deque[TransitionRecord] = deque(maxlen=32)
        self.request_sizes: deque[int] = deque(maxlen=self.settings.history_requests)
        self._cursor: int | None = None
        self._measured = _Measured()
        self._last_tokens: tuple[float, float, int | None] | None = None
        self._log = LogThrottle(repeat_s=(log or LogSettings()).repeat_s)
        self._transitioning = False
        self._wake = asyncio.Event()
        self._changed = ChangeNotifier()
        self.model_ctx_tokens: int | None = None
        self._pending_since_s = 0.0
        # Called with each new page of the server's request log (the gate learns from it).
        self.request_log_listeners: list[Callable[[Sequence[RequestEntry]], object]] = []
        # KV tokens of the requests the gate forwarded and the server has not answered
        # (`Gate.forwarded_kv_tokens`); with no gate, only the server's used pages count.
        self.forwarded_kv_tokens: Callable[[], int] = lambda: 0
        self.used_kv_tokens = 0

    # ---- the gate's CapacityController protocol -----------------------------------------

    def _ctx_cap(self, kv_tokens: int) -> int:
        # ft serve admits min(model ctx, KV tokens) per sequence (engine.py:701-703).
        return kv_tokens if self.model_ctx_tokens is None else min(kv_tokens,
                                                                   self.model_ctx_tokens)

    def capacity_tokens(self) -> int:
        if self.status is None:
            return 0
        g = self.status.geometry
        return self._ctx_cap(g.num_pages * self.status.shape.page_size)

    def max_capacity_tokens(self) -> int:
        if self.ladder is None or not self.ladder.rungs:
            return self.capacity_tokens()
        return self._ctx_cap(max(self.ladder.top.kv_tokens, self.capacity_tokens()))

    async def request_capacity(self, tokens: int) -> None:
        if tokens > self.pending_kv_tokens:
            self.pending_kv_tokens = tokens
        self._pending_since_s = self.clock.monotonic()
        self._wake.set()

    def transition_running(self) -> bool:
        return self._transitioning

    async def wait_changed(self, timeout_s: float) -> None:
        await self._changed.wait(timeout_s)

    def _notify(self) -> None:
        self._changed.notify()

    # ---- observation -----------------------------------------------------------------

    def ladder_view(self) -> LadderView:
        assert self.ladder is not None
        return self.ladder.view(transition_cost_s(self.transitions,
                                                  self.settings.transition_estimate_s))

    def _rebuild_ladder(self, status: CacheStatus, model_ctx_tokens: int | None) -> None:
        self.model = MemoryModel.from_status(status, fixed_bytes=self.spec.fixed_bytes,
                                             reserve_bytes=self.spec.reserve_bytes)
        spec = self.spec
        if model_ctx_tokens is not None and (spec.kv_max_tokens is None
                                             or spec.kv_max_tokens > model_ctx_tokens):
            # No rung needs more KV than one sequence of the model's context can use.
            spec = replace(spec, kv_max_tokens=max(model_ctx_tokens, spec.kv_floor_tokens))
        self.ladder = build_ladder(self.model, status.geometry, spec)
        self._measured = _Measured()
        log.info("ladder built", extra={"server": self.name, "rungs": len(self.ladder.rungs),
                                        "instance": self.instance_id})
        hint = small_budget_hint(self.ladder, spec)
        if hint is not None:
            log.warning("small ladder", extra={"server": self.name,
                                               "hint": hint.message(len(self.ladder.rungs))})

    def _place(self, geometry: Geometry) -> int | None:
        return None if self.ladder is None else self.ladder.index_of(geometry)

    async def observe(self) -> Observation | None:
        now = self.clock.monotonic()
        try:
            health = await self.client.health()
            status = await self.client.cache_status()
            stats = await self.client.stats()
            log_page = await self.client.requests(since=self._cursor, limit=100)
        except ClientError as exc:
            self.last_error = str(exc)
            self.safeguards.record_read(now, ok=False)
            self.metrics.read_failures.labels(self.name).inc()
            held = self._log.warning("observe", str(exc), now)
            if held is not None:
                hint = ({"hint": "the server wants an API key: set api_key_env (or api_key) "
                                 "for this server, or --api-key"}
                        if isinstance(exc, Unauthorized) else {})
                log.warning("observation failed", extra={"server": self.name, "error": str(exc),
                                                         "repeats_not_logged": held, **hint})
            return None
        self.safeguards.record_read(now, ok=True)
        self.last_error = None
        if self._log.clear("observe"):
            log.info("observation recovered", extra={"server": self.name})
        if health.instance_id != self.instance_id:
            if self.instance_id is not None:
                log.warning("server restarted", extra={"server": self.name,
                                                       "old": self.instance_id,
                                                       "new": health.instance_id})
            self.instance_id = health.instance_id
            self._cursor = None
            self._rebuild_ladder(status, stats.model_ctx)
        self.status = status
        self.rung = self._place(status.geometry)
        self._cursor = log_page.next_cursor
        for listener in self.request_log_listeners:
            listener(log_page.entries)
        for entry in log_page.entries:
            if entry.prompt_tokens is not None:
                self.request_sizes.append(entry.prompt_tokens + (entry.completion_tokens or 0))
        page = status.shape.page_size
        self.used_kv_tokens = (stats.kv.used_pages * page) if stats.kv is not None else 0
        # Read in this synchronous tail of observe(), after the last await: a request the
        # gate forwards later found no transition running, or finds this tick's one and waits.
        self.live_kv_tokens = max(self.used_kv_tokens, self.forwarded_kv_tokens())
        self.active_requests = stats.requests_active or 0
        if (self.pending_kv_tokens and self.capacity_tokens() >= self.pending_kv_tokens
                and now - self._pending_since_s > _PENDING_GRACE_S):
            # The held request was forwarded long enough ago to show up as live demand.
            self.pending_kv_tokens = 0
        self.decode_tps = stats.decode_tps
        self.model_ctx_tokens = stats.model_ctx
        self._measure(now, stats.completion_tokens_total)
        self.last_observation_s = now
        assert self.model is not None
        assert self.ladder is not None
        self.metrics.observe_geometry(self.name, self.model, status.geometry, self.rung,
                                      len(self.ladder.rungs))
        self.metrics.observe_stats(self.name, stats)
        self._notify()
        return Observation(now_s=now, rung=self.rung, live_kv_tokens=self.live_kv_tokens,
                           pending_kv_tokens=self.pending_kv_tokens,
                           active_requests=self.active_requests, decode_tps=self.decode_tps,
                           state=status.state, decode_tps_by_rung=self._measured.view(),
                           recent_request_tokens=tuple(self.request_sizes))

    def _measure(self, now: float, completion_total: int | None) -> None:
        if completion_total is None:
            return
        last = self._last_tokens
        self._last_tokens = (now, float(completion_total), self.rung)
        if last is None or last[2] is None or last[2] != self.rung:
            return
        tokens = completion_total - last[1]
        if tokens > 0:  # time spent idle says nothing about a rung's speed
            self._measured.add(self.rung, tokens, now - last[0])

    # ---- one iteration ---------------------------------------------------------------

    async def tick(self) -> None:
        obs = await self.observe()
        if obs is None or self.ladder is None or not self.ladder.rungs:
            self._notify()
            return
        view = self.ladder_view()
        decision = self.policy.decide(obs, view)
        self.last_decision = decision
        verdict = self.safeguards.admit(obs.now_s, obs.rung, decision, obs.demand_kv_tokens,
                                        view)
        self.last_verdict = verdict.reason
        self.metrics.decisions.labels(self.name, self.policy_name,
                                      "go" if verdict.allowed else "hold").inc()
        # The reason's figures move every tick; the line is news when the outcome changes.
        held = self._log.state("decision", (obs.rung, decision.rung, verdict.allowed,
                                            verdict.code), obs.now_s)
        if held is not None:
            log.info("decision", extra={"server": self.name, "rung": obs.rung,
                                        "wanted": decision.rung, "reason": decision.reason,
                                        "allowed": verdict.allowed, "verdict": verdict.reason,
                                        "unchanged_not_logged": held})
        if verdict.allowed and verdict.rung != obs.rung:
            await self.transition(verdict.rung, decision.reason)
        self._notify()

    async def transition(self, to_rung: int, reason: str) -> ApplyResult:
        assert self.ladder is not None
        assert self.model is not None
        target = self.ladder.rungs[to_rung].geometry
        from_rung = self.rung
        started = self.clock.monotonic()
        self._transitioning = True
        self._notify()
        try:
            result = await apply_target(self.client, lambda _s: target,
                                        settings=self.apply_settings, clock=self.clock,
                                        on_event=self._on_step)
            # Re-read the truth before the gate relies on the new capacity.
            await self.observe()
            if self.capacity_tokens() >= self.pending_kv_tokens:
                self.pending_kv_tokens = 0  # the gate forwards it now; it becomes live demand
        finally:
            self._transitioning = False
            self._notify()
        seconds = self.clock.monotonic() - started
        now = self.clock.monotonic()
        self.safeguards.record_transition(now, ok=result.reached)
        direction = "up" if from_rung is None or to_rung > from_rung else "down"
        self.metrics.transitions.labels(self.name, direction,
                                        "reached" if result.reached else "failed").inc()
        self.metrics.transition_seconds.labels(self.name).observe(seconds)
        self.metrics.planned_peak_bytes.labels(self.name).set(result.plan.peak_bytes)
        observed = [self.model.total_bytes(s.after) for s in result.steps if s.after is not None]
        if observed:
            self.metrics.observed_peak_bytes.labels(self.name).set(max(observed))
        for step in result.steps:
            self.metrics.rebuild_calls.labels(self.name, step.kind).inc()
        record = TransitionRecord(started, seconds, from_rung, to_rung, reason, result.reached,
                                  result.to_json())
        self.transitions.append(record)
        log.info("transition", extra={"server": self.name, "from": from_rung, "to": to_rung,
                                      "reached": result.reached, "seconds": round(seconds, 3),
                                      "why": result.reason})
        return result

    def _on_step(self, event: str, payload: dict[str, Any]) -> None:
        log.info("step", extra={"server": self.name, "event": event, **payload})

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until `stop` is set; a gate's request for capacity cuts the wait short."""
        while not stop.is_set():
            self._wake.clear()
            await self.tick()
            if stop.is_set():
                break
            waiter = asyncio.ensure_future(self._wake.wait())
            stopper = asyncio.ensure_future(stop.wait())
            sleeper = asyncio.ensure_future(self.clock.sleep(self.settings.poll_s))
            try:
                await asyncio.wait({waiter, stopper, sleeper},
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (waiter, stopper, sleeper):
                    task.cancel()

    # ---- /status -----------------------------------------------------------------------

    def status_json(self) -> dict[str, Any]:
        ladder = self.ladder
        return {
            "name": self.name, "url": self.client.base_url, "instance_id": self.instance_id,
            "policy": self.policy_name, "rung": self.rung,
            "geometry": None if self.status is None else self.status.geometry.to_json(),
            "state": None if self.status is None else self.status.state,
            "live_kv_tokens": self.live_kv_tokens, "used_kv_tokens": self.used_kv_tokens,
            "pending_kv_tokens": self.pending_kv_tokens,
            "active_requests": self.active_requests, "decode_tps": self.decode_tps,
            "ladder": [] if ladder is None else [r.to_json() for r in ladder.rungs],
            "dropped_rungs": [] if ladder is None else [
                {"kv_tokens": d.kv_tokens, "reason": d.reason} for d in ladder.dropped],
            "last_decision": None if self.last_decision is None else {
                "rung": self.last_decision.rung, "reason": self.last_decision.reason,
                "verdict": self.last_verdict},
            "last_transition": None if not self.transitions else _record_json(
                self.transitions[-1]),
            "transitioning": self._transitioning,
            "last_error": self.last_error,
            "safeguards": self.safeguards.snapshot_json(),
        }


def _record_json(record: TransitionRecord) -> dict[str, Any]:
    return {"started_s": record.started_s, "from_rung": record.from_rung,
            "to_rung": record.to_rung, "reason": record.reason,
            "reached": record.reached, "seconds": round(record.seconds, 3),
            "steps": record.result["steps"], "result": record.result["reason"]}
