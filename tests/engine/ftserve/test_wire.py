"""`engine.ftserve.wire` against every document captured from a live ft serve 0.1.2, plus fuzzing.

The manifests say which endpoint produced each file and with which HTTP status, so every
control-plane capture goes through the parser for its route; the expected outcome of each
rebuild reply is spelled out per file rather than derived, so a classification change shows
up as a named failure.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.ftserve.fields import DocumentError
from engine.ftserve.geometry import parse_cache_status
from engine.ftserve.wire import (
    REBUILD_REQUEST_KEYS,
    Health,
    RebuildOutcome,
    build_rebuild_body,
    classify_rebuild,
    parse_health,
    parse_rebuild_reply,
    parse_requests,
    parse_stats,
)
from tests.conftest import CAPTURES, captured_manifest

MANIFEST = captured_manifest()


def _doc(name: str) -> Any:
    return json.loads((CAPTURES / name).read_text())


def _files(route: str) -> list[str]:
    return sorted(name for name, e in MANIFEST.items() if e["path"].split("?", 1)[0] == route)


HEALTH_FILES = _files("/health")
STATUS_FILES = _files("/v1/cache/status")
STATS_FILES = _files("/v1/stats")
REQUESTS_FILES = _files("/v1/requests")
REBUILD_FILES = _files("/v1/cache/rebuild")
# Generation and admin routes are not the client layer's business; listed so that a new
# capture cannot slip by unparsed.
OUT_OF_SCOPE_ROUTES = {
    "/v1/chat/completions",
    "/v1/completions",
    "/generate",
    "/v1/models",
    "/v1/admin/prepare-stop",
}


def test_every_capture_is_in_a_manifest_and_routed() -> None:
    on_disk = {
        p.name for p in CAPTURES.iterdir() if p.name != "README.md" and not p.name.startswith("_")
    }
    assert on_disk == set(MANIFEST)
    assert len(on_disk) == 91
    parsed = set(HEALTH_FILES + STATUS_FILES + STATS_FILES + REQUESTS_FILES + REBUILD_FILES)
    rest = {name for name in MANIFEST if name not in parsed}
    assert {MANIFEST[name]["path"] for name in rest} <= OUT_OF_SCOPE_ROUTES


# --------------------------------------------------------------------------------- /health

HEALTH_STATE = {
    "health.loading.0.json": "loading",
    "health.loading.1.json": "loading",
    "health.serving.json": "serving",
    "health.during_rebuild.json": "rebuilding",
    # The OOM was rolled back: still serving, no latch.
    "health.bug_after_combined.json": "serving",
    "health.after_prepare_stop.json": "stopping",
    "wholecard.health.loading.0.json": "loading",
    "wholecard.health.loading.1.json": "loading",
    "wholecard.health.serving.json": "serving",
    "control.health.loading.0.json": "loading",
    "control.health.loading.1.json": "loading",
    "control.health.serving.json": "serving",
}


def test_health_table_covers_every_health_capture() -> None:
    assert set(HEALTH_STATE) == set(HEALTH_FILES)


@pytest.mark.parametrize("name", HEALTH_FILES)
def test_health_capture_parses_to_its_state(name: str) -> None:
    assert MANIFEST[name]["http_status"] == 200
    health = parse_health(_doc(name))
    assert health.state == HEALTH_STATE[name]
    assert health.serving is (HEALTH_STATE[name] == "serving")
    assert len(health.instance_id) == 36
    if health.status == "loading":
        assert health.maintenance is None
        assert health.phase in {"other", "warmup"}
        assert health.progress is not None
        assert health.version is None
    else:
        assert health.status == "ok"
        assert health.maintenance == HEALTH_STATE[name]
        assert health.version == "0.1.2"
        assert health.uptime_s is not None


def test_health_ok_can_hide_a_latched_failure() -> None:
    health = parse_health(
        {"status": "ok", "instance_id": "i", "maintenance": "failed", "version": "0.1.2"}
    )
    assert health.status == "ok"
    assert health.state == "failed"
    assert not health.serving


def test_health_error_is_worker_death_and_counts_as_failed() -> None:
    health = parse_health({"status": "error", "message": "worker exited 137", "instance_id": "i"})
    assert health.state == "failed"
    assert health.message == "worker exited 137"
    assert health.maintenance is None


def test_health_ok_without_maintenance_is_unknown_not_serving() -> None:
    health = parse_health({"status": "ok", "instance_id": "i"})
    assert health.maintenance is None
    assert health.state == "unknown"
    assert not health.serving


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"instance_id": "i"}, "status"),
        ({"status": "sleeping", "instance_id": "i"}, "status"),
        ({"status": "ok"}, "instance_id"),
        ({"status": "ok", "instance_id": "i", "maintenance": "draining"}, "maintenance"),
        (
            {"status": "loading", "instance_id": "i", "progress": {"done_bytes": 1}},
            "progress.total_bytes",
        ),
        ({"status": "ok", "instance_id": 7}, "instance_id"),
        ([], "document"),
    ],
)
def test_health_errors_name_the_field(doc: Any, field: str) -> None:
    with pytest.raises(DocumentError) as info:
        parse_health(doc)
    assert info.value.field == field


# ----------------------------------------------------------------------- /v1/cache/status


@pytest.mark.parametrize("name", STATUS_FILES)
def test_cache_status_capture_parses(name: str) -> None:
    status = parse_cache_status(_doc(name))
    expected = (
        "rebuilding" if "during_rebuild" in name or "right_after_timeout" in name else ("serving")
    )
    assert status.state == expected
    assert status.shape.num_experts == 64


def test_timed_out_rebuild_lands_in_last_rebuild_later() -> None:
    timeout = classify_rebuild(504, _doc("wholecard.rebuild.timeout_short_wait.json"))
    during = parse_cache_status(_doc("wholecard.cache_status.right_after_timeout.json"))
    settled = parse_cache_status(_doc("wholecard.cache_status.after_timeout_settled.json"))
    assert during.state == "rebuilding"
    assert during.last_rebuild is not None
    assert during.last_rebuild.request_id != timeout.request_id
    assert settled.last_rebuild is not None
    assert settled.last_rebuild.request_id == timeout.request_id
    assert settled.geometry.num_pages == 2_000_000


# ------------------------------------------------------------------------------- /v1/stats


@pytest.mark.parametrize("name", STATS_FILES)
def test_stats_capture_parses(name: str) -> None:
    stats = parse_stats(_doc(name))
    assert stats.model_ctx == 8192
    assert stats.model_id == "tiny-moe"
    assert stats.requests_active is not None
    assert stats.decode_tps is not None
    assert stats.prefill_tps is not None
    if name.endswith("stats.boot.json"):
        # Before the first generation the server does not know pool usage: None, not zero.
        assert stats.kv is None
        assert stats.mamba is None
        assert stats.requests_completed == 0
    else:
        assert stats.kv is not None
        assert stats.kv.page_size == 1
        assert stats.mamba is not None
        assert stats.mamba.total_slots == 8


def test_stats_during_generation_shows_the_active_request() -> None:
    stats = parse_stats(_doc("stats.during_generation.json"))
    assert stats.requests_active == 1
    assert stats.kv is not None
    assert stats.kv.used_pages == 22
    assert stats.mamba is not None
    assert stats.mamba.used_slots == 3


def test_stats_total_pages_is_stale_after_a_rebuild() -> None:
    """Why sizes must come from /v1/cache/status: stats keeps the pre-rebuild total."""
    stats = parse_stats(_doc("stats.after_rebuild_before_generation.json"))
    status = parse_cache_status(_doc("cache_status.after_grow_kv.json"))
    assert stats.instance_id == "925cf001-3652-41ab-9510-02ede52ec5f6"
    assert stats.kv is not None
    assert stats.kv.total_pages == 1_000_000
    assert status.geometry.num_pages == 2_000_000
    assert stats.kv.total_pages != status.geometry.num_pages


def test_stats_missing_sections_are_unknown() -> None:
    stats = parse_stats({"instance_id": "i"})
    assert stats.kv is None
    assert stats.mamba is None
    assert stats.decode_tps is None
    assert stats.requests_active is None
    assert stats.model_ctx is None


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({}, "instance_id"),
        ({"instance_id": "i", "kv": {"used_pages": 1, "total_pages": 2}}, "kv.page_size"),
        ({"instance_id": "i", "kv": []}, "kv"),
        ({"instance_id": "i", "requests": {"active": -1}}, "requests.active"),
        ({"instance_id": "i", "requests": {"active": 1.5}}, "requests.active"),
        ({"instance_id": "i", "throughput": {"decode_tps": "fast"}}, "throughput.decode_tps"),
        ({"instance_id": "i", "mamba": {"used_slots": True, "total_slots": 8}}, "mamba.used_slots"),
    ],
)
def test_stats_errors_name_the_field(doc: Any, field: str) -> None:
    with pytest.raises(DocumentError) as info:
        parse_stats(doc)
    assert info.value.field == field


# ---------------------------------------------------------------------------- /v1/requests


@pytest.mark.parametrize("name", REQUESTS_FILES)
def test_requests_capture_parses(name: str) -> None:
    log = parse_requests(_doc(name))
    assert log.next_cursor == len(_doc(name)["entries"]) or "since" in name
    for entry in log.entries:
        assert entry.method == "POST"
        if entry.path in {"/generate", "/v1/completions"}:
            assert entry.prompt_tokens is None
            assert entry.completion_tokens is None
        elif entry.status == 200:
            assert entry.prompt_tokens == 12
            assert entry.completion_tokens == 15


def test_requests_page_after_a_cursor() -> None:
    assert MANIFEST["requests.since_2_limit_2.json"]["path"] == "/v1/requests?since=2&limit=2"
    log = parse_requests(_doc("requests.since_2_limit_2.json"))
    assert [e.path for e in log.entries] == ["/v1/completions", "/generate"]
    assert log.next_cursor == 4
    assert log.entries[1].stream is True
    assert log.entries[0].duration_ms == 2397.0


def test_requests_errors_name_the_entry() -> None:
    doc = _doc("requests.final.json")
    del doc["entries"][3]["status"]
    with pytest.raises(DocumentError) as info:
        parse_requests(doc)
    assert info.value.field == "entries[3].status"
    with pytest.raises(DocumentError) as info:
        parse_requests({"entries": "none", "next_cursor": 0})
    assert info.value.field == "entries"


# ---------------------------------------------------------------------- /v1/cache/rebuild

# file -> (kind, recorded HTTP status). Spelled out per file on purpose; latched is False for all.
REBUILD_KIND: dict[str, tuple[str, int]] = {
    "control.rebuild.combined_grow_moe_shrink_kv.json": ("ok", 200),
    "control.rebuild.prep_fill_kv.json": ("ok", 200),
    "rebuild.bug_combined_grow_moe_shrink_kv.json": ("rejected", 503),
    "rebuild.bug_control_combined_shrink_moe_grow_kv.json": ("ok", 200),
    "rebuild.bug_prep_fill_kv.json": ("ok", 200),
    "rebuild.bug_two_step_1_shrink_kv.json": ("ok", 200),
    "rebuild.bug_two_step_2_grow_moe.json": ("ok", 200),
    "rebuild.concurrent_busy.json": ("busy_rebuilding", 409),
    "rebuild.grow_kv.json": ("ok", 200),
    "rebuild.grow_mamba.json": ("ok", 200),
    "rebuild.grow_moe.json": ("ok", 200),
    "rebuild.invalid_mamba_below_floor.json": ("rejected", 503),
    "rebuild.invalid_mode_drain.json": ("invalid", 422),
    "rebuild.invalid_moe_below_floor.json": ("rejected", 503),
    "rebuild.invalid_num_pages_zero.json": ("rejected", 503),
    "rebuild.invalid_over_budget.json": ("rejected", 503),
    "rebuild.invalid_swa_both.json": ("invalid", 422),
    "rebuild.invalid_swa_no_window_pool.json": ("rejected", 503),
    "rebuild.invalid_swa_ratio_range.json": ("invalid", 422),
    "rebuild.invalid_type.json": ("invalid", 422),
    "rebuild.noop_empty_body.json": ("ok", 200),
    "rebuild.restore_kv.json": ("ok", 200),
    "rebuild.shrink_kv.json": ("ok", 200),
    "rebuild.shrink_mamba.json": ("ok", 200),
    "rebuild.shrink_moe.json": ("ok", 200),
    "wholecard.rebuild.combined_grow_moe_shrink_kv_roomy.json": ("ok", 200),
    "wholecard.rebuild.right_after_timeout_second.json": ("busy_rebuilding", 409),
    "wholecard.rebuild.timeout_short_wait.json": ("timeout", 504),
    "wholecard.rebuild.while_generating.json": ("busy_scheduler", 503),
}


def _classify(name: str) -> RebuildOutcome:
    return classify_rebuild(MANIFEST[name]["http_status"], _doc(name))


def test_rebuild_table_covers_every_rebuild_capture() -> None:
    assert set(REBUILD_KIND) == set(REBUILD_FILES)


@pytest.mark.parametrize("name", REBUILD_FILES)
def test_rebuild_capture_classifies(name: str) -> None:
    kind, http_status = REBUILD_KIND[name]
    assert MANIFEST[name]["http_status"] == http_status
    outcome = _classify(name)
    assert outcome.kind == kind
    assert outcome.http_status == http_status
    assert outcome.latched is False
    assert outcome.applied is (kind == "ok")
    if kind in {"ok", "rejected", "busy_scheduler"}:
        # Scheduler replies carry the geometry served after the attempt.
        assert outcome.reply is not None
        assert outcome.request_id == outcome.reply.request_id
    else:
        assert outcome.reply is None
    if kind != "ok":
        assert outcome.error or kind in {"busy_scheduler", "timeout"}


@pytest.mark.parametrize("name", [n for n, (k, _) in REBUILD_KIND.items() if k == "ok"])
def test_ok_reply_serves_what_was_requested(name: str) -> None:
    """Request keys map to reply keys; note `num_mamba_slots` comes back as `mamba_slots`."""
    reply = _classify(name).reply
    assert reply is not None
    assert reply.status == "ok"
    assert reply.error is None
    reply_key = {"num_mamba_slots": "mamba_slots"}
    for key, value in MANIFEST[name]["request_body"].items():
        assert getattr(reply, reply_key.get(key, key)) == value


def test_mamba_slots_spelling_differs_between_request_and_reply() -> None:
    assert MANIFEST["rebuild.grow_mamba.json"]["request_body"] == {"num_mamba_slots": 12}
    doc = _doc("rebuild.grow_mamba.json")
    assert "mamba_slots" in doc
    assert "num_mamba_slots" not in doc
    reply = parse_rebuild_reply(doc)
    assert reply.mamba_slots == 12
    assert reply.geometry().num_mamba_slots == 12
    # A reply spelled like the request is not a reply.
    doc["num_mamba_slots"] = doc.pop("mamba_slots")
    with pytest.raises(DocumentError) as info:
        parse_rebuild_reply(doc)
    assert info.value.field == "mamba_slots"
    # And a request spelled like the reply would be silently ignored by FastAPI.
    with pytest.raises(DocumentError, match="num_mamba_slots") as req_info:
        build_rebuild_body({"mamba_slots": 12}, wait_s=1.0)
    assert req_info.value.field == "mamba_slots"


def test_combined_grow_moe_shrink_kv_rolled_back_and_kept_old_sizes() -> None:
    outcome = _classify("rebuild.bug_combined_grow_moe_shrink_kv.json")
    assert outcome.kind == "rejected"
    assert outcome.error is not None
    assert "rolled back" in outcome.error
    assert "out of memory" in outcome.error
    assert outcome.reply is not None
    # The requested moe=512 / kv=2732093 did not happen: the old geometry is still served.
    assert (outcome.reply.moe_cache_size, outcome.reply.num_pages) == (128, 3_911_741)
    assert parse_cache_status(_doc("cache_status.bug_after_combined.json")).state == "serving"


def test_fit_check_rejection_text() -> None:
    outcome = _classify("rebuild.invalid_over_budget.json")
    assert outcome.error is not None
    assert "old cache kept, still serving" in outcome.error


def test_busy_scheduler_is_503_with_a_reply_and_busy_rebuilding_is_409() -> None:
    busy = _classify("wholecard.rebuild.while_generating.json")
    assert (busy.kind, busy.http_status) == ("busy_scheduler", 503)
    assert busy.reply is not None
    assert busy.reply.status == "busy"
    assert busy.request_id == "5f1c6d06-9286-4250-bd28-80ff2e8d6ae1"
    gate = _classify("rebuild.concurrent_busy.json")
    assert (gate.kind, gate.http_status) == ("busy_rebuilding", 409)
    assert gate.error == "a cache rebuild is already in progress"
    assert gate.request_id is None


def test_invalid_in_both_422_shapes() -> None:
    fastapi = _classify("rebuild.invalid_mode_drain.json")
    assert fastapi.kind == "invalid"
    assert fastapi.error == "body.mode: Input should be 'if_idle'"
    typed = _classify("rebuild.invalid_type.json")
    assert typed.error is not None
    assert typed.error.startswith("body.num_pages: ")
    failed_shape = _classify("rebuild.invalid_swa_both.json")
    assert failed_shape.kind == "invalid"
    assert failed_shape.error == "pass num_swa_pages OR swa_full_tokens_ratio, not both"
    assert failed_shape.latched is False


def test_timeout_keeps_the_request_id_to_poll_for() -> None:
    outcome = _classify("wholecard.rebuild.timeout_short_wait.json")
    assert outcome.kind == "timeout"
    assert outcome.http_status == 504
    assert outcome.request_id == "fe160491-32b8-40ff-8825-3a1803681417"


def test_noop_empty_body_is_ok() -> None:
    assert MANIFEST["rebuild.noop_empty_body.json"]["request_body"] == {}
    assert _classify("rebuild.noop_empty_body.json").kind == "ok"


# Bodies of ft serve's documented control API that the 0.1.2 capture does not hold.
_FAILED_REPLY = {
    "request_id": "r-1",
    "status": "failed",
    "moe_cache_size": 128,
    "num_pages": 0,
    "mamba_slots": 8,
    "num_swa_pages": 0,
    "error": "rebuild failed and rollback failed: OutOfMemoryError(...)",
}


@pytest.mark.parametrize(
    ("http_status", "body", "kind", "latched"),
    [
        (
            503,
            {"status": "loading", "error": "model is still loading; cannot rebuild cache yet"},
            "loading",
            False,
        ),
        (
            503,
            {"status": "failed", "error": "server latched in maintenance; restart required"},
            "failed",
            True,
        ),
        (
            503,
            {"status": "failed", "error": "failed to dispatch rebuild: zmq.Again()"},
            "failed",
            False,
        ),
        (503, {"status": "failed", "error": "backend worker exited with code -9"}, "failed", True),
        (503, _FAILED_REPLY, "failed", True),
        (503, {**_FAILED_REPLY, "status": "unsupported", "error": "TP>1"}, "unsupported", False),
        (409, {"status": "busy", "error": "engine stop is in progress"}, "busy_rebuilding", False),
        (401, {"error": "Unauthorized"}, "unauthorized", False),
        (401, None, "unauthorized", False),
        (200, {**_FAILED_REPLY, "status": "busy"}, "unexpected", False),
        (200, {"status": "ok"}, "unexpected", False),
        (500, {"error": "Internal Server Error"}, "unexpected", False),
        (503, {"status": "maybe"}, "unexpected", False),
        (503, "Service Unavailable", "unexpected", False),
        (504, {"error": "gateway"}, "unexpected", False),
        (422, {"status": "weird"}, "unexpected", False),
    ],
)
def test_documented_rebuild_replies(http_status: int, body: Any, kind: str, latched: bool) -> None:
    outcome = classify_rebuild(http_status, body)
    assert outcome.kind == kind
    assert outcome.latched is latched
    assert outcome.http_status == http_status
    if kind in {"failed", "loading", "unauthorized", "unexpected"}:
        assert outcome.error


def test_failed_rollback_keeps_the_reply() -> None:
    outcome = classify_rebuild(503, _FAILED_REPLY)
    assert outcome.reply is not None
    assert outcome.reply.status == "failed"
    assert outcome.request_id == "r-1"


def test_build_rebuild_body_adds_timeout_and_mode_only_when_absent() -> None:
    assert build_rebuild_body({"num_pages": 4}, wait_s=30.0) == {
        "num_pages": 4,
        "timeout": 30.0,
        "mode": "if_idle",
    }
    assert build_rebuild_body({"timeout": 5, "mode": "if_idle"}, wait_s=30.0) == {
        "timeout": 5,
        "mode": "if_idle",
    }
    # A bad mode is the server's to refuse (422): it is passed through untouched.
    assert build_rebuild_body({"mode": "drain"}, wait_s=1.0)["mode"] == "drain"


@pytest.mark.parametrize(
    ("body", "wait_s", "field"),
    [
        ({"kv_tokens": 4}, 1.0, "kv_tokens"),
        ({}, 0.0, "timeout"),
        ({}, math.inf, "timeout"),
        ({"timeout": "soon"}, 1.0, "timeout"),
        ({"timeout": -1}, 1.0, "timeout"),
        ({"num_pages": object()}, 1.0, "body"),
        ({"num_pages": math.nan}, 1.0, "body"),
    ],
)
def test_build_rebuild_body_refuses(body: dict[str, Any], wait_s: float, field: str) -> None:
    with pytest.raises(DocumentError) as info:
        build_rebuild_body(body, wait_s=wait_s)
    assert info.value.field == field


# ------------------------------------------------------------------------------ fuzzing

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)

ALL_KEYS = sorted(
    {
        key
        for name in MANIFEST
        if name.endswith(".json")
        for key in json.dumps(_doc(name)).split('"')[1::2]
        if key.isidentifier()
    }
)
# Objects whose keys are real field names reach deeper into the parsers than random text.
keyed_objects = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(ALL_KEYS), children, max_size=8)
    ),
    max_leaves=30,
)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            found += _paths(value, (*prefix, index))
    return found


@st.composite
def mutated_capture(draw: st.DrawFn, names: list[str]) -> Any:
    """A real capture with one value replaced by arbitrary JSON, or one key deleted."""
    doc = _doc(draw(st.sampled_from(names)))
    path = draw(st.sampled_from(_paths(doc)))
    if not path:
        return draw(json_values)
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    if isinstance(parent, dict) and draw(st.booleans()):
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(json_values)
    return doc


WIRE_PARSERS: list[tuple[Callable[[Any], Any], list[str]]] = [
    (parse_health, HEALTH_FILES),
    (parse_stats, STATS_FILES),
    (parse_requests, REQUESTS_FILES),
    (parse_rebuild_reply, [n for n, (k, _) in REBUILD_KIND.items() if k != "invalid"]),
]


@pytest.mark.parametrize(
    ("parser", "names"), WIRE_PARSERS, ids=[p.__name__ for p, _ in WIRE_PARSERS]
)
@given(data=st.data())
def test_wire_parsers_raise_only_document_error(
    parser: Callable[[Any], Any], names: list[str], data: st.DataObject
) -> None:
    doc = data.draw(json_values | keyed_objects | mutated_capture(names))
    try:
        parser(doc)
    except DocumentError as exc:
        assert exc.field


@given(doc=json_values | keyed_objects | mutated_capture(STATUS_FILES))
def test_status_parser_raises_only_document_error(doc: Any) -> None:
    try:
        parse_cache_status(doc)
    except DocumentError as exc:
        assert exc.field


@given(
    http_status=st.sampled_from([200, 401, 409, 422, 500, 503, 504]) | st.integers(-5, 999),
    body=json_values | keyed_objects | mutated_capture(REBUILD_FILES),
)
def test_classify_rebuild_never_raises(http_status: int, body: Any) -> None:
    outcome = classify_rebuild(http_status, body)
    assert outcome.http_status == http_status
    assert outcome.kind != "ok" or (outcome.reply is not None and outcome.reply.status == "ok")
    assert outcome.latched is False or outcome.kind == "failed"


@given(
    body=st.dictionaries(st.sampled_from(sorted(REBUILD_REQUEST_KEYS)) | st.text(), json_values),
    wait_s=st.floats(allow_nan=True, allow_infinity=True),
)
def test_build_rebuild_body_raises_only_document_error(body: dict[str, Any], wait_s: float) -> None:
    try:
        payload = build_rebuild_body(body, wait_s=wait_s)
    except DocumentError:
        return
    assert payload["mode"] == body.get("mode", "if_idle")
    json.dumps(payload, allow_nan=False)


def test_health_is_frozen() -> None:
    health = parse_health(_doc("health.serving.json"))
    with pytest.raises(AttributeError):
        health.status = "error"  # type: ignore[misc]
    assert isinstance(health, Health)
