"""Seeded request traces shaped like public workload descriptions.

The ladder's value depends on the traffic: short chat keeps KV at its floor and wants every
slot, while agentic coding sessions grow a context turn by turn to 150-200k tokens and pause
between turns, which is when a resize is cheap. No real trace is reachable from project
machines, so these generators rebuild the published distributions instead:

* `agentic_session`: the aiperf agentic-code synthesizer's published parameters, checked
  against TraceLab (mean 153.7k input tokens per step) and SemiAnalysis (median 150-200k).
* `short_chat`: ShareGPT V3 (computed from the dataset): context at a human turn median 821 /
  p90 1,879 / p99 2,454, first reply median 279 / p90 630 / p99 946.
* `mixed`: a few concurrent agentic sessions with chat traffic in between.
* `handoff`: one user's day: an agentic session runs a few turns and ends, short chat follows,
  then the next session; the case a grow-only ladder cannot serve (it keeps the long
  session's KV, and its few expert slots, through the chat that follows).
* `scaled`: the same shapes at 1/factor of the tokens, for CPU smoke runs of the tiny engine.

Times are open-loop: within a session `t_s` grows by the think gap after each turn. A closed-
loop replayer should wait for the previous reply and then sleep the same gap (the differences of
`t_s` within a session). Everything here is pure and seeded; `main()` is the only I/O.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np

__all__ = [
    "DEFAULT_AGENTIC",
    "DEFAULT_CHAT",
    "MIXED_CHAT",
    "AgenticParams",
    "ChatParams",
    "TraceRequest",
    "agentic_session",
    "agentic_sessions",
    "handoff",
    "lognormal_sigma",
    "main",
    "mixed",
    "scaled",
    "short_chat",
]

# Distinct SeedSequence roots per generator, so agentic_session(1) and short_chat(1) do not
# share random streams when `mixed` combines them.
_AGENTIC_TAG = 0x4147
_CHAT_TAG = 0x4348
_MIXED_TAG = 0x4D58
_REPO_TAG = 0x5250
_SESSIONS_TAG = 0x5353
_HANDOFF_TAG = 0x484F


@dataclass(frozen=True)
class TraceRequest:
    """One request: send at `t_s`, a context of `prompt_tokens`, generate `max_tokens`."""

    t_s: float
    session: str
    prompt_tokens: int
    max_tokens: int
    kind: str  # "agentic" or "chat"


@dataclass(frozen=True)
class AgenticParams:
    """The aiperf agentic-code synthesizer, plus what it leaves open.

    Lognormals are given by median and mean, as aiperf states them, and are capped.
    """

    system_tools_tokens: int = 32_000  # shared system prompt + tool definitions
    # aiperf: "100 repo groups, Zipf 0.6"; their sizes are not published. Published test mixes
    # start a session at ~35-50k = 32k + ~10k repo + ~5k session prefix: per-group sizes are
    # lognormal around 10k (sigma 0.5), fixed per group so sessions of one repo agree.
    repo_groups: int = 100
    repo_zipf_s: float = 0.6
    repo_tokens_median: int = 10_000
    repo_tokens_sigma: float = 0.5
    session_prefix_median_tokens: int = 5_000
    session_prefix_mean_tokens: int = 15_000
    session_prefix_max_tokens: int = 50_000
    new_tokens_median: int = 4_000  # user message + tool results added per turn
    new_tokens_mean: int = 6_000
    new_tokens_max: int = 50_000
    output_median_tokens: int = 800
    output_mean_tokens: int = 1_000
    output_max_tokens: int = 10_000
    context_cap_tokens: int = 200_000
    # aiperf: "reset probability 0.05, growing with context". Read here as 0.05 per turn at the
    # context cap, proportional to context below it (~0.01 at a 40k start): with that reading a
    # session spends most turns at 100-200k, matching TraceLab's 153.7k mean per step.
    reset_prob_at_cap: float = 0.05
    # A turn that would pass the cap is compacted (TraceLab: a drop of >= 25 %): the
    # conversation part above the fixed prefix keeps a uniform share in this range.
    compaction_keep_range: tuple[float, float] = (0.2, 0.6)
    agentic_gap_share: float = 0.7  # tool round trips; the rest are human think times
    agentic_gap_median_s: float = 2.0
    agentic_gap_mean_s: float = 5.0
    human_gap_median_s: float = 15.0
    human_gap_mean_s: float = 30.0


@dataclass(frozen=True)
class ChatParams:
    """ShareGPT V3 quantiles as piecewise-linear inverse CDFs.

    The 0 and 1 knots are not published: a 1-token floor and a tail cap a little above p99,
    because the cleaned split caps conversations at ~2k tokens.
    """

    context_knots: tuple[tuple[float, int], ...] = (
        (0.0, 4), (0.5, 821), (0.9, 1879), (0.99, 2454), (1.0, 3000),
    )
    reply_knots: tuple[tuple[float, int], ...] = (
        (0.0, 1), (0.5, 279), (0.9, 630), (0.99, 946), (1.0, 1400),
    )
    rate_per_s: float = 0.5  # Poisson arrivals


DEFAULT_AGENTIC = AgenticParams()
DEFAULT_CHAT = ChatParams()
# Background chat next to agentic sessions: one request every ~5 s.
MIXED_CHAT = ChatParams(rate_per_s=0.2)


def lognormal_sigma(median: float, mean: float) -> float:
    """sigma of a lognormal with this median and mean (mean = median * exp(sigma^2 / 2))."""
    if not 0 < median <= mean:
        raise ValueError(f"need 0 < median <= mean, got {median}, {mean}")
    return math.sqrt(2.0 * math.log(mean / median))


def _lognormal(rng: np.random.Generator, median: float, mean: float, cap: float) -> float:
    value = median * math.exp(lognormal_sigma(median, mean) * rng.standard_normal())
    return min(value, cap)


def _tokens(value: float) -> int:
    return max(1, round(value))


def _quantile(knots: Sequence[tuple[float, int]], u: float) -> int:
    probs = [p for p, _ in knots]
    values = [v for _, v in knots]
    return _tokens(float(np.interp(u, probs, values)))


def _rng(tag: int, *seed_words: int) -> np.random.Generator:
    # SeedSequence wants non-negative words; any int seed is accepted.
    words = [tag, *(w % (1 << 64) for w in seed_words)]
    return np.random.default_rng(np.random.SeedSequence(words))


def _repo_tokens(params: AgenticParams, group: int) -> int:
    # Per group, independent of the session seed: two sessions on one repo share its size.
    value = params.repo_tokens_median * math.exp(
        params.repo_tokens_sigma * _rng(_REPO_TAG, group).standard_normal()
    )
    return _tokens(value)


def _check_stop(n: int | None, duration_s: float | None) -> None:
    if n is None and duration_s is None:
        raise ValueError("give n or duration_s")
    if n is not None and n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if duration_s is not None and duration_s < 0:
        raise ValueError(f"duration_s must be >= 0, got {duration_s}")


def _take(
    requests: Iterable[TraceRequest], n: int | None, duration_s: float | None
) -> list[TraceRequest]:
    out: list[TraceRequest] = []
    for request in requests:
        if (n is not None and len(out) >= n) or (
            duration_s is not None and request.t_s > duration_s
        ):
            break
        out.append(request)
    return out


def _agentic_turns(
    seed_words: tuple[int, ...], session: str, start_s: float, params: AgenticParams
) -> Iterator[TraceRequest]:
    rng = _rng(_AGENTIC_TAG, *seed_words)
    p = params
    group_weight = np.arange(1, p.repo_groups + 1, dtype=np.float64) ** -p.repo_zipf_s
    group_weight /= group_weight.sum()
    # One repo per session: a reset clears the conversation, not the checkout.
    group = int(rng.choice(p.repo_groups, p=group_weight))
    fixed_tokens = p.system_tools_tokens + _repo_tokens(p, group)

    def fresh_context() -> int:
        prefix = _lognormal(
            rng, p.session_prefix_median_tokens, p.session_prefix_mean_tokens,
            p.session_prefix_max_tokens,
        )
        return min(p.context_cap_tokens, fixed_tokens + _tokens(prefix))

    context_tokens = fresh_context()
    t_s = start_s
    while True:
        output_tokens = _tokens(
            _lognormal(rng, p.output_median_tokens, p.output_mean_tokens, p.output_max_tokens)
        )
        yield TraceRequest(t_s, session, context_tokens, output_tokens, "agentic")

        if rng.random() < p.agentic_gap_share:
            gap_s = _lognormal(rng, p.agentic_gap_median_s, p.agentic_gap_mean_s, math.inf)
        else:
            gap_s = _lognormal(rng, p.human_gap_median_s, p.human_gap_mean_s, math.inf)
        t_s += gap_s

        reset_prob = p.reset_prob_at_cap * context_tokens / p.context_cap_tokens
        if rng.random() < reset_prob:
            context_tokens = fresh_context()
            continue
        new_tokens = _tokens(
            _lognormal(rng, p.new_tokens_median, p.new_tokens_mean, p.new_tokens_max)
        )
        grown = context_tokens + output_tokens + new_tokens
        if grown > p.context_cap_tokens:
            keep = rng.uniform(*p.compaction_keep_range)
            compacted = fixed_tokens + round(keep * max(0, context_tokens - fixed_tokens))
            # The compacted history still gets this turn's new tokens; never a < 25 % drop.
            grown = min(compacted + new_tokens, math.floor(0.75 * context_tokens))
            grown = min(max(grown, 1), p.context_cap_tokens)
        context_tokens = grown


def agentic_session(
    seed: int,
    n: int | None = None,
    duration_s: float | None = None,
    *,
    session: str | None = None,
    start_s: float = 0.0,
    params: AgenticParams = DEFAULT_AGENTIC,
) -> list[TraceRequest]:
    """One agentic coding session: `n` turns, or turns sent up to `duration_s`.

    `prompt_tokens` is the whole context of the turn (prefix + history + new tokens).
    """
    _check_stop(n, duration_s)
    name = f"agentic-{seed}" if session is None else session
    stop_s = None if duration_s is None else start_s + duration_s
    return _take(_agentic_turns((seed,), name, start_s, params), n, stop_s)


def agentic_sessions(
    seed: int,
    sessions: int,
    n: int | None = None,
    duration_s: float | None = None,
    *,
    stagger_s: float = 60.0,
    params: AgenticParams = DEFAULT_AGENTIC,
) -> list[TraceRequest]:
    """`sessions` concurrent agentic sessions started `stagger_s` apart, merged by time.

    `n` bounds the merged trace's length, `duration_s` its last send time.
    """
    _check_stop(n, duration_s)
    streams = [
        _agentic_turns((_SESSIONS_TAG, seed, j), f"agentic-{seed}-{j}", j * stagger_s, params)
        for j in range(sessions)
    ]
    return _take(_merge(streams), n, duration_s)


def _chat_requests(
    seed_words: tuple[int, ...], prefix: str, params: ChatParams
) -> Iterator[TraceRequest]:
    rng = _rng(_CHAT_TAG, *seed_words)
    t_s = 0.0
    i = 0
    while True:
        t_s += float(rng.exponential(1.0 / params.rate_per_s))
        prompt_tokens = _quantile(params.context_knots, float(rng.random()))
        max_tokens = _quantile(params.reply_knots, float(rng.random()))
        yield TraceRequest(t_s, f"{prefix}-{i}", prompt_tokens, max_tokens, "chat")
        i += 1


def short_chat(
    seed: int,
    n: int | None = None,
    duration_s: float | None = None,
    *,
    params: ChatParams = DEFAULT_CHAT,
) -> list[TraceRequest]:
    """ShareGPT-shaped single requests with Poisson arrivals at `params.rate_per_s`."""
    _check_stop(n, duration_s)
    return _take(_chat_requests((seed,), f"chat-{seed}", params), n, duration_s)


def _merge(streams: Sequence[Iterator[TraceRequest]]) -> Iterator[TraceRequest]:
    # Ties broken by session name, so the order never depends on generator internals.
    return heapq.merge(*streams, key=lambda r: (r.t_s, r.session))


def mixed(
    seed: int,
    n: int | None = None,
    duration_s: float | None = None,
    *,
    agentic_count: int = 2,
    stagger_s: float = 60.0,
    chat: ChatParams = MIXED_CHAT,
    agentic: AgenticParams = DEFAULT_AGENTIC,
) -> list[TraceRequest]:
    """`agentic_count` agentic sessions interleaved with short chat, merged by time."""
    _check_stop(n, duration_s)
    streams = [
        _agentic_turns((_MIXED_TAG, seed, j), f"agentic-{seed}-{j}", j * stagger_s, agentic)
        for j in range(agentic_count)
    ]
    streams.append(_chat_requests((_MIXED_TAG, seed), f"chat-{seed}", chat))
    return _take(_merge(streams), n, duration_s)


def handoff(
    seed: int,
    n: int | None = None,
    duration_s: float | None = None,
    *,
    turns_range: tuple[int, int] = (4, 8),
    chats_range: tuple[int, int] = (6, 12),
    chat: ChatParams = DEFAULT_CHAT,
    agentic: AgenticParams = DEFAULT_AGENTIC,
) -> list[TraceRequest]:
    """Agentic sessions of `turns_range` turns (inclusive), each followed by `chats_range`
    short chat requests, one after another.

    Everything is one closed-loop session (`handoff-SEED`), so a replayer sends each request
    after the previous reply plus the gap: the long session has really ended when the chat
    starts, however fast the server decodes. Chat requests follow a human think gap
    (`agentic.human_gap_*`), as a person moving from an agent to a chat window would.
    """
    _check_stop(n, duration_s)
    if not 1 <= turns_range[0] <= turns_range[1] or not 0 <= chats_range[0] <= chats_range[1]:
        raise ValueError(f"need 1 <= turns and 0 <= chats ranges, got {turns_range}, "
                         f"{chats_range}")
    return _take(_handoff_requests(seed, turns_range, chats_range, chat, agentic), n,
                 duration_s)


def _handoff_requests(seed: int, turns_range: tuple[int, int], chats_range: tuple[int, int],
                      chat: ChatParams, agentic: AgenticParams) -> Iterator[TraceRequest]:
    rng = _rng(_HANDOFF_TAG, seed)
    name = f"handoff-{seed}"
    t_s = 0.0
    block = 0
    while True:
        turns = int(rng.integers(turns_range[0], turns_range[1] + 1))
        for request in itertools.islice(
                _agentic_turns((_HANDOFF_TAG, seed, block), name, t_s, agentic), turns):
            t_s = request.t_s
            yield request
        for _ in range(int(rng.integers(chats_range[0], chats_range[1] + 1))):
            t_s += _lognormal(rng, agentic.human_gap_median_s, agentic.human_gap_mean_s,
                              math.inf)
            yield TraceRequest(t_s, name, _quantile(chat.context_knots, float(rng.random())),
                               _quantile(chat.reply_knots, float(rng.random())), "chat")
        t_s += _lognormal(rng, agentic.human_gap_median_s, agentic.human_gap_mean_s, math.inf)
        block += 1


def scaled(trace: Iterable[TraceRequest], factor: float) -> list[TraceRequest]:
    """Token counts divided by `factor` (>= 1 token each), times unchanged: CPU smoke runs."""
    if factor <= 0:
        raise ValueError(f"factor must be > 0, got {factor}")
    return [
        replace(
            r,
            prompt_tokens=max(1, round(r.prompt_tokens / factor)),
            max_tokens=max(1, round(r.max_tokens / factor)),
        )
        for r in trace
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print a seeded request trace as JSON lines.")
    parser.add_argument("--kind", choices=("agentic", "chat", "mixed", "handoff"),
                        default="agentic")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n", type=int, default=None, help="number of requests")
    parser.add_argument("--duration-s", type=float, default=None, help="last send time")
    parser.add_argument("--sessions", type=int, default=1, help="agentic sessions")
    parser.add_argument("--scale", type=float, default=1.0, help="divide token counts by this")
    args = parser.parse_args(argv)
    n = args.n if args.n is not None or args.duration_s is not None else 20
    if args.kind == "agentic":
        if args.sessions == 1:
            trace = agentic_session(args.seed, n, args.duration_s)
        else:
            trace = agentic_sessions(args.seed, args.sessions, n, args.duration_s)
    elif args.kind == "chat":
        trace = short_chat(args.seed, n, args.duration_s)
    elif args.kind == "handoff":
        trace = handoff(args.seed, n, args.duration_s)
    else:
        trace = mixed(args.seed, n, args.duration_s, agentic_count=args.sessions)
    if args.scale != 1.0:
        trace = scaled(trace, args.scale)
    for request in trace:
        sys.stdout.write(json.dumps(asdict(request)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
