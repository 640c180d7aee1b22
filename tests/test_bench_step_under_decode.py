"""CI smoke test of bench/step_under_decode.py: one KV -> experts step under decode on the CPU,
whose report keys (the README's figures and the pause-budget comparison) must stay there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import step_under_decode


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_step_bench_compares_pause_budgets(tmp_path: Path) -> None:
    target = tmp_path / "transition.json"
    assert step_under_decode.main(["--device", "cpu", "--small", "--out", str(target)]) == 0
    report = json.loads(target.read_text())
    summary = report["summary"]
    assert summary["incremental_status"] == "ok" and summary["replay_tokens_match"] is True
    assert summary["freetoken_status"] == "rejected"
    for key in ("incremental_wall_s", "pause_p50_ms", "pause_p99_ms", "moved_bytes",
                "hit_rate_before", "hit_rate_later"):
        assert is_number(summary[key]), key
    runs = report["pause_budgets"]
    assert set(runs) == set(summary["pause_budgets"]) == {"0", "2"}
    for key, run in runs.items():
        assert run["status"] == "ok", run
        assert run["budget_s"] == float(key) / 1e3
        for name in ("wall_s", "decode_rounds", "chunk_ops", "baseline_decode_tps",
                     "tokens_during", "tokens_lost"):
            assert is_number(run[name]), (key, name)
        for name in ("p50_ms", "p99_ms", "max_ms"):
            assert is_number(run["round_pauses"][name]), (key, name)
        assert all(is_number(v) for v in summary["pause_budgets"][key].values()), key
    # One operation a round at 0; a 2 ms round holds several of the tiny model's operations.
    assert runs["2"]["decode_rounds"] < runs["0"]["decode_rounds"]
