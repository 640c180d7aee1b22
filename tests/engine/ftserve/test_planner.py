"""The planner, checked against a small independent simulator of the engines' execution order.

The simulator below re-derives physical bytes and the order of frees and allocations from
ft serve's order (README, "How a transition is priced") on its own; it shares no code with
`engine.ftserve.planner`.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from engine.ftserve.budget import MemoryModel
from engine.ftserve.geometry import (
    EngineModel,
    Floors,
    Geometry,
    ModelShape,
    UnitCosts,
    parse_cache_status,
)
from engine.ftserve.planner import plan_transition
from tests.conftest import load_fixture

ORDER = ("moe_cache_size", "num_pages", "num_mamba_slots")


def physical_bytes(model: MemoryModel, pool: str, size: int) -> int:
    u, shape = model.units, model.shape
    if pool == "moe_cache_size":
        return size * u.moe_per_expert
    if pool == "num_pages":
        return (size + 1) * shape.page_size * u.kv_per_token if size else 0
    return (size + 1) * u.mamba_per_slot if size else 0


def simulate_call(model: MemoryModel, before: dict[str, int], body: dict[str, int]) -> int:
    """Peak bytes of one ft serve rebuild call: each pool frees itself, then allocates."""
    held = {p: physical_bytes(model, p, before[p]) for p in ORDER}
    peak = sum(held.values())
    for pool in ORDER:
        if pool in body:
            held[pool] = 0
            held[pool] = physical_bytes(model, pool, body[pool])
            peak = max(peak, sum(held.values()))
    return peak


def simulate_chunked(model: MemoryModel, before: dict[str, int], body: dict[str, int],
                     chunk_bytes: int) -> int:
    """Peak of the reference engine's call: release chunks of shrinking pools, then add chunks."""
    held = {p: physical_bytes(model, p, before[p]) for p in ORDER}
    peak = sum(held.values())
    want = {p: physical_bytes(model, p, body.get(p, before[p])) for p in ORDER}
    for pool in ORDER:
        while held[pool] > want[pool]:
            held[pool] = max(want[pool], held[pool] - chunk_bytes)
    for pool in ORDER:
        while held[pool] < want[pool]:
            held[pool] = min(want[pool], held[pool] + chunk_bytes)
            peak = max(peak, sum(held.values()))
    return peak


def report_model() -> tuple[MemoryModel, Geometry]:
    status = parse_cache_status(load_fixture("seed-rtx5080-status.json"))
    return MemoryModel.from_status(status), status.geometry


@pytest.mark.parametrize(
    ("target", "bodies"),
    [
        (Geometry(1024, 1024, 8), [{"num_pages": 1024}, {"moe_cache_size": 1024}]),
        (Geometry(1400, 128, 4),
         [{"num_pages": 128, "num_mamba_slots": 4}, {"moe_cache_size": 1400}]),
    ],
)
def test_report_transitions_take_two_safe_calls(
    target: Geometry, bodies: list[dict[str, int]]
) -> None:
    model, live = report_model()
    plan = plan_transition(model, live, target)
    assert plan.feasible, plan.reason
    assert [dict(s.body) for s in plan.steps] == bodies
    assert plan.peak_bytes <= plan.budget_bytes < plan.single_call_peak_bytes
    assert plan.steps[-1].after.to_json() == target.to_json()
    single = simulate_call(model, live.to_json(), target.to_json())
    assert single == plan.single_call_peak_bytes


def test_report_single_call_overshoot_is_one_moe_growth() -> None:
    # The report's OOM: the new experts are allocated while the old KV is still resident.
    model, live = report_model()
    plan = plan_transition(model, live, Geometry(1024, 1024, 8))
    grown = 512 * model.units.moe_per_expert
    assert plan.single_call_peak_bytes == model.total_bytes(live) + grown


def test_safe_direction_is_one_call_and_moe_only_calls_are_preferred() -> None:
    model, live = report_model()
    # A small MoE growth fits beside the old KV: one call, no needless second cold start.
    plan = plan_transition(model, live, Geometry(600, 2048, 8))
    assert [dict(s.body) for s in plan.steps] == [{"moe_cache_size": 600, "num_pages": 2048}]
    grow_moe = plan_transition(model, live, Geometry(700, 4096, 8))
    assert [dict(s.body) for s in grow_moe.steps] == [{"moe_cache_size": 700}]
    assert not grow_moe.steps[0].touches_kv
    grow_kv = plan_transition(model, live, Geometry(512, 4200, 8))
    assert [dict(s.body) for s in grow_kv.steps] == [{"num_pages": 4200}]
    shrink_moe_grow_kv = plan_transition(model, live.with_sizes(moe_cache_size=700),
                                         Geometry(512, 4300, 8))
    assert len(shrink_moe_grow_kv.steps) == 1


def test_grow_kv_while_shrinking_mamba_is_split() -> None:
    # FreeToken #526: an OOM in the KV step latches `failed`; never send that call.
    model, live = report_model()
    start = live.with_sizes(num_pages=2048, num_mamba_slots=12)
    target = Geometry(512, 5000, 4)
    plan = plan_transition(model, start, target)
    assert plan.feasible
    assert plan.single_call_peak_bytes > plan.budget_bytes
    assert [dict(s.body) for s in plan.steps] == [{"num_mamba_slots": 4}, {"num_pages": 5000}]


@pytest.mark.parametrize(
    ("target", "words"),
    [
        (Geometry(400, 4096, 8), "below the floor of 512"),
        (Geometry(30000, 64, 4), "above the 24576 experts"),
        (Geometry(2000, 64, 4), "over the budget"),
        (Geometry(512, 4096, 2), "below the floor of 4 slots"),
    ],
)
def test_refusals_carry_the_reason(target: Geometry, words: str) -> None:
    model, live = report_model()
    plan = plan_transition(model, live, target)
    assert not plan.feasible
    assert words in plan.reason
    assert plan.steps == ()


def test_from_an_over_budget_live_geometry_shrinks_are_safe_and_grows_must_fit() -> None:
    model, _ = report_model()
    over = Geometry(1843, 4096, 8)
    live_bytes = model.total_bytes(over)
    assert live_bytes > model.budget_bytes
    shrink = plan_transition(model, over, Geometry(512, 4096, 8))
    assert shrink.feasible, shrink.reason
    assert [dict(s.body) for s in shrink.steps] == [{"moe_cache_size": 512}]
    assert shrink.peak_bytes == live_bytes == shrink.ceiling_bytes
    assert shrink.live_over_budget_bytes == live_bytes - model.budget_bytes
    # A boot a few experts above the budget (ft serve without --num-tokens) onto a geometry
    # that fits: shrinks first, and the grow lands within the budget.
    boot = Geometry(model.max_moe_slots(kv_pages=4096, mamba_slots=8) + 3, 4096, 8)
    assert model.total_bytes(boot) > model.budget_bytes
    onto = plan_transition(model, boot, Geometry(1374, 512, 8))
    assert onto.feasible, onto.reason
    assert [dict(s.body) for s in onto.steps] == [{"num_pages": 512}, {"moe_cache_size": 1374}]
    state = boot.to_json()
    for step in onto.steps:
        assert simulate_call(model, state, dict(step.body)) == step.peak_bytes
        state = {**state, **step.body}
    assert onto.steps[0].peak_bytes == model.total_bytes(boot)
    assert onto.steps[1].peak_bytes <= model.budget_bytes
    # Any byte above what the live geometry holds must fit the budget: it does not here.
    grow = plan_transition(model, over, Geometry(1844, 4096, 8))
    assert not grow.feasible
    assert "the live geometry holds" in grow.reason
    assert plan_transition(model, over, over).feasible


def test_a_shrink_the_engines_fit_check_rejects_is_not_sent() -> None:
    # ft serve rejects a call whose final geometry is over its cache budget, even a shrink.
    model, _ = report_model()
    over = Geometry(1843, 4096, 8)
    target = Geometry(1842, 4096, 8)
    assert not model.engine_accepts(target)
    plan = plan_transition(model, over, target)
    assert not plan.feasible and plan.steps == ()
    assert "fit-check would reject" in plan.reason


def test_noop_and_json_contract() -> None:
    model, live = report_model()
    plan = plan_transition(model, live, live)
    assert plan.feasible and plan.steps == ()
    doc = json.loads(json.dumps(plan_transition(model, live, Geometry(1024, 1024, 8)).to_json()))
    assert set(doc) >= {"feasible", "engine", "budget_bytes", "from", "to", "steps",
                        "peak_bytes", "single_call_peak_bytes", "reason", "live_bytes",
                        "live_over_budget_bytes", "ceiling_bytes"}
    assert set(doc["from"]) == {"moe_cache_size", "num_pages", "num_mamba_slots"}
    assert set(doc["steps"][0]) >= {"body", "peak_bytes", "after"}


# ---- properties over random geometries -------------------------------------------------------

@st.composite
def scenarios(draw: st.DrawFn, engine: str = "freetoken") -> tuple[MemoryModel, Geometry, Geometry]:
    page_size = draw(st.sampled_from([1, 16, 64]))
    experts = draw(st.integers(4, 256))
    layers = draw(st.integers(1, 48))
    has_mamba = draw(st.booleans())
    units = UnitCosts(
        kv_per_token=draw(st.integers(1, 50_000)),
        moe_per_expert=draw(st.integers(1_000, 30_000_000)),
        mamba_per_slot=draw(st.integers(1_000, 200_000_000)) if has_mamba else 0,
        swa_per_token=0,
    )
    shape = ModelShape(page_size, experts, layers, 0, has_mamba, False)
    floors = Floors(kv_tokens=page_size, moe_slots=experts, mamba_slots=2 if has_mamba else 0)
    engine_model = (EngineModel("reference", "ref", chunk_bytes=draw(st.integers(1 << 16, 1 << 26)),
                                serves_while_rebuilding=True)
                    if engine == "reference" else EngineModel("freetoken", "ft serve"))

    def geometry() -> Geometry:
        return Geometry(
            draw(st.integers(experts, experts * layers)),
            draw(st.integers(1, 20_000)),
            draw(st.integers(2, 40)) if has_mamba else 0,
        )

    live, target = geometry(), geometry()
    model = MemoryModel(shape, units, floors, engine_model, cache_budget_bytes=1)
    need = max(model.total_bytes(live), model.total_bytes(target))
    slack = draw(st.integers(0, need // 4))
    # The reference engine may hold one chunk more while it re-chunks a partial tail.
    slack += engine_model.chunk_bytes
    model = MemoryModel(shape, units, floors, engine_model, cache_budget_bytes=need + slack)
    return model, live, target


@given(scenarios())
def test_ftserve_plans_are_safe_at_every_instant(
    case: tuple[MemoryModel, Geometry, Geometry],
) -> None:
    model, live, target = case
    plan = plan_transition(model, live, target)
    assert plan.feasible, plan.reason
    assert len(plan.steps) <= 2
    state = live.to_json()
    for step in plan.steps:
        body = dict(step.body)
        simulated = simulate_call(model, state, body)
        assert simulated == step.peak_bytes
        assert simulated <= model.budget_bytes
        state = {**state, **body}
    assert state == target.to_json()
    assert plan.single_call_peak_bytes == simulate_call(model, live.to_json(), target.to_json())
    if len(plan.steps) == 2:
        # Split only when the one call would not fit, and the first call frees something.
        assert plan.single_call_peak_bytes > model.budget_bytes
        first = dict(plan.steps[0].body)
        assert any(first[k] < live.to_json()[k] for k in first)


@given(scenarios(engine="reference"))
def test_reference_plans_are_one_chunked_call(
    case: tuple[MemoryModel, Geometry, Geometry],
) -> None:
    model, live, target = case
    plan = plan_transition(model, live, target)
    assert plan.feasible, plan.reason
    assume(plan.steps)
    assert len(plan.steps) == 1
    peak = simulate_chunked(model, live.to_json(), dict(plan.steps[0].body),
                            model.engine.chunk_bytes)
    # The planner adds one chunk per phase for re-chunking a partial tail: never below the
    # simulated peak, never more than a chunk above it, always within the budget.
    assert peak <= plan.peak_bytes <= peak + model.engine.chunk_bytes
    assert plan.peak_bytes <= model.budget_bytes


@given(scenarios(), st.integers(-3, 3), st.integers(-5000, 5000), st.integers(0, 10 ** 10))
def test_infeasible_answers_always_carry_a_reason(
    case: tuple[MemoryModel, Geometry, Geometry], dmoe: int, dpages: int, cut: int
) -> None:
    model, live, target = case
    wild = Geometry(max(0, target.moe_cache_size * (1 + dmoe)), max(0, target.num_pages + dpages),
                    target.num_mamba_slots)
    squeezed = MemoryModel(model.shape, model.units, model.floors, model.engine,
                           max(1, model.cache_budget_bytes - cut))
    plan = plan_transition(squeezed, live, wild)
    if plan.feasible:
        # Nothing above what the live geometry holds unless it fits the budget, and every
        # call ends where the engine's fit-check accepts it.
        ceiling = max(squeezed.budget_bytes, squeezed.total_bytes(live))
        assert plan.peak_bytes <= ceiling
        assert squeezed.total_bytes(wild) <= ceiling
        assert all(squeezed.engine_accepts(step.after) for step in plan.steps)
    else:
        assert plan.reason
        assert plan.steps == ()


@given(scenarios(), st.sampled_from(["freetoken", "reference"]), st.integers(0, 10 ** 10))
def test_a_pure_shrink_is_one_call_from_any_live_geometry(
    case: tuple[MemoryModel, Geometry, Geometry], engine: str, cut: int
) -> None:
    # Whatever the live geometry holds, above the budget or not, every pool shrinking is one
    # call that never holds more than now, unless the engine's fit-check rejects its end.
    model, live, target = case
    engine_model = (EngineModel("reference", "ref", chunk_bytes=1 << 21,
                                serves_while_rebuilding=True)
                    if engine == "reference" else EngineModel("freetoken", "ft serve"))
    squeezed = MemoryModel(model.shape, model.units, model.floors, engine_model,
                           max(1, model.cache_budget_bytes - cut))
    shrunk = Geometry(min(live.moe_cache_size, target.moe_cache_size),
                      min(live.num_pages, target.num_pages),
                      min(live.num_mamba_slots, target.num_mamba_slots))
    assume(shrunk.to_json() != live.to_json())
    plan = plan_transition(squeezed, live, shrunk)
    if not squeezed.engine_accepts(shrunk):
        assert not plan.feasible and "fit-check" in plan.reason
        return
    assert plan.feasible, plan.reason
    assert len(plan.steps) == 1
    assert plan.peak_bytes == squeezed.total_bytes(live)
    if engine == "freetoken":
        assert simulate_call(squeezed, live.to_json(), dict(plan.steps[0].body)) == plan.peak_bytes
    else:
        assert simulate_chunked(squeezed, live.to_json(), dict(plan.steps[0].body),
                                1 << 21) == plan.peak_bytes
