"""The byte bound on prompt tokens, and how the server's request log tightens it.

Why: without the served tokenizer the gate still has to size a prompt (`ladder.sizing`), and a
size that is too small is the one mistake that matters (ft serve clips `max_tokens` of a
request that no longer fits). Every BPE token (byte-level or with byte fallback) covers at
least one UTF-8 byte, so `bytes` never under-counts the text. `TokenBound.tightened` lowers the
rate for ASCII letters and spaces only, from what the server's request log reports for
requests the gate forwarded (`match_observations` pairs the two); digits, punctuation, control
and non-ASCII bytes always count one token each, because tokenizers differ most there (Qwen
splits every digit; rare scripts fall back to bytes).

Pure: no I/O, no clock, no logging.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Final

from engine.ftserve.wire import RequestEntry

__all__ = ["ForwardRecord", "SizedPrompt", "TextStats", "TokenBound", "match_observations",
           "text_stats"]

# Bytes the tightened rate applies to: ASCII letters and the space, which BPE merges into words
# (" hello" is one token). Everything else stays at one token per byte.
_LETTER_BYTES: Final = frozenset(
    b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ "
)
_LETTER_TABLE: Final = bytes(1 if b in _LETTER_BYTES else 0 for b in range(256))


@dataclass(frozen=True, slots=True)
class TextStats:
    """What the bound needs to know about a request's text: its bytes, split by class."""

    letter_bytes: int
    other_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.letter_bytes + self.other_bytes

    def __add__(self, other: TextStats) -> TextStats:
        return TextStats(
            self.letter_bytes + other.letter_bytes, self.other_bytes + other.other_bytes
        )


def text_stats(text: str) -> TextStats:
    """Split `text`'s UTF-8 bytes into tightenable letters/spaces and the rest."""
    data = text.encode("utf-8", errors="surrogatepass")
    # Translate every byte to 1 (letter) or 0 and sum: linear and allocation-light.
    letters = sum(data.translate(_LETTER_TABLE))
    return TextStats(letter_bytes=letters, other_bytes=len(data) - letters)


@dataclass(frozen=True, slots=True)
class SizedPrompt:
    """One forwarded request whose prompt size the server reported in its request log."""

    prompt_tokens: int
    text: TextStats
    messages: int
    tools: int = 0


@dataclass(frozen=True, slots=True)
class TokenBound:
    """An upper bound of prompt tokens from text bytes, plus chat-template overhead.

    `tokens(text) = ceil(letter_tokens_per_byte * letter_bytes + other_bytes)`; the overhead is
    `base_tokens + per_message_tokens * messages`, plus `tools_tokens` once when tools are given
    (templates wrap tool definitions in instructions) and `per_message_tokens` per tool.
    At the default rate 1.0 the text part is the byte count, which no BPE tokenizer exceeds.
    """

    letter_tokens_per_byte: float = 1.0
    per_message_tokens: int = 16
    base_tokens: int = 64
    tools_tokens: int = 256
    safety_factor: float = 1.1
    # Tightening waits for this many observations with at least `min_sample_bytes` letters:
    # a handful of short requests says little about the next long one.
    min_observations: int = 16
    min_sample_bytes: int = 256

    def __post_init__(self) -> None:
        if not math.isfinite(self.letter_tokens_per_byte) or self.letter_tokens_per_byte < 0:
            raise ValueError(
                f"letter_tokens_per_byte must be >= 0, got {self.letter_tokens_per_byte}"
            )
        if not math.isfinite(self.safety_factor) or self.safety_factor < 1.0:
            raise ValueError(f"safety_factor must be >= 1, got {self.safety_factor}")
        for name in ("per_message_tokens", "base_tokens", "tools_tokens", "min_observations",
                     "min_sample_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    def text_tokens(self, stats: TextStats) -> int:
        return math.ceil(self.letter_tokens_per_byte * stats.letter_bytes) + stats.other_bytes

    def overhead_tokens(self, messages: int, tools: int = 0) -> int:
        tool_part = self.tools_tokens + self.per_message_tokens * tools if tools else 0
        return self.base_tokens + self.per_message_tokens * messages + tool_part

    def prompt_tokens(self, stats: TextStats, messages: int, tools: int = 0) -> int:
        return self.text_tokens(stats) + self.overhead_tokens(messages, tools)

    def required_rate(self, obs: SizedPrompt) -> float:
        """The least letter rate at which this bound would have covered `obs` exactly."""
        overhead = self.overhead_tokens(obs.messages, obs.tools)
        rest = obs.prompt_tokens - obs.text.other_bytes - overhead
        if rest <= 0:
            return 0.0
        # No letters to spread `rest` over: no rate covers it. Report infinity so tightening
        # keeps the current rate rather than pretending (only a bad match produces this).
        return rest / obs.text.letter_bytes if obs.text.letter_bytes else math.inf

    def tightened(self, observations: Iterable[SizedPrompt]) -> TokenBound:
        """A bound whose letter rate covers every observation, times `safety_factor`.

        Reasoning: the rate must be an upper bound of what the server actually produced, so it
        is the *maximum* required rate over the observations (never an average), times the
        safety factor for traffic not seen yet. Until `min_observations` samples with enough
        letters have been seen the rate stays at least 1.0 token per byte, the provable bound.
        It can rise above 1.0 if an observation demands it (a template larger than the
        configured overhead); that only over-counts. Tightening is statistical, not a proof:
        traffic unlike the recent window (random identifiers, base64 letters) can need more,
        which is why only letters are tightened and why an exact tokenizer file is preferred.
        """
        rates: list[float] = []
        samples = 0
        for obs in observations:
            rate = self.required_rate(obs)
            if math.isinf(rate):
                continue
            rates.append(rate)
            if obs.text.letter_bytes >= self.min_sample_bytes:
                samples += 1
        need = max(rates, default=0.0) * self.safety_factor
        if samples < self.min_observations:
            need = max(need, 1.0)
        return replace(self, letter_tokens_per_byte=need)


# ---------------------------------------------------------------------------------------------
# Matching the server's request log to what the gate forwarded


@dataclass(frozen=True, slots=True)
class ForwardRecord:
    """What the gate measured for one request it forwarded and saw answered 2xx in full."""

    path: str
    stream: bool
    finished_at: datetime  # aware, UTC
    text: TextStats
    messages: int
    tools: int = 0


def _parse_ts(ts: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(ts)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def match_observations(
    records: Sequence[ForwardRecord],
    entries: Sequence[RequestEntry],
    *,
    tolerance_s: float = 1.0,
) -> list[tuple[int, SizedPrompt]]:
    """Pair request-log entries with forwarded records; returns (record index, observation).

    An entry and a record are compatible when path and stream flag agree, the entry succeeded
    with a reported `prompt_tokens > 0` (0 means a mid-stream disconnect) and the record
    finished inside `[ts - tolerance, ts + duration + tolerance]` (the window covers `ts`
    being either the start or the finish). Only one-to-one compatible pairs are kept: under
    concurrency the pairing is ambiguous, and a wrong pair could teach the bound a rate that
    is too low, so ambiguous pairs are dropped rather than guessed.
    """
    tolerance = timedelta(seconds=tolerance_s)
    candidates: list[list[int]] = []
    by_record: dict[int, list[int]] = {}
    for e_index, entry in enumerate(entries):
        ts = _parse_ts(entry.ts)
        ok = (
            ts is not None
            and 200 <= entry.status < 300
            and entry.prompt_tokens is not None
            and entry.prompt_tokens > 0
        )
        matches: list[int] = []
        if ok and ts is not None:
            low = ts - tolerance
            high = ts + timedelta(milliseconds=entry.duration_ms) + tolerance
            for r_index, record in enumerate(records):
                if (record.path == entry.path and record.stream == entry.stream
                        and low <= record.finished_at <= high):
                    matches.append(r_index)
                    by_record.setdefault(r_index, []).append(e_index)
        candidates.append(matches)
    pairs: list[tuple[int, SizedPrompt]] = []
    for e_index, matches in enumerate(candidates):
        if len(matches) != 1 or len(by_record[matches[0]]) != 1:
            continue
        record = records[matches[0]]
        tokens = entries[e_index].prompt_tokens
        assert tokens is not None
        pairs.append((matches[0], SizedPrompt(tokens, record.text, record.messages, record.tools)))
    return pairs
