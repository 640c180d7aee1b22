"""The controller's safeguards, shared by every policy: a pure state machine, time passed in.

A policy only says which rung it would like. Whether the daemon acts on it now is decided
here, once, so a third-party policy cannot flap a server, storm it with retries or rebuild it
while its observations are failing: the daemon never makes a server worse than it found it.
The vocabulary is Kubernetes HPA's and KEDA's.

Checks, in order; the first that applies decides:

1. Target. The wanted rung is clamped to the ladder and raised to the lowest rung holding
   `demand_kv_tokens` (a policy can be wrong; a request must not fail for it). A step down is
   the hysteresis band's business: it goes only as low as a rung whose capacity exceeds demand
   by `down_tolerance` (demand <= kv_tokens * (1 - down_tolerance)), so demand hovering at a
   rung's edge does not step the server down and straight back up. If that leaves the
   current rung, hold.
2. Fallback: after `fallback_after_failed_reads` consecutive failed observations, hold until
   `reads_to_recover` consecutive good ones (KEDA's fallback; SGLang's success threshold).
   Observations that just failed are no basis for a rebuild, even a needed one.
3. Circuit breaker: `breaker_failures` consecutive failed transitions open it for
   `breaker_open_s`; then it is half-open and admits one trial, whose outcome closes or
   reopens it. Open blocks every transition, a needed step up included: an engine whose
   rebuilds keep failing is made worse by more rebuilds, and the gate keeps the oversized
   request queued rather than failing it.
4. Backoff after a failed transition: `backoff_base_s * 2**(n-1)`, at most `backoff_max_s`,
   for the n-th consecutive failure (no retry storm, needed or not).
5. A step up needed to hold demand (current rung too small, or the rung is unknown: the
   geometry is off the ladder) goes now: it bypasses the rest (grow fast).
6. Hourly cap: at most `max_transitions_per_hour` transitions in any sliding hour.
7. Cooldown: `cooldown_s` since the last transition ended.
8. Dwell, for a step down only: `min_dwell_s` on the current rung (counted from the
   transition that reached it, or from when the controller first saw it there). A voluntary
   step up (the policy wants more margin than demand needs yet) waits for cooldown and the
   hourly cap but not for dwell: grow fast, shrink slowly, as HPA's zero scale-up window.

"Now" only moves forward through the calls; `snapshot()` reports the state as of the last
call, with HPA-style conditions for /status.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Literal

from ladder.knobs import check_knobs, check_order, knob
from ladder.parsers import ratio, seconds, whole
from policies.api import Decision, LadderView

__all__ = [
    "Condition",
    "SafeguardSettings",
    "SafeguardSnapshot",
    "Safeguards",
    "Verdict",
]

HOUR_S = 3600.0

BreakerState = Literal["closed", "open", "half-open"]
ConditionStatus = Literal["True", "False", "Unknown"]


@dataclass(frozen=True, slots=True)
class SafeguardSettings:
    """The `[safeguards]` table of the config; the checks above say how each is used."""

    cooldown_s: float = knob(60.0, seconds(), "Least time between two transitions, seconds.")
    min_dwell_s: float = knob(120.0, seconds(), "Least time on a rung before shrinking off it, "
                              "seconds.")
    down_tolerance: float = knob(
        0.10, ratio(low=0.0, high=1.0, low_open=False, high_open=True),
        "No shrink while the demand is within this fraction of the current rung; in [0, 1).")
    max_transitions_per_hour: int = knob(12, whole(minimum=1), "Rate limit on transitions, "
                                         ">= 1.")
    backoff_base_s: float = knob(5.0, seconds(), "First wait after a failed transition, "
                                 "seconds; doubles per failure.")
    backoff_max_s: float = knob(300.0, seconds(), "Ceiling of that wait, seconds, >= "
                                "`backoff_base_s`.")
    breaker_failures: int = knob(5, whole(minimum=1), "Consecutive failed transitions that "
                                 "open the circuit breaker (stop mutating), >= 1.")
    breaker_open_s: float = knob(600.0, seconds(), "How long the breaker stays open before one "
                                 "trial transition, seconds.")
    fallback_after_failed_reads: int = knob(
        3, whole(minimum=1), "Consecutive failed status reads after which the controller holds "
        "(no decisions), >= 1.")
    reads_to_recover: int = knob(2, whole(minimum=1), "Consecutive good status reads that end "
                                 "that hold, >= 1.")

    def __post_init__(self) -> None:
        check_knobs(self)
        check_order(self, "backoff_base_s", "backoff_max_s")


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether to transition now, to which rung, and why.

    `code` is a fixed vocabulary for metric labels and tests: `go`, `needed`, `same_rung`,
    `hysteresis`, `fallback`, `breaker_open`, `backoff`, `hourly_cap`, `cooldown`, `dwell`,
    `no_rungs`.
    """

    allowed: bool
    rung: int
    reason: str
    code: str = "go"


@dataclass(frozen=True, slots=True)
class Condition:
    """One HPA-style status condition."""

    type: str
    status: ConditionStatus
    reason: str
    message: str
    last_transition_s: float | None


@dataclass(frozen=True, slots=True)
class SafeguardSnapshot:
    as_of_s: float | None
    breaker: BreakerState
    breaker_open_until_s: float | None
    consecutive_failures: int
    backoff_until_s: float | None
    consecutive_failed_reads: int
    holding_for_reads: bool
    transitions_last_hour: int
    last_transition_s: float | None
    rung: int | None
    rung_since_s: float | None
    last_verdict: Verdict | None
    conditions: tuple[Condition, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Safeguards:
    """One server's safeguards; the controller calls `admit` once per decision."""

    def __init__(self, settings: SafeguardSettings | None = None) -> None:
        self.settings = settings or SafeguardSettings()
        self._now_s: float | None = None
        self._transitions_s: deque[float] = deque()
        self._last_transition_s: float | None = None
        self._failures = 0
        self._last_failure_s: float | None = None
        self._open_until_s: float | None = None
        self._failed_reads = 0
        self._good_reads = 0
        self._holding = False
        self._reads_seen = False
        self._rung: int | None = None
        self._rung_since_s: float | None = None
        self._arrived_s: float | None = None  # a transition just ended: its rung dates from it
        self._last_verdict: Verdict | None = None
        self._conditions: dict[str, Condition] = {}
        self._refresh()

    # ---- time and derived state ---------------------------------------------------------

    def _tick(self, now_s: float) -> float:
        # A clock step backwards must not reopen windows; treat it as no time passing.
        if self._now_s is None or now_s > self._now_s:
            self._now_s = now_s
        cutoff = self._now_s - HOUR_S
        while self._transitions_s and self._transitions_s[0] <= cutoff:
            self._transitions_s.popleft()
        return self._now_s

    def breaker_state(self, now_s: float | None = None) -> BreakerState:
        now = self._now_s if now_s is None else now_s
        if self._open_until_s is None:
            return "closed"
        return "open" if now is not None and now < self._open_until_s else "half-open"

    def backoff_until_s(self) -> float | None:
        if self._failures == 0 or self._last_failure_s is None:
            return None
        s = self.settings
        delay = min(s.backoff_base_s * 2.0 ** (self._failures - 1), s.backoff_max_s)
        return self._last_failure_s + delay

    # ---- inputs -------------------------------------------------------------------------

    def record_read(self, now_s: float, ok: bool) -> None:
        """One observation of the server, successful or not."""
        self._tick(now_s)
        self._reads_seen = True
        s = self.settings
        if ok:
            self._failed_reads = 0
            self._good_reads += 1
            if self._holding and self._good_reads >= s.reads_to_recover:
                self._holding = False
        else:
            self._good_reads = 0
            self._failed_reads += 1
            if self._failed_reads >= s.fallback_after_failed_reads:
                self._holding = True
        self._refresh()

    def record_transition(self, now_s: float, ok: bool) -> None:
        """A transition the controller attempted has ended (reached its rung or not)."""
        now = self._tick(now_s)
        self._transitions_s.append(now)
        self._last_transition_s = now
        if ok:
            self._failures = 0
            self._last_failure_s = None
            self._open_until_s = None
            self._arrived_s = now
        else:
            half_open = self.breaker_state(now) == "half-open"
            self._failures += 1
            self._last_failure_s = now
            if half_open or self._failures >= self.settings.breaker_failures:
                self._open_until_s = now + self.settings.breaker_open_s
        self._refresh()

    def _see_rung(self, now: float, rung: int | None) -> None:
        if rung != self._rung or self._rung_since_s is None:
            self._rung = rung
            self._rung_since_s = self._arrived_s if self._arrived_s is not None else now
        self._arrived_s = None

    # ---- the decision -------------------------------------------------------------------

    def admit(self, now_s: float, current_rung: int | None, wanted: Decision,
              demand_kv_tokens: int, ladder: LadderView) -> Verdict:
        """May the controller move from `current_rung` towards `wanted.rung` now?"""
        now = self._tick(now_s)
        verdict = self._admit(now, current_rung, wanted, max(0, demand_kv_tokens), ladder)
        self._last_verdict = verdict
        self._refresh()
        return verdict

    def _admit(self, now: float, current: int | None, wanted: Decision, demand: int,
               ladder: LadderView) -> Verdict:
        s = self.settings
        n = len(ladder.rungs)
        if n == 0:
            return Verdict(False, current if current is not None else 0,
                           "the ladder has no rungs", "no_rungs")
        if current is not None and not 0 <= current < n:
            current = None
        self._see_rung(now, current)
        notes: list[str] = []
        target = min(max(wanted.rung, 0), n - 1)
        if target != wanted.rung:
            notes.append(f"policy's rung {wanted.rung} clamped to {target}")
        floor = ladder.lowest_holding(demand)
        if target < floor:
            notes.append(f"raised from rung {target}: it does not hold {demand:,} tokens")
            target = floor
        needed = current is None or ladder.rungs[current].kv_tokens < demand
        if current is not None and target < current:
            proposed = target
            spare = 1.0 - s.down_tolerance
            while target < current and demand > ladder.rungs[target].kv_tokens * spare:
                target += 1
            if target == current:
                return Verdict(False, current, _join(
                    f"hold rung {current}: {demand:,} tokens leave less than "
                    f"{s.down_tolerance:.0%} of rung {proposed}'s "
                    f"{ladder.rungs[proposed].kv_tokens:,} KV tokens spare", notes),
                    "hysteresis")
            if target != proposed:
                notes.append(f"only to rung {target}: rungs {proposed}-{target - 1} would "
                             f"leave less than {s.down_tolerance:.0%} spare")
        if target == current:
            return Verdict(False, current, _join(f"stay on rung {current}", notes), "same_rung")
        hold = current if current is not None else target
        if self._holding:
            return Verdict(False, hold, _join(
                f"hold: observations failing ({self._failed_reads} in a row) or not yet "
                f"{s.reads_to_recover} good in a row", notes), "fallback")
        breaker = self.breaker_state(now)
        if breaker == "open":
            assert self._open_until_s is not None
            return Verdict(False, hold, _join(
                f"hold: circuit open after {self._failures} failed transitions, for "
                f"{self._open_until_s - now:.0f} s more", notes), "breaker_open")
        backoff = self.backoff_until_s()
        if backoff is not None and now < backoff:
            return Verdict(False, hold, _join(
                f"hold: backing off {backoff - now:.0f} s more after {self._failures} failed "
                f"transition(s)", notes), "backoff")
        trial = " (half-open trial)" if breaker == "half-open" else ""
        move = f"rung {current} -> {target}" if current is not None else f"to rung {target}"
        if needed and (current is None or target > current):
            why = ("the live geometry is not on the ladder" if current is None else
                   f"rung {current} ({ladder.rungs[current].kv_tokens:,} KV tokens) does not "
                   f"hold {demand:,} tokens")
            return Verdict(True, target, _join(f"{move} now{trial}: {why}", notes), "needed")
        recent = len(self._transitions_s)
        if recent >= s.max_transitions_per_hour:
            return Verdict(False, hold, _join(
                f"hold: {recent} transitions in the last hour (limit "
                f"{s.max_transitions_per_hour})", notes), "hourly_cap")
        if self._last_transition_s is not None and now - self._last_transition_s < s.cooldown_s:
            return Verdict(False, hold, _join(
                f"hold: cooling down, {s.cooldown_s - (now - self._last_transition_s):.0f} s "
                f"left of {s.cooldown_s:.0f} s", notes), "cooldown")
        assert self._rung_since_s is not None
        on_for_s = now - self._rung_since_s
        if current is not None and target < current and on_for_s < s.min_dwell_s:
            return Verdict(False, hold, _join(
                f"hold: on rung {current} for {on_for_s:.0f} s of the {s.min_dwell_s:.0f} s "
                f"minimum dwell", notes), "dwell")
        return Verdict(True, target, _join(f"{move}{trial}", notes), "go")

    # ---- /status ------------------------------------------------------------------------

    def _set(self, type_: str, status: ConditionStatus, reason: str, message: str) -> None:
        old = self._conditions.get(type_)
        since = old.last_transition_s if old is not None and old.status == status else self._now_s
        self._conditions[type_] = Condition(type_, status, reason, message, since)

    def _refresh(self) -> None:
        s = self.settings
        now = self._now_s
        breaker = self.breaker_state()
        backoff = self.backoff_until_s()
        if breaker == "open":
            self._set("AbleToResize", "False", "CircuitOpen",
                      f"{self._failures} consecutive failed transitions; open until "
                      f"{self._open_until_s:.0f} s")
        elif backoff is not None and now is not None and now < backoff:
            self._set("AbleToResize", "False", "BackoffAfterFailure",
                      f"{self._failures} consecutive failed transition(s); retry after "
                      f"{backoff:.0f} s")
        elif self._holding:
            self._set("AbleToResize", "False", "HoldingForObservations",
                      "no transitions until observations succeed again")
        elif breaker == "half-open":
            self._set("AbleToResize", "True", "CircuitHalfOpen",
                      "the next transition is a trial: success closes the circuit")
        else:
            self._set("AbleToResize", "True", "ReadyForNewResize", "transitions allowed")
        if not self._reads_seen:
            self._set("ObservationsValid", "Unknown", "NoObservations", "no observation yet")
        elif self._holding:
            self._set("ObservationsValid", "False", "FailedReads",
                      f"{self._failed_reads} consecutive failed observations "
                      f"(fallback after {s.fallback_after_failed_reads}); holding until "
                      f"{s.reads_to_recover} good in a row")
        elif self._failed_reads:
            self._set("ObservationsValid", "True", "RecentFailedReads",
                      f"{self._failed_reads} consecutive failed observation(s)")
        else:
            self._set("ObservationsValid", "True", "ValidObservations", "last observation ok")
        v = self._last_verdict
        if v is None:
            self._set("TargetLimited", "Unknown", "NoDecision", "no decision yet")
        elif v.code in ("go", "needed", "same_rung"):
            self._set("TargetLimited", "False", "DesiredWithinLimits", v.reason)
        else:
            self._set("TargetLimited", "True", _camel(v.code), v.reason)

    def snapshot(self) -> SafeguardSnapshot:
        return SafeguardSnapshot(
            as_of_s=self._now_s, breaker=self.breaker_state(),
            breaker_open_until_s=self._open_until_s, consecutive_failures=self._failures,
            backoff_until_s=self.backoff_until_s(), consecutive_failed_reads=self._failed_reads,
            holding_for_reads=self._holding, transitions_last_hour=len(self._transitions_s),
            last_transition_s=self._last_transition_s, rung=self._rung,
            rung_since_s=self._rung_since_s, last_verdict=self._last_verdict,
            conditions=tuple(self._conditions.values()))

    def snapshot_json(self) -> dict[str, Any]:
        return self.snapshot().to_json()


def _join(head: str, notes: list[str]) -> str:
    return head if not notes else f"{head} ({'; '.join(notes)})"


def _camel(code: str) -> str:
    return "".join(part.capitalize() for part in code.split("_"))
