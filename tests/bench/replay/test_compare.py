"""A GPU many-seed run beside the replay of the same trace and seed."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from bench.replay.calibration import DEFAULT_CALIBRATION, load_profile
from bench.replay.compare import compare_run, pass_pairs
from bench.replay.records import RecordSetup, replay_run

RUN = (Path(__file__).resolve().parents[3] / "bench" / "results" / "h200" / "seeds"
       / "agentic-1" / "ladder-seeds.json")


def test_the_h200_seed_run_is_replayed_arm_for_arm() -> None:
    doc = json.loads(RUN.read_text())
    run = doc["runs"]["agentic/seed1"]
    run = {**run, "arms": {a: run["arms"][a] for a in ("static-full", "pinned-0")}}
    got = compare_run(run, doc["meta"], load_profile(DEFAULT_CALIBRATION, "h200-bench")[0])
    assert (got["trace"], got["seed"], got["requests"]) == ("agentic", 1, 10)
    row = got["tps"]["arms"]["pinned-0"]
    assert row["measured_tps"] == run["arms"]["pinned-0"]["decode_tps"]
    assert row["predicted_served"] == row["measured_served"] == 10
    ratio = got["vs_static_full"]["pinned-0"]
    assert ratio["measured"] == pytest.approx(
        run["arms"]["pinned-0"]["decode_tps"] / run["arms"]["static-full"]["decode_tps"],
        abs=1e-4)
    assert got["vs_static_full"]["static-full"] == {"measured": 1.0, "predicted": 1.0,
                                                    "error": 0.0}
    assert ratio["predicted"] > 1.2  # the ladder beats static-full in the replay too


def test_a_run_replays_on_the_ladder_step_it_ran() -> None:
    """Runs before 2026-12-07 name no step and ran the 32k one; later runs name theirs."""
    doc = json.loads(RUN.read_text())
    run = doc["runs"]["agentic/seed1"]
    costs = load_profile(DEFAULT_CALIBRATION, "h200-bench")[0]
    assert "kv_step_tokens" not in doc["meta"]

    def widest_step(meta: dict) -> int:
        kv = [r["kv_tokens"] for r in replay_run(RecordSetup(file=""), meta, run, costs,
                                                 ["pinned-0"])["ladders"]["pinned-0"]]
        return max(b - a for a, b in itertools.pairwise(kv[:-1]))

    assert widest_step(doc["meta"]) == 32_768
    assert compare_run(run, doc["meta"], costs)["kv_step_tokens"] == 32_768
    assert widest_step({**doc["meta"], "kv_step_tokens": 16_384}) == 16_384


def test_the_cli_says_when_a_run_has_no_static_full_arm(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from bench.replay.__main__ import main

    doc = json.loads(RUN.read_text())
    run = doc["runs"]["agentic/seed1"]
    doc["runs"] = {"agentic/seed1": {**run, "arms": {"pinned-0": run["arms"]["pinned-0"]}}}
    path = tmp_path / "ladder-seeds.json"
    path.write_text(json.dumps(doc))
    assert main(["compare", str(path), "--out", str(tmp_path / "out.json")]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "pinned-0" in x)
    assert line.endswith("no static-full arm") and "0.000" not in line


def test_an_arm_run_twice_is_paired_with_itself() -> None:
    """`--passes 2`: each arm's pass 2 over pass 1, measured and at both probe prices, from
    the compare document of the probed calls (pure: no replay)."""
    doc = json.loads((RUN.parents[3] / "h100" / "probe" / "replay-compare.json").read_text())
    pairs = pass_pairs(doc["runs"])
    assert {p["run"].split(":")[1] for p in pairs} == {"mixed/seed12", "mixed/seed13",
                                                        "handoff/seed8"}
    for pair in pairs:
        first = doc["runs"][pair["run"]]["tps"]["arms"][pair["arm"]]
        second = doc["runs"][pair["run"] + "/pass2"]["tps"]["arms"][pair["arm"]]
        assert pair["measured"] == pytest.approx(
            second["measured_tps"] / first["measured_tps"], abs=1e-4)
        assert pair["at_arm_probes"] > 0 and pair["at_call_probe"] > 0
    assert doc["passes"] == pairs
    # A run without its second pass pairs with nothing.
    assert pass_pairs({k: r for k, r in doc["runs"].items() if "/pass2" not in k}) == []
