"""The `headroom` policy, and the demand rule every built-in policy honours.

A request must never fail or wait forever because the rung is too small (FreeToken issue 111:
a 200k prompt "queued forever with no error"), while every reserved but unused KV token is an
expert slot lost. So the policy reserves the live demand plus the growth of one agentic turn
(a few thousand tokens): `R = next_rung(live + expected_growth)`. No proportional margin by
default: the ladder's rounding up to the next rung already leaves up to (ratio - 1) of the
demand spare, and a margin on top of it sends long agentic turns a rung higher, to fewer
expert slots (docs/results.md); `margin` remains an option. It steps up at once, and steps down only
once the lower rung has held demand for a whole stabilization window: HPA's scale-down
stabilization, where the target while shrinking is the highest
recommendation over the last `dwell_s`.

`DemandRule`, `DemandHistory` and `check_options` live here because `throughput` and `pinned`
obey the same floor; this module is their common ground, not a base class to inherit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from policies.api import Decision, LadderView, Observation

__all__ = [
    "DemandHistory",
    "DemandRule",
    "Headroom",
    "check_options",
    "demand_step",
    "number_option",
]


def check_options(policy: str, unknown: Mapping[str, Any], known: Iterable[str]) -> None:
    """Fail loudly on option keys a policy does not take (a typo must not pass silently)."""
    if unknown:
        raise ValueError(
            f"policy {policy!r}: unknown option(s) {', '.join(sorted(map(str, unknown)))}; "
            f"it takes {', '.join(sorted(known)) or 'no options'}")


def number_option(policy: str, key: str, value: Any, *, minimum: float = 0.0,
                  integer: bool = False) -> float:
    """A numeric option as TOML gives it; bool is refused even though it is an int."""
    wanted = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"policy {policy!r}: option {key} must be {wanted}, got {value!r}")
    if integer and not isinstance(value, int):
        raise ValueError(f"policy {policy!r}: option {key} must be {wanted}, got {value!r}")
    if not math.isfinite(value) or value < minimum:
        raise ValueError(f"policy {policy!r}: option {key} must be at least {minimum:g}, "
                         f"got {value!r}")
    return float(value)


def current_rung(observation: Observation, ladder: LadderView) -> int | None:
    """The observed rung, or None when it is unknown or not on this ladder (stale index)."""
    rung = observation.rung
    if rung is None or not 0 <= rung < len(ladder.rungs):
        return None
    return rung


@dataclass(frozen=True, slots=True)
class DemandRule:
    """How many KV tokens to reserve: `max(live, pending) * (1 + margin) + growth_tokens`,
    never less than live + pending (`Observation.demand_kv_tokens`)."""

    margin: float = 0.0
    growth_tokens: int = 8192

    def tokens(self, observation: Observation) -> int:
        live = max(0, observation.live_kv_tokens)
        pending = max(0, observation.pending_kv_tokens)
        wanted = math.ceil(max(live, pending) * (1.0 + self.margin)) + self.growth_tokens
        return max(wanted, observation.demand_kv_tokens)

    def rung(self, observation: Observation, ladder: LadderView) -> int:
        """The lowest rung holding `tokens`; the top rung when none does."""
        return ladder.lowest_holding(self.tokens(observation))

    def describe(self, observation: Observation) -> str:
        return (f"{self.tokens(observation):,} tokens ({observation.live_kv_tokens:,} live + "
                f"{observation.pending_kv_tokens:,} pending with {self.margin:.0%} margin and "
                f"{self.growth_tokens:,} growth)")


class DemandHistory:
    """Per rung, since when it has held demand without a break (None: it does not hold now).

    One sample per observation. A rung "holds" a sample when it is at or above the rung the
    demand rule needed. Counting from the first observation that showed the rung holding
    (not from the last one that did not) errs on the side of staying: the drop happened
    somewhere between the two polls. The first sample after a (re)start counts as needing
    the rung the server is on, because nothing is known of the demand before it.
    """

    __slots__ = ("_held_since_s", "_key", "_last_s")

    def __init__(self) -> None:
        self._key: tuple[int, ...] | None = None
        self._last_s: float | None = None
        self._held_since_s: list[float | None] = []

    def update(self, now_s: float, ladder: LadderView, needed: int, on_rung: int | None) -> None:
        key = tuple(r.kv_tokens for r in ladder.rungs)
        # A new ladder (server restart) or time running backwards (another run): start over.
        if key != self._key or self._last_s is None or now_s < self._last_s:
            self._key = key
            self._held_since_s = [None] * len(key)
            needed = max(needed, on_rung if on_rung is not None else needed)
        self._last_s = now_s
        for r in range(len(self._held_since_s)):
            if r < needed:
                self._held_since_s[r] = None
            elif self._held_since_s[r] is None:
                self._held_since_s[r] = now_s

    def held_since_s(self, rung: int) -> float | None:
        return self._held_since_s[rung] if 0 <= rung < len(self._held_since_s) else None

    def held_for_s(self, now_s: float, rung: int) -> float:
        since = self.held_since_s(rung)
        return 0.0 if since is None else max(0.0, now_s - since)



DownStep = tuple[float, int, int, str]


def demand_step(policy: str, rule: DemandRule, history: DemandHistory, observation: Observation,
                ladder: LadderView) -> Decision | DownStep:
    """The part every demand-following policy shares: record demand, and decide at once when
    demand says up or stay. Otherwise return (now_s, current rung, needed rung, demand text)
    for the policy's own step-down rule."""
    if not ladder.rungs:
        raise ValueError(f"{policy}: the ladder has no rungs")
    now = observation.now_s
    on = current_rung(observation, ladder)
    needed = rule.rung(observation, ladder)
    history.update(now, ladder, needed, on)
    demand = rule.describe(observation)
    top = len(ladder.rungs) - 1
    if needed == top and ladder.rungs[top].kv_tokens < rule.tokens(observation):
        return Decision(top, f"top rung: no rung holds {demand}")
    if on is None or needed >= on:
        verb = "stay on" if needed == on else "step up to" if on is not None else "go to"
        return Decision(needed, f"{verb} rung {needed} "
                                f"({ladder.rungs[needed].kv_tokens:,} KV tokens): "
                                f"holds {demand}")
    return now, on, needed, demand

class Headroom:
    """The lowest rung that holds demand plus growth; up at once, down after `dwell_s`.

    Options: `margin` (fraction, default 0), `growth_tokens` (default 8192; lower it for
    chat-only servers whose contexts stay under 4k), `dwell_s` (default 300).
    """

    name = "headroom"

    def __init__(self, *, margin: float = 0.0, growth_tokens: int = 8192,
                 dwell_s: float = 300.0, **unknown: Any) -> None:
        check_options(self.name, unknown, ("margin", "growth_tokens", "dwell_s"))
        self.rule = DemandRule(number_option(self.name, "margin", margin),
                               int(number_option(self.name, "growth_tokens", growth_tokens,
                                                 integer=True)))
        self.dwell_s = number_option(self.name, "dwell_s", dwell_s)
        self._history = DemandHistory()

    def decide(self, observation: Observation, ladder: LadderView) -> Decision:
        step = demand_step(self.name, self.rule, self._history, observation, ladder)
        if isinstance(step, Decision):
            return step
        now, on, needed, demand = step
        # Stepping down: the lowest rung that has held demand for the whole window, which is
        # the highest rung any observation in the window needed.
        for r in range(needed, on):
            held_s = self._history.held_for_s(now, r)
            if held_s >= self.dwell_s:
                return Decision(r, f"step down to rung {r} ({ladder.rungs[r].kv_tokens:,} KV "
                                   f"tokens): it has held demand for {held_s:.0f} s "
                                   f"(dwell {self.dwell_s:.0f} s); now {demand}")
        held_s = self._history.held_for_s(now, needed)
        return Decision(on, f"stay on rung {on}: rung {needed} would hold {demand}, but only "
                            f"for {held_s:.0f} s of the {self.dwell_s:.0f} s dwell")
