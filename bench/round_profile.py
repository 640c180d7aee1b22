"""Where an arm's decode time went: the reference engine's scheduler rounds, summed up.

Why: two arms at the same expert hit rate and the same contexts decoded 11-14 % apart on the
GPU (agentic seeds 5-6, docs/results.md), and the request-level figures cannot say whether the
time went into the decode itself (the engine's pools after many transitions) or elsewhere on
the event loop (the daemon, HTTP handlers, the load generator, which the bench runs in one
process). The engine reports each decoding round (`engine.reference.runtime.SchedulerRound`);
`RoundProfile` listens and sums them up per arm, overall and by context, so arms compare at
equal context, and keeps one row a round, so a slow stretch can be read against the arm's
transitions.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

import numpy as np

__all__ = ["CONTEXT_BUCKET_TOKENS", "SERIES_COLUMNS", "RoundProfile", "allocator_counters"]

# Buckets of the decoding requests' mean context, for comparing arms at equal context.
CONTEXT_BUCKET_TOKENS = 16_384
# torch's CUDA caching-allocator counters that cost a decode step when they move: a retry
# frees the cache and synchronises; a device alloc or free is a driver call.
_ALLOCATOR_KEYS = ("num_alloc_retries", "num_device_alloc", "num_device_free",
                   "num_sync_all_streams")


# One row of `series` a round, so a run can be read against its transitions' times.
SERIES_COLUMNS = ("t_s", "decode_ms", "tokens", "context_tokens", "misses", "miss_layers",
                  "yielded_ms")


class RoundProfile:
    """A listener for the engine's `scheduler_round` events (`engine.listeners`); `origin_s`
    (the engine's clock) is time 0 of the series."""

    def __init__(self, origin_s: float) -> None:
        self.origin_s = origin_s
        self.rounds: list[Any] = []

    def __call__(self, event: str, payload: Any) -> None:
        if event == "scheduler_round":
            self.rounds.append(payload)

    def summary(self) -> dict[str, Any] | None:
        """Totals (seconds), per-token means (ms) and by-context medians; None without rounds
        (an engine that does not report them, as the replay's simulated one)."""
        rounds = self.rounds
        if not rounds:
            return None
        tokens = sum(r.tokens for r in rounds)
        totals = {key: sum(getattr(r, key) for r in rounds)
                  for key in ("decode_s", "yielded_s", "admit_s", "rebuild_s")}
        buckets: dict[int, list[Any]] = defaultdict(list)
        for r in rounds:
            buckets[r.context_tokens // r.tokens // CONTEXT_BUCKET_TOKENS].append(r)
        return {
            "rounds": len(rounds), "tokens": tokens,
            **{key: round(value, 4) for key, value in totals.items()},
            **{f"{key[:-2]}_ms_per_token": round(1e3 * value / tokens, 4)
               for key, value in totals.items()},
            "yielded_ms_p50": round(1e3 * statistics.median(r.yielded_s for r in rounds), 4),
            "yielded_ms_max": round(1e3 * max(r.yielded_s for r in rounds), 3),
            "context_tokens_mean": round(sum(r.context_tokens for r in rounds) / tokens),
            "kv_runs_mean": round(sum(r.kv_runs for r in rounds) / tokens, 2),
            "misses": sum(r.misses for r in rounds),
            "miss_layers": sum(r.miss_layers for r in rounds),
            "by_context": [_bucket(index, group) for index, group in sorted(buckets.items())],
            "series_columns": list(SERIES_COLUMNS),
            "series": [[round(r.started_s - self.origin_s, 3), round(1e3 * r.decode_s, 3),
                        r.tokens, r.context_tokens, r.misses, r.miss_layers,
                        round(1e3 * r.yielded_s, 3)] for r in rounds],
        }


def _bucket(index: int, rounds: list[Any]) -> dict[str, Any]:
    return {
        "context_from_tokens": index * CONTEXT_BUCKET_TOKENS, "rounds": len(rounds),
        "decode_ms_per_token_p50": round(
            1e3 * statistics.median(r.decode_s / r.tokens for r in rounds), 4),
        "yielded_ms_p50": round(1e3 * statistics.median(r.yielded_s for r in rounds), 4),
        "kv_runs_p50": statistics.median(r.kv_runs / r.tokens for r in rounds),
    }


def allocator_counters(device: Any) -> dict[str, int] | None:
    """torch's CUDA allocator counters now (None off CUDA); subtract two for an arm's."""
    import torch

    if torch.device(device).type != "cuda":
        return None
    stats = torch.cuda.memory_stats(device)
    return {key: int(stats.get(key, 0)) for key in _ALLOCATOR_KEYS}


def shared_fit(arms: dict[str, dict[str, Any]], transitions: dict[str, list[dict[str, Any]]],
               *, after_s: float = 1.0) -> dict[str, Any] | None:
    """One least-squares model of a round's decode time over every profiled arm of a run,
    `decode_ms = tokens*a + context_tokens*b + misses*c + miss_layers*d`, and each arm's mean
    residual, ms a token: overall, in the `after_s` seconds after each of its transitions
    began, and elsewhere. Arms at equal work then differ only by their residuals: what the
    model's four costs do not explain. None with fewer than two profiled arms."""
    series = {arm: np.asarray(a["engine_profile"]["series"], dtype=float)
              for arm, a in arms.items() if a.get("engine_profile", {}).get("series")}
    if len(series) < 2:
        return None
    columns = {name: i for i, name in enumerate(SERIES_COLUMNS)}
    features = [columns[c] for c in ("tokens", "context_tokens", "misses", "miss_layers")]
    stacked = np.concatenate(list(series.values()))
    coef, *_ = np.linalg.lstsq(stacked[:, features], stacked[:, columns["decode_ms"]],
                               rcond=None)
    out: dict[str, Any] = {"coefficients": {
        "ms_per_token": round(float(coef[0]), 4),
        "us_per_1k_context_tokens": round(float(coef[1]) * 1e6, 3),
        "us_per_miss": round(float(coef[2]) * 1e3, 2),
        "us_per_miss_layer": round(float(coef[3]) * 1e3, 2)}, "after_s": after_s, "arms": {}}
    for arm, rows in series.items():
        residual = rows[:, columns["decode_ms"]] - rows[:, features] @ coef
        tokens = rows[:, columns["tokens"]]
        starts = [t["t_s"] for t in transitions.get(arm, ())]
        t = rows[:, columns["t_s"]]
        after = np.zeros(len(rows), dtype=bool)
        for start in starts:
            after |= (t >= start) & (t < start + after_s)

        predicted = float((rows[:, features] @ coef).sum())
        out["arms"][arm] = {
            "rounds": len(rows),
            "residual_ms_per_token": _per_token(residual, tokens, np.ones_like(after)),
            "residual_share": round(float(residual.sum()) / predicted, 4),
            "rounds_after_transitions": int(after.sum()),
            "residual_ms_per_token_after_transitions": _per_token(residual, tokens, after),
            "residual_ms_per_token_elsewhere": _per_token(residual, tokens, ~after)}
    return out


def _per_token(residual: Any, tokens: Any, mask: Any) -> float | None:
    """The rounds' residual ms over their tokens, where `mask` holds; None where it never does."""
    if not mask.any():
        return None
    return round(float(residual[mask].sum() / tokens[mask].sum()), 4)
