"""The speed probe: the same small decode workload before every arm of a device call, and after
the last, so a call's speed is measured on work no policy touches.

Why: the same work on the same card ran up to 1.3x apart from one device call to the next, and
up to 11 % apart within one (docs/results.md, the fidelity table). The replay prices a call it
has not seen at the median recorded speed, so its error on a new call is mostly that call's
speed, not the model. A probe is fixed work on a static geometry: two sessions of two turns,
run side by side (a round of two, the bench engine's `max_running_requests`), short prompts
so the per-request cost, the one cost that moves between calls, dominates its decode time.
The replay solves each probe for that cost (`bench/replay/probe.py`) and prices the call's
arms at it; the probes' spread within the call is the call's own drift, which no model of the
arms can predict.

Pure: the probe's trace and its start rung; bench/policy_bench.py runs it like an arm.
"""

from __future__ import annotations

from bench.traces import TraceRequest

__all__ = ["PROBE", "PROBE_MAX_TOKENS", "PROBE_PROMPT_TOKENS", "probe_demand_tokens",
           "probe_trace"]

PROBE = "probe"
# Real tokens (divided by the bench's --scale like a trace's). 2k of context costs ~0.06 ms
# a token at the fitted context cost, against ~10 ms a request: the probe measures the latter.
PROBE_PROMPT_TOKENS = 2048
# Not scaled by --output-scale: 192 tokens in rounds of ~20 ms is a ~4 s window, long enough
# that the second session's prefill (~70 ms) overlaps under 3 % of it (pairs need > 97 %).
PROBE_MAX_TOKENS = 192
_SESSIONS = 2
_TURNS = 2


def probe_trace(prompt_tokens: int) -> list[TraceRequest]:
    """Two sessions of two turns, sent together, no think time: every turn a round of two."""
    return [TraceRequest(0.0, f"probe-{session}", prompt_tokens, PROBE_MAX_TOKENS, "chat")
            for _ in range(_TURNS) for session in range(_SESSIONS)]


def probe_demand_tokens(prompt_tokens: int) -> int:
    """KV tokens the probe's rung must hold: both sessions' requests at once."""
    return _SESSIONS * (prompt_tokens + PROBE_MAX_TOKENS)
