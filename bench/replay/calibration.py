"""The replay's cost model: every number it charges, named, with its unit and its source.

Why one file of parameters (bench/calibration/h200.json): a replay is only as good as what it
charges for time, so each cost is written down once with where it came from (a fit over the
GPU records, a bench's measurement, a published figure) and `python -m bench.replay fit`
rewrites the fitted ones from the records. A profile prices one machine:

- decode, per scheduler round: `round_s` once, then per running request `request_s` +
  `context_token_s` x its live context + `miss_s` x its expert misses this token (the
  reference engine computes every request alone, one after the other, and a layer with a miss
  waits for its copy);
- prefill, blocking the scheduler: `prefill_s` + `prefill_token_s` x prompt tokens;
- a rebuild's chunk operations (bench/replay/ops.py): `alloc_s`, `free_s` each, a move
  `move_s` + its bytes over `d2d_bytes_per_s` (through host memory, twice, over
  `h2d_bytes_per_s`, for a staged tail);
- `freetoken_rebuild_s`: one ft serve-style rebuild, when measured on the real server
  (0 prices it by its chunk operations, as the reference engine in `freetoken` mode does it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_CALIBRATION", "SCHEMA", "CalibrationError", "Costs", "Parameter",
           "load_profile", "profile_doc"]

SCHEMA = "moe-ladder.replay-calibration.v1"
DEFAULT_CALIBRATION = Path(__file__).resolve().parent.parent / "calibration" / "h200.json"


class CalibrationError(ValueError):
    """A calibration file the replay cannot use; the message names the file and the key."""


@dataclass(frozen=True, slots=True)
class Parameter:
    value: float
    unit: str
    source: str


@dataclass(frozen=True, slots=True)
class Costs:
    """What the simulated server charges for time (see the module docstring); seconds."""

    round_s: float
    request_s: float
    context_token_s: float
    miss_s: float
    prefill_s: float
    prefill_token_s: float
    alloc_s: float
    free_s: float
    move_s: float
    d2d_bytes_per_s: float
    h2d_bytes_per_s: float
    freetoken_rebuild_s: float

    def with_misses_free(self) -> Costs:
        """The same machine where a miss costs nothing: the no-miss ceiling."""
        return _replace(self, miss_s=0.0)


def _replace(costs: Costs, **changes: float) -> Costs:
    values = {f.name: getattr(costs, f.name) for f in fields(Costs)}
    values.update(changes)
    return Costs(**values)


_POSITIVE = ("d2d_bytes_per_s", "h2d_bytes_per_s")


def _parameter(path: str, name: str, raw: Any) -> Parameter:
    where = f"{path}: parameter {name!r}"
    if not isinstance(raw, Mapping) or not {"value", "unit", "source"} <= set(raw):
        raise CalibrationError(f"{where} needs value, unit and source")
    value = raw["value"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
            value) or value < 0 or (name in _POSITIVE and value == 0):
        raise CalibrationError(f"{where}: value must be a finite number >= 0 (> 0 for "
                               f"bandwidths), got {value!r}")
    if not isinstance(raw["source"], str) or not raw["source"].strip():
        raise CalibrationError(f"{where}: source must say where the number comes from")
    return Parameter(float(value), str(raw["unit"]), raw["source"])


def load_profile(path: str | Path, name: str) -> tuple[Costs, dict[str, Parameter]]:
    """The costs of profile `name` in the calibration file at `path`, and its parameters."""
    path = str(path)
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise CalibrationError(f"{path}: cannot read it ({exc.strerror})") from exc
    except json.JSONDecodeError as exc:
        raise CalibrationError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from exc
    if not isinstance(doc, Mapping) or doc.get("schema") != SCHEMA:
        raise CalibrationError(f"{path}: not a replay calibration (schema {SCHEMA})")
    profiles = doc.get("profiles")
    if not isinstance(profiles, Mapping) or name not in profiles:
        known = ", ".join(sorted(profiles)) if isinstance(profiles, Mapping) else "none"
        raise CalibrationError(f"{path}: no profile {name!r} (it has {known})")
    raw = profiles[name].get("parameters") if isinstance(profiles[name], Mapping) else None
    if not isinstance(raw, Mapping):
        raise CalibrationError(f"{path}: profile {name!r} has no parameters")
    wanted = [f.name for f in fields(Costs)]
    missing = [k for k in wanted if k not in raw]
    unknown = [k for k in raw if k not in wanted]
    if missing or unknown:
        raise CalibrationError(f"{path}: profile {name!r}: missing {missing or 'none'}, "
                               f"unknown {unknown or 'none'}")
    params = {k: _parameter(f"{path} profile {name!r}", k, raw[k]) for k in wanted}
    return Costs(**{k: p.value for k, p in params.items()}), params


def profile_doc(description: str, params: Mapping[str, Parameter]) -> dict[str, Any]:
    """One profile as the calibration file holds it."""
    return {"description": description,
            "parameters": {k: {"value": p.value, "unit": p.unit, "source": p.source}
                           for k, p in params.items()}}
