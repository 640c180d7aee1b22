"""The device's two speeds: which of an arm's decode rounds ran in the host's slow state.

Why: within one device call the same work ran up to 1.5x apart (the speed probe, and the same
arm run twice, `--passes 2`). The engine reports every decode round (bench/round_profile.py);
net of the costs the replay counts (a miss, a context token, at the calibration's prices), a
one-token round of an arm that keeps experts resident costs one of two amounts, about 10-11
ms or 16-17 ms on the H100 calls of 2026-12-08, with few rounds between: the engine process
(one core, never waiting for the card, the card's SM clock at its maximum) runs in one of two
host states that no arm causes and no counted cost explains. An arm's share of rounds in the
slow state is then what its speed carries besides its policy.

The static geometries are left out: every one of their lookups misses, and a layer's copies
share one wait (the round fit's cost per layer that waited), so their net cost sits on another
scale than the arms that hit.

Pure arithmetic (numpy) over a run's per-arm `engine_profile` series.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from bench.policy_arms import base_arm
from bench.replay.calibration import Costs
from bench.round_profile import SERIES_COLUMNS

__all__ = ["speed_states", "two_speeds"]

_COLUMN = {name: i for i, name in enumerate(SERIES_COLUMNS)}
_ITERATIONS = 50


def _net_round_ms(series: Any, costs: Costs) -> np.ndarray:
    """One-token rounds' decode ms less their misses and context at `costs`' prices."""
    rows = np.asarray(series, dtype=float)
    if rows.size == 0:
        return rows
    rows = rows[rows[:, _COLUMN["tokens"]] == 1]
    net: np.ndarray = (rows[:, _COLUMN["decode_ms"]]
                       - 1e3 * costs.miss_s * rows[:, _COLUMN["misses"]]
                       - 1e3 * costs.context_token_s * rows[:, _COLUMN["context_tokens"]])
    return net


def two_speeds(values: np.ndarray) -> tuple[float, float]:
    """The two centres of `values` (1-D k-means, k = 2, from the quartiles): (fast, slow)."""
    fast, slow = np.percentile(values, [25, 75])
    for _ in range(_ITERATIONS):
        is_slow = values > (fast + slow) / 2
        if is_slow.all() or not is_slow.any():
            break
        fast, slow = values[~is_slow].mean(), values[is_slow].mean()
    return float(fast), float(slow)


def speed_states(run: Mapping[str, Any], costs: Costs) -> dict[str, Any] | None:
    """The run's fast and slow round costs (ms), their ratio, and each arm's share of rounds
    in the slow state; None without profiled rounds of an arm that hits."""
    nets = {arm: _net_round_ms(a["engine_profile"]["series"], costs)
            for arm, a in run["arms"].items()
            if not base_arm(arm).startswith("static-")
            and a.get("engine_profile", {}).get("series")}
    nets = {arm: v for arm, v in nets.items() if v.size}
    if not nets:
        return None
    fast, slow = two_speeds(np.concatenate(list(nets.values())))
    cut = (fast + slow) / 2
    return {"fast_ms": round(fast, 2), "slow_ms": round(slow, 2),
            "ratio": round(slow / fast, 3),
            "slow_share": {arm: round(float((v > cut).mean()), 3) for arm, v in nets.items()}}
