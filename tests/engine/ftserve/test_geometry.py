"""The `/v1/cache/status` parser: every real document, both shapes, and broken ones."""

from __future__ import annotations

import contextlib
import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.ftserve.fields import DocumentError
from engine.ftserve.geometry import Geometry, parse_cache_status
from tests.conftest import FIXTURES, load_fixture

CAPTURED = sorted((FIXTURES / "freetoken-0.1.2").glob("*cache_status*.json"))


def test_every_captured_status_document_parses() -> None:
    assert len(CAPTURED) >= 18
    for path in CAPTURED:
        doc = json.loads(path.read_text())
        status = parse_cache_status(doc)
        geo = doc["geometry"]
        assert status.state == doc["state"]
        assert status.geometry == Geometry(geo["moe_cache_size"], geo["num_pages"],
                                           geo["num_mamba_slots"], geo["num_swa_pages"])
        assert status.units.kv_per_token == geo["unit_bytes"]["kv_per_token"]
        assert status.cache_budget_bytes == geo["cache_budget_bytes"]
        assert status.floors.moe_slots == geo["limits"]["moe_experts"]["min"]
        assert status.engine.kind == "freetoken"


def test_captured_tiny_qwen35_shape() -> None:
    status = parse_cache_status(load_fixture("freetoken-0.1.2/cache_status.boot.json"))
    assert status.shape.page_size == 1
    assert status.shape.max_expert_slots == 64 * 8
    assert status.shape.has_mamba
    assert not status.shape.has_swa
    assert status.floors.kv_tokens == 1
    assert status.floors.mamba_slots == 4
    assert status.last_rebuild is None


def test_during_rebuild_state_and_last_rebuild() -> None:
    status = parse_cache_status(load_fixture("freetoken-0.1.2/cache_status.during_rebuild.json"))
    assert status.state == "rebuilding"
    after = parse_cache_status(
        load_fixture("freetoken-0.1.2/cache_status.bug_after_combined.json"))
    assert after.last_rebuild is not None
    assert after.last_rebuild.status == "rejected"
    assert "rolled back" in (after.last_rebuild.error or "")


def test_report_geometry() -> None:
    status = parse_cache_status(load_fixture("seed-rtx5080-status.json"))
    assert status.geometry == Geometry(512, 4096, 8)
    assert status.shape.pages_for_tokens(65536) == 1024
    assert status.shape.pages_for_tokens(65537) == 1025
    assert status.limits.moe_experts_max == 1843


def test_021_example_shape() -> None:
    status = parse_cache_status(load_fixture("ftserve-0.2.1-example-status.json"))
    assert status.geometry == Geometry(1677, 4097, 20)
    assert status.last_rebuild is not None and status.last_rebuild.status == "ok"
    assert status.shape.max_expert_slots == 512 * 48


def test_reference_engine_block() -> None:
    doc = load_fixture("seed-rtx5080-status.json")
    doc["engine"] = {"name": "moe-ladder-reference", "rebuild_mode": "incremental",
                     "chunk_bytes": 2 << 20}
    status = parse_cache_status(doc)
    assert status.engine.kind == "reference"
    assert status.engine.chunk_bytes == 2 << 20
    doc["engine"]["rebuild_mode"] = "freetoken"
    assert parse_cache_status(doc).engine.kind == "freetoken"


def _broken(path: tuple[str, ...], value: Any) -> Any:
    doc = copy.deepcopy(load_fixture("seed-rtx5080-status.json"))
    node = doc
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


@pytest.mark.parametrize(
    ("path", "value", "field", "words"),
    [
        (("geometry",), KeyError, "geometry", "missing"),
        (("geometry", "num_pages"), KeyError, "geometry.num_pages", "missing"),
        (("geometry", "num_pages"), "4096", "geometry.num_pages", "integer"),
        (("geometry", "num_pages"), 0, "geometry.num_pages", ">= 1"),
        (("geometry", "moe_cache_size"), True, "geometry.moe_cache_size", "integer"),
        (("geometry", "moe_cache_size"), 1.5, "geometry.moe_cache_size", "integer"),
        (("geometry", "page_size"), 0, "geometry.page_size", ">= 1"),
        (("geometry", "unit_bytes", "moe_per_expert"), 0,
         "geometry.unit_bytes.moe_per_expert", "does not know"),
        (("geometry", "unit_bytes", "kv_per_token"), 0,
         "geometry.unit_bytes.kv_per_token", "does not know"),
        (("geometry", "unit_bytes", "mamba_per_slot"), 0,
         "geometry.unit_bytes.mamba_per_slot", "does not know"),
        (("geometry", "unit_bytes"), [], "geometry.unit_bytes", "object"),
        (("geometry", "limits", "kv_tokens"), KeyError, "geometry.limits.kv_tokens", "missing"),
        (("geometry", "cache_budget_bytes"), -5, "geometry.cache_budget_bytes", ">= 1"),
        (("state",), 3, "state", "string"),
        (("engine",), {"name": "x", "rebuild_mode": "drain"}, "engine.rebuild_mode", "drain"),
    ],
)
def test_broken_documents_name_the_field(
    path: tuple[str, ...], value: Any, field: str, words: str
) -> None:
    with pytest.raises(DocumentError) as info:
        parse_cache_status(_broken(path, value))
    assert info.value.field == field
    assert words in str(info.value)


def test_unknown_unit_cost_is_fine_for_an_absent_pool() -> None:
    doc = _broken(("geometry", "unit_bytes", "mamba_per_slot"), 0)
    doc["geometry"]["num_mamba_slots"] = 0
    status = parse_cache_status(doc)
    assert not status.shape.has_mamba


def test_not_an_object() -> None:
    with pytest.raises(DocumentError, match="document"):
        parse_cache_status([1, 2])


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@given(doc=_json)
def test_fuzz_arbitrary_json_only_raises_document_error(doc: Any) -> None:
    with contextlib.suppress(DocumentError):
        parse_cache_status(doc)


@given(key=st.sampled_from(["num_pages", "page_size", "moe_cache_size", "num_mamba_slots",
                            "num_experts", "num_moe_layers", "unit_bytes", "limits",
                            "cache_budget_bytes", "num_swa_pages", "swa_page_size"]),
       value=_json)
def test_fuzz_one_field_replaced(key: str, value: Any) -> None:
    doc = _broken(("geometry", key), value)
    try:
        parse_cache_status(doc)
    except DocumentError as exc:
        assert exc.field.startswith("geometry")
