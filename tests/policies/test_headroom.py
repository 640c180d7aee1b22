"""The headroom policy: demand with margin, up at once, down after the dwell, never too small.

Time is a float the test advances, so a 300 s stabilization window runs in microseconds.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ladder.rungs import LadderSpec, kv_levels
from policies.api import Decision, LadderView, Observation, Policy, RungView
from policies.headroom import DemandRule, Headroom


def make_ladder(transition_s: float = 1.0) -> LadderView:
    """Geometric rungs 4k..256k; expert slots fall as KV grows, capped at 6,000 low down."""
    levels = kv_levels(LadderSpec(), page_size=64, kv_max_tokens=262144)
    return LadderView(tuple(RungView(i, kv, min(6000, (400_000 - kv) // 50), 0)
                            for i, kv in enumerate(levels)), transition_s=transition_s)


LADDER = make_ladder()
TOP = len(LADDER.rungs) - 1


def obs(now_s: float, live: int, pending: int = 0, rung: int | None = None) -> Observation:
    return Observation(now_s=now_s, rung=rung, live_kv_tokens=live, pending_kv_tokens=pending,
                       active_requests=1 if live or pending else 0, decode_tps=None)


@dataclass(frozen=True)
class Tick:
    now_s: float
    live: int
    pending: int
    on: int | None
    decided: Decision


def simulate(policy: Policy, trace: list[tuple[float, int, int]], start: int | None,
             ladder: LadderView = LADDER) -> list[Tick]:
    """Apply every decision at once (the safeguards are tested on their own)."""
    now, on, ticks = 0.0, start, []
    for dt, live, pending in trace:
        now += dt
        d = policy.decide(obs(now, live, pending, on), ladder)
        ticks.append(Tick(now, live, pending, on, d))
        on = d.rung
    return ticks


def needed_rung(rule: DemandRule, live: int, pending: int, ladder: LadderView = LADDER) -> int:
    """The documented rule, computed independently of the implementation."""
    wanted = -(-max(live, pending) * (100 + round(rule.margin * 100)) // 100)
    tokens = max(wanted + rule.growth_tokens, live + pending)
    return next((r.index for r in ladder.rungs if r.kv_tokens >= tokens), ladder.rungs[-1].index)


tokens = st.integers(0, 320_000)
traces = st.lists(st.tuples(st.floats(0.5, 120.0), tokens,
                            st.one_of(st.just(0), tokens)), min_size=1, max_size=80)
starts = st.one_of(st.none(), st.integers(0, TOP))


# ---- examples ------------------------------------------------------------------------------

def test_reason_names_demand_margin_and_growth() -> None:
    d = Headroom().decide(obs(0.0, 70_000, 0, rung=0), LADDER)
    assert d.rung == needed_rung(DemandRule(), 70_000, 0)
    assert "70,000 live" in d.reason and "0% margin" in d.reason and "8,192 growth" in d.reason
    assert d.reason.startswith("step up to rung")


def test_demand_uses_the_larger_of_live_and_pending_but_never_less_than_their_sum() -> None:
    rule = DemandRule(margin=0.25, growth_tokens=0)
    assert rule.tokens(obs(0, 40_000, 10_000)) == 50_000
    assert rule.tokens(obs(0, 100_000, 100_000)) == 200_000
    assert DemandRule().tokens(obs(0, 0, 0)) == 8192


def test_steps_up_at_once_and_down_only_after_the_dwell() -> None:
    p = Headroom(dwell_s=300)
    high = needed_rung(p.rule, 100_000, 0)
    assert p.decide(obs(0.0, 100_000, 0, rung=0), LADDER).rung == high
    low = needed_rung(p.rule, 1_000, 0)
    assert low < high
    assert p.decide(obs(10.0, 1_000, 0, rung=high), LADDER).rung == high
    stay = p.decide(obs(309.0, 1_000, 0, rung=high), LADDER)
    assert stay.rung == high and "of the 300 s dwell" in stay.reason
    down = p.decide(obs(310.0, 1_000, 0, rung=high), LADDER)
    assert down.rung == low and "step down" in down.reason


def test_window_takes_the_highest_recommendation() -> None:
    p = Headroom(dwell_s=100)
    p.decide(obs(0.0, 150_000, rung=TOP), LADDER)
    mid = needed_rung(p.rule, 50_000, 0)
    p.decide(obs(10.0, 50_000, rung=TOP), LADDER)
    p.decide(obs(60.0, 1_000, rung=TOP), LADDER)
    # At 110 s rung `mid` has held for 100 s, the lowest rung only for 50 s.
    assert p.decide(obs(110.0, 1_000, rung=TOP), LADDER).rung == mid


def test_top_rung_when_nothing_holds_demand() -> None:
    d = Headroom().decide(obs(0.0, 400_000, rung=0), LADDER)
    assert d.rung == TOP and d.reason.startswith("top rung: no rung holds")


def test_startup_waits_a_dwell_before_stepping_down() -> None:
    p = Headroom(dwell_s=300)
    assert p.decide(obs(1000.0, 0, rung=TOP), LADDER).rung == TOP
    assert p.decide(obs(1200.0, 0, rung=TOP), LADDER).rung == TOP
    assert p.decide(obs(1500.0, 0, rung=TOP), LADDER).rung < TOP


def test_unknown_rung_goes_straight_to_demand() -> None:
    assert Headroom().decide(obs(0.0, 1_000, rung=None), LADDER).rung == needed_rung(
        DemandRule(), 1_000, 0)
    assert Headroom().decide(obs(0.0, 1_000, rung=99), LADDER).rung == needed_rung(
        DemandRule(), 1_000, 0)


def test_new_ladder_resets_the_window() -> None:
    p = Headroom(dwell_s=10)
    p.decide(obs(0.0, 0, rung=TOP), LADDER)
    other = LadderView(LADDER.rungs[:-1])
    assert p.decide(obs(100.0, 0, rung=TOP - 1), other).rung == TOP - 1


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match=r"unknown option.*dwell_seconds"):
        Headroom(dwell_seconds=3)
    with pytest.raises(ValueError, match="margin"):
        Headroom(margin=-0.1)
    with pytest.raises(ValueError, match="growth_tokens must be an integer"):
        Headroom(growth_tokens=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dwell_s"):
        Headroom(dwell_s=True)
    assert Headroom(margin=0, growth_tokens=0, dwell_s=0).dwell_s == 0.0


def test_is_a_policy() -> None:
    assert isinstance(Headroom(), Policy)


# ---- properties ----------------------------------------------------------------------------

@given(traces, starts, st.floats(0.0, 1.0), st.integers(0, 20_000), st.floats(0.0, 900.0))
def test_never_below_demand_and_up_at_once(trace: list[tuple[float, int, int]],
                                           start: int | None, margin: float, growth: int,
                                           dwell_s: float) -> None:
    p = Headroom(margin=margin, growth_tokens=growth, dwell_s=dwell_s)
    for t in simulate(p, trace, start):
        rung = LADDER.rungs[t.decided.rung]
        assert rung.kv_tokens >= t.live + t.pending or t.decided.rung == TOP
        need = p.rule.rung(obs(t.now_s, t.live, t.pending), LADDER)
        assert t.decided.rung >= need
        if t.on is None or need >= t.on:
            assert t.decided.rung == need


@given(traces, st.integers(0, TOP), st.floats(1.0, 900.0))
def test_no_step_down_sooner_than_dwell_after_demand_dropped(
        trace: list[tuple[float, int, int]], start: int, dwell_s: float) -> None:
    p = Headroom(dwell_s=dwell_s)
    ticks = simulate(p, trace, start)
    # What each observation needed; the first one also counts the rung the server was on.
    needs = [needed_rung(p.rule, t.live, t.pending) for t in ticks]
    needs[0] = max(needs[0], start)
    for i, t in enumerate(ticks):
        if t.on is not None and t.decided.rung < t.on:
            r = t.decided.rung
            last_high = max((j for j in range(i + 1) if needs[j] > r), default=-1)
            first_low = ticks[last_high + 1].now_s
            assert t.now_s - first_low >= dwell_s
            # ... and it goes no lower than the highest need in the window.
            assert all(needs[j] <= r for j in range(last_high + 1, i + 1))


@given(tokens, st.one_of(st.just(0), tokens), starts, st.floats(1.0, 60.0),
       st.floats(1.0, 600.0))
def test_no_oscillation_under_constant_demand(live: int, pending: int, start: int | None,
                                              poll_s: float, dwell_s: float) -> None:
    p = Headroom(dwell_s=dwell_s)
    steps = int(3 * dwell_s / poll_s) + 4
    ticks = simulate(p, [(poll_s, live, pending)] * steps, start)
    need = needed_rung(p.rule, live, pending)
    rungs = [t.decided.rung for t in ticks]
    changes = sum(a != b for a, b in itertools.pairwise(rungs))
    assert changes <= 1
    # Settled one poll after the dwell (two, to absorb float rounding in the sum of polls).
    settled = [t.decided.rung for t in ticks
               if t.now_s >= ticks[0].now_s + dwell_s + 2 * poll_s]
    assert settled and set(settled) == {need}
