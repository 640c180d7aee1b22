"""The reduced fault soak for CI: 300 seeded faults against the real controller and engine.

The full 10,000-fault form is `python bench/soak.py`; this one keeps the same driver and the
same targets (0 risky calls, 0 wedges, 0 crashes, recovery once faults stop) in seconds.
"""

from __future__ import annotations

import pytest

from bench import soak


@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_reduced_soak_meets_the_targets() -> None:
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
