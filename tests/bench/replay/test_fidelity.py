"""Fidelity: the replay's expert hits are the measured ones, and the docs' tables are the
ones the JSON files render."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.replay.calibration import DEFAULT_CALIBRATION, load_profile
from bench.replay.fidelity import device_repeatability, record_fidelity
from bench.replay.records import load_record, replay_record
from bench.replay.tables import fidelity_markdown, seeds_markdown, targets_markdown

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "bench" / "results"


def test_replayed_hits_match_the_h200_record() -> None:
    """Hits come from the engine's routing and LRU, not a fit: grow-only's hit rate on the
    agentic record is reproduced to a point, and its decode speed within the table's error."""
    costs, _ = load_profile(DEFAULT_CALIBRATION, "h200-bench")
    _, _, run = load_record("ladder-agentic")
    predicted = replay_record("ladder-agentic", costs, ["grow-only"])["arms"]
    row = record_fidelity(predicted, {"grow-only": run["arms"]["grow-only"]})["arms"]["grow-only"]
    assert row["predicted_hit_rate"] == pytest.approx(row["measured_hit_rate"], abs=0.01)
    assert abs(row["error"]) < 0.15
    assert predicted["grow-only"]["served"] == run["arms"]["grow-only"]["served"]


def test_the_device_disagrees_with_itself() -> None:
    rows = device_repeatability()
    assert {(r["trace"], r["arm"]) for r in rows} >= {("mixed/seed0/40", "static-full")}
    assert max(r["spread"] for r in rows) > 0.2


def test_the_readme_fidelity_table_is_the_files() -> None:
    fidelity = json.loads((RESULTS / "replay-fidelity.json").read_text())
    assert fidelity_markdown(fidelity) in (ROOT / "README.md").read_text()


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
