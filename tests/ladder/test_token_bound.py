"""The byte bound never under-counts, and tightening from the request log keeps it a bound."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.ftserve.wire import RequestEntry
from engine.reference import tokenizer as reference
from ladder.token_bound import (
    ForwardRecord,
    SizedPrompt,
    TextStats,
    TokenBound,
    match_observations,
    text_stats,
)

BOUND = TokenBound()
NO_OVERHEAD = TokenBound(per_message_tokens=0, base_tokens=0, tools_tokens=0)


@given(st.text())
def test_byte_bound_never_under_counts_the_reference_tokenizer(text: str) -> None:
    assert BOUND.text_tokens(text_stats(text)) >= reference.count(text)
    assert NO_OVERHEAD.text_tokens(text_stats(text)) >= reference.count(text)


def test_text_stats_classes() -> None:
    assert text_stats("ab C") == TextStats(letter_bytes=4, other_bytes=0)
    assert text_stats("12,\n") == TextStats(letter_bytes=0, other_bytes=4)
    assert text_stats("é") == TextStats(letter_bytes=0, other_bytes=2)


observations = st.builds(
    SizedPrompt,
    prompt_tokens=st.integers(min_value=0, max_value=200_000),
    text=st.builds(TextStats, letter_bytes=st.integers(min_value=0, max_value=100_000),
                   other_bytes=st.integers(min_value=0, max_value=100_000)),
    messages=st.integers(min_value=0, max_value=50),
    tools=st.integers(min_value=0, max_value=5),
)


@given(st.lists(observations, max_size=40))
def test_tightening_never_goes_below_an_observed_rate(obs: list[SizedPrompt]) -> None:
    tight = BOUND.tightened(obs)
    for o in obs:
        need = BOUND.required_rate(o)
        if math.isinf(need):
            continue
        assert tight.letter_tokens_per_byte >= need
        # Equivalently: the tightened bound would have covered every observed request.
        assert tight.prompt_tokens(o.text, o.messages, o.tools) >= o.prompt_tokens


@given(st.lists(observations, max_size=15))
def test_few_observations_keep_the_byte_bound(obs: list[SizedPrompt]) -> None:
    assert BOUND.tightened(obs).letter_tokens_per_byte >= 1.0


def test_tightening_with_enough_english_samples() -> None:
    english = [SizedPrompt(prompt_tokens=64 + 16 + 250, text=TextStats(1000, 0), messages=1)
               for _ in range(16)]
    tight = BOUND.tightened(english)
    assert tight.letter_tokens_per_byte == pytest.approx(0.25 * 1.1)
    assert tight.per_message_tokens == BOUND.per_message_tokens
    # One short sample short of the threshold: stay at one token per byte.
    assert BOUND.tightened(english[:15]).letter_tokens_per_byte == 1.0


@pytest.mark.parametrize("kwargs", [{"letter_tokens_per_byte": -1.0}, {"safety_factor": 0.9},
                                    {"base_tokens": -1}, {"letter_tokens_per_byte": math.nan}])
def test_invalid_bounds_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        TokenBound(**kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Matching the request log


T0 = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)


def entry(ts: datetime, tokens: int | None, *, path: str = "/v1/chat/completions",
          status: int = 200, stream: bool = False, duration_ms: float = 500.0) -> RequestEntry:
    return RequestEntry(ts=ts.isoformat().replace("+00:00", "Z"), method="POST", path=path,
                        status=status, duration_ms=duration_ms, ttft_ms=None,
                        prompt_tokens=tokens, completion_tokens=1, stream=stream, error=None)


def record(at: datetime, *, path: str = "/v1/chat/completions",
           stream: bool = False) -> ForwardRecord:
    return ForwardRecord(path=path, stream=stream, finished_at=at, text=TextStats(900, 100),
                         messages=2)


def test_unambiguous_pairs_are_matched() -> None:
    records = [record(T0), record(T0 + timedelta(seconds=10), stream=True)]
    entries = [entry(T0, 300), entry(T0 + timedelta(seconds=10), 200, stream=True)]
    pairs = match_observations(records, entries)
    assert [(i, o.prompt_tokens) for i, o in pairs] == [(0, 300), (1, 200)]
    assert pairs[0][1].text == TextStats(900, 100) and pairs[0][1].messages == 2


def test_ambiguous_failed_and_foreign_entries_are_dropped() -> None:
    # Two requests finishing together: either could be either; neither is learned from.
    assert match_observations([record(T0), record(T0 + timedelta(milliseconds=200))],
                              [entry(T0, 300), entry(T0, 10)]) == []
    assert match_observations([record(T0)], [entry(T0, 300, status=400)]) == []
    assert match_observations([record(T0)], [entry(T0, 0)]) == []  # mid-stream disconnect
    assert match_observations([record(T0)], [entry(T0, None)]) == []
    assert match_observations([record(T0)], [entry(T0, 300, path="/v1/messages")]) == []
    assert match_observations([record(T0)], [entry(T0 + timedelta(seconds=5), 300)]) == []
    bad_ts = RequestEntry(ts="yesterday", method="POST", path="/v1/chat/completions",
                          status=200, duration_ms=1.0, ttft_ms=None, prompt_tokens=5,
                          completion_tokens=1, stream=False, error=None)
    assert match_observations([record(T0)], [bad_ts]) == []
