"""ft serve's control-plane rules, as pure functions the reference engine's server applies.

Field names, status codes, error texts and the order of checks follow ft serve 0.1.2 (the
documents captured from it in tests/fixtures/freetoken-0.1.2/), so that a client cannot tell
the two apart on the wire except where a difference is deliberate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.ftserve.budget import MemoryModel
from engine.ftserve.geometry import Geometry

__all__ = [
    "Accepted",
    "Answered",
    "RebuildRequest",
    "Refused",
    "fit_check_error",
    "geometry_error",
    "parse_rebuild_body",
    "rebuild_verdict",
    "reply_body",
]

_INT_FIELDS = ("moe_cache_size", "num_pages", "num_mamba_slots", "num_swa_pages")


@dataclass(frozen=True, slots=True)
class RebuildRequest:
    """A validated `POST /v1/cache/rebuild` body; None means "leave that pool alone"."""

    moe_cache_size: int | None
    num_pages: int | None
    num_mamba_slots: int | None
    num_swa_pages: int | None
    swa_full_tokens_ratio: float | None
    mode: str
    timeout_s: float

    def target(self, live: Geometry) -> Geometry:
        return Geometry(
            live.moe_cache_size if self.moe_cache_size is None else self.moe_cache_size,
            live.num_pages if self.num_pages is None else self.num_pages,
            live.num_mamba_slots if self.num_mamba_slots is None else self.num_mamba_slots,
            live.num_swa_pages if self.num_swa_pages is None else self.num_swa_pages,
        )


def _detail(kind: str, loc: str, msg: str, value: Any) -> dict[str, Any]:
    return {"type": kind, "loc": ["body", loc], "msg": msg, "input": value}


def parse_rebuild_body(raw: Any, *, modes: tuple[str, ...]) -> RebuildRequest | tuple[int, Any]:
    """Validate like FastAPI + ft serve's pre-flight: a request, or (HTTP status, error body)."""
    if not isinstance(raw, Mapping):
        return 422, {"detail": [_detail("model_attributes_type", "body",
                                        "Input should be a valid dictionary or object", raw)]}
    details: list[dict[str, Any]] = []
    ints: dict[str, int | None] = {}
    for key in _INT_FIELDS:
        value = raw.get(key)
        if value is None:
            ints[key] = None
        elif isinstance(value, bool) or not isinstance(value, int | float | str):
            details.append(_detail("int_type", key, "Input should be a valid integer", value))
        else:
            try:
                number = float(value)
            except ValueError:
                details.append(_detail("int_parsing", key, "Input should be a valid integer, "
                                       "unable to parse string as an integer", value))
                continue
            if not math.isfinite(number) or not number.is_integer():
                details.append(_detail("int_from_float", key,
                                       "Input should be a valid integer, got a number with a "
                                       "fractional part", value))
                continue
            ints[key] = int(number)
    mode = raw.get("mode", "if_idle")
    if mode not in modes:
        expected = " or ".join(f"'{m}'" for m in modes)
        details.append({**_detail("literal_error", "mode", f"Input should be {expected}", mode),
                        "ctx": {"expected": expected}})
    timeout = raw.get("timeout", 300.0)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(
            timeout):
        details.append(_detail("float_type", "timeout", "Input should be a valid number",
                               timeout))
    ratio = raw.get("swa_full_tokens_ratio")
    if ratio is not None and (isinstance(ratio, bool) or not isinstance(ratio, int | float)):
        details.append(_detail("float_type", "swa_full_tokens_ratio",
                               "Input should be a valid number", ratio))
    if details:
        return 422, {"detail": details}
    if ints["num_swa_pages"] is not None and ratio is not None:
        return 422, {"status": "failed",
                     "error": "pass num_swa_pages OR swa_full_tokens_ratio, not both"}
    if ratio is not None and not 0.0 < float(ratio) <= 1.0:
        return 422, {"status": "failed", "error": "swa_full_tokens_ratio must be in (0, 1]"}
    return RebuildRequest(ints["moe_cache_size"], ints["num_pages"], ints["num_mamba_slots"],
                          ints["num_swa_pages"], None if ratio is None else float(ratio),
                          str(mode), float(timeout))


def geometry_error(request: RebuildRequest, model: MemoryModel) -> str | None:
    """ft serve's geometry checks (engine.py:736-778), with its wording."""
    if request.moe_cache_size is not None and request.moe_cache_size < model.shape.num_experts:
        return f"cache_size {request.moe_cache_size} < num_experts {model.shape.num_experts}"
    if request.num_pages is not None and request.num_pages <= 0:
        return f"num_pages must be positive, got {request.num_pages}"
    if request.num_mamba_slots is not None and request.num_mamba_slots < model.floors.mamba_slots:
        return (f"num_mamba_slots {request.num_mamba_slots} is below the minimum "
                f"{model.floors.mamba_slots} (non-evictable working set) needed to run; "
                "admission would deadlock")
    if (request.num_swa_pages is not None or request.swa_full_tokens_ratio is not None) and not (
            model.shape.has_swa):
        return "num_swa_pages requested but this model has no window pool"
    return None


def _gib(nbytes: int) -> str:
    return f"{nbytes / 1024**3:.2f} GiB"


def fit_check_error(target: Geometry, model: MemoryModel) -> str | None:
    """ft serve's fit-check on the final geometry only (base.py:83-117): usable KV pages, and
    the GDN pool at its physical size (sink included) taken off the budget, as it words it."""
    if model.engine_accepts(target):
        return None
    state = model.mamba_bytes(target.num_mamba_slots) + model.fixed_bytes
    need = model.fit_check_bytes(target) - state
    budget = model.cache_budget_bytes - state
    return (f"requested cache (moe={target.moe_cache_size} slots, kv={target.num_pages} pages, "
            f"mamba={target.num_mamba_slots} slots) needs {_gib(need)} > budget {_gib(budget)}; "
            "old cache kept, still serving")


def reply_body(request_id: str, status: str, geometry: Geometry,
               error: str | None) -> dict[str, Any]:
    """The scheduler's reply: the geometry served after the attempt (reply key `mamba_slots`)."""
    return {"request_id": request_id, "status": status,
            "moe_cache_size": geometry.moe_cache_size, "num_pages": geometry.num_pages,
            "mamba_slots": geometry.num_mamba_slots, "num_swa_pages": geometry.num_swa_pages,
            "error": error}


@dataclass(frozen=True, slots=True)
class Answered:
    """A reply sent before a rebuild is even considered (bad body, wrong state); the engine
    records nothing of it."""

    http_status: int
    body: Any


@dataclass(frozen=True, slots=True)
class Refused:
    """The scheduler's refusal (`rejected` or `busy`), recorded as the last rebuild."""

    status: str
    error: str | None


@dataclass(frozen=True, slots=True)
class Accepted:
    target: Geometry
    timeout_s: float


def rebuild_verdict(raw: Any, *, state: str, mode: str, live: Geometry, model: MemoryModel,
                    used_pages: int, used_mamba_slots: int, busy: bool,
                    ) -> Answered | Refused | Accepted:
    """How an engine with ft serve's semantics answers `POST /v1/cache/rebuild`, in ft serve's
    order of checks: the body, the state, the geometry and fit-check, the live content, and
    (`mode` "freetoken") `busy` while any request runs or waits."""
    parsed = parse_rebuild_body(raw, modes=("if_idle", "incremental"))
    if isinstance(parsed, tuple):
        return Answered(*parsed)
    if state == "loading":
        return Answered(503, {"status": "loading",
                              "error": "model is still loading; cannot rebuild cache yet"})
    if state == "failed":
        return Answered(503, {"status": "failed",
                              "error": "server latched in maintenance; restart required"})
    if state == "rebuilding":
        return Answered(409, {"status": "busy", "error": "a cache rebuild is already in progress"})
    if state == "stopping":
        return Answered(409, {"status": "busy", "error": "engine stop is in progress"})
    target = parsed.target(live)
    error = geometry_error(parsed, model) or fit_check_error(target, model)
    if error is None and target.num_pages < used_pages:
        error = (f"kv: {used_pages} pages are live in running requests; cannot shrink to "
                 f"{target.num_pages}")
    if error is None and target.num_mamba_slots < used_mamba_slots:
        error = (f"mamba: {used_mamba_slots} slots are live in running requests; cannot "
                 f"shrink to {target.num_mamba_slots}")
    if error is not None:
        return Refused("rejected", error)
    if mode == "freetoken" and busy:
        # ft serve's scheduler answers `busy` with no error text (a full reply, 503).
        return Refused("busy", None)
    return Accepted(target, parsed.timeout_s)
