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


def _oracle_chat_delays_s(waits_for: str) -> tuple[list[float], float]:
    """How late the oracle sent each chat of a mixed trace (one-request sessions, so their
    schedule does not depend on replies), and the seconds its engine spent rebuilding."""
    from bench.replay.arms import replay_arm
    from bench.replay.experts import RoutingBank
    from bench.replay.seeds import world_for
    from bench.replay.vloop import run_virtual

    trace = arms.build_trace("mixed", 24, seed=4, output_scale=8.0)
    world = world_for("h200-bench")
    opts = arms.BenchOptions(device="cuda", scale=1.0, seed=4, arms=(), quiet=True,
                             threads=None, oracle_waits_for=waits_for)
    result = run_virtual(replay_arm("oracle", trace, opts, world,
                                    RoutingBank(world.spec.routing, 4)))
    return ([row.sent_s - opts.seconds(trace[row.index].t_s)
             for row in result.rows if row.kind == "chat"], result.engine_rebuild_s)


def test_the_oracle_sends_on_the_traces_schedule() -> None:
    """The oracle's sender holds the next request only while it changes the geometry for
    this one, so it offers the same load as every other arm; waiting for the first token
    (how runs before `oracle_waits_for` ran) held chats seconds behind a slow admission."""
    delays, rebuild_s = _oracle_chat_delays_s("queue")
    assert len(delays) == 14 and min(delays) >= 0
    assert max(delays) <= rebuild_s + 1e-9 and sorted(delays)[len(delays) // 2] == 0
    old_delays, _ = _oracle_chat_delays_s("first-token")
    assert sorted(old_delays)[len(old_delays) // 2] > 1.0


def test_bench_options_refuse_an_unknown_oracle_rule() -> None:
    with pytest.raises(ValueError, match="oracle_waits_for must be one of queue, first-token"):
        arms.BenchOptions(oracle_waits_for="admission")
