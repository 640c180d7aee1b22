"""`python -m bench.replay`: bad input is one line on stderr and exit 2, before any work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.replay.__main__ import main

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("argv", "message"), [
    (["seeds", "--seeds", "two"], "seeds: a count, a list"),
    (["seeds", "--workloads", "agentic,nope"], "unknown workload: nope"),
    (["seeds", "--arms", "fastest"], "unknown arm: fastest"),
    (["seeds", "--kv-step", "wide"], "kv-step: 'wide' is not a count"),
    (["seeds", "--kv-step", "0"], "kv-step: '0' is not a positive count"),
])
def test_bad_arguments_are_one_line(argv: list[str], message: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_bad_calibration_file_is_an_error_before_any_replay(tmp_path: Path) -> None:
    bad = tmp_path / "cal.json"
    bad.write_text("{}")
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.replay", "seeds", "--seeds", "1", "--calibration",
         str(bad), "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: {bad}: not a replay calibration (schema moe-ladder.replay-calibration.v1)"]
    assert not out.exists()


def test_one_seed_of_one_workload_writes_its_document(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str],
                                                      ) -> None:
    out = tmp_path / "seeds.json"
    assert main(["seeds", "--seeds", "1", "--workloads", "report", "--workers", "1",
                 "--arms", "static-full,pinned-0,grow-only,headroom,oracle,"
                 "freetoken-pinned-0,no-miss", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    report = doc["traces"]["report"]
    assert report["seeds"] == [0]
    assert {"headroom_vs_grow_only", "headroom_vs_static_full", "headroom_vs_oracle"} <= set(
        report)
    # The report's card holds at most 1,843 of 24,576 experts: the no-miss ceiling is far
    # above every rung, and every rung is far from it.
    assert report["arms"]["no-miss"][0] > 2 * report["arms"]["pinned-0"][0]
    assert "target" in capsys.readouterr().out


def test_tables_need_both_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tables", "--fidelity", str(tmp_path / "absent.json")]) == 2
    assert "absent.json" in capsys.readouterr().err


def test_kv_step_sets_the_moe_ladder_arms_ladder(tmp_path: Path) -> None:
    """The same seed on 32k and 16k steps: the step is recorded, grow-only (PR #300's own
    ladder) replays to the same numbers, and the pinned arm's do not."""
    docs = {}
    for step in ("32k", "16k"):
        out = tmp_path / f"{step}.json"
        assert main(["seeds", "--seeds", "1", "--workloads", "mixed", "--workers", "1",
                     "--arms", "static-full,grow-only,pinned-0", "--kv-step", step,
                     "--out", str(out)]) == 0
        docs[step] = json.loads(out.read_text())
    assert [docs[s]["meta"]["kv_step_tokens"] for s in ("32k", "16k")] == [32_768, 16_384]
    arms = {s: docs[s]["traces"]["mixed"]["arms"] for s in docs}
    assert arms["32k"]["grow-only"] == arms["16k"]["grow-only"]
    assert arms["32k"]["pinned-0"] != arms["16k"]["pinned-0"]


def test_compare_says_when_a_call_ran_at_two_speeds(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A probed H100 call: its arms' shares of slow rounds are printed beside their tok/s, so
    a reader sees which of two arms the host slowed before reading their ratio."""
    run = ROOT / "bench" / "results" / "h100" / "probe" / "mixed-11" / "ladder-seeds.json"
    out = tmp_path / "compare.json"
    assert main(["compare", str(run), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "decode rounds at two speeds, 11.1 and 17.2 ms (1.55x)" in printed
    assert "grow-only 83%, pinned-0 10%, oracle 0%" in printed
    states = next(iter(json.loads(out.read_text())["runs"].values()))["speed_states"]
    assert states["slow_share"]["grow-only"] > 0.8 > 0.2 > states["slow_share"]["pinned-0"]
