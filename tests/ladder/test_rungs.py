"""The ladder: spacing, budget use, verified transitions, dropped rungs, honest ranges."""

from __future__ import annotations

import itertools
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.ftserve.budget import MemoryModel
from engine.ftserve.geometry import Geometry, parse_cache_status
from engine.ftserve.planner import plan_transition
from ladder.rungs import LadderSpec, build_ladder, kv_levels, reachable_ranges
from tests.conftest import load_fixture


def report() -> tuple[MemoryModel, Geometry, object]:
    status = parse_cache_status(load_fixture("seed-rtx5080-status.json"))
    return MemoryModel.from_status(status), status.geometry, status.limits


def test_default_spacing_is_finer_than_32k_at_short_contexts() -> None:
    levels = kv_levels(LadderSpec(), page_size=64, kv_max_tokens=262144)
    assert levels[0] == 4096
    assert levels[-1] == 262144
    short = [b - a for a, b in itertools.pairwise(levels) if b <= 65536]
    assert short and max(short) < 32768
    assert all(level % 64 == 0 for level in levels)
    assert levels == sorted(set(levels))


def test_linear_spacing_like_pr300() -> None:
    spec = LadderSpec(kv_floor_tokens=65536, spacing="linear", kv_step_tokens=32768)
    assert kv_levels(spec, page_size=64, kv_max_tokens=262144) == [
        65536, 98304, 131072, 163840, 196608, 229376, 262144]


def test_report_ladder_fills_the_budget_and_verifies_every_transition() -> None:
    model, live, _ = report()
    ladder = build_ladder(model, live, LadderSpec(kv_max_tokens=262144))
    assert ladder.rungs[0].kv_tokens == 4096 and ladder.top.kv_tokens == 262144
    slots = [r.geometry.moe_cache_size for r in ladder.rungs]
    assert slots == sorted(slots, reverse=True)  # more KV, fewer experts
    for rung in ladder.rungs:
        g = rung.geometry
        assert model.total_bytes(g) <= model.budget_bytes
        # One more expert slot would not fit: the rest of the budget went to experts.
        assert (model.total_bytes(g.with_sizes(moe_cache_size=g.moe_cache_size + 1))
                > model.budget_bytes or g.moe_cache_size == model.shape.max_expert_slots)
        assert g.num_mamba_slots == live.num_mamba_slots
    n = len(ladder.rungs)
    assert len(ladder.transitions) == n * (n - 1)
    assert all(p.feasible and p.peak_bytes <= model.budget_bytes
               for p in ladder.transitions.values())
    assert ladder.rung_holding(70000) is not None
    assert ladder.rung_holding(70000).kv_tokens >= 70000  # type: ignore[union-attr]
    assert ladder.rung_holding(10**9) is None


def test_reserve_and_cap_at_all_experts() -> None:
    model, live, _ = report()
    reserved = build_ladder(model, live, LadderSpec(reserve_bytes=500 << 20))
    plain = build_ladder(model, live, LadderSpec())
    assert reserved.rungs[0].geometry.moe_cache_size < plain.rungs[0].geometry.moe_cache_size
    assert all(r.total_bytes <= model.budget_bytes - (500 << 20) for r in reserved.rungs)
    status = parse_cache_status(load_fixture("freetoken-0.1.2/cache_status.boot.json"))
    tiny = MemoryModel.from_status(status)
    ladder = build_ladder(tiny, status.geometry, LadderSpec())
    assert ladder.rungs[0].geometry.moe_cache_size == 64 * 8  # capped at E * L


def test_rungs_below_the_expert_floor_are_dropped_with_a_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model, live, _ = report()
    with caplog.at_level(logging.INFO, logger="ladder.rungs"):
        kept = build_ladder(model, live, LadderSpec(min_moe_slots=1000))
        assert kept.top.geometry.moe_cache_size >= 1000
        assert not kept.dropped
        # 1,800 slots do not fit beside even the smallest KV: no rung, and the reason.
        none = build_ladder(model, live, LadderSpec(min_moe_slots=1800))
    assert none.rungs == ()
    assert "no KV size fits" in none.dropped[0].reason
    assert any(r.message == "rung dropped" for r in caplog.records)


def test_bad_specs_are_refused() -> None:
    with pytest.raises(ValueError, match="kv_step_ratio"):
        LadderSpec(kv_step_ratio=1.0)
    with pytest.raises(ValueError, match="below kv_floor_tokens"):
        LadderSpec(kv_floor_tokens=8192, kv_max_tokens=4096)


def test_reachable_ranges_are_honest_where_advertised_ones_are_not() -> None:
    model, live, limits = report()
    ranges = {r.pool: r for r in reachable_ranges(model, live, limits)}  # type: ignore[arg-type]
    moe = ranges["moe"]
    assert moe.advertised_max == 1843
    assert moe.max_keeping_others < moe.max_with_others_at_floor < moe.advertised_max
    # Each maximum is reachable by a safe plan, one slot more is not.
    for size, kv_pages, mamba in ((moe.max_keeping_others, live.num_pages, 8),
                                  (moe.max_with_others_at_floor, 1, 4)):
        target = Geometry(size, kv_pages, mamba)
        assert plan_transition(model, live, target).feasible
        assert not plan_transition(model, live, target.with_sizes(moe_cache_size=size + 1)
                                   ).feasible
    kv = ranges["kv"]
    assert kv.max_keeping_others % 64 == 0
    assert plan_transition(model, live, live.with_sizes(num_pages=kv.max_keeping_others // 64)
                           ).feasible
    assert not plan_transition(
        model, live, live.with_sizes(num_pages=kv.max_keeping_others // 64 + 1)).feasible


@given(floor=st.integers(1, 100_000), ratio=st.floats(1.05, 4.0),
       step=st.integers(1, 200_000), page=st.sampled_from([1, 16, 64]),
       top=st.integers(1, 2_000_000))
def test_levels_are_increasing_page_aligned_and_end_at_the_top(
    floor: int, ratio: float, step: int, page: int, top: int
) -> None:
    levels = kv_levels(LadderSpec(kv_floor_tokens=floor, kv_step_ratio=ratio,
                                  kv_step_tokens=step),
                       page_size=page, kv_max_tokens=top)
    assert levels == sorted(set(levels))
    assert all(level % page == 0 for level in levels)
    if top >= page:
        assert levels[-1] == top // page * page
    for a, b in itertools.pairwise(levels[:-1]):
        # The ratio's step, or the cap when that is smaller; up to a page of rounding.
        assert b <= max(a + page, min(a * ratio, a + step) + page)


def test_default_geometric_steps_stop_growing_at_16k() -> None:
    levels = kv_levels(LadderSpec(), page_size=16, kv_max_tokens=262_144)
    steps = [b - a for a, b in itertools.pairwise(levels)]
    assert levels[:3] == [4096, 5808, 8224]  # sqrt(2) apart, page-aligned
    assert max(steps) == 16_384
    assert levels[-3:-1] == [levels[-2] - 16_384, levels[-2]]  # linear at the top
    # Beyond ~40k tokens the ratio would step further than 16k; every step there is the cap.
    assert all(b - a == 16_384 for a, b in itertools.pairwise(levels[:-1]) if a >= 40_000)
