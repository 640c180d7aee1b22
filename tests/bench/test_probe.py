"""The speed probe's work: fixed, small, two requests side by side."""

from __future__ import annotations

from bench.probe import PROBE_MAX_TOKENS, probe_demand_tokens, probe_trace


def test_the_probe_is_two_sessions_of_two_turns_sent_together() -> None:
    trace = probe_trace(2048)
    assert [r.session for r in trace] == ["probe-0", "probe-1", "probe-0", "probe-1"]
    assert {(r.t_s, r.prompt_tokens, r.max_tokens) for r in trace} == {
        (0.0, 2048, PROBE_MAX_TOKENS)}
    # Its rung holds both sessions' requests at once, so the pair decodes side by side.
    assert probe_demand_tokens(2048) == 2 * (2048 + PROBE_MAX_TOKENS)
