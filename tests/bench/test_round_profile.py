"""bench/round_profile.py: an arm's scheduler rounds summed up, overall and by context."""

from __future__ import annotations

import pytest

from bench.round_profile import (
    CONTEXT_BUCKET_TOKENS,
    SERIES_COLUMNS,
    RoundProfile,
    allocator_counters,
    shared_fit,
)
from engine.reference.runtime import SchedulerRound


def one(started_s: float, yielded_s: float, decode_s: float, tokens: int, context: int,
        runs: int, admit_s: float = 0.0, rebuild_s: float = 0.0, misses: int = 0,
        miss_layers: int = 0) -> SchedulerRound:
    return SchedulerRound(started_s=started_s, yielded_s=yielded_s, admit_s=admit_s,
                          rebuild_s=rebuild_s, decode_s=decode_s, tokens=tokens,
                          context_tokens=context, kv_runs=runs, misses=misses,
                          miss_layers=miss_layers)


def test_no_rounds_is_no_profile() -> None:
    profile = RoundProfile(0.0)
    profile("rebuild_pause", object())  # other events are not rounds
    assert profile.summary() is None


def test_totals_per_token_means_and_context_buckets() -> None:
    profile = RoundProfile(100.0)
    near, far = 1_000, CONTEXT_BUCKET_TOKENS * 3 + 5
    profile("scheduler_round", one(100.5, 0.0, 0.010, 1, near, 1, admit_s=0.2, misses=3,
                                   miss_layers=2))
    profile("scheduler_round", one(100.52, 0.001, 0.012, 1, near + 1, 1))
    # Two requests at `far` each: their mean context puts the round in bucket 3.
    profile("scheduler_round", one(101.0, 0.003, 0.040, 2, 2 * far, 80, rebuild_s=0.005,
                                   misses=5, miss_layers=4))
    s = profile.summary()
    assert s is not None
    assert (s["rounds"], s["tokens"]) == (3, 4)
    assert s["decode_s"] == pytest.approx(0.062)
    assert s["yielded_s"] == pytest.approx(0.004)
    assert s["admit_s"] == pytest.approx(0.2) and s["rebuild_s"] == pytest.approx(0.005)
    assert s["decode_ms_per_token"] == pytest.approx(15.5)
    assert s["yielded_ms_per_token"] == pytest.approx(1.0)
    assert s["yielded_ms_p50"] == pytest.approx(1.0) and s["yielded_ms_max"] == 3.0
    assert s["kv_runs_mean"] == pytest.approx(82 / 4, abs=0.01)
    assert s["context_tokens_mean"] == round((2 * near + 1 + 2 * far) / 4)
    near_bucket, far_bucket = s["by_context"]
    assert (near_bucket["context_from_tokens"], near_bucket["rounds"]) == (0, 2)
    assert near_bucket["decode_ms_per_token_p50"] == pytest.approx(11.0)
    assert far_bucket["context_from_tokens"] == 3 * CONTEXT_BUCKET_TOKENS
    assert far_bucket["decode_ms_per_token_p50"] == pytest.approx(20.0)
    assert far_bucket["kv_runs_p50"] == 40
    assert (s["misses"], s["miss_layers"]) == (8, 6)
    # One row a round, on the origin's clock.
    assert s["series_columns"] == list(SERIES_COLUMNS)
    assert s["series"] == [[0.5, 10.0, 1, near, 3, 2, 0.0], [0.52, 12.0, 1, near + 1, 0, 0, 1.0],
                           [1.0, 40.0, 2, 2 * far, 5, 4, 3.0]]


def test_no_allocator_counters_off_cuda() -> None:
    assert allocator_counters("cpu") is None


def _arm(rows: list[list[float]]) -> dict:
    return {"engine_profile": {"series": rows}}


def test_the_shared_fit_finds_the_costs_and_where_an_arm_is_slower() -> None:
    import random

    rng = random.Random(3)

    def rows(extra_ms_near: float, transitions: list[float]) -> list[list[float]]:
        out = []
        for i in range(400):
            t = i * 0.05
            context, misses = rng.randrange(1_000, 100_000), rng.randrange(0, 20)
            layers = min(misses, rng.randrange(0, 8))
            ms = 9.0 + 30e-6 * context + 0.05 * misses + 0.02 * layers
            if any(start <= t < start + 1.0 for start in transitions):
                ms += extra_ms_near
            out.append([t, ms, 1, context, misses, layers, 0.3])
        return out

    arms = {"a": _arm(rows(0.0, [5.0])), "b": _arm(rows(2.0, [2.0, 12.0]))}
    fit = shared_fit(arms, {"a": [{"t_s": 5.0}], "b": [{"t_s": 2.0}, {"t_s": 12.0}]})
    assert fit is not None
    c = fit["coefficients"]
    assert c["us_per_1k_context_tokens"] == pytest.approx(30.0, rel=0.05)
    assert c["us_per_miss"] == pytest.approx(50.0, rel=0.2)
    a, b = fit["arms"]["a"], fit["arms"]["b"]
    assert (a["rounds_after_transitions"], b["rounds_after_transitions"]) == (20, 40)
    # b's extra time sits within a second of its transitions, where its residual is ~2 ms
    # above its own elsewhere and above a's.
    near, elsewhere = (b["residual_ms_per_token_after_transitions"],
                       b["residual_ms_per_token_elsewhere"])
    assert near - elsewhere == pytest.approx(2.0, abs=0.1)
    assert near > a["residual_ms_per_token_after_transitions"] + 1.5
    assert b["residual_ms_per_token"] > a["residual_ms_per_token"]
    assert shared_fit({"a": arms["a"]}, {}) is None
