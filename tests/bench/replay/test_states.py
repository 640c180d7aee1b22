"""The device's two speeds in an arm's decode rounds (bench/replay/states.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.replay.calibration import DEFAULT_CALIBRATION, load_profile
from bench.replay.states import speed_states, two_speeds
from bench.round_profile import SERIES_COLUMNS

COSTS, _ = load_profile(DEFAULT_CALIBRATION, "h200-bench")
PROBED = Path(__file__).resolve().parents[3] / "bench" / "results" / "h100" / "probe"


def rounds(decode_ms: list[float], *, misses: int = 0, context: int = 0) -> list[list[float]]:
    values = {"t_s": 0.0, "tokens": 1, "context_tokens": context, "misses": misses,
              "miss_layers": 0, "yielded_ms": 0.0}
    return [[values.get(c, ms) if c != "decode_ms" else ms for c in SERIES_COLUMNS]
            for ms in decode_ms]


def test_two_speeds_finds_both_modes() -> None:
    values = np.array([10.0, 10.5, 11.0, 10.2, 16.5, 17.0, 17.5, 10.8])
    assert two_speeds(values) == pytest.approx((10.5, 17.0))


def test_each_arm_gets_its_share_of_slow_rounds_net_of_its_counted_work() -> None:
    miss_ms = COSTS.miss_s * 1e3
    run = {"arms": {
        "grow-only": {"engine_profile": {"series": rounds([10.0] * 3 + [17.0])}},
        # Ten misses a round more, priced at the calibration's miss cost: the same state.
        "pinned-0": {"engine_profile": {"series": rounds(
            [10.0 + 10 * miss_ms, 17.0 + 10 * miss_ms], misses=10)}},
        # Every lookup missing: another scale, left out.
        "static-full": {"engine_profile": {"series": rounds([40.0] * 4, misses=192)}},
        "oracle": {"decode_tps": 1.0}}}  # not profiled
    states = speed_states(run, COSTS)
    assert states["fast_ms"] == pytest.approx(10.0) and states["slow_ms"] == pytest.approx(17.0)
    assert states["slow_share"] == {"grow-only": 0.25, "pinned-0": 0.5}
    assert speed_states({"arms": {"oracle": {}}}, COSTS) is None


def test_the_probed_h100_calls_ran_in_two_states() -> None:
    """The recorded calls of 2026-12-08: rounds cluster 1.5x apart, and the same arm's share
    of slow rounds moves between two passes of one call."""
    doc = json.loads((PROBED / "mixed-12" / "ladder-seeds.json").read_text())
    first, second = (speed_states(r, COSTS) for r in doc["runs"].values())
    assert first["ratio"] > 1.4 and second["ratio"] > 1.4
    assert abs(first["slow_share"]["grow-only"] - second["slow_share"]["grow-only"]) > 0.3


@given(st.floats(5.0, 20.0), st.floats(1.3, 3.0), st.integers(3, 60), st.integers(3, 60))
def test_two_separate_clusters_give_back_their_centres(fast: float, ratio: float,
                                                       n_fast: int, n_slow: int) -> None:
    jitter = np.linspace(-0.02, 0.02, 5)  # +-2 %: far inside the gap between the two
    values = np.concatenate([fast * (1 + np.resize(jitter, n_fast)),
                             fast * ratio * (1 + np.resize(jitter, n_slow))])
    got_fast, got_slow = two_speeds(values)
    assert got_fast == pytest.approx(fast * (1 + np.resize(jitter, n_fast)).mean())
    assert got_slow == pytest.approx(fast * ratio * (1 + np.resize(jitter, n_slow)).mean())
