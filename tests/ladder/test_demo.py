"""`ladder run` end to end: reference engine + daemon + gate over loopback HTTP (the demo)."""

from __future__ import annotations

import pytest

from ladder.demo import render_summary, run_demo


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_daemon_steps_up_before_a_long_request_and_back_down_after() -> None:
    lines: list[str] = []
    result = await run_demo(short_requests=2, long_prompt_tokens=3000, dwell_s=2.0,
                            say=lines.append)
    assert result.refused == 0
    assert result.truncated == 0
    assert [p.requests for p in result.phases] == [2, 1, 2]
    reached = [t for t in result.transitions if t["reached"]]
    assert all(t["reached"] for t in result.transitions)
    # Up to a rung whose KV holds the long request (3000 prompt + 96 output tokens) ...
    ups = [t for t in reached if t["kv_tokens"] >= 3096]
    assert ups, result.transitions
    top_index = result.transitions.index(ups[0])
    # ... and back down to the lowest rung once it had ended.
    downs = [t for t in result.transitions[top_index + 1:] if t["to_rung"] == 0]
    assert downs, result.transitions
    assert downs[0]["expert_slots"] > ups[0]["expert_slots"]
    summary = render_summary(result)
    assert "0 refused, 0 truncated" in summary
    assert any("rung" in line for line in lines)
