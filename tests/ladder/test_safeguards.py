"""The controller's safeguards, driven by a float clock: an hour of control runs in ms."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ladder.safeguards import Safeguards, SafeguardSettings, Verdict
from policies.api import Decision
from tests.policies.test_headroom import LADDER, TOP

QUIET = SafeguardSettings(cooldown_s=0, min_dwell_s=0, down_tolerance=0.0)


def want(rung: int) -> Decision:
    return Decision(rung, "test")


def kv(rung: int) -> int:
    return LADDER.rungs[rung].kv_tokens


def admit(g: Safeguards, now_s: float, on: int | None, rung: int, demand: int = 0) -> Verdict:
    return g.admit(now_s, on, want(rung), demand, LADDER)


def settled(settings: SafeguardSettings = QUIET, rung: int = 5) -> Safeguards:
    """Safeguards that have watched the server on `rung` for a long time without incident."""
    g = Safeguards(settings)
    g.record_read(0.0, ok=True)
    admit(g, 0.0, rung, rung)
    return g


# ---- the target ----------------------------------------------------------------------------

def test_same_rung_is_a_hold() -> None:
    v = admit(settled(), 10_000.0, 5, 5)
    assert (v.allowed, v.rung, v.code) == (False, 5, "same_rung")


def test_target_is_raised_to_hold_demand_and_clamped() -> None:
    g = settled()
    v = admit(g, 10_000.0, 5, 0, demand=kv(3) - 1)
    assert (v.allowed, v.rung) == (True, 3) and "raised from rung 0" in v.reason
    v = admit(settled(), 10_000.0, 5, 99)
    assert (v.allowed, v.rung) == (True, TOP) and "clamped" in v.reason


def test_hysteresis_band_on_step_down() -> None:
    g = settled(SafeguardSettings(cooldown_s=0, min_dwell_s=0, down_tolerance=0.10), rung=5)
    inside = int(kv(2) * 0.95)
    v = admit(g, 10_000.0, 5, 2, demand=inside)
    # Rung 2 would be 95 % full: only as low as a rung with 10 % spare.
    assert v.allowed and v.rung == 3 and "10% spare" in v.reason
    v = admit(g, 10_000.0, 3, 2, demand=inside)
    assert (v.allowed, v.code) == (False, "hysteresis")
    v = admit(g, 10_000.0, 3, 2, demand=int(kv(2) * 0.9))
    assert (v.allowed, v.rung) == (True, 2)


# ---- timing --------------------------------------------------------------------------------

def test_cooldown_blocks_a_voluntary_step_but_not_a_needed_one() -> None:
    g = settled(SafeguardSettings(cooldown_s=60, min_dwell_s=0, down_tolerance=0.0))
    g.record_transition(100.0, ok=True)
    assert admit(g, 159.0, 5, 2).code == "cooldown"
    assert admit(g, 159.0, 5, 7).code == "cooldown"  # a bigger rung nobody needs yet
    needed = admit(g, 101.0, 5, 7, demand=kv(5) + 1)
    assert (needed.allowed, needed.rung, needed.code) == (True, 7, "needed")
    assert admit(g, 160.0, 5, 2).allowed


def test_min_dwell_counts_from_the_transition_that_reached_the_rung() -> None:
    g = settled(SafeguardSettings(cooldown_s=0, min_dwell_s=120, down_tolerance=0.0), rung=5)
    g.record_transition(1000.0, ok=True)
    assert admit(g, 1010.0, 6, 2).code == "dwell"  # the first look at the new rung
    assert admit(g, 1119.0, 6, 2).code == "dwell"
    assert admit(g, 1010.0, 6, 8).allowed  # a voluntary step up does not wait for dwell
    assert admit(g, 1120.0, 6, 2).allowed
    # A rung first seen without a transition (someone else resized) dates from that sight.
    assert admit(g, 2000.0, 4, 1).code == "dwell"
    assert admit(g, 2120.0, 4, 1).allowed


def test_hourly_cap_is_a_sliding_window() -> None:
    g = settled(SafeguardSettings(cooldown_s=0, min_dwell_s=0, max_transitions_per_hour=12))
    for i in range(12):
        g.record_transition(100.0 + i, ok=True)
    v = admit(g, 200.0, 5, 2)
    assert (v.allowed, v.code) == (False, "hourly_cap") and "12 transitions" in v.reason
    assert admit(g, 200.0, 5, 7, demand=kv(6)).allowed  # safety beats the cap
    assert not admit(g, 3699.5, 5, 2).allowed
    assert admit(g, 3700.0, 5, 2).allowed  # the window is (now - 3600, now]: the first is out


def test_backoff_doubles_up_to_its_maximum() -> None:
    s = SafeguardSettings(cooldown_s=0, min_dwell_s=0, backoff_base_s=5, backoff_max_s=300,
                          breaker_failures=100)
    g = settled(s)
    now = 1000.0
    for n in range(1, 10):
        g.record_transition(now, ok=False)
        delay = min(5.0 * 2 ** (n - 1), 300.0)
        blocked = admit(g, now + delay - 0.01, 5, 7, demand=kv(6))  # even a needed step
        assert (blocked.allowed, blocked.code) == (False, "backoff")
        assert admit(g, now + delay, 5, 7, demand=kv(6)).allowed
        now += delay
    g.record_transition(now, ok=True)
    assert g.snapshot().backoff_until_s is None
    assert admit(g, now, 5, 7, demand=kv(6)).allowed


def test_breaker_opens_then_half_opens_for_one_trial() -> None:
    g = settled(SafeguardSettings(cooldown_s=0, min_dwell_s=0, breaker_failures=5,
                                  breaker_open_s=600))
    now = 0.0
    for _ in range(5):
        now += 400.0  # past any backoff
        g.record_transition(now, ok=False)
    assert g.breaker_state() == "open"
    v = admit(g, now + 599.0, 5, 7, demand=kv(6))
    assert (v.allowed, v.code) == (False, "breaker_open")  # even a needed step
    cond = {c.type: c for c in g.snapshot().conditions}["AbleToResize"]
    assert (cond.status, cond.reason) == ("False", "CircuitOpen")
    trial = admit(g, now + 600.0, 5, 7, demand=kv(6))
    assert trial.allowed and "half-open trial" in trial.reason
    assert g.breaker_state() == "half-open"
    # The trial fails: open again for a whole period, at once.
    g.record_transition(now + 601.0, ok=False)
    assert g.breaker_state() == "open"
    assert admit(g, now + 1200.0, 5, 7, demand=kv(6)).code == "breaker_open"
    # The next trial succeeds: closed, failures forgotten.
    assert admit(g, now + 1201.0, 5, 7, demand=kv(6)).allowed
    g.record_transition(now + 1202.0, ok=True)
    snap = g.snapshot()
    assert (snap.breaker, snap.consecutive_failures) == ("closed", 0)
    assert admit(g, now + 1203.0, 7, 2).allowed


def test_fallback_holds_after_failed_reads_until_they_recover() -> None:
    g = settled(SafeguardSettings(cooldown_s=0, min_dwell_s=0, fallback_after_failed_reads=3,
                                  reads_to_recover=2))
    for t in (10.0, 20.0):
        g.record_read(t, ok=False)
    assert admit(g, 25.0, 5, 2).allowed  # two failures are not yet a fallback
    g.record_read(30.0, ok=False)
    cond = {c.type: c for c in g.snapshot().conditions}["ObservationsValid"]
    assert (cond.status, cond.reason, cond.last_transition_s) == ("False", "FailedReads", 30.0)
    g.record_read(40.0, ok=True)
    v = admit(g, 40.0, 5, 7, demand=kv(6))
    assert (v.allowed, v.code) == (False, "fallback")  # one good read is not enough
    g.record_read(50.0, ok=True)
    assert admit(g, 50.0, 5, 7, demand=kv(6)).allowed
    assert g.snapshot().holding_for_reads is False


def test_unknown_rung_is_adopted_as_needed() -> None:
    g = Safeguards()
    v = g.admit(0.0, None, want(3), 0, LADDER)
    assert (v.allowed, v.rung, v.code) == (True, 3, "needed")
    v = g.admit(0.0, 99, want(3), 0, LADDER)  # an index from another ladder
    assert v.allowed and "not on the ladder" in v.reason


def test_snapshot_is_frozen_json_with_hpa_conditions() -> None:
    g = Safeguards()
    first = {c.type: c.status for c in g.snapshot().conditions}
    assert first == {"AbleToResize": "True", "ObservationsValid": "Unknown",
                     "TargetLimited": "Unknown"}
    g.record_read(1.0, ok=True)
    admit(g, 1.0, 5, 5)
    g.record_transition(2.0, ok=True)
    v = admit(g, 3.0, 5, 2)
    assert v.code == "cooldown"
    snap = g.snapshot()
    limited = {c.type: c for c in snap.conditions}["TargetLimited"]
    assert (limited.status, limited.reason) == ("True", "Cooldown")
    doc = json.loads(json.dumps(g.snapshot_json()))
    assert doc["last_verdict"]["code"] == "cooldown"
    assert doc["transitions_last_hour"] == 1
    with pytest.raises(AttributeError):
        snap.breaker = "open"  # type: ignore[misc]


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="down_tolerance"):
        SafeguardSettings(down_tolerance=1.0)
    with pytest.raises(ValueError, match="breaker_failures"):
        SafeguardSettings(breaker_failures=0)
    with pytest.raises(ValueError, match="cooldown_s"):
        SafeguardSettings(cooldown_s=-1)


def test_empty_ladder_is_a_hold() -> None:
    from policies.api import LadderView
    v = Safeguards().admit(0.0, None, want(0), 0, LadderView(()))
    assert (v.allowed, v.code) == (False, "no_rungs")


# ---- properties ----------------------------------------------------------------------------

ops = st.lists(st.one_of(
    st.tuples(st.just("read"), st.floats(0.0, 120.0), st.booleans()),
    st.tuples(st.just("admit"), st.floats(0.0, 120.0),
              st.tuples(st.integers(-1, TOP + 1), st.integers(0, 300_000), st.booleans(),
                        st.floats(0.0, 30.0))),
), max_size=120)


settings_st = st.builds(
    SafeguardSettings, cooldown_s=st.floats(0, 120), min_dwell_s=st.floats(0, 240),
    down_tolerance=st.floats(0, 0.5), max_transitions_per_hour=st.integers(1, 12),
    backoff_base_s=st.floats(0, 20), backoff_max_s=st.floats(20, 300),
    breaker_failures=st.integers(1, 5), breaker_open_s=st.floats(0, 900),
    fallback_after_failed_reads=st.integers(1, 3), reads_to_recover=st.integers(1, 3))


@given(ops, st.integers(0, TOP), settings_st)
def test_every_admitted_transition_respects_every_safeguard(
        sequence: list[tuple[str, float, object]], start: int, s: SafeguardSettings) -> None:
    g = Safeguards(s)
    now, on = 0.0, start
    ends: list[float] = []
    arrived: float | None = None
    seen: tuple[int, float] | None = None
    failures, last_failure, open_until = 0, None, None
    bad_reads, good_reads, holding = 0, 0, False
    for kind, dt, arg in sequence:
        now += dt
        if kind == "read":
            assert isinstance(arg, bool)
            g.record_read(now, ok=arg)
            bad_reads, good_reads = (0, good_reads + 1) if arg else (bad_reads + 1, 0)
            holding = (holding or bad_reads >= s.fallback_after_failed_reads) and not (
                good_reads >= s.reads_to_recover)
            continue
        assert isinstance(arg, tuple)
        rung, demand, ok, duration = arg
        if seen is None or seen[0] != on:
            seen = (on, arrived if arrived is not None else now)
        arrived = None
        v = g.admit(now, on, want(rung), demand, LADDER)
        if not v.allowed:
            continue
        target = LADDER.rungs[v.rung]
        assert target.kv_tokens >= demand or v.rung == TOP
        assert v.rung != on
        assert not holding
        assert open_until is None or now >= open_until
        if last_failure is not None:
            assert now >= last_failure + min(s.backoff_base_s * 2 ** (failures - 1),
                                             s.backoff_max_s)
        if v.rung < on:
            assert demand <= target.kv_tokens * (1 - s.down_tolerance)
        if v.code != "needed":
            assert LADDER.rungs[on].kv_tokens >= demand
            assert len([e for e in ends if e > now - 3600]) < s.max_transitions_per_hour
            assert not ends or now - ends[-1] >= s.cooldown_s
            if v.rung < on:
                assert now - seen[1] >= s.min_dwell_s
        half_open = open_until is not None
        now += duration
        g.record_transition(now, ok=ok)
        ends.append(now)
        if ok:
            on, arrived = v.rung, now
            failures, last_failure, open_until = 0, None, None
        else:
            failures, last_failure = failures + 1, now
            if half_open or failures >= s.breaker_failures:
                open_until = now + s.breaker_open_s
