"""bench/traces.py reproduces its documented distributions, seeded and in order.

Sample statistics are held to 20 % of the published medians/means over a few thousand draws
(sampling noise there is ~2-4 %; the slack covers the caps, which trim the lognormal tails).
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from bench import traces

P = traces.DEFAULT_AGENTIC


@pytest.fixture(scope="module")
def sessions() -> list[list]:
    return [traces.agentic_session(seed, 84) for seed in range(40)]


def _near(value: float, target: float, rel: float = 0.2) -> bool:
    return abs(value - target) <= rel * target


def test_generators_are_deterministic() -> None:
    assert traces.agentic_session(3, 30) == traces.agentic_session(3, 30)
    assert traces.short_chat(3, 50) == traces.short_chat(3, 50)
    assert traces.mixed(3, 60) == traces.mixed(3, 60)
    assert traces.agentic_sessions(3, 3, 60) == traces.agentic_sessions(3, 3, 60)
    assert traces.handoff(3, 60) == traces.handoff(3, 60)
    assert traces.handoff(3, 60) != traces.handoff(4, 60)
    assert traces.agentic_session(3, 30) != traces.agentic_session(4, 30)
    assert traces.short_chat(3, 50) != traces.short_chat(4, 50)


@pytest.mark.parametrize(
    "make",
    [
        lambda: traces.agentic_session(1, 200),
        lambda: traces.agentic_sessions(1, 4, 300),
        lambda: traces.short_chat(1, 300),
        lambda: traces.mixed(1, 300),
        lambda: traces.handoff(1, 300),
    ],
    ids=["agentic", "sessions", "chat", "mixed", "handoff"],
)
def test_time_is_monotone_and_fields_valid(make) -> None:
    trace = make()
    times = [r.t_s for r in trace]
    assert times == sorted(times)
    assert all(r.prompt_tokens >= 1 and r.max_tokens >= 1 for r in trace)
    assert {r.kind for r in trace} <= {"agentic", "chat"}
    # Within a session strictly increasing: two turns of one session never share a send time.
    by_session: dict[str, list[float]] = {}
    for r in trace:
        by_session.setdefault(r.session, []).append(r.t_s)
    assert all(np.all(np.diff(t) > 0) for t in by_session.values())


def test_n_and_duration_bound_the_trace() -> None:
    assert len(traces.agentic_session(1, 17)) == 17
    assert len(traces.short_chat(1, 0)) == 0
    chat = traces.short_chat(1, duration_s=600.0)
    assert chat[-1].t_s <= 600.0
    assert len(chat) == pytest.approx(600 * traces.DEFAULT_CHAT.rate_per_s, rel=0.2)
    agentic = traces.agentic_session(1, duration_s=300.0, start_s=100.0)
    assert agentic[0].t_s == 100.0
    assert agentic[-1].t_s <= 400.0
    with pytest.raises(ValueError, match="n or duration_s"):
        traces.short_chat(1)


def test_agentic_contexts_start_near_45k_and_reach_150k(sessions: list[list]) -> None:
    starts = [s[0].prompt_tokens for s in sessions]
    assert 35_000 <= float(np.median(starts)) <= 60_000
    assert min(starts) >= P.system_tools_tokens
    peaks = [max(r.prompt_tokens for r in s) for s in sessions]
    assert np.mean(np.array(peaks) >= 150_000) >= 0.9
    contexts = [r.prompt_tokens for s in sessions for r in s]
    # TraceLab: mean 153.7k per step; SemiAnalysis: median 150-200k. Same ballpark, lower.
    assert 100_000 <= float(np.mean(contexts)) <= 170_000


def test_agentic_caps_respected(sessions: list[list]) -> None:
    for s in sessions:
        assert all(r.prompt_tokens <= P.context_cap_tokens for r in s)
        assert all(r.max_tokens <= P.output_max_tokens for r in s)


def test_agentic_outputs_and_new_tokens_match_aiperf(sessions: list[list]) -> None:
    outputs = np.array([r.max_tokens for s in sessions for r in s])
    assert _near(float(np.median(outputs)), P.output_median_tokens)
    assert _near(float(np.mean(outputs)), P.output_mean_tokens)
    # A plain turn grows by the previous reply plus the new tokens; resets and compactions
    # shrink the context, so positive growth isolates the new-token draws.
    new = []
    for s in sessions:
        for a, b in itertools.pairwise(s):
            grown = b.prompt_tokens - a.prompt_tokens - a.max_tokens
            if grown > 0:
                new.append(grown)
    assert len(new) > 2000
    assert _near(float(np.median(new)), P.new_tokens_median)
    assert _near(float(np.mean(new)), P.new_tokens_mean)
    assert max(new) <= P.new_tokens_max


def test_agentic_resets_and_compactions_drop_by_a_quarter(sessions: list[list]) -> None:
    drops = [
        (a.prompt_tokens, b.prompt_tokens)
        for s in sessions
        for a, b in itertools.pairwise(s)
        if b.prompt_tokens < a.prompt_tokens
    ]
    assert len(drops) >= len(sessions)  # every session of 84 turns resets or compacts ~5x
    compactions = [(a, b) for a, b in drops if a > 150_000]
    assert compactions
    assert all(b <= 0.75 * a for a, b in compactions)


def _lognormal_cdf(x: float, median: float, mean: float) -> float:
    sigma = traces.lognormal_sigma(median, mean)
    return 0.5 * (1 + math.erf(math.log(x / median) / (sigma * math.sqrt(2))))


def test_agentic_gaps_mix_tool_and_human(sessions: list[list]) -> None:
    gaps = np.concatenate([np.diff([r.t_s for r in s]) for s in sessions])

    def mixture_cdf(x: float) -> float:
        return P.agentic_gap_share * _lognormal_cdf(
            x, P.agentic_gap_median_s, P.agentic_gap_mean_s
        ) + (1 - P.agentic_gap_share) * _lognormal_cdf(
            x, P.human_gap_median_s, P.human_gap_mean_s
        )

    lo, hi = 0.01, 1_000.0
    for _ in range(60):  # bisection for the mixture's median
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if mixture_cdf(mid) < 0.5 else (lo, mid)
    assert _near(float(np.median(gaps)), lo)
    mean_s = P.agentic_gap_share * P.agentic_gap_mean_s + (
        1 - P.agentic_gap_share
    ) * P.human_gap_mean_s
    assert _near(float(np.mean(gaps)), mean_s, rel=0.25)  # heavy tails: looser
    # ~30 % of gaps are human think times; most of those are idle points over 10 s.
    assert 0.15 <= float(np.mean(gaps > 10.0)) <= 0.35


def test_short_chat_matches_sharegpt() -> None:
    chat = traces.short_chat(2, 4000)
    prompts = np.array([r.prompt_tokens for r in chat])
    replies = np.array([r.max_tokens for r in chat])
    for values, targets in ((prompts, (821, 1879, 2454)), (replies, (279, 630, 946))):
        for q, target in zip((50, 90, 99), targets, strict=True):
            assert _near(float(np.percentile(values, q)), target)
    assert _near(float(np.mean(replies)), 312)
    assert prompts.max() <= 3000
    assert replies.max() <= 1400
    gaps = np.diff([r.t_s for r in chat])
    assert _near(float(np.mean(gaps)), 1 / traces.DEFAULT_CHAT.rate_per_s, rel=0.1)
    assert len({r.session for r in chat}) == len(chat)


def test_mixed_interleaves_both_kinds() -> None:
    trace = traces.mixed(5, duration_s=1800.0, agentic_count=3)
    kinds = [r.kind for r in trace]
    assert {"agentic", "chat"} == set(kinds)
    agentic_sessions = {r.session for r in trace if r.kind == "agentic"}
    assert len(agentic_sessions) == 3
    # Interleaved, not concatenated: chat requests appear between agentic turns.
    first_chat, last_chat = kinds.index("chat"), len(kinds) - 1 - kinds[::-1].index("chat")
    assert "agentic" in kinds[first_chat:last_chat]
    assert trace == sorted(trace, key=lambda r: (r.t_s, r.session))


def test_handoff_ends_each_session_before_its_chat() -> None:
    for seed in range(10):
        trace = traces.handoff(seed, 200, turns_range=(2, 5), chats_range=(3, 6))
        # One closed-loop session: each request waits for the one before it.
        assert {r.session for r in trace} == {f"handoff-{seed}"}
        runs = [(kind, len(list(group)))
                for kind, group in itertools.groupby(r.kind for r in trace)]
        assert [kind for kind, _ in runs[:4]] == ["agentic", "chat", "agentic", "chat"]
        for kind, count in runs[:-1]:  # the last block may be cut by n
            assert 2 <= count <= 5 if kind == "agentic" else 3 <= count <= 6
        chats = [r for r in trace if r.kind == "chat"]
        assert max(r.prompt_tokens for r in chats) <= traces.DEFAULT_CHAT.context_knots[-1][1]
        assert min(r.prompt_tokens for r in trace if r.kind == "agentic") >= P.system_tools_tokens
    assert traces.main(["--kind", "handoff", "--n", "7"]) == 0
    with pytest.raises(ValueError, match="turns"):
        traces.handoff(1, 10, turns_range=(0, 3))


def test_scaled_divides_tokens_and_keeps_times() -> None:
    trace = traces.agentic_session(1, 30) + traces.short_chat(1, 30)
    small = traces.scaled(trace, 100)
    assert [r.t_s for r in small] == [r.t_s for r in trace]
    assert [r.session for r in small] == [r.session for r in trace]
    for big, little in zip(trace, small, strict=True):
        assert little.prompt_tokens == max(1, round(big.prompt_tokens / 100))
        assert little.max_tokens >= 1
    assert all(r.max_tokens == 1 for r in traces.scaled(trace, 1e9))
    with pytest.raises(ValueError, match="factor"):
        traces.scaled(trace, 0)


def test_main_prints_json_lines(capsys: pytest.CaptureFixture[str]) -> None:
    assert traces.main(["--kind", "agentic", "--seed", "1", "--n", "20"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 20
    rows = [json.loads(line) for line in lines]
    assert rows[0] == {
        "t_s": 0.0, "session": "agentic-1", "prompt_tokens": rows[0]["prompt_tokens"],
        "max_tokens": rows[0]["max_tokens"], "kind": "agentic",
    }
    expected = traces.agentic_session(1, 20)
    assert [r["prompt_tokens"] for r in rows] == [r.prompt_tokens for r in expected]
    assert traces.main(["--kind", "mixed", "--n", "5", "--scale", "100", "--sessions", "2"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 5


def test_lognormal_sigma() -> None:
    assert traces.lognormal_sigma(4_000, 6_000) == pytest.approx(math.sqrt(2 * math.log(1.5)))
    assert traces.lognormal_sigma(5, 5) == 0
    with pytest.raises(ValueError, match="median"):
        traces.lognormal_sigma(10, 5)
