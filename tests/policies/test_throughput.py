"""The throughput policy: a step down happens exactly when its expected gain repays its cost."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.api import LadderView, Observation, RungView
from policies.headroom import DemandRule
from policies.throughput import Throughput, estimate_tps
from tests.policies.test_headroom import LADDER, TOP, needed_rung, simulate, starts, traces


def obs(now_s: float, live: int, rung: int | None,
        measured: Mapping[int, tuple[float, float]] | None = None,
        decode_tps: float | None = None) -> Observation:
    return Observation(now_s=now_s, rung=rung, live_kv_tokens=live, pending_kv_tokens=0,
                       active_requests=1, decode_tps=decode_tps,
                       decode_tps_by_rung=dict(measured or {}))


def two_rungs(tps_low: float, tps_high: float, transition_s: float = 1.0,
              ) -> tuple[LadderView, dict[int, tuple[float, float]]]:
    ladder = LadderView((RungView(0, 16_384, 6000, 0), RungView(1, 262_144, 3000, 0)),
                        transition_s=transition_s)
    return ladder, {0: (tps_low, 600.0), 1: (tps_high, 600.0)}


# ---- examples ------------------------------------------------------------------------------

def test_steps_down_once_the_stay_repays_the_transition() -> None:
    # 10 % faster below: gain 10 tok/s * stay >= 100 tok/s * 1 s * 2 once stay >= 20 s.
    ladder, measured = two_rungs(110.0, 100.0)
    p = Throughput()
    assert p.decide(obs(0.0, 200_000, 1, measured), ladder).rung == 1
    assert p.decide(obs(10.0, 1_000, 1, measured), ladder).rung == 1
    hold = p.decide(obs(29.0, 1_000, 1, measured), ladder)
    assert hold.rung == 1 and "does not repay 200 tokens" in hold.reason
    down = p.decide(obs(30.0, 1_000, 1, measured), ladder)
    assert down.rung == 0
    assert "110.0 tok/s measured vs 100.0 tok/s measured" in down.reason
    assert "gains 200 tokens >= 200" in down.reason


def test_never_steps_down_to_a_rung_that_is_not_faster() -> None:
    ladder, measured = two_rungs(100.0, 100.0)
    p = Throughput()
    for t in range(0, 5000, 10):
        assert p.decide(obs(float(t), 1_000 if t else 200_000, 1, measured), ladder).rung == 1


def test_payback_factor_and_transition_cost_scale_the_wait() -> None:
    ladder, measured = two_rungs(110.0, 100.0, transition_s=3.0)
    p = Throughput(payback_factor=1.0)  # cost 300 tokens: 30 s of a 10 tok/s gain
    p.decide(obs(0.0, 200_000, 1, measured), ladder)
    p.decide(obs(1.0, 1_000, 1, measured), ladder)
    assert p.decide(obs(30.9, 1_000, 1, measured), ladder).rung == 1
    assert p.decide(obs(31.0, 1_000, 1, measured), ladder).rung == 0


def test_expected_stay_is_capped() -> None:
    ladder, measured = two_rungs(100.5, 100.0)  # 0.5 tok/s: needs a 400 s stay
    for cap_s, rung in ((300.0, 1), (500.0, 0)):
        p = Throughput(max_stay_s=cap_s)
        p.decide(obs(0.0, 1_000, 1, measured), ladder)  # counts as needing rung 1 (startup)
        p.decide(obs(1.0, 1_000, 1, measured), ladder)
        assert p.expected_stay_s(10_000.0, 0) == cap_s
        assert p.decide(obs(10_000.0, 1_000, 1, measured), ladder).rung == rung


def test_short_measurements_fall_back_to_the_prior() -> None:
    ladder = LadderView((RungView(0, 16_384, 6000, 0), RungView(1, 262_144, 3000, 0)))
    speeds = estimate_tps(ladder, {0: (10.0, 5.0), 1: (100.0, 60.0)}, min_measured_s=30.0,
                          slot_exponent=0.75)
    assert speeds[1].measured and speeds[1].tps == 100.0
    assert not speeds[0].measured
    assert speeds[0].tps == pytest.approx(100.0 * 2 ** 0.75)


def test_explores_down_on_the_prior_alone() -> None:
    p = Throughput()
    ticks = simulate(p, [(10.0, 1_000, 0)] * 100, start=TOP)
    assert ticks[-1].decided.rung == needed_rung(p.rule, 1_000, 0)
    assert "assumed" in next(t.decided.reason for t in ticks if t.decided.rung < TOP)


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match=r"unknown option.*payback"):
        Throughput(payback=2)
    with pytest.raises(ValueError, match="payback_factor"):
        Throughput(payback_factor=-1)


# ---- properties ----------------------------------------------------------------------------

@given(st.lists(st.one_of(st.none(), st.tuples(st.floats(1.0, 1000.0),
                                               st.floats(0.0, 120.0))),
                min_size=len(LADDER.rungs), max_size=len(LADDER.rungs)),
       st.floats(0.0, 1.5))
def test_prior_never_says_a_lower_rung_is_slower(cells: list[tuple[float, float] | None],
                                                 exponent: float) -> None:
    measured = {r: c for r, c in enumerate(cells) if c is not None}
    speeds = estimate_tps(LADDER, measured, min_measured_s=30.0, slot_exponent=exponent)
    for r, s in enumerate(speeds):
        cell = measured.get(r)
        if cell is not None and cell[1] >= 30.0:
            assert s.measured and s.tps == cell[0]
        else:
            assert not s.measured
            assert all(s.tps >= above.tps for above in speeds[r + 1:])


@given(traces, starts, st.floats(0.0, 5.0), st.floats(0.0, 5.0),
       st.dictionaries(st.integers(0, TOP), st.tuples(st.floats(1.0, 500.0),
                                                      st.floats(0.0, 600.0))))
def test_never_below_the_demand_rule(trace: list[tuple[float, int, int]], start: int | None,
                                     payback: float, transition_s: float,
                                     measured: dict[int, tuple[float, float]]) -> None:
    p = Throughput(payback_factor=payback)
    ladder = LadderView(LADDER.rungs, transition_s=transition_s)
    now, on = 0.0, start
    for dt, live, pending in trace:
        now += dt
        o = Observation(now, on, live, pending, 1, None, decode_tps_by_rung=measured)
        d = p.decide(o, ladder)
        assert d.rung >= DemandRule().rung(o, ladder)
        assert ladder.rungs[d.rung].kv_tokens >= live + pending or d.rung == TOP
        if on is None or DemandRule().rung(o, ladder) >= on:
            assert d.rung == DemandRule().rung(o, ladder)
        on = d.rung


@given(st.lists(st.tuples(st.floats(0.5, 60.0), st.integers(0, 300_000)), min_size=1,
                max_size=40),
       st.lists(st.floats(1.0, 500.0), min_size=len(LADDER.rungs), max_size=len(LADDER.rungs)),
       st.floats(0.1, 5.0), st.floats(0.1, 5.0), st.floats(10.0, 2000.0))
def test_steps_down_exactly_when_payback_is_met(
        trace: list[tuple[float, int]], tps: list[float], payback: float, transition_s: float,
        max_stay_s: float) -> None:
    """The server stays on the top rung; every decision is checked against the formula."""
    ladder = LadderView(LADDER.rungs, transition_s=transition_s)
    measured = {r: (v, 1000.0) for r, v in enumerate(tps)}
    p = Throughput(payback_factor=payback, max_stay_s=max_stay_s)
    needs: list[tuple[float, int]] = []
    now = 0.0
    for dt, live in trace:
        now += dt
        d = p.decide(obs(now, live, TOP, measured), ladder)
        need = needed_rung(p.rule, live, 0)
        needs.append((now, max(need, TOP) if not needs else need))
        cost = tps[TOP] * transition_s * payback
        gains: dict[int, float] = {}
        for r in range(need, TOP):
            # Held since the first sample after the last one that needed more than r.
            last_high = max((i for i, (_, n) in enumerate(needs) if n > r), default=-1)
            held = last_high + 1 < len(needs)
            stay = min(now - needs[last_high + 1][0], max_stay_s) if held else 0.0
            gains[r] = (tps[r] - tps[TOP]) * stay
        paying = {r: g - cost for r, g in gains.items() if g >= cost}
        if d.rung < TOP:
            assert d.rung in paying
            assert paying[d.rung] == max(paying.values())
        else:
            # Allow float noise at the exact threshold.
            assert all(g < cost + 1e-6 * max(1.0, cost) for g in gains.values())


@given(st.integers(0, 300_000), starts, st.floats(5.0, 60.0),
       st.dictionaries(st.integers(0, TOP), st.tuples(st.floats(1.0, 500.0),
                                                      st.floats(0.0, 600.0))))
def test_no_oscillation_under_constant_demand(live: int, start: int | None, poll_s: float,
                                              measured: dict[int, tuple[float, float]]) -> None:
    p = Throughput()
    now, on, rungs = 0.0, start, []
    for _ in range(int(4000 / poll_s) + 2):
        now += poll_s
        on = p.decide(obs(now, live, on, measured), LADDER).rung
        rungs.append(on)
    # Every move is away from where it was: no rung is left and then visited again.
    visited: list[int] = []
    for r in rungs:
        if not visited or visited[-1] != r:
            assert r not in visited
            visited.append(r)
    # Once every stay has reached its 900 s cap, a chain of steps down takes at most one poll
    # per rung; after that nothing changes any more.
    tail = rungs[int((900 + (TOP + 3) * 60) / poll_s) + 1:]
    assert len(set(tail)) <= 1
