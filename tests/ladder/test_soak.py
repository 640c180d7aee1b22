"""The reduced fault soak for CI: 300 seeded faults against the real controller and engine.

The full 10,000-fault form is `python bench/soak.py`; this one keeps the same driver and the
same targets (0 risky calls, 0 wedges, 0 crashes, recovery once faults stop) in seconds.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _soak_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_soak", ROOT / "bench" / "soak.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_reduced_soak_meets_the_targets() -> None:
    soak = _soak_module()
    result = await soak.run_soak(300, seed=7)
    assert result.faults_injected == 300
    assert result.risky_calls == 0, result
    assert result.unconfirmed_grows == 0, result
    assert result.wedges == 0, result
    assert result.daemon_crashes == 0, result
    assert result.recovered, result
    # Retries bounded in rate: backoff and safeguards keep rebuilds sparse in virtual time.
    assert result.max_rebuilds_per_10s <= 10, result
    assert len(result.faults_by_kind) >= 8  # the mix really mixed
