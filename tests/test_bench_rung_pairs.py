"""CI smoke tests of bench/rung_pairs.py: the plan mode on the four geometries at 99 % fill, and
the engine mode at the smallest sizes on two transitions with real allocations."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from bench import rung_pairs
from engine.ftserve.budget import MemoryModel
from engine.ftserve.geometry import parse_cache_status
from engine.reference.scenarios import REPORT


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return rung_pairs


def test_geometry_files_parse_and_cite_their_sources(bench: ModuleType) -> None:
    paths = sorted(bench.GEOMETRY_DIR.glob("*.json"))
    assert len(paths) == 3
    for path in paths:
        doc = json.loads(path.read_text())
        status = parse_cache_status(doc)  # the real parser, as from /v1/cache/status
        assert doc["_note"] and doc["_bench"]["headroom_source"]
        # The live geometry fits its budget, as --moe-cache-auto leaves it.
        assert MemoryModel.from_status(status).fits(status.geometry)
    assert bench.REPORT_BENCH["headroom_bytes"] == REPORT.free_at_oom_bytes


def test_plan_mode_at_99_percent(bench: ModuleType) -> None:
    out = bench.run_plan_mode(bench.load_geometries(), [0.99], include_pairs=False)
    rows = {row["geometry"]: row for row in out["table"]}
    assert len(rows) == 4
    for row in rows.values():
        assert row["pairs"] > 0
        assert row["plan_failures"] == 0
        assert row["max_plan_peak_over_budget"] <= 1.0
        # Only MoE-grow-while-KV/mamba-shrink calls can OOM; not all of them do (headroom).
        assert row["fails_but_not_risky"] == 0
    assert rows["rtx5080-report-16gb"]["single_call_failures"] >= 1
    report = next(g for g in out["geometries"] if g["geometry"] == "rtx5080-report-16gb")
    first = report["report_cases"][0]  # README: ladder plan --to moe=1024,kv=64k
    assert first["single_call_peak_bytes"] == 5_946_808_609
    assert first["single_call_outcome"] == "oom_rolled_back"
    assert first["plan_bodies"] == [{"num_pages": 1024}, {"moe_cache_size": 1024}]
    assert first["plan_peak_bytes"] == 4_527_298_849


async def test_engine_mode_real_ooms_only_in_the_single_freetoken_call(
        bench: ModuleType) -> None:
    geo = bench.load_geometries(["rtx5080-report-16gb"])[0]
    sizes = bench.SIZES["tiny"]
    _, ladder = bench.engine_ladder(bench.scale_geometry(geo, sizes))
    top = len(ladder.rungs) - 1
    out = await bench.run_engine_mode(geo, sizes, device="cpu", card_bytes=0,
                                      pair_sample=None, pairs=[(top, 0), (0, top)])
    capacity, budget = out["capacity_bytes"], out["budget_bytes"]
    shrink_kv, grow_kv = out["transitions"]
    assert shrink_kv["risky"] and not grow_kv["risky"]
    assert shrink_kv["predicted_single_call_outcome"] == "oom_rolled_back"
    single = shrink_kv["runs"]["single_freetoken"]
    assert single["ooms"] == 1 and not single["reached"]
    assert single["outcome"] == "rejected" and single["final_state"] == "serving"
    for row in out["transitions"]:
        for key in ("plan_freetoken", "single_incremental"):
            run = row["runs"][key]
            assert run["ooms"] == 0 and run["reached"], (key, run)
        assert row["runs"]["plan_freetoken"]["real_peak_bytes"] <= budget
        assert row["runs"]["plan_freetoken"]["real_peak_bytes"] == (
            row["runs"]["plan_freetoken"]["predicted_peak_bytes"])
        for run in row["runs"].values():
            assert run["real_peak_bytes"] <= capacity
    assert grow_kv["runs"]["single_freetoken"]["ooms"] == 0
    assert out["summary"]["ooms_match_prediction"]


async def test_engine_mode_fills_a_geometry_whose_budget_holds_many_layers_of_experts(
        bench: ModuleType) -> None:
    # gemma-like on 16 GB: the budget holds ~28 layers' worth of experts, more than the tiny
    # model's 4 layers; the scaled model must still let the rungs fill the budget.
    geo = bench.load_geometries(["gemma-4-26b-a4b-like-rtx4080super-16gb"])[0]
    scaled = bench.scale_geometry(geo, bench.SIZES["tiny"])
    assert scaled.spec.num_layers == 29
    _, ladder = bench.engine_ladder(scaled)
    assert all(r.total_bytes >= 0.98 * scaled.budget_bytes for r in ladder.rungs)
    top = len(ladder.rungs) - 1
    out = await bench.run_engine_mode(geo, bench.SIZES["tiny"], device="cpu", card_bytes=0,
                                      pair_sample=None, pairs=[(top, 0)])
    single = out["transitions"][0]["runs"]["single_freetoken"]
    assert single["ooms"] == 1 and out["summary"]["ooms_match_prediction"]


def test_command_line_prints_one_json_object(bench: ModuleType, tmp_path: Path) -> None:
    printed: list[str] = []
    target = tmp_path / "plan.json"
    bench.main(["--mode", "plan", "--fills", "99", "--geometry", "rtx5080-report-16gb",
                "--out", str(target)], emit=printed.append)
    assert len(printed) == 1
    assert json.loads(printed[0]) == json.loads(target.read_text())


def test_default_card_is_16_gib_unless_the_scaled_pools_need_more(bench: ModuleType) -> None:
    gib = 1 << 30
    assert bench.default_card_bytes(2 * gib) == 16 * gib
    # gemma's scaled pools (~15.9 GiB) plus 2 GiB for the model and context: 18 GiB.
    assert bench.default_card_bytes(int(15.9 * gib)) == 18 * gib
