"""An arm's error interval on its requests' noise (bench/replay/noise.py)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.replay.noise import error_interval


def rows(decode_s: list[float], status: int = 200) -> list[dict[str, Any]]:
    return [{"status": status, "completion_tokens": 51, "decode_s": s} for s in decode_s]


def test_a_replay_off_by_the_same_factor_on_every_request_has_no_spread() -> None:
    measured = rows([1.0, 2.0, 0.5, 1.5])
    predicted = rows([s / 1.1 for s in (1.0, 2.0, 0.5, 1.5)])  # 10 % faster on each
    low, high = error_interval(measured, predicted)
    assert low == pytest.approx(0.1, abs=1e-4) and high == pytest.approx(0.1, abs=1e-4)


def test_requests_that_jitter_around_the_prediction_give_an_interval_holding_zero() -> None:
    predicted = rows([1.0] * 10)
    measured = rows([1.3, 0.7] * 5)  # the device 30 % either way, request by request
    low, high = error_interval(measured, predicted)
    assert low < 0 < high and high - low > 0.2
    # A systematic 40 % on top of the same jitter moves the interval off zero.
    low, high = error_interval(rows([1.3 * 1.4, 0.7 * 1.4] * 5), predicted)
    assert low > 0


def test_only_requests_both_served_count_and_two_are_needed() -> None:
    measured = rows([1.0, 1.0]) + rows([9.0], status=503)
    predicted = rows([1.0, 1.0, 1.0])
    assert error_interval(measured, predicted) == [0.0, 0.0]
    assert error_interval(rows([1.0]) + rows([1.0], status=503), rows([1.0, 1.0])) is None


def test_the_interval_is_the_same_every_time() -> None:
    measured, predicted = rows([1.3, 0.7, 1.1, 0.9, 1.6]), rows([1.0] * 5)
    assert error_interval(measured, predicted) == error_interval(measured, predicted)


@given(st.lists(st.floats(0.05, 10.0), min_size=2, max_size=30), st.floats(0.5, 2.0))
def test_a_uniform_factor_is_an_interval_of_one_point(decode_s: list[float],
                                                      factor: float) -> None:
    """Whatever the requests, a replay off by one factor on each has no noise to spread."""
    low, high = error_interval(rows(decode_s), rows([s / factor for s in decode_s]))
    assert low == pytest.approx(factor - 1, abs=2e-4)
    assert high == pytest.approx(factor - 1, abs=2e-4)
