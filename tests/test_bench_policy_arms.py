"""bench/policy_arms.py: the grow-only baseline policy, and the arm of the default policy."""

from __future__ import annotations

import pytest

from bench import policy_arms as arms


def test_grow_only_never_steps_down() -> None:
    from policies.api import LadderView, Observation, RungView

    view = LadderView(tuple(RungView(i, kv, 100 - 10 * i, 4)
                            for i, kv in enumerate((1824, 2736, 3648))))
    policy = arms.GrowOnly()

    def decide(live: int, pending: int = 0) -> int:
        return policy.decide(Observation(now_s=0.0, rung=None, live_kv_tokens=live,
                                         pending_kv_tokens=pending, active_requests=0,
                                         decode_tps=None), view).rung

    assert decide(0) == 0
    assert decide(2000) == 1
    assert decide(1000, 2000) == 2
    assert decide(0) == 2
    with pytest.raises(ValueError, match="unknown option"):
        arms.GrowOnly(step=3)


def test_the_default_arm_is_the_daemons_default_policy() -> None:
    from ladder.config import ServerConfig
    from policies.pinned import Pinned
    from policies.registry import BUILTINS

    policy, options = arms._policy(arms.DEFAULT_ARM, arms.BenchOptions())
    assert BUILTINS[ServerConfig().policy] == policy
    # The daemon's default policy runs with no options: the arm must add none of its own.
    assert options == {"rung": Pinned().rung}
