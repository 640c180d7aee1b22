"""The lint settings in pyproject.toml hold for the whole tree: ruff runs as a test."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_is_clean() -> None:
    if shutil.which("ruff") is None:
        pytest.fail("ruff is part of the test extra; install with .[test]")
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise",
                           "ladder", "engine", "policies", "tests", "bench"],
                          cwd=ROOT, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
