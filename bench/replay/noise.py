"""How far an arm's replay error could move on its own requests' noise alone.

Why: an arm of a per-seed run is ten requests, and the device's speed jitters from one
request to the next (a static-full request of the same shape decodes up to 1.5x slower than
the one before it). So an arm's decode tokens/s carries sampling noise, and an error of 12 %
can be noise or a cost the model lacks. Resampling the arm's requests (with replacement,
measured and predicted paired by request) gives the interval the arm's error would spread
over on other draws of the same work; an interval that excludes 0 is an error the noise does
not explain: a systematic one, a cost to model.

The requests of one arm are resampled as if independent. They are not quite: requests that
decode side by side share rounds, so the interval is, if anything, too narrow, and the test
errs toward calling an error systematic.

Pure arithmetic (numpy) over a record's per-request rows and the replay's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["ERROR_DRAWS", "error_interval"]

ERROR_DRAWS = 2000
_SEED = 0  # fixed: the fidelity file is a function of the records


def _decode(row: Mapping[str, Any]) -> tuple[int, float] | None:
    """A served request's decode tokens and seconds, as the arm's summary counts them."""
    if row.get("status") != 200:
        return None
    return max(0, row["completion_tokens"] - 1), row["decode_s"]


def error_interval(measured: Sequence[Mapping[str, Any]], predicted: Sequence[Mapping[str, Any]],
                   *, draws: int = ERROR_DRAWS) -> list[float] | None:
    """The 95 % bootstrap interval of predicted over measured decode tokens/s, less one, over
    the requests both served (paired by position); None with fewer than two such requests or
    no decode time."""
    decoded = [(_decode(m), _decode(p)) for m, p in zip(measured, predicted, strict=True)]
    table = np.array([[*m, *p] for m, p in decoded if m is not None and p is not None],
                     dtype=float)
    if len(table) < 2:
        return None
    picks = np.random.default_rng(_SEED).integers(0, len(table), (draws, len(table)))
    sums = table[picks].sum(axis=1)  # draws x (m_tokens, m_s, p_tokens, p_s)
    if (sums[:, 1] <= 0).any() or (sums[:, 3] <= 0).any():
        return None
    errors = (sums[:, 2] / sums[:, 3]) / (sums[:, 0] / sums[:, 1]) - 1
    low, high = np.percentile(errors, [2.5, 97.5])
    return [round(float(low), 4), round(float(high), 4)]
