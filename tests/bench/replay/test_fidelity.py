"""Fidelity: the replay's expert hits are the measured ones, and the docs' tables are the
ones the JSON files render."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench.policy_arms import DEFAULT_ARM
from bench.replay.calibration import DEFAULT_CALIBRATION, load_profile
from bench.replay.fidelity import device_repeatability, fidelity_doc, record_fidelity
from bench.replay.fit import decode_fit
from bench.replay.records import RECORDS, load_record, record_options, replay_record
from bench.replay.tables import (
    fidelity_markdown,
    fidelity_summary_markdown,
    gpu_markdown,
    kv_step_markdown,
    passes_markdown,
    probe_markdown,
    seeds_markdown,
    targets_markdown,
)

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "bench" / "results"


def test_replayed_hits_match_the_h200_record() -> None:
    """Hits come from the engine's routing and LRU, not a fit: grow-only's hit rate on the
    agentic record is reproduced to a point, and at the record's own speed its decode speed
    within the table's error."""
    costs, _ = load_profile(DEFAULT_CALIBRATION, "h200-bench")
    costs = dataclasses.replace(costs, request_s=decode_fit().request_s_by_record[
        "ladder-agentic"])
    _, _, run = load_record("ladder-agentic")
    predicted = replay_record("ladder-agentic", costs, ["grow-only"])["arms"]
    row = record_fidelity(predicted, {"grow-only": run["arms"]["grow-only"]})["arms"]["grow-only"]
    assert row["predicted_hit_rate"] == pytest.approx(row["measured_hit_rate"], abs=0.01)
    assert abs(row["error"]) < 0.10
    assert predicted["grow-only"]["served"] == run["arms"]["grow-only"]["served"]


def test_every_per_seed_gpu_run_is_a_record() -> None:
    """A run gpu_run.sh policy_seeds wrote under bench/results/CARD/seeds is fitted and
    checked without being listed by hand."""
    runs = sorted(RESULTS.glob("*/seeds/*/ladder-seeds.json"))
    assert len(runs) >= 12
    names = {f"{p.parts[-4]}/{p.parts[-2]}" for p in runs}
    assert names <= set(RECORDS)
    assert {RECORDS[n].group for n in names} == {"seed_runs"}
    assert decode_fit().request_s_by_record.keys() >= names


def test_a_record_replays_with_the_settings_it_ran_with() -> None:
    """What a record's meta names it ran with; what it does not, as the code of its day."""
    setup, meta, run = load_record("h100/agentic-0")
    opts = record_options(setup, meta, run)
    assert "oracle_waits_for" not in meta and opts.oracle_waits_for == "first-token"
    assert opts.kv_step_tokens == setup.kv_step_tokens == 32_768
    newer = {**meta, "oracle_waits_for": "queue", "kv_step_tokens": 16_384}
    opts = record_options(setup, newer, run)
    assert (opts.oracle_waits_for, opts.kv_step_tokens, opts.seed) == ("queue", 16_384, 0)


def test_the_device_disagrees_with_itself() -> None:
    """Across calls the same work lands up to 28 % apart; within one call up to 11 %."""
    aa = device_repeatability()
    across = {(r["trace"], r["arm"]): r["spread"] for r in aa["across_calls"]}
    assert across[("mixed/seed0/40", "static-full")] > 0.2
    within = {r["record"]: r["spread"] for r in aa["within_call"]}
    assert within["h100/handoff-0"] > 0.1 and within["h100/mixed-0"] < 0.01


def test_the_readme_fidelity_table_is_the_files() -> None:
    fidelity = json.loads((RESULTS / "replay-fidelity.json").read_text())
    assert fidelity_summary_markdown(fidelity) in (ROOT / "README.md").read_text()
    assert fidelity_markdown(fidelity) in (ROOT / "docs" / "results.md").read_text()


def test_the_results_tables_are_the_files() -> None:
    seeds = json.loads((RESULTS / "replay-seeds.json").read_text())
    results = (ROOT / "docs" / "results.md").read_text()
    assert seeds_markdown(seeds) in results
    assert targets_markdown(seeds) in results
    for trace in ("agentic", "mixed", "handoff", "report"):
        s = seeds["traces"][trace]
        assert len(s["seeds"]) >= 30
        assert {"seeds", "arms", "headroom_vs_grow_only", "headroom_vs_static_full",
                "headroom_vs_oracle"} <= set(s)


def test_the_ladder_step_table_is_the_files() -> None:
    """docs/results.md's step table: the default step's many-seed file beside the same seeds
    replayed on every other step (`seeds --kv-step`), each a full 30-seed run."""
    seeds = json.loads((RESULTS / "replay-seeds.json").read_text())
    steps = [json.loads(p.read_text()) for p in sorted((RESULTS / "replay-kv-step").glob("*.json"))]
    assert len(steps) >= 2
    assert seeds["meta"]["kv_step_tokens"] not in {d["meta"]["kv_step_tokens"] for d in steps}
    for doc in steps:
        assert doc["meta"]["default_arm"] == seeds["meta"]["default_arm"]
        assert all(len(t["seeds"]) >= 30 for t in doc["traces"].values())
    assert kv_step_markdown([seeds, *steps]) in (ROOT / "docs" / "results.md").read_text()


def test_the_held_out_gpu_table_is_the_file() -> None:
    """docs/results.md's table of the GPU runs after the calibration froze: one row a run
    file under bench/results/h100/step16k, each on the step its meta names."""
    doc = json.loads((RESULTS / "replay-vs-gpu-step16k.json").read_text())
    files = sorted((RESULTS / "h100" / "step16k").glob("*/ladder-seeds.json"))
    assert len(doc["runs"]) == len(files) >= 9
    for key, run in doc["runs"].items():
        meta = json.loads((ROOT / key.split(":")[0]).read_text())["meta"]
        assert run["kv_step_tokens"] == meta["kv_step_tokens"]
    table = gpu_markdown(doc, DEFAULT_ARM)
    assert table.count("\n") == len(files) + 1
    assert table in (ROOT / "docs" / "results.md").read_text()


def test_a_record_held_out_is_also_priced_at_its_static_full_arms_speed() -> None:
    """Static-full's windows give the call's speed; its other arms are then predicted with the
    record left out of the fit (H100 mixed seed 2: each within 10 % at that speed)."""
    costs, _ = load_profile(DEFAULT_CALIBRATION, "h200-bench")
    doc = fidelity_doc(costs, ["h100/mixed-2"])
    entry = doc["records"]["h100/mixed-2"]
    at_speed = entry["held_out_at_static_full_speed"]
    _, _, run = load_record("h100/mixed-2")
    assert set(at_speed["arms"]) == set(run["arms"]) - {"static-full"}
    assert at_speed["arms_within_10pct"] == at_speed["arms_compared"] == 5
    summary = doc["summary"]["seed_runs"]["held_out_at_static_full_speed"]
    assert summary["arms_compared"] == 5


def test_the_probe_tables_are_the_file() -> None:
    """docs/results.md's probed GPU runs: one block a run (a pass) of the files under
    bench/results/h100/probe, and a row an arm run twice in one call."""
    doc = json.loads((RESULTS / "h100" / "probe" / "replay-compare.json").read_text())
    files = sorted((RESULTS / "h100" / "probe").glob("*/ladder-seeds.json"))
    runs = sum(len(json.loads(f.read_text())["runs"]) for f in files)
    assert len(doc["runs"]) == runs > len(files) >= 6
    assert all(len(r["probe"]["request_s"]) == 5 for r in doc["runs"].values())
    results = (ROOT / "docs" / "results.md").read_text()
    assert probe_markdown(doc) in results
    assert len(doc["passes"]) >= 12 and passes_markdown(doc) in results
