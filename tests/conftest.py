"""Shared fixtures: paths to the captured ft serve documents and hypothesis profiles."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

FIXTURES = Path(__file__).parent / "fixtures"


CAPTURES = FIXTURES / "freetoken-0.1.2"


def captured_manifest() -> dict[str, dict[str, Any]]:
    """Every captured ft serve document's manifest entry (method, path, status...), by file."""
    entries: dict[str, dict[str, Any]] = {}
    for manifest in sorted(CAPTURES.glob("_manifest.*.json")):
        for entry in json.loads(manifest.read_text()):
            entries[entry["file"]] = entry
    return entries


def load_fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture
def report_status_doc() -> Any:
    """The motivating report's RTX 5080 geometry (reconstructed from its `ft ctl cache` table)."""
    return load_fixture("seed-rtx5080-status.json")
