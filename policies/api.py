"""The policy interface: what a policy sees, what it answers. Pure values, no I/O.

A policy is a plain object with one synchronous method, `decide(observation, ladder)`. It is
found through the entry-point group `moe_ladder.policies` (the built-ins register the same
way) or named as `module:attr`; the entry point is a factory called with the policy's own
options table. The controller, not the policy, owns every safeguard (safe timing, cooldown,
dwell, hysteresis, step limits, backoff, circuit breaker), so a policy only says which rung
it would like and why. Time comes in the observation: a policy has no clock of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "Decision",
    "LadderView",
    "Observation",
    "Policy",
    "PolicyFactory",
    "RungView",
]


@dataclass(frozen=True, slots=True)
class RungView:
    """One rung as a policy sees it: its capacity and what it gives to experts."""

    index: int
    kv_tokens: int
    expert_slots: int
    mamba_slots: int


@dataclass(frozen=True, slots=True)
class LadderView:
    """The ladder, lowest KV (fastest decode) first; `transition_s` estimates a step's cost."""

    rungs: tuple[RungView, ...]
    transition_s: float = 1.0

    def lowest_holding(self, kv_tokens: int) -> int:
        """Index of the lowest rung whose KV holds `kv_tokens`; the top rung when none does."""
        for rung in self.rungs:
            if rung.kv_tokens >= kv_tokens:
                return rung.index
        return self.rungs[-1].index


@dataclass(frozen=True, slots=True)
class Observation:
    """What the controller saw at `now_s` (monotonic seconds).

    `live_kv_tokens`: KV the requests the server has accepted hold or will hold: the larger
    of its used pages and, behind the gate, prompt + max_tokens of every request forwarded
    and not yet answered (one queued inside the server has no page yet). `pending_kv_tokens`:
    the largest prompt + max_tokens among requests the gate holds (its demand).
    `decode_tps_by_rung`: measured aggregate decode tokens/s per rung index, as
    (tokens/s, seconds measured). `recent_request_tokens`: sizes of finished requests,
    newest last.
    """

    now_s: float
    rung: int | None
    live_kv_tokens: int
    pending_kv_tokens: int
    active_requests: int
    decode_tps: float | None
    state: str = "serving"
    decode_tps_by_rung: Mapping[int, tuple[float, float]] = field(default_factory=dict)
    recent_request_tokens: tuple[int, ...] = ()

    @property
    def demand_kv_tokens(self) -> int:
        """KV that must fit now: every running request plus the largest one waiting to be
        admitted; summed, not maxed, because the waiting one is admitted beside the running
        ones. The one meaning of "demand": the built-in policies never choose a rung below it,
        and the safeguards raise any decision to a rung that holds it."""
        return max(0, self.live_kv_tokens) + max(0, self.pending_kv_tokens)


@dataclass(frozen=True, slots=True)
class Decision:
    """The rung the policy wants and a reason a person can read."""

    rung: int
    reason: str


@runtime_checkable
class Policy(Protocol):
    """One selected implementation; state, if any, lives on the instance."""

    name: str

    def decide(self, observation: Observation, ladder: LadderView) -> Decision: ...


class PolicyFactory(Protocol):
    """What an entry point loads: called with the `[policy.<name>]` options table."""

    def __call__(self, **options: Any) -> Policy: ...
