"""bench/schedule.py: the offline optimum rung schedule, checked against brute force."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.schedule import Schedule, best_schedule, schedule_cost

Table = list[list[float]]


def _fn(table: Table) -> Callable[[int, int], float]:
    def step(a: int, b: int) -> float:
        assert a != b, "staying is free; the cost function is never asked for it"
        return table[a][b]
    return step


def _brute(need: Sequence[int], tokens: Sequence[int], spt: Sequence[float], table: Table,
           start: int) -> list[Schedule]:
    """schedule_cost of every feasible schedule."""
    ranges = [range(lo, len(spt)) for lo in need]
    return [schedule_cost(rungs, tokens, spt, _fn(table), start_rung=start)
            for rungs in itertools.product(*ranges)]


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


@st.composite
def _problems(draw: st.DrawFn, *, max_n: int = 5, max_r: int = 4,
              integral: bool = False, zero_steps: bool = False,
              ) -> tuple[list[int], list[int], list[float], Table, int]:
    n_rungs = draw(st.integers(1, max_r))
    n = draw(st.integers(0, max_n))
    need = draw(st.lists(st.integers(0, n_rungs - 1), min_size=n, max_size=n))
    tokens = draw(st.lists(st.integers(0, 1000), min_size=n, max_size=n))
    cost: st.SearchStrategy[float]
    if integral:  # small integers as floats: every sum is exact, so ties are real ties
        spt = [float(v) for v in draw(st.lists(st.integers(0, 3), min_size=n_rungs,
                                               max_size=n_rungs))]
        cost = st.integers(0, 3000).map(float)
    else:
        spt = draw(st.lists(st.floats(0, 10, allow_nan=False), min_size=n_rungs,
                            max_size=n_rungs))
        cost = st.floats(0, 5000, allow_nan=False)
    if zero_steps:
        cost = st.just(0.0)
    table = [[0.0 if a == b else draw(cost) for b in range(n_rungs)] for a in range(n_rungs)]
    start = draw(st.integers(0, n_rungs - 1))
    return need, tokens, spt, table, start


Problem = tuple[list[int], list[int], list[float], Table, int]


def _solve(p: Problem) -> Schedule:
    need, tokens, spt, table, start = p
    return best_schedule(need, tokens, spt, _fn(table), start_rung=start)


@given(_problems())
def test_feasible_and_priced_by_schedule_cost(p: Problem) -> None:
    need, tokens, spt, table, start = p
    best = _solve(p)
    assert len(best.rungs) == len(need)
    assert all(lo <= r < len(spt) for lo, r in zip(need, best.rungs, strict=True))
    assert best == schedule_cost(best.rungs, tokens, spt, _fn(table), start_rung=start)
    assert best.cost_s == best.decode_s + best.transition_s


@given(_problems())
def test_optimal_against_brute_force(p: Problem) -> None:
    need, tokens, spt, table, start = p
    best = _solve(p)
    floor = min(s.cost_s for s in _brute(need, tokens, spt, table, start))
    assert best.cost_s <= floor or _close(best.cost_s, floor)


@given(_problems(integral=True))
def test_exact_optimum_and_tie_break_on_integral_costs(p: Problem) -> None:
    """Exact arithmetic: the least (cost, transitions, rungs) of all feasible schedules."""
    need, tokens, spt, table, start = p
    expected = min(_brute(need, tokens, spt, table, start),
                   key=lambda s: (s.cost_s, s.transitions, s.rungs))
    assert _solve(p) == expected


@given(_problems(max_n=12, max_r=8))
def test_no_worse_than_the_lowest_rung_or_the_highest_need(p: Problem) -> None:
    need, tokens, spt, table, start = p
    best = _solve(p)
    lowest = schedule_cost(need, tokens, spt, _fn(table), start_rung=start)
    top = schedule_cost([max(need, default=0)] * len(need), tokens, spt, _fn(table),
                        start_rung=start)
    for other in (lowest, top):
        assert best.cost_s <= other.cost_s or _close(best.cost_s, other.cost_s)


@given(_problems(max_n=12, max_r=8, zero_steps=True))
def test_free_steps_and_non_decreasing_spt_follow_need(p: Problem) -> None:
    need, tokens, spt, table, start = p
    spt = list(itertools.accumulate(spt))  # non-decreasing
    best = best_schedule(need, tokens, spt, _fn(table), start_rung=start)
    by_need = schedule_cost(need, tokens, spt, _fn(table), start_rung=start)
    assert _close(best.cost_s, by_need.cost_s)
    assert best.transition_s == 0.0


@given(_problems(max_n=12, max_r=8, zero_steps=True),
       st.lists(st.floats(0.01, 10), min_size=8, max_size=8))
def test_free_steps_and_increasing_spt_give_need_exactly(p: Problem, gaps: list[float]) -> None:
    need, tokens, _, table, start = p
    spt = list(itertools.accumulate(gaps[:len(table)]))  # strictly increasing
    tokens = [t + 1 for t in tokens]  # every rung above need costs something
    best = best_schedule(need, tokens, spt, _fn(table), start_rung=start)
    assert best.rungs == tuple(need)


@given(_problems(max_n=12, max_r=8))
def test_huge_step_costs_take_the_fewest_steps(p: Problem) -> None:
    need, tokens, spt, table, start = p
    huge = [[0.0 if a == b else 1e9 + v for b, v in enumerate(row)]
            for a, row in enumerate(table)]
    best = best_schedule(need, tokens, spt, _fn(huge), start_rung=start)
    # One step to max(need) covers everything; none is needed when the start rung already does.
    assert best.transitions == (0 if max(need, default=0) <= start else 1)
    if len(need) <= 5 and len(spt) <= 4:
        assert best.transitions == min(s.transitions for s in _brute(need, tokens, spt, huge,
                                                                     start))


def test_tie_break_prefers_fewer_steps_then_lower_rungs() -> None:
    free = _fn([[0.0] * 3 for _ in range(3)])
    flat = [1.0, 1.0, 1.0]
    # need [1, 0] from rung 1: staying on 1 ties dropping to 0 and takes no step.
    assert best_schedule([1, 0], [5, 5], flat, free, start_rung=1).rungs == (1, 1)
    # From rung 0 every feasible schedule takes at least one step: the lowest, (1, 1), wins.
    assert best_schedule([1, 0], [5, 5], flat, free, start_rung=0).rungs == (1, 1)
    assert best_schedule([0, 0], [5, 5], flat, free, start_rung=2).rungs == (2, 2)


def test_prices_transitions_unlike_the_free_oracle() -> None:
    """The H200 case: stepping down to a faster rung per request loses once steps cost ~1 s."""
    spt = [0.010, 0.012, 0.015]  # lower rung = faster decode
    need = [2, 0, 2, 0, 2, 0]
    tokens = [100] * 6
    costly = _fn([[0.0 if a == b else 1.0 for b in range(3)] for a in range(3)])
    best = best_schedule(need, tokens, spt, costly, start_rung=2)
    assert best.rungs == (2,) * 6
    assert best.transitions == 0
    assert _close(best.cost_s, 600 * 0.015)
    cheap = _fn([[0.0 if a == b else 0.1 for b in range(3)] for a in range(3)])
    best = best_schedule(need, [100, 1000] * 3, spt, cheap, start_rung=2)
    assert best.rungs == tuple(need)


def test_empty_trace() -> None:
    best = best_schedule([], [], [0.01], _fn([[0.0]]), start_rung=0)
    assert best == Schedule(rungs=(), cost_s=0.0, decode_s=0.0, transition_s=0.0,
                            transitions=0)


def test_large_trace_is_fast() -> None:
    n, n_rungs = 500, 60
    need = [(i * 37) % n_rungs for i in range(n)]
    tokens = [(i * 101) % 997 for i in range(n)]
    spt = [0.01 + 0.0005 * r for r in range(n_rungs)]

    def step(a: int, b: int) -> float:
        return 0.2 + 0.01 * abs(a - b)

    t0 = time.perf_counter()
    best = best_schedule(need, tokens, spt, step, start_rung=0)
    elapsed = time.perf_counter() - t0
    assert all(lo <= r for lo, r in zip(need, best.rungs, strict=True))
    assert elapsed < 3.0, f"{elapsed:.2f} s"


def _ok() -> dict[str, object]:
    return {"need": [0, 1], "decode_tokens": [3, 4], "spt": [0.01, 0.02],
            "transition_s": lambda a, b: 0.5, "start_rung": 0}


@pytest.mark.parametrize(("change", "match"), [
    ({"decode_tokens": [3]}, "differ in length"),
    ({"need": [0, 2]}, r"need\[1\] = 2 outside \[0, 2\)"),
    ({"need": [-1, 0]}, r"need\[0\] = -1 outside"),
    ({"decode_tokens": [3, -1]}, r"decode_tokens\[1\] = -1 is negative"),
    ({"spt": []}, "spt is empty"),
    ({"spt": [0.01, math.nan]}, r"spt\[1\] must be finite"),
    ({"spt": [math.inf, 0.02]}, r"spt\[0\] must be finite"),
    ({"spt": [-0.01, 0.02]}, r"spt\[0\] must be finite and >= 0"),
    ({"transition_s": lambda a, b: math.inf}, r"transition_s\(0, 1\) must be finite"),
    ({"transition_s": lambda a, b: math.nan}, r"transition_s\(0, 1\) must be finite"),
    ({"transition_s": lambda a, b: -1.0 if a == 1 else 0.5}, r"transition_s\(1, 0\)"),
    ({"start_rung": 2}, r"start_rung 2 outside \[0, 2\)"),
    ({"start_rung": -1}, r"start_rung -1 outside"),
])
def test_best_schedule_rejects_bad_input(change: dict[str, object], match: str) -> None:
    kwargs = _ok() | change
    with pytest.raises(ValueError, match=match) as info:
        best_schedule(**kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("rungs", "change", "match"), [
    ([0], {}, "differ in length"),
    ([0, 2], {}, r"rungs\[1\] = 2 outside \[0, 2\)"),
    ([0, 1], {"decode_tokens": [-3, 4]}, r"decode_tokens\[0\] = -3 is negative"),
    ([0, 1], {"spt": [0.01, math.inf]}, r"spt\[1\] must be finite"),
    ([0, 1], {"transition_s": lambda a, b: -0.5}, r"transition_s\(0, 1\) must be finite"),
    ([0, 1], {"start_rung": 5}, r"start_rung 5 outside"),
])
def test_schedule_cost_rejects_bad_input(rungs: list[int], change: dict[str, object],
                                         match: str) -> None:
    kwargs = _ok() | change
    del kwargs["need"]
    with pytest.raises(ValueError, match=match):
        schedule_cost(rungs, **kwargs)  # type: ignore[arg-type]


def test_schedule_cost_prices_only_steps_taken() -> None:
    calls: list[tuple[int, int]] = []

    def step(a: int, b: int) -> float:
        calls.append((a, b))
        return 0.25 * (a + b)

    s = schedule_cost([1, 1, 0, 2], [10, 0, 10, 1], [0.1, 0.2, 0.4], step, start_rung=1)
    assert calls == [(1, 0), (0, 2)]
    assert s.rungs == (1, 1, 0, 2)
    assert s.transitions == 2
    assert _close(s.transition_s, 0.25 + 0.5)
    assert _close(s.decode_s, 10 * 0.2 + 10 * 0.1 + 0.4)
    assert s.cost_s == s.decode_s + s.transition_s
