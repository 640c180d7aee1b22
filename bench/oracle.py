"""The oracle arm's plan: the best rung schedule for a trace, priced by the run itself.

An oracle that picks the lowest rung holding each request and treats transitions as free is
no bound: on the H200 it lost to a grow-only ladder, its flips under live decode each evicting
or emptying expert slots (README, "Results"). This module prices every choice with what the
other arms of the same run measured, and hands the pricing to the exact optimiser of
`bench/schedule.py`. A rung changes only how often a layer misses its expert (a request's
attention, prefill and the rest cost the same on any rung that holds it), so:

- a token on rung r costs (1 - hit rate on r) x lookups a token x the cost of a miss. The hit
  rate is the engine's expert counters over the timeline samples the incremental-mode arms on
  the default ladder spent on r; a rung no arm stayed on is interpolated linearly in expert
  slots between measured rungs (the nearest one beyond them), and no rung is credited a lower
  hit rate than a rung with fewer slots. A miss costs the run's fitted cost (`miss_cost`), or
  one expert's measured copy when the fit is missing or not positive;
- a step from rung a to rung b costs the median wall time of the run's measured transitions,
  plus, when b has fewer expert slots, one miss for each slot given up (those experts must be
  copied in again when the slots come back);
- what must fit when a request is sent is itself plus the requests live at that moment in the
  `static-full` arm (which never holds a request back), in that arm's send order.

The predicted cost is therefore seconds of misses and steps, not of decode. Pure: run
documents in, a plan out.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from bench.schedule import best_schedule

__all__ = ["LIVE_SET_ARM", "PRICED_ARMS", "hit_rates", "measured_lookups", "oracle_plan"]

PRICED_ARMS = ("static-full", "static-short", "headroom", "throughput", "pinned-0")
LIVE_SET_ARM = "static-full"


def measured_lookups(run: Mapping[str, Any],
                     ladder: Sequence[Mapping[str, int]]) -> dict[int, tuple[int, int]]:
    """Per rung index, (expert hits, lookups) between consecutive timeline samples that were
    both on that rung, over the priced arms on this ladder."""
    kv_tokens = [r["kv_tokens"] for r in ladder]
    hits: dict[int, int] = {}
    lookups: dict[int, int] = {}
    for arm in PRICED_ARMS:
        if [r["kv_tokens"] for r in run["ladders"].get(arm, ())] != kv_tokens:
            continue
        samples = [s for s in run["timeline"].get(arm, ()) if len(s) >= 6]
        for before, after in itertools.pairwise(samples):
            rung = before[1]
            if rung < 0 or after[1] != rung:
                continue
            hits[rung] = hits.get(rung, 0) + after[4] - before[4]
            lookups[rung] = lookups.get(rung, 0) + after[4] - before[4] + after[5] - before[5]
    return {r: (hits[r], lookups[r]) for r in hits if lookups[r] > 0}


def hit_rates(slots: Sequence[int], measured: Mapping[int, tuple[int, int]]) -> list[float]:
    """Hit rate per rung (`slots`: expert slots per rung): measured, else interpolated in
    slots, never below a rung with fewer slots; all 0.0 when nothing was measured."""
    known = sorted((slots[r], hits / lookups) for r, (hits, lookups) in measured.items())
    if not known:
        return [0.0] * len(slots)
    xs = [x for x, _ in known]
    rates = []
    for r, n in enumerate(slots):
        if r in measured:
            rates.append(measured[r][0] / measured[r][1])
        elif n <= xs[0]:
            rates.append(known[0][1])
        elif n >= xs[-1]:
            rates.append(known[-1][1])
        else:
            hi = next(i for i, x in enumerate(xs) if x >= n)
            (x0, y0), (x1, y1) = known[hi - 1], known[hi]
            rates.append(y0 + (y1 - y0) * (n - x0) / (x1 - x0) if x1 > x0 else y1)
    by_slots = sorted(range(len(slots)), key=lambda r: slots[r])
    best = 0.0
    for r in by_slots:
        best = max(best, rates[r])
        rates[r] = best
    return rates


def step_seconds(run: Mapping[str, Any]) -> float:
    """Median wall seconds of the transitions the run's daemons reached (0 when none)."""
    steps = [t["seconds"] for arm, records in run.get("transitions", {}).items()
             if not arm.startswith("freetoken-") for t in records if t["reached"]]
    return float(statistics.median(steps)) if steps else 0.0


def _pages(tokens: int, page_size: int) -> int:
    return math.ceil(tokens / page_size) * page_size


def live_needs(requests: Sequence[tuple[int, int]], rows: Sequence[Mapping[str, Any]] | None,
               ladder: Sequence[Mapping[str, int]], page_size: int) -> tuple[list[int],
                                                                             list[int]]:
    """(send order, lowest rung needed at each send in that order) for requests given as
    (prompt_tokens, max_tokens) by index. `rows`: a reference arm's rows for every request;
    without them each request is taken alone, in index order."""
    kv_tokens = [r["kv_tokens"] for r in ladder]

    def rung_holding(tokens: int) -> int:
        return next((i for i, kv in enumerate(kv_tokens) if kv >= tokens), len(kv_tokens) - 1)

    own = [_pages(p + m, page_size) for p, m in requests]
    if rows is None:
        return list(range(len(requests))), [rung_holding(t) for t in own]
    spans = {row["index"]: (row["sent_s"],
                            row["sent_s"] + (row["ttft_s"] or 0.0) + row["decode_s"])
             for row in rows}
    order = sorted(range(len(requests)), key=lambda i: (spans[i][0], i))
    needs = []
    for i in order:
        sent = spans[i][0]
        live = sum(own[j] for j in order
                   if j != i and spans[j][0] <= sent < spans[j][1])
        needs.append(rung_holding(own[i] + live))
    return order, needs


def oracle_plan(requests: Sequence[tuple[int, int]], run: Mapping[str, Any],
                ladder: Sequence[Mapping[str, int]], *, page_size: int, lookups_per_token: int,
                expert_copy_us: float) -> dict[str, Any]:
    """The oracle's schedule and its prices, as the JSON's `oracle_plan` block; `rungs` is the
    planned rung of each request by index."""
    slots = [r["moe_cache_size"] for r in ladder]
    measured = measured_lookups(run, ladder)
    rates = hit_rates(slots, measured)
    cost = run.get("miss_cost")
    miss_s = (cost["us_per_miss"] if cost and cost["us_per_miss"] > 0 else expert_copy_us) * 1e-6
    miss_s_per_token = [(1.0 - rate) * lookups_per_token * miss_s for rate in rates]
    step_s = step_seconds(run)

    def transition_s(a: int, b: int) -> float:
        return step_s + max(0, slots[a] - slots[b]) * miss_s

    rows = run["per_request"].get(LIVE_SET_ARM)
    if rows is not None and {row["index"] for row in rows} != set(range(len(requests))):
        rows = None
    order, need = live_needs(requests, rows, ladder, page_size)
    schedule = best_schedule(need, [max(0, requests[i][1] - 1) for i in order],
                             miss_s_per_token, transition_s, start_rung=0)
    rungs = [0] * len(requests)
    for i, rung in zip(order, schedule.rungs, strict=True):
        rungs[i] = rung
    return {"live_set_from": None if rows is None else LIVE_SET_ARM,
            "step_s": round(step_s, 4), "miss_us": round(miss_s * 1e6, 1),
            "hit_rate_by_rung": [round(rate, 4) for rate in rates],
            "measured_rungs": sorted(measured),
            "rungs": rungs, "predicted_miss_s": round(schedule.decode_s, 3),
            "predicted_transition_s": round(schedule.transition_s, 3),
            "transitions": schedule.transitions}
