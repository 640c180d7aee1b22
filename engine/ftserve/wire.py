"""Pure parsers for the `ft serve` control-plane documents, apart from `/v1/cache/status`.

Why a module of its own: the daemon's decisions hinge on telling apart replies that look alike on
the wire. On the rebuild route HTTP 503 means five different things (scheduler busy, rejected and
still serving, latched failure, dispatch failure with the gate back to serving, still loading), and
`/health` `"ok"` can hide a latched `maintenance: "failed"`. Those distinctions must be testable
against the captured bytes of a real server (tests/fixtures/freetoken-0.1.2/), without any I/O,
so they live here and `ladder.client` only moves bytes.

Contract: every `parse_*` function raises `engine.ftserve.fields.DocumentError` naming the
offending field and nothing else, whatever the input. `classify_rebuild` never raises: every
reply of the rebuild route, including one it does not understand, is an outcome the controller
must act on. `/v1/cache/status` is parsed by `engine.ftserve.geometry.parse_cache_status`, which
the planner shares.

Missing means unknown, not zero: optional sections and counters the server leaves out are `None`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, cast, get_args

from engine.ftserve.fields import (
    DocumentError,
    mapping,
    opt_float,
    opt_int,
    opt_section,
    opt_str,
    req_bool,
    req_float,
    req_int,
    req_str,
    required,
)
from engine.ftserve.geometry import Geometry

__all__ = [
    "REBUILD_REQUEST_KEYS",
    "Health",
    "HealthStatus",
    "KvUsage",
    "LoadProgress",
    "MaintenanceState",
    "MambaUsage",
    "RebuildKind",
    "RebuildOutcome",
    "RebuildReply",
    "ReplyStatus",
    "RequestEntry",
    "RequestLog",
    "Stats",
    "build_rebuild_body",
    "classify_rebuild",
    "parse_health",
    "parse_rebuild_reply",
    "parse_requests",
    "parse_stats",
]

HealthStatus = Literal["loading", "ok", "error"]
MaintenanceState = Literal["loading", "serving", "rebuilding", "failed", "stopping"]
ReplyStatus = Literal["ok", "busy", "rejected", "unsupported", "failed"]
RebuildKind = Literal[
    "ok",
    "busy_scheduler",
    "busy_rebuilding",
    "rejected",
    "failed",
    "loading",
    "unsupported",
    "invalid",
    "timeout",
    "unauthorized",
    "unexpected",
]

_HEALTH_STATUSES: Final = frozenset(get_args(HealthStatus))
_MAINTENANCE_STATES: Final = frozenset(get_args(MaintenanceState))
_REPLY_STATUSES: Final = frozenset(get_args(ReplyStatus))

# The 503 `failed` body after a ZMQ enqueue failure; the gate went back to `serving`
# (api_server.py:531-534), so unlike every other `failed` it is not latched.
_DISPATCH_FAILURE_PREFIX: Final = "failed to dispatch rebuild"

REBUILD_REQUEST_KEYS: Final = frozenset(
    {
        "moe_cache_size",
        "num_pages",
        "num_mamba_slots",
        "num_swa_pages",
        "swa_full_tokens_ratio",
        "mode",
        "timeout",
    }
)
# FastAPI ignores unknown body keys, so a reply-side spelling in a request is a silent no-op
# rebuild that answers `ok`; catch the likely mix-ups before they reach the wire.
_REQUEST_KEY_HINTS: Final = {"mamba_slots": "num_mamba_slots", "wait_s": "timeout"}


# ---------------------------------------------------------------------------------------------
# GET /health


@dataclass(frozen=True, slots=True)
class LoadProgress:
    """Weight-loading progress while `status == "loading"`; both 0 when the phase has no bytes."""

    done_bytes: int
    total_bytes: int


@dataclass(frozen=True, slots=True)
class Health:
    """`GET /health`. Read `state`, never `status`: `"ok"` also covers a latched failure."""

    status: HealthStatus
    instance_id: str
    maintenance: MaintenanceState | None
    model: str | None = None
    version: str | None = None
    uptime_s: float | None = None
    phase: str | None = None
    progress: LoadProgress | None = None
    message: str | None = None

    @property
    def state(self) -> MaintenanceState | Literal["unknown"]:
        """The real maintenance state; `"error"` (worker death) counts as `failed`."""
        if self.status == "loading":
            return "loading"
        if self.status == "error":
            return "failed"
        # A server that says "ok" without a maintenance field has not told us it is serving.
        return self.maintenance if self.maintenance is not None else "unknown"

    @property
    def serving(self) -> bool:
        return self.state == "serving"


def parse_health(doc: Any) -> Health:
    """Parse a decoded `/health` body."""
    top = mapping(doc, "document")
    status = req_str(top, "status", "")
    if status not in _HEALTH_STATUSES:
        raise DocumentError("status", f"expected one of {sorted(_HEALTH_STATUSES)}, got {status!r}")
    maintenance = opt_str(top, "maintenance", "")
    if maintenance is not None and maintenance not in _MAINTENANCE_STATES:
        # An unknown state must not be mistaken for serving; refuse it instead of guessing.
        raise DocumentError(
            "maintenance", f"expected one of {sorted(_MAINTENANCE_STATES)}, got {maintenance!r}"
        )
    progress_doc = opt_section(top, "progress", "")
    progress = (
        None
        if progress_doc is None
        else LoadProgress(
            done_bytes=req_int(progress_doc, "done_bytes", "progress."),
            total_bytes=req_int(progress_doc, "total_bytes", "progress."),
        )
    )
    return Health(
        status=cast(HealthStatus, status),
        instance_id=req_str(top, "instance_id", ""),
        maintenance=cast("MaintenanceState | None", maintenance),
        model=opt_str(top, "model", ""),
        version=opt_str(top, "version", ""),
        uptime_s=opt_float(top, "uptime_s", ""),
        phase=opt_str(top, "phase", ""),
        progress=progress,
        message=opt_str(top, "message", ""),
    )


# ---------------------------------------------------------------------------------------------
# GET /v1/stats


@dataclass(frozen=True, slots=True)
class KvUsage:
    """`/v1/stats` `kv`: last-known values, never a source of pool sizes.

    `used_pages` is stamped after each batch and goes stale while idle; `total_pages` keeps the
    pre-rebuild size until the next generation. Sizes come from `/v1/cache/status` only.
    """

    used_pages: int
    total_pages: int
    page_size: int


@dataclass(frozen=True, slots=True)
class MambaUsage:
    """`/v1/stats` `mamba`: last-known like `KvUsage`; sizes come from `/v1/cache/status`."""

    used_slots: int
    total_slots: int


@dataclass(frozen=True, slots=True)
class Stats:
    """`GET /v1/stats`. Every field but `instance_id` is `None` when the server leaves it out.

    `kv`/`mamba` are `None` before the first generation and for models without that pool.
    `decode_tps`/`prefill_tps` are 5 s aggregate sliding windows that decay to 0 when idle.
    `requests_active` is the best idle signal the server offers. `vram_bytes` is last-known
    (0 before the first batch).
    """

    instance_id: str
    model_id: str | None
    model_ctx: int | None
    uptime_s: float | None
    kv: KvUsage | None
    mamba: MambaUsage | None
    vram_bytes: int | None
    decode_tps: float | None
    prefill_tps: float | None
    requests_active: int | None
    requests_completed: int | None
    p95_ms: float | None
    ttft_mean_ms: float | None
    prompt_tokens_total: int | None
    completion_tokens_total: int | None


def parse_stats(doc: Any) -> Stats:
    """Parse a decoded `/v1/stats` body."""
    top = mapping(doc, "document")
    empty: Mapping[str, Any] = {}
    model = opt_section(top, "model", "") or empty
    throughput = opt_section(top, "throughput", "") or empty
    requests = opt_section(top, "requests", "") or empty
    kv_doc = opt_section(top, "kv", "")
    kv = (
        None
        if kv_doc is None
        else KvUsage(
            used_pages=req_int(kv_doc, "used_pages", "kv."),
            total_pages=req_int(kv_doc, "total_pages", "kv."),
            page_size=req_int(kv_doc, "page_size", "kv."),
        )
    )
    mamba_doc = opt_section(top, "mamba", "")
    mamba = (
        None
        if mamba_doc is None
        else MambaUsage(
            used_slots=req_int(mamba_doc, "used_slots", "mamba."),
            total_slots=req_int(mamba_doc, "total_slots", "mamba."),
        )
    )
    return Stats(
        instance_id=req_str(top, "instance_id", ""),
        model_id=opt_str(model, "id", "model."),
        model_ctx=opt_int(model, "ctx", "model."),
        uptime_s=opt_float(top, "uptime_s", ""),
        kv=kv,
        mamba=mamba,
        vram_bytes=opt_int(top, "vram_bytes", ""),
        decode_tps=opt_float(throughput, "decode_tps", "throughput."),
        prefill_tps=opt_float(throughput, "prefill_tps", "throughput."),
        requests_active=opt_int(requests, "active", "requests."),
        requests_completed=opt_int(requests, "completed", "requests."),
        p95_ms=opt_float(requests, "p95_ms", "requests."),
        ttft_mean_ms=opt_float(requests, "ttft_mean_ms", "requests."),
        prompt_tokens_total=opt_int(requests, "prompt_tokens_total", "requests."),
        completion_tokens_total=opt_int(requests, "completion_tokens_total", "requests."),
    )


# ---------------------------------------------------------------------------------------------
# GET /v1/requests


@dataclass(frozen=True, slots=True)
class RequestEntry:
    """One finished request from the server's ring of 512.

    `ts` is the server's ISO-8601 UTC string, kept verbatim. `prompt_tokens` and
    `completion_tokens` are `None` for `/v1/completions` and `/generate` rows, and 0 after a
    mid-stream disconnect.
    """

    ts: str
    method: str
    path: str
    status: int
    duration_ms: float
    ttft_ms: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    stream: bool
    error: str | None
    model: str | None = None


@dataclass(frozen=True, slots=True)
class RequestLog:
    """`GET /v1/requests`: entries after the cursor, and the cursor for the next call."""

    entries: tuple[RequestEntry, ...]
    next_cursor: int


def _parse_entry(raw: Any, path: str) -> RequestEntry:
    entry = mapping(raw, path.rstrip("."))
    return RequestEntry(
        ts=req_str(entry, "ts", path),
        method=req_str(entry, "method", path),
        path=req_str(entry, "path", path),
        status=req_int(entry, "status", path),
        duration_ms=req_float(entry, "duration_ms", path),
        ttft_ms=opt_float(entry, "ttft_ms", path),
        prompt_tokens=opt_int(entry, "prompt_tokens", path),
        completion_tokens=opt_int(entry, "completion_tokens", path),
        stream=req_bool(entry, "stream", path),
        error=opt_str(entry, "error", path),
        model=opt_str(entry, "model", path),
    )


def parse_requests(doc: Any) -> RequestLog:
    """Parse a decoded `/v1/requests` body."""
    top = mapping(doc, "document")
    raw_entries = required(top, "entries", "")
    if isinstance(raw_entries, str | bytes) or not isinstance(raw_entries, Sequence):
        raise DocumentError("entries", f"expected a list, got {type(raw_entries).__name__}")
    return RequestLog(
        entries=tuple(_parse_entry(raw, f"entries[{i}].") for i, raw in enumerate(raw_entries)),
        next_cursor=req_int(top, "next_cursor", ""),
    )


# ---------------------------------------------------------------------------------------------
# POST /v1/cache/rebuild


@dataclass(frozen=True, slots=True)
class RebuildReply:
    """The scheduler's reply: the geometry served *after* the attempt (old sizes on reject).

    The reply spells the mamba pool `mamba_slots`; the request and `/v1/cache/status` spell it
    `num_mamba_slots`. Pools the model lacks are 0.
    """

    request_id: str
    status: ReplyStatus
    moe_cache_size: int
    num_pages: int
    mamba_slots: int
    num_swa_pages: int
    error: str | None

    def geometry(self) -> Geometry:
        """The served sizes in the planner's vocabulary (`num_mamba_slots`)."""
        return Geometry(
            moe_cache_size=self.moe_cache_size,
            num_pages=self.num_pages,
            num_mamba_slots=self.mamba_slots,
            num_swa_pages=self.num_swa_pages,
        )


def parse_rebuild_reply(doc: Any) -> RebuildReply:
    """Parse a scheduler reply (the 200 body, or a 503 body carrying a `request_id`)."""
    top = mapping(doc, "document")
    status = req_str(top, "status", "")
    if status not in _REPLY_STATUSES:
        raise DocumentError("status", f"expected one of {sorted(_REPLY_STATUSES)}, got {status!r}")
    return RebuildReply(
        request_id=req_str(top, "request_id", ""),
        status=cast(ReplyStatus, status),
        moe_cache_size=req_int(top, "moe_cache_size", ""),
        num_pages=req_int(top, "num_pages", ""),
        mamba_slots=req_int(top, "mamba_slots", ""),
        num_swa_pages=opt_int(top, "num_swa_pages", "") or 0,
        error=opt_str(top, "error", ""),
    )


@dataclass(frozen=True, slots=True)
class RebuildOutcome:
    """What one `POST /v1/cache/rebuild` means for the controller.

    kind:
      ok               applied; `reply` holds the new geometry.
      busy_scheduler   503 `busy`: a generation is running; back off and retry once idle.
      busy_rebuilding  409: a rebuild is already in flight (or the engine is stopping); poll
                       `/v1/cache/status` until the gate leaves `rebuilding`.
      rejected         503 `rejected`: fit-check failed or the rebuild rolled back; still serving
                       the old geometry (`reply`); re-read status and re-plan.
      failed           503 `failed`. `latched` tells whether a restart is needed: true for a
                       latched gate, a failed rollback and worker death; false for a dispatch
                       failure, after which the gate went back to `serving`.
      loading          503 `loading`: the model is not ready yet.
      unsupported      503 `unsupported`: this server cannot rebuild (TP>1, mode, no support).
      invalid          422: the request itself is wrong (FastAPI `detail` or a `failed` body).
      timeout          504: the server stopped waiting but is STILL rebuilding; poll status.
      unauthorized     401: API key missing or wrong (0.2.1).
      unexpected       anything else; the server's state is unknown, so re-read it.
    """

    kind: RebuildKind
    http_status: int
    reply: RebuildReply | None = None
    error: str | None = None
    request_id: str | None = None
    latched: bool = False

    @property
    def applied(self) -> bool:
        return self.kind == "ok"


def _detail_text(detail: Any) -> str:
    """FastAPI validation detail -> 'body.mode: Input should be 'if_idle'' (never raises)."""
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):
        parts: list[str] = []
        for item in detail:
            if isinstance(item, Mapping) and isinstance(item.get("msg"), str):
                loc = item.get("loc")
                where = (
                    ".".join(str(p) for p in loc if isinstance(p, str | int))
                    if isinstance(loc, list)
                    else ""
                )
                parts.append(f"{where}: {item['msg']}" if where else item["msg"])
        if parts:
            return "; ".join(parts)
    return "request validation failed"


def _unexpected(http_status: int, why: str) -> RebuildOutcome:
    return RebuildOutcome(kind="unexpected", http_status=http_status, error=why)


def classify_rebuild(http_status: int, body: Any) -> RebuildOutcome:
    """Map the rebuild route's (HTTP status, decoded body) to one outcome; never raises.

    Pass `body=None` when the body was not JSON. The table is `RebuildOutcome`'s, checked
    against the captured 0.1.2 replies (tests/fixtures/freetoken-0.1.2/rebuild.*.json).
    """
    doc: Mapping[str, Any] = body if isinstance(body, Mapping) else {}
    raw_status = doc.get("status")
    status = raw_status if isinstance(raw_status, str) else None
    raw_error = doc.get("error")
    error = raw_error if isinstance(raw_error, str) else None
    raw_id = doc.get("request_id")
    request_id = raw_id if isinstance(raw_id, str) else None
    reply: RebuildReply | None = None
    reply_problem: str | None = None
    if "request_id" in doc:
        try:
            reply = parse_rebuild_reply(doc)
        except DocumentError as exc:
            reply_problem = str(exc)

    def outcome(kind: RebuildKind, *, latched: bool = False) -> RebuildOutcome:
        return RebuildOutcome(
            kind=kind,
            http_status=http_status,
            reply=reply,
            error=error,
            request_id=request_id,
            latched=latched,
        )

    if http_status == 401:
        return RebuildOutcome(kind="unauthorized", http_status=401, error=error or "Unauthorized")
    if not isinstance(body, Mapping):
        return _unexpected(http_status, f"expected a JSON object, got {type(body).__name__}")

    if http_status == 200:
        if reply is None:
            return _unexpected(http_status, reply_problem or "200 without a rebuild reply")
        if reply.status != "ok":
            return _unexpected(http_status, f"200 with reply status {reply.status!r}")
        return outcome("ok")

    if http_status == 409:
        # Pre-flight: the gate is `rebuilding` (ours may still be running after a 504) or
        # `stopping`; nothing was dispatched.
        if status == "busy":
            return outcome("busy_rebuilding")
        return _unexpected(409, f"unknown 409 body with status {status!r}")

    if http_status == 422:
        if "detail" in doc:
            return RebuildOutcome(
                kind="invalid", http_status=422, error=_detail_text(doc["detail"])
            )
        if status == "failed":
            return outcome("invalid")
        return _unexpected(422, f"unknown 422 body with status {status!r}")

    if http_status == 504:
        if status == "timeout":
            return outcome("timeout")
        return _unexpected(504, f"unknown 504 body with status {status!r}")

    if http_status == 503:
        if status == "busy":
            return outcome("busy_scheduler")
        if status == "rejected":
            return outcome("rejected")
        if status == "unsupported":
            return outcome("unsupported")
        if status == "loading":
            return outcome("loading")
        if status == "failed":
            # Only a dispatch failure reopens the gate; a latched pre-flight, a failed rollback
            # (a scheduler reply) and worker death all leave `failed` until restart.
            dispatch_failure = reply is None and (error or "").startswith(_DISPATCH_FAILURE_PREFIX)
            return outcome("failed", latched=not dispatch_failure)
        return _unexpected(503, f"unknown 503 body with status {status!r}")

    return _unexpected(http_status, f"HTTP {http_status} is not a documented rebuild reply")


def build_rebuild_body(body: Mapping[str, Any], *, wait_s: float) -> dict[str, Any]:
    """The JSON object to POST: `body` plus `timeout=wait_s` and `mode="if_idle"` if absent.

    Raises `DocumentError` for a key the server would silently ignore (e.g. the reply spelling
    `mamba_slots`), a non-positive wait, or a body that is not JSON-serialisable.
    """
    if not isinstance(wait_s, int | float) or not math.isfinite(wait_s) or wait_s <= 0:
        raise DocumentError("timeout", f"wait_s must be a positive finite number, got {wait_s!r}")
    for key in body:
        if key not in REBUILD_REQUEST_KEYS:
            hint = _REQUEST_KEY_HINTS.get(key)
            raise DocumentError(
                str(key),
                f"not a rebuild request key (the server would ignore it); use {hint!r}"
                if hint
                else f"not a rebuild request key; expected one of {sorted(REBUILD_REQUEST_KEYS)}",
            )
    payload = dict(body)
    payload.setdefault("timeout", float(wait_s))
    payload.setdefault("mode", "if_idle")
    wait = payload["timeout"]
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not math.isfinite(wait):
        raise DocumentError("timeout", f"expected a finite number of seconds, got {wait!r}")
    if wait <= 0:
        raise DocumentError("timeout", f"must be > 0 seconds, got {wait!r}")
    try:
        json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise DocumentError("body", f"not JSON-serialisable: {exc}") from exc
    return payload
