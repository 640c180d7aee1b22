"""The `throughput` policy: step down to a faster rung only when the step pays for itself.

A transition is not free: every rebuild cold-starts the expert cache (64-160 tokens of
warm-up plus the refill) and on ft serve refuses requests for about a second (README,
Verified against ft serve: rebuilds of 0.5-1 s). Stepping down after a fixed dwell, as
`headroom` does, pays that price even when the lower rung is barely faster (expert slots
already capped) or the demand is about to come back. This policy prices the trade in decoded
tokens instead:

    tps(r)         measured decode tokens/s on rung r when it was measured for at least
                   `min_measured_s`, else a prior (below)
    stay_s(r)      min(time since demand last exceeded rung r, `max_stay_s`): demand that has
                   stayed below r for T seconds is expected to stay about T more (Lindy)
    gain(r)        (tps(r) - tps(current)) * stay_s(r)            tokens won on rung r
    cost           tps(current) * ladder.transition_s * `payback_factor`   tokens lost

It steps down to the rung with the largest `gain(r) - cost` among those with
`gain(r) >= cost`, and otherwise stays. It steps up at once, but never above what the demand
rule needs (the `headroom` rule: `max(live, pending) * (1 + margin) + growth_tokens`, at
least live + pending), and it never goes below that rule.

The prior says a lower rung is at least as fast as any rung above it (more expert slots, the
same live context): an unmeasured rung gets the speed of the nearest measured rung (or the
current rung's speed, or 1.0 when nothing is known: only ratios matter) scaled by
`(expert_slots(r) / expert_slots(ref)) ** prior_slot_exponent`, and never less than any
estimate above it. The default exponent 0.75 is the low end of public pairs: FreeToken PR 103
(694 -> 2,074 slots, 65.8 -> 150.2 tok/s: 0.75) and PR 300 (4,627 -> 6,425 slots, 63.0 ->
83.8 tok/s: 0.87). Equal slot counts (capped pools) give no prior gain, so no step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies.api import Decision, LadderView, Observation
from policies.headroom import (
    DemandHistory,
    DemandRule,
    check_options,
    demand_step,
    number_option,
)

__all__ = ["RungSpeed", "Throughput", "estimate_tps"]

_OPTIONS = ("margin", "growth_tokens", "payback_factor", "min_measured_s", "max_stay_s",
            "prior_slot_exponent")


@dataclass(frozen=True, slots=True)
class RungSpeed:
    """Expected decode tokens/s on one rung, and whether it was measured or assumed."""

    tps: float
    measured: bool


def estimate_tps(ladder: LadderView, measured: Mapping[int, tuple[float, float]], *,
                 min_measured_s: float, slot_exponent: float, current: int | None = None,
                 current_tps: float | None = None) -> tuple[RungSpeed, ...]:
    """Per rung, the measured speed where there is enough of it, else the monotone prior."""
    n = len(ladder.rungs)
    known: dict[int, float] = {
        r: tps for r, (tps, seconds) in measured.items()
        if 0 <= r < n and seconds >= min_measured_s and tps > 0}
    anchors = dict(known)
    if not anchors:
        anchor = current if current is not None else n - 1
        anchors[anchor] = current_tps if current_tps is not None and current_tps > 0 else 1.0

    def scaled(r: int) -> float:
        ref = min(anchors, key=lambda a: (abs(a - r), -a))
        slots_ref = max(1, ladder.rungs[ref].expert_slots)
        slots_r = max(1, ladder.rungs[r].expert_slots)
        return float(anchors[ref] * (slots_r / slots_ref) ** slot_exponent)

    speeds: list[RungSpeed] = [RungSpeed(0.0, False)] * n
    fastest_above = 0.0
    for r in reversed(range(n)):
        speed = (RungSpeed(known[r], True) if r in known
                 else RungSpeed(max(scaled(r), fastest_above), False))
        speeds[r] = speed
        fastest_above = max(fastest_above, speed.tps)
    return tuple(speeds)


class Throughput:
    """Fastest expected decode that holds demand, counting what each transition costs."""

    name = "throughput"

    def __init__(self, *, margin: float = 0.0, growth_tokens: int = 8192,
                 payback_factor: float = 2.0, min_measured_s: float = 30.0,
                 max_stay_s: float = 900.0, prior_slot_exponent: float = 0.75,
                 **unknown: Any) -> None:
        check_options(self.name, unknown, _OPTIONS)
        n = self.name
        self.rule = DemandRule(number_option(n, "margin", margin),
                               int(number_option(n, "growth_tokens", growth_tokens,
                                                 integer=True)))
        self.payback_factor = number_option(n, "payback_factor", payback_factor)
        self.min_measured_s = number_option(n, "min_measured_s", min_measured_s)
        self.max_stay_s = number_option(n, "max_stay_s", max_stay_s)
        self.prior_slot_exponent = number_option(n, "prior_slot_exponent", prior_slot_exponent)
        self._history = DemandHistory()

    def expected_stay_s(self, now_s: float, rung: int) -> float:
        return min(self._history.held_for_s(now_s, rung), self.max_stay_s)

    def decide(self, observation: Observation, ladder: LadderView) -> Decision:
        step = demand_step(self.name, self.rule, self._history, observation, ladder)
        if isinstance(step, Decision):
            return step
        now, on, needed, demand = step
        speeds = estimate_tps(ladder, observation.decode_tps_by_rung,
                              min_measured_s=self.min_measured_s,
                              slot_exponent=self.prior_slot_exponent, current=on,
                              current_tps=observation.decode_tps)
        tps_on = speeds[on].tps
        cost = tps_on * ladder.transition_s * self.payback_factor
        best: tuple[float, int, float, float] | None = None
        for r in range(needed, on):
            stay_s = self.expected_stay_s(now, r)
            gain = (speeds[r].tps - tps_on) * stay_s
            # `>` keeps the lowest of equally good rungs: fewer rungs to come back up through.
            if gain >= cost and (best is None or gain - cost > best[0]):
                best = (gain - cost, r, gain, stay_s)
        if best is None:
            r = needed
            return Decision(on, f"stay on rung {on}: rung {r} would hold {demand}, but "
                                f"{self._speed(speeds, r)} vs {self._speed(speeds, on)} over "
                                f"an expected {self.expected_stay_s(now, r):.0f} s does not "
                                f"repay {cost:,.0f} tokens ({self.payback_factor:g}x a "
                                f"{ladder.transition_s:g} s transition)")
        _, r, gain, stay_s = best
        return Decision(r, f"step down to rung {r}: {self._speed(speeds, r)} vs "
                           f"{self._speed(speeds, on)} over an expected {stay_s:.0f} s gains "
                           f"{gain:,.0f} tokens >= {cost:,.0f} ({self.payback_factor:g}x a "
                           f"{ladder.transition_s:g} s transition); holds {demand}")

    @staticmethod
    def _speed(speeds: tuple[RungSpeed, ...], rung: int) -> str:
        s = speeds[rung]
        return f"{s.tps:.1f} tok/s {'measured' if s.measured else 'assumed'}"
