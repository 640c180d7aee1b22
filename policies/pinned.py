"""The `pinned` policy, the daemon's default: one rung, raised only when demand needs more.

With its default `rung` 0 (the fewest KV tokens, the most expert slots) it is "the lowest
rung that holds live + pending demand": every token not reserved for a request is an expert
slot. That is the default because it decoded fastest of the daemon's policies on the
calibrated replay (30 seeds of four workloads, both engine modes) and on both H200 ladder
records (docs/results.md). Another `rung` pins a rung an operator chose:
for benchmarking a rung, reproducing a report, or a server whose workload is known. Pinning
must not turn into failed requests, so the floor every built-in honours still applies: when
live + pending KV does not fit the pinned rung, the policy asks for the lowest rung that holds
it and says so; it goes back to the pin as soon as demand allows (the controller's dwell and
cooldown keep that from flapping).
"""

from __future__ import annotations

from typing import Any

from policies.api import Decision, LadderView, Observation
from policies.headroom import check_options

__all__ = ["Pinned"]


class Pinned:
    """Option `rung` (default 0): a rung index, 0 = fastest; clamped to the ladder."""

    name = "pinned"

    def __init__(self, *, rung: int = 0, **unknown: Any) -> None:
        check_options(self.name, unknown, ("rung",))
        if isinstance(rung, bool) or not isinstance(rung, int):
            raise ValueError(f"policy 'pinned': option rung must be an integer, got {rung!r}")
        self.rung = rung

    def decide(self, observation: Observation, ladder: LadderView) -> Decision:
        if not ladder.rungs:
            raise ValueError("pinned: the ladder has no rungs")
        top = len(ladder.rungs) - 1
        pin = min(max(self.rung, 0), top)
        clamp = "" if pin == self.rung else f" (option rung {self.rung} clamped to the ladder)"
        floor = observation.demand_kv_tokens
        if ladder.rungs[pin].kv_tokens >= floor:
            return Decision(pin, f"pinned to rung {pin}{clamp}: its "
                                 f"{ladder.rungs[pin].kv_tokens:,} KV tokens hold "
                                 f"{observation.live_kv_tokens:,} live + "
                                 f"{observation.pending_kv_tokens:,} pending")
        raised = ladder.lowest_holding(floor)
        holds = ladder.rungs[raised].kv_tokens >= floor
        return Decision(raised, f"raised from pinned rung {pin}{clamp} to rung {raised}: "
                                f"{observation.live_kv_tokens:,} live + "
                                f"{observation.pending_kv_tokens:,} pending tokens do not fit "
                                f"its {ladder.rungs[pin].kv_tokens:,}"
                                + ("" if holds else "; no rung holds them, top rung"))
