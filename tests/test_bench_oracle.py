"""bench/oracle.py: the oracle's prices come from the run's own measurements."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.oracle import hit_rates, live_needs, measured_lookups, oracle_plan

# Three rungs, lowest KV first: more KV, fewer expert slots.
LADDER = [{"index": i, "kv_tokens": kv, "moe_cache_size": slots, "num_mamba_slots": 4,
           "num_pages": kv // 16, "total_bytes": 0}
          for i, (kv, slots) in enumerate(((512, 300), (1024, 200), (4096, 50)))]


def _run(timeline: list[list[float]], rows: list[dict[str, Any]] | None = None,
         transitions: list[float] = ()) -> dict[str, Any]:
    run: dict[str, Any] = {
        "ladders": {"headroom": LADDER, "grow-only": LADDER[1:]},
        "timeline": {"headroom": timeline,
                     # Another ladder's samples: not this ladder's rungs, not counted.
                     "grow-only": [[0.0, 0, 0, 0, 0, 0], [1.0, 0, 0, 0, 0, 10_000]]},
        "per_request": {"static-full": rows} if rows is not None else {},
        "transitions": {"headroom": [{"seconds": s, "reached": True} for s in transitions]},
        "miss_cost": None,
    }
    return run


def test_lookups_are_counted_between_samples_on_one_rung() -> None:
    timeline = [[0.0, 0, 512, 0, 0, 0], [0.1, 0, 512, 0, 90, 10],  # rung 0: 90 of 100
                [0.2, 2, 4096, 0, 100, 30],  # changed rung in between: not counted
                [0.3, 2, 4096, 0, 150, 80],  # rung 2: 50 of 100
                [0.4, -1, 0, 0, 150, 180]]  # off the ladder: not counted
    assert measured_lookups(_run(timeline), LADDER) == {0: (90, 100), 2: (50, 100)}


def test_hit_rates_interpolate_in_slots_and_never_fall_with_more_slots() -> None:
    slots = [300, 200, 50]
    assert hit_rates(slots, {}) == [0.0, 0.0, 0.0]
    assert hit_rates(slots, {0: (90, 100), 2: (50, 100)}) == pytest.approx([0.9, 0.74, 0.5])
    assert hit_rates(slots, {1: (60, 100)}) == pytest.approx([0.6, 0.6, 0.6])
    # A rung with more slots measured lower (noise) is raised to the one with fewer.
    assert hit_rates(slots, {0: (40, 100), 2: (50, 100)}) == pytest.approx([0.5, 0.5, 0.5])


@given(st.lists(st.integers(1, 1000), min_size=1, max_size=8),
       st.dictionaries(st.integers(0, 7), st.tuples(st.integers(0, 100), st.integers(1, 100)),
                       max_size=8))
def test_hit_rates_are_monotone_in_slots_and_within_what_was_measured(
        slots: list[int], raw: dict[int, tuple[int, int]]) -> None:
    measured = {r: (min(h, n), n) for r, (h, n) in raw.items() if r < len(slots)}
    rates = hit_rates(slots, measured)
    assert len(rates) == len(slots)
    for a in range(len(slots)):
        for b in range(len(slots)):
            if slots[a] > slots[b]:
                assert rates[a] >= rates[b] - 1e-12
    if measured:
        seen = [h / n for h, n in measured.values()]
        assert all(min(seen) - 1e-12 <= r <= max(seen) + 1e-12 for r in rates)


def test_live_needs_add_what_is_running_at_each_send() -> None:
    requests = [(300, 100), (300, 100), (100, 10)]
    # Request 1 is sent while 0 decodes; request 2 after both ended.
    rows = [{"index": 0, "sent_s": 0.0, "ttft_s": 0.1, "decode_s": 1.0},
            {"index": 1, "sent_s": 0.5, "ttft_s": 0.1, "decode_s": 1.0},
            {"index": 2, "sent_s": 5.0, "ttft_s": 0.1, "decode_s": 1.0}]
    assert live_needs(requests, rows, LADDER, 16) == ([0, 1, 2], [0, 1, 0])
    assert live_needs(requests, None, LADDER, 16) == ([0, 1, 2], [0, 0, 0])
    # The send order is the reference arm's, not the index order.
    rows[2]["sent_s"] = -1.0
    assert live_needs(requests, rows, LADDER, 16)[0] == [2, 0, 1]


def test_the_plan_prices_rungs_by_their_misses_and_steps_by_their_cost() -> None:
    timeline = [[0.0, 0, 512, 0, 0, 0], [0.1, 0, 512, 0, 900, 100],
                [0.2, 2, 4096, 0, 900, 100], [0.3, 2, 4096, 0, 1400, 600]]
    rows = [{"index": i, "sent_s": float(i), "ttft_s": 0.1, "decode_s": 0.5}
            for i in range(3)]
    # A long request between two short ones.
    requests = [(100, 200), (2000, 200), (100, 200)]
    cheap = oracle_plan(requests, _run(timeline, rows, [0.001]), LADDER, page_size=16,
                        lookups_per_token=32, expert_copy_us=50.0)
    assert cheap["hit_rate_by_rung"] == pytest.approx([0.9, 0.74, 0.5])
    assert cheap["measured_rungs"] == [0, 2]
    assert cheap["live_set_from"] == "static-full"
    assert cheap["miss_us"] == 50.0
    assert cheap["rungs"] == [0, 2, 0]  # cheap steps: back down for the last one
    assert cheap["transitions"] == 2
    # Steps that cost more than the misses they save: stay up after the long request.
    dear = oracle_plan(requests, _run(timeline, rows, [10.0]), LADDER, page_size=16,
                       lookups_per_token=32, expert_copy_us=50.0)
    assert dear["rungs"] == [0, 2, 2]
    assert dear["transitions"] == 1
    assert dear["step_s"] == 10.0
