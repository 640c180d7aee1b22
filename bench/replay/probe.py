"""A device call's own speed, from the speed probes it ran (bench/probe.py).

Why: the replay's one cost that moves from call to call is the per-request cost of a decode
round (`DecodeFit`); a call it has not seen is otherwise priced at the median record's. A
probe is fixed work the policy never touches, so solving its decode windows for that one cost,
every other cost held at the calibration's, measures the call's speed without using any arm
being predicted. Two prices follow: the call's (the median of its probes) and each arm's (the
mean of the probe before it and the one after it), and the probes' spread is the drift within
the call that neither can remove.

Pure arithmetic over a run's JSON object.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from bench.probe import PROBE
from bench.replay.calibration import Costs
from bench.replay.fit import decode_samples

__all__ = ["arm_request_s", "probe_request_s", "probe_summary", "window_request_s"]


def probe_request_s(probe: Mapping[str, Any], costs: Costs) -> float | None:
    """The per-request cost that prices `probe`'s decode windows best; None when it has no
    usable window (`window_request_s`)."""
    return window_request_s(probe["per_request"], costs)


def window_request_s(rows: Sequence[Mapping[str, Any]], costs: Costs) -> float | None:
    """The per-request cost that prices the decode windows of `rows` (one arm's requests, run
    without a transition) best: token-weighted least squares in that one unknown, the round,
    context and miss costs held at `costs`; None without a usable window."""
    run = {"per_request": {PROBE: rows}, "transitions": {}}
    weighted = squares = 0.0
    for (_, batch, context, misses), seconds, tokens in decode_samples(run):
        rest = seconds - costs.round_s - costs.context_token_s * context - costs.miss_s * misses
        weighted += tokens * batch * rest
        squares += tokens * batch * batch
    return weighted / squares if squares else None


def _speeds(run: Mapping[str, Any], costs: Costs) -> list[tuple[str | None, float | None]]:
    return [(p["before"], probe_request_s(p, costs)) for p in run.get("probes", ())]


def arm_request_s(run: Mapping[str, Any], costs: Costs) -> dict[str, float]:
    """Each probed arm's price: the mean of the probe just before it and the next one (each
    call's probes end with one after its last arm, so both are of the arm's own call)."""
    speeds = _speeds(run, costs)
    out = {}
    for (arm, before), (_, after) in itertools.pairwise(speeds):
        got = [s for s in (before, after) if s is not None]
        if arm is not None and got:
            out[arm] = statistics.fmean(got)
    return out


def probe_summary(run: Mapping[str, Any], costs: Costs) -> dict[str, Any] | None:
    """The call's probes priced: each one's request cost in order, the call's (their median),
    and their spread (largest over smallest, less one); None for a run without probes."""
    speeds = [(arm, s) for arm, s in _speeds(run, costs) if s is not None]
    if not speeds:
        return None
    values = [s for _, s in speeds]
    return {"before": [arm for arm, _ in speeds],
            "request_s": [round(s, 6) for s in values],
            "call_request_s": round(statistics.median(values), 6),
            "spread": round(max(values) / min(values) - 1, 4)}
