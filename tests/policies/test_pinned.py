"""The pinned policy: the operator's rung, raised (and saying so) only when demand needs it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.pinned import Pinned
from tests.policies.test_headroom import LADDER, TOP, obs, simulate, starts, traces


def test_pinned_rung_when_demand_fits() -> None:
    d = Pinned(rung=2).decide(obs(0.0, 1_000, 0, rung=5), LADDER)
    assert d.rung == 2 and d.reason.startswith("pinned to rung 2")


def test_raised_when_demand_does_not_fit_and_back_when_it_does() -> None:
    p = Pinned(rung=0)
    live = LADDER.rungs[3].kv_tokens - 100
    up = p.decide(obs(0.0, live, 50, rung=0), LADDER)
    assert up.rung == 3
    assert up.reason.startswith("raised from pinned rung 0 to rung 3")
    assert f"{live:,} live + 50 pending" in up.reason
    assert p.decide(obs(1.0, 10, 0, rung=3), LADDER).rung == 0


def test_clamped_to_the_ladder() -> None:
    high = Pinned(rung=99).decide(obs(0.0, 0, 0), LADDER)
    assert high.rung == TOP and "clamped" in high.reason
    assert Pinned(rung=-4).decide(obs(0.0, 0, 0), LADDER).rung == 0


def test_top_rung_when_nothing_holds_demand() -> None:
    d = Pinned(rung=1).decide(obs(0.0, 10_000_000, 0), LADDER)
    assert d.rung == TOP and "no rung holds them" in d.reason


def test_options_are_checked() -> None:
    assert Pinned().rung == 0  # the default policy: the lowest rung holding demand
    with pytest.raises(ValueError, match=r"unknown option\(s\) index"):
        Pinned(rung=1, index=2)
    with pytest.raises(ValueError, match="integer"):
        Pinned(rung=True)
    with pytest.raises(ValueError, match="integer"):
        Pinned(rung=1.0)  # type: ignore[arg-type]


@given(traces, starts, st.integers(-3, TOP + 3))
def test_never_below_live_demand(trace: list[tuple[float, int, int]], start: int | None,
                                 pin: int) -> None:
    clamped = min(max(pin, 0), TOP)
    for t in simulate(Pinned(rung=pin), trace, start):
        rung = LADDER.rungs[t.decided.rung]
        assert rung.kv_tokens >= t.live + t.pending or t.decided.rung == TOP
        if LADDER.rungs[clamped].kv_tokens >= t.live + t.pending:
            assert t.decided.rung == clamped
        else:
            assert t.decided.rung == LADDER.lowest_holding(t.live + t.pending)
            assert "raised" in t.decided.reason
