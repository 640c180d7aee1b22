"""The daemon beside `ft serve` booted the usual way: KV sized by ft serve, not by `--num-tokens`.

Issue 16: on such a boot the live geometry sits a page or a drift above `cache_budget_bytes`,
and every plan, even a pure shrink, used to be refused. Each fixture of `tests/ftserve_boot.py`
(default boot and `--moe-cache-auto`, with and without mamba, three models, three readings of
free memory) goes through the real CLI (`status`, `plan`, `rungs` on a saved status document)
and through the policy and safeguards that make `run`'s first move.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.ftserve.budget import MemoryModel
from engine.ftserve.geometry import CacheStatus, Geometry, parse_cache_status
from engine.ftserve.planner import SIZE_FIELD, Plan, plan_transition
from engine.reference.runtime import ReferenceEngine
from engine.reference.server import make_app
from ladder.cli import main
from ladder.config import merge
from ladder.daemon import build_daemon
from ladder.demo import demo_engine_config
from ladder.rungs import Ladder, LadderSpec, build_ladder, reachable_ranges
from ladder.safeguards import Safeguards
from policies.api import Observation
from policies.registry import load_policy
from tests.ftserve_boot import (
    BOOTS,
    MIB,
    MODELS,
    TINY_QWEN35_H200,
    Boot,
    BootModel,
    boot_geometry,
    boot_status,
    physical_bytes,
)

CASES = [(model, boot, drift) for model in MODELS for boot, drift in BOOTS]
IDS = [f"{m.name}-{boot}{drift // MIB:+d}MiB" for m, boot, drift in CASES]


@functools.cache
def _doc(model: BootModel, boot: Boot, drift_bytes: int) -> str:
    return json.dumps(boot_status(model, boot, drift_bytes))


@functools.cache
def _pure(model: BootModel, boot: Boot, drift_bytes: int) -> tuple[CacheStatus, MemoryModel,
                                                                   Ladder]:
    status = parse_cache_status(json.loads(_doc(model, boot, drift_bytes)))
    memory = MemoryModel.from_status(status)
    return status, memory, build_ladder(memory, status.geometry, LadderSpec())


def _cli(capsys: pytest.CaptureFixture[str], status_file: Path, *args: str) -> tuple[int, Any]:
    code = main([*args, "--status", str(status_file), "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.fixture(params=CASES, ids=IDS)
def case(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, CacheStatus,
                                                                  MemoryModel, Ladder]:
    model, boot, drift = request.param
    path = tmp_path / "status.json"
    path.write_text(_doc(model, boot, drift))
    return (path, *_pure(model, boot, drift))


def _target(sizes: dict[str, int]) -> str:
    return ",".join(f"{'kv_pages' if pool == 'kv' else pool}={n}" for pool, n in sizes.items())


def test_the_kit_reproduces_the_report_of_issue_16() -> None:
    model = TINY_QWEN35_H200
    moe, pages = boot_geometry(model, "default", 2 * MIB)
    assert (moe, pages, model.mamba_slots) == (128, 3_956_321, 8)
    # The report's "the live geometry already holds 8922341376 B".
    assert physical_bytes(model, moe, pages, model.mamba_slots) == 8_922_341_376
    status = parse_cache_status(boot_status(model, "default", 2 * MIB))
    assert MemoryModel.from_status(status).over_budget_bytes(status.geometry) == (
        8_922_341_376 - 8_920_242_585)


@pytest.mark.parametrize(("model", "boot", "drift"), CASES, ids=IDS)
def test_ft_serve_boots_land_above_the_budget(model: BootModel, boot: Boot, drift: int) -> None:
    status = parse_cache_status(boot_status(model, boot, drift))
    memory = MemoryModel.from_status(status)
    # Usable pages fill the reading, so the dummy page (and any positive drift) is over it.
    assert (memory.over_budget_bytes(status.geometry) > 0) == (drift >= 0)
    assert memory.engine_accepts(status.geometry) == (
        memory.fit_check_bytes(status.geometry) <= status.cache_budget_bytes)


def test_pure_shrinks_plan_in_one_call(capsys: pytest.CaptureFixture[str],
                                       case: tuple[Path, CacheStatus, MemoryModel, Ladder]
                                       ) -> None:
    path, status, memory, _ = case
    live, floors = status.geometry, status.floors
    shrinks = [{"kv": live.num_pages // 2}]
    if status.shape.max_expert_slots and live.moe_cache_size > floors.moe_slots:
        shrinks.append({"moe": floors.moe_slots})
    if status.shape.has_mamba:
        shrinks.append({"mamba": floors.mamba_slots})
        shrinks.append({"moe": floors.moe_slots, "kv": live.num_pages // 2,
                        "mamba": floors.mamba_slots})
    for sizes in shrinks:
        code, plan = _cli(capsys, path, "plan", "--to", _target(sizes))
        assert (code, plan["feasible"], len(plan["steps"])) == (0, True, 1), (sizes, plan)
        # Never above what the live geometry holds, even when that is over the budget.
        assert plan["peak_bytes"] <= plan["live_bytes"] == memory.total_bytes(live)
        assert plan["live_over_budget_bytes"] == memory.over_budget_bytes(live)


def _check_reaches(memory: MemoryModel, live: Geometry, plan: Plan) -> None:
    assert plan.feasible, plan.reason
    assert 1 <= len(plan.steps) <= 2
    assert all(s.peak_bytes <= memory.ceiling_bytes(live) for s in plan.steps)
    assert all(memory.engine_accepts(s.after) for s in plan.steps)
    assert memory.total_bytes(plan.target) <= memory.budget_bytes


def test_every_rung_is_reached_in_at_most_two_calls(
        capsys: pytest.CaptureFixture[str],
        case: tuple[Path, CacheStatus, MemoryModel, Ladder]) -> None:
    path, status, memory, ladder = case
    live = status.geometry
    assert ladder.rungs, ladder.dropped
    assert ladder.index_of(live) is None  # the boot geometry fills more than the budget
    for rung in ladder.rungs:
        _check_reaches(memory, live, plan_transition(memory, live, rung.geometry))
    # The CLI sends the same: its plan onto the top rung.
    top = ladder.top.geometry
    code, plan = _cli(capsys, path, "plan", "--to", _target({
        "moe": top.moe_cache_size, "kv": top.num_pages, "mamba": top.num_mamba_slots}))
    assert (code, plan["feasible"]) == (0, True) and 1 <= len(plan["steps"]) <= 2


def test_status_ranges_are_sizes_plan_sends(
        capsys: pytest.CaptureFixture[str],
        case: tuple[Path, CacheStatus, MemoryModel, Ladder]) -> None:
    path, status, _, ladder = case
    floors, shape = status.floors, status.shape
    code, doc = _cli(capsys, path, "status")
    assert code == 0
    assert [r["kv_tokens"] for r in doc["rungs"]] == [r.kv_tokens for r in ladder.rungs]
    floor_sizes = {"moe": floors.moe_slots,
                   "kv": math.ceil(floors.kv_tokens / shape.page_size),
                   "mamba": floors.mamba_slots}
    caps = {"moe": shape.max_expert_slots}
    for r in doc["ranges"]:
        pool = r["pool"]
        scale = shape.page_size if pool == "kv" else 1
        for key, others in (("max_keeping_others", {}),
                            ("max_with_others_at_floor",
                             {p: n for p, n in floor_sizes.items() if p != pool
                              and (p != "mamba" or shape.has_mamba)})):
            top = r[key]
            assert top is not None, (pool, key)
            assert top % scale == 0
            size = top // scale
            code, plan = _cli(capsys, path, "plan", "--to",
                              _target({**others, pool: size}))
            assert code == 0, (pool, key, plan["reason"])
            if size == caps.get(pool):
                continue
            code, plan = _cli(capsys, path, "plan", "--to",
                              _target({**others, pool: size + 1}))
            assert code == 1, (pool, key, size + 1)
        # A size strictly inside the range plans too (ranges are contiguous).
        middle = (r["min"] + r["max_keeping_others"]) // 2 // scale
        if middle * scale >= r["min"]:
            assert _cli(capsys, path, "plan", "--to", _target({pool: middle}))[0] == 0


def test_run_first_move_lands_on_a_rung_in_at_most_two_calls(
        case: tuple[Path, CacheStatus, MemoryModel, Ladder]) -> None:
    _, status, memory, ladder = case
    live = status.geometry
    view = ladder.view(transition_s=1.0)
    policy = load_policy("headroom", {})
    # The controller's first observation: off the ladder, nothing running yet.
    obs = Observation(now_s=0.0, rung=None, live_kv_tokens=0, pending_kv_tokens=0,
                      active_requests=0, decode_tps=None)
    decision = policy.decide(obs, view)
    verdict = Safeguards().admit(0.0, None, decision, 0, view)
    assert verdict.allowed, verdict.reason
    _check_reaches(memory, live, plan_transition(memory, live,
                                                 ladder.rungs[verdict.rung].geometry))


@settings(max_examples=60, deadline=None)
@given(model=st.sampled_from(MODELS), drift_bytes=st.integers(-8 * MIB, 8 * MIB),
       moe_share=st.floats(0.0, 1.0), running=st.integers(1, 4))
def test_ranges_never_advertise_a_size_plan_refuses(model: BootModel, drift_bytes: int,
                                                    moe_share: float, running: int) -> None:
    slots = model.num_experts + round(moe_share * (model.boot_moe_slots - model.num_experts))
    variant = replace(model, boot_moe_slots=slots, max_running_requests=running)
    status = parse_cache_status(boot_status(variant, "default", drift_bytes))
    memory, live = MemoryModel.from_status(status), status.geometry

    def plans(pool: str, size: int) -> bool:
        return plan_transition(memory, live, live.with_sizes(**{SIZE_FIELD[pool]: size})).feasible

    for r in reachable_ranges(memory, live, status.limits):
        if r.max_keeping_others is None:
            continue
        unit = status.shape.page_size if r.pool == "kv" else 1
        low, top = math.ceil(r.minimum / unit), r.max_keeping_others // unit
        assert all(plans(r.pool, size) for size in {low, (low + top) // 2, top}), r
        if r.pool != "moe" or top < status.shape.max_expert_slots:
            assert not plans(r.pool, top + 1), r


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["freetoken", "incremental"])
@pytest.mark.parametrize("drift_pages", [0, 3])
async def test_daemon_beside_a_default_booted_reference_engine(
        aiohttp_server: Any, capsys: pytest.CaptureFixture[str], mode: str,
        drift_pages: int) -> None:
    config = demo_engine_config()
    page_bytes = config.model.page_size * config.model.kv_bytes_per_token
    engine = ReferenceEngine(replace(config, num_pages=None, rebuild_mode=mode,
                                     boot_drift_bytes=drift_pages * page_bytes))
    url = str((await aiohttp_server(make_app(engine))).make_url("")).rstrip("/")

    async def cli(*args: str) -> tuple[int, Any]:
        code = await asyncio.to_thread(main, [*args, "--server", url, "--json"])
        return code, json.loads(capsys.readouterr().out)

    memory = engine.memory_model
    booted = engine.geometry()
    assert engine.memory.allocated_bytes == memory.total_bytes(booted) > memory.budget_bytes
    code, doc = await cli("status")
    assert code == 0 and doc["allocated_bytes"] == engine.memory.allocated_bytes
    kv = next(r for r in doc["ranges"] if r["pool"] == "kv")
    assert kv["max_keeping_others"] is not None
    # A pure KV shrink over HTTP: planned in one call and applied, never above the boot bytes.
    half = f"kv_pages={booted.num_pages // 2}"
    code, plan = await cli("plan", "--to", half)
    assert (code, len(plan["steps"])) == (0, 1), plan["reason"]
    engine.memory.reset_peak()
    code, _ = await cli("apply", "--to", half)
    assert code == 0
    assert engine.geometry().num_pages == booted.num_pages // 2
    assert engine.memory.peak_bytes <= memory.total_bytes(booted)

    # Boot again and let `run`'s controller make its first move.
    engine = ReferenceEngine(replace(config, num_pages=None, rebuild_mode=mode,
                                     boot_drift_bytes=drift_pages * page_bytes))
    url = str((await aiohttp_server(make_app(engine))).make_url("")).rstrip("/")
    daemon_config = merge({
        "servers": [{"name": "s", "url": url, "policy": "headroom",
                     "ladder": {"kv_floor_tokens": 512}}],
        "control": {"apply_poll_s": 0.01}})
    engine.memory.reset_peak()
    async with aiohttp.ClientSession() as session:
        controller = build_daemon(daemon_config, session).controllers[0]
        await controller.tick()
    assert controller.rung is not None, controller.last_verdict
    record = controller.transitions[-1]
    assert record.reached and 1 <= len(record.result["steps"]) <= 2
    assert controller.ladder is not None
    assert engine.geometry() == controller.ladder.rungs[controller.rung].geometry
    assert engine.memory.peak_bytes <= max(memory.budget_bytes, memory.total_bytes(booted))
