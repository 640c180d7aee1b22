"""The offline optimum rung schedule for a request trace: the bench's `oracle` arm.

Why: the bench's previous oracle set, before each request, the lowest rung holding it, and timed
nothing of the step ("free transitions"). On the H200 it lost to the grow-only ladder, each of
its transitions taken under live decode and costing about a second (README, "Results"). An
oracle has to price transitions, so this module computes the optimum over rung schedules given
each rung's measured decode speed (`spt`, seconds per token) and each step's measured cost
(`transition_s`, seconds). No online policy can beat it except by noise or by a cost the model
does not price.

Model: request i (send order) decodes `decode_tokens[i]` tokens on rung `s[i]`, the rung the
server is on from just before request i is sent until just before request i+1 is; it must hold
everything live at that send, `need[i] <= s[i] < R` (the caller computes `need`). Cost is
`sum_i decode_tokens[i] * spt[s[i]] + sum_i transition_s(s[i-1], s[i])`, with `s[-1]` the
start rung and no cost for staying. The last rung is free: no step back is priced.

Not modelled: rungs change only at sends (never mid-decode, never on a timer); a request's
tokens are all priced at the rung chosen at its send, even when a later send moves the server
while it still decodes; decode speed on a rung does not depend on history, so cache warm-up
after a step must be folded into that step's `transition_s`, which depends only on (from, to),
not on what decodes during it. Latency (TTFT, queueing behind a step) is not an objective.

Pure: no I/O, no clock; exact dynamic programming over (request, rung), O(n * R^2) time and
O(n * R) memory.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Schedule", "best_schedule", "schedule_cost"]


@dataclass(frozen=True)
class Schedule:
    """A rung per request and what it costs (seconds).

    `cost_s = decode_s + transition_s`; `transitions` counts the steps (from the start rung to
    `rungs[0]`, then between consecutive requests) where the rung changes.
    """

    rungs: tuple[int, ...]
    cost_s: float
    decode_s: float
    transition_s: float
    transitions: int


def _check_cost(value: float, what: str) -> float:
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{what} must be finite and >= 0, got {value!r}")
    return v


def _check_common(decode_tokens: Sequence[int], spt: Sequence[float], start_rung: int) -> int:
    n_rungs = len(spt)
    if n_rungs == 0:
        raise ValueError("spt is empty: there must be at least one rung")
    for r, value in enumerate(spt):
        _check_cost(value, f"spt[{r}]")
    if not 0 <= start_rung < n_rungs:
        raise ValueError(f"start_rung {start_rung} outside [0, {n_rungs})")
    for i, tokens in enumerate(decode_tokens):
        if tokens < 0:
            raise ValueError(f"decode_tokens[{i}] = {tokens} is negative")
    return n_rungs


def schedule_cost(rungs: Sequence[int], decode_tokens: Sequence[int], spt: Sequence[float],
                  transition_s: Callable[[int, int], float], *, start_rung: int) -> Schedule:
    """Price a given schedule: `rungs[i]` is the rung request i decodes on.

    `transition_s(a, b)` is called once per step actually taken (a != b), never for a == b
    (staying costs 0). Sums are exact-rounded (`math.fsum`). Raises ValueError on lengths that
    differ, a rung or start rung outside [0, len(spt)), negative tokens, or a non-finite or
    negative spt or transition cost. Feasibility against `need` is the caller's to check.
    """
    if len(rungs) != len(decode_tokens):
        raise ValueError(f"rungs ({len(rungs)}) and decode_tokens ({len(decode_tokens)}) "
                         "differ in length")
    n_rungs = _check_common(decode_tokens, spt, start_rung)
    for i, r in enumerate(rungs):
        if not 0 <= r < n_rungs:
            raise ValueError(f"rungs[{i}] = {r} outside [0, {n_rungs})")
    decode = math.fsum(tokens * float(spt[r]) for tokens, r in zip(decode_tokens, rungs,
                                                                     strict=True))
    steps: list[float] = []
    prev = start_rung
    for r in rungs:
        if r != prev:
            steps.append(_check_cost(transition_s(prev, r), f"transition_s({prev}, {r})"))
        prev = r
    step_s = math.fsum(steps)
    return Schedule(rungs=tuple(rungs), cost_s=decode + step_s, decode_s=decode,
                    transition_s=step_s, transitions=len(steps))


def best_schedule(need: Sequence[int], decode_tokens: Sequence[int], spt: Sequence[float],
                  transition_s: Callable[[int, int], float], *, start_rung: int) -> Schedule:
    """The cheapest feasible schedule (`need[i] <= rungs[i] < len(spt)`), exactly.

    `transition_s(from_rung, to_rung)` gives a step's cost in seconds; it is called once per
    ordered pair of distinct rungs, up front (so all must be finite and >= 0), never for
    a == b. Ties: among schedules of equal cost (as floats) the one with fewer transitions wins,
    then the lexicographically smallest `rungs` (lower rungs first). The result equals
    `schedule_cost` of its own rungs. Raises ValueError (one line) on lengths that differ, need
    or start rung outside [0, len(spt)), negative tokens, non-finite or negative costs.
    """
    n = len(need)
    if n != len(decode_tokens):
        raise ValueError(f"need ({n}) and decode_tokens ({len(decode_tokens)}) differ in length")
    n_rungs = _check_common(decode_tokens, spt, start_rung)
    for i, lo in enumerate(need):
        if not 0 <= lo < n_rungs:
            raise ValueError(f"need[{i}] = {lo} outside [0, {n_rungs})")
    rates = [float(v) for v in spt]
    table = [[0.0 if a == b else _check_cost(transition_s(a, b), f"transition_s({a}, {b})")
              for b in range(n_rungs)] for a in range(n_rungs)]

    # Backward pass: cost[i][r] / steps[i][r] = the best (cost, transitions) of requests i..n-1
    # with request i on rung r (inf below need[i]); the end is free.
    cost: list[list[float]] = [[]] * n
    steps: list[list[int]] = [[]] * n
    for i in range(n - 1, -1, -1):
        lo, tokens = need[i], decode_tokens[i]
        here_cost = [math.inf] * n_rungs
        here_steps = [0] * n_rungs
        if i == n - 1:
            for r in range(lo, n_rungs):
                here_cost[r] = tokens * rates[r]
        else:
            nxt_lo, nxt_cost, nxt_steps = need[i + 1], cost[i + 1], steps[i + 1]
            tail_cost = nxt_cost[nxt_lo:]
            for r in range(lo, n_rungs):
                cand = list(map(operator.add, table[r][nxt_lo:], tail_cost))
                best = min(cand)
                if cand.count(best) == 1:
                    k = nxt_lo + cand.index(best)
                    best_steps = nxt_steps[k] + (k != r)
                else:
                    best_steps = min(nxt_steps[nxt_lo + j] + (nxt_lo + j != r)
                                     for j, c in enumerate(cand) if c == best)
                here_cost[r] = tokens * rates[r] + best
                here_steps[r] = best_steps
        cost[i], steps[i] = here_cost, here_steps

    # Forward pass: from the start rung, the lowest rung achieving the best (cost, transitions)
    # of the rest, which makes the whole schedule the lexicographically smallest optimum.
    rungs: list[int] = []
    prev = start_rung
    for i in range(n):
        row, here_cost, here_steps = table[prev], cost[i], steps[i]
        pick, pick_key = -1, (math.inf, 0)
        for r in range(need[i], n_rungs):
            key = (row[r] + here_cost[r], here_steps[r] + (r != prev))
            if pick < 0 or key < pick_key:  # strict: the lowest rung wins a tie
                pick, pick_key = r, key
        rungs.append(pick)
        prev = pick
    return schedule_cost(rungs, decode_tokens, rates, lambda a, b: table[a][b],
                         start_rung=start_rung)
