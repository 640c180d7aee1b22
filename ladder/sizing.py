"""How many tokens a generation request needs, without under-counting: the admission gate's core.

Why it exists: a KV shrink lowers ft serve's `max_seq_len`, and the server then refuses a prompt
that no longer fits (`context_length_exceeded`) and, worse, silently clips `max_tokens` to
`max_seq_len - input_len` (ftserve-control-plane.md §1.6). The gate (`ladder.gate`) must step the
ladder up *before* forwarding such a request, so it needs the request's size first. A size that
is too small is the one mistake that matters (the request is truncated); a size that is too
large only costs a step up that was not needed. Everything here therefore rounds up.

Two ways to count the prompt:

* exact: a tokenizer file names the served tokenizer (`load_tokenizer`); the extracted text is
  counted with it. The server's chat template still adds tokens the gate cannot render, so the
  template overhead of `TokenBound` is added in this mode too (set it to 0 for a server that
  adds none, like the reference engine).
* bound: no tokenizer. Every BPE token (byte-level or with byte fallback) covers at least one
  UTF-8 byte, so `bytes` never under-counts the text. `TokenBound.tightened` lowers the rate for
  ASCII letters and spaces only, from what the server's request log reports for requests the
  gate forwarded; digits, punctuation, control and non-ASCII bytes always count one token each,
  because tokenizers differ most there (Qwen splits every digit; rare scripts fall back to bytes).

`max_tokens` absent: the server may then generate up to the whole context, and sizing every
such request to the model context would pin the ladder at its top rung. It is sized as
`default_max_tokens` (4096 unless configured) instead; a generation that runs longer than that
may still hit the live rung's limit. Clients that care should send `max_tokens`.

Pure: no I/O, no clock, no logging. `load_tokenizer` reads one small file and is the exception.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

from engine.ftserve.wire import RequestEntry

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "GENERATION_PATHS",
    "ForwardRecord",
    "RequestSize",
    "SizedPrompt",
    "SizingError",
    "TextStats",
    "TokenBound",
    "load_tokenizer",
    "match_observations",
    "size_request",
    "text_stats",
]

DEFAULT_MAX_TOKENS: Final = 4096
GENERATION_PATHS: Final = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses", "/generate"}
)
REFERENCE_TOKENIZER_KIND: Final = "moe-ladder-reference"

# Bytes the tightened rate applies to: ASCII letters and the space, which BPE merges into words
# (" hello" is one token). Everything else stays at one token per byte.
_LETTER_BYTES: Final = frozenset(
    b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ "
)
_LETTER_TABLE: Final = bytes(1 if b in _LETTER_BYTES else 0 for b in range(256))


class SizingError(ValueError):
    """A request body the gate cannot size (not an object, wrong field types)."""


# ---------------------------------------------------------------------------------------------
# The bound


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
# Request sizing


@dataclass(frozen=True, slots=True)
class RequestSize:
    """Tokens one request may occupy in one sequence's context: prompt plus generation.

    `exact` is true when the prompt text was counted by the served tokenizer. `text` and
    `messages` are what the bound was computed from; the gate records them for tightening.
    `max_tokens_given` is false when `max_tokens` came from the configured default.
    """

    prompt_tokens: int
    max_tokens: int
    exact: bool
    text: TextStats = TextStats(0, 0)
    messages: int = 0
    tools: int = 0
    max_tokens_given: bool = True

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.max_tokens


def _compact(value: Any) -> str:
    # Structured parts (tool calls, tool inputs, tool definitions) reach the model as JSON.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def _texts(value: Any) -> Iterator[str]:
    """Every piece of text a template may render from a message, part or item."""
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, int | float):
        yield str(value)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _texts(item)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            # Roles and part types are what the per-message overhead pays for.
            if key in ("role", "type") and isinstance(item, str):
                continue
            if key == "content" or isinstance(item, str | list | tuple):
                yield from _texts(item)
            elif isinstance(item, Mapping):
                yield _compact(item)
            else:
                yield from _texts(item)
    else:
        yield str(value)


@dataclass(slots=True)
class _Prompt:
    texts: list[str]
    messages: int = 0
    tools: int = 0
    token_ids: int = 0  # prompts given as token ids are counted exactly

    def add(self, value: Any) -> None:
        self.texts.extend(_texts(value))


def _get_list(body: Mapping[str, Any], key: str) -> list[Any] | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, list):
        raise SizingError(f"{key}: expected a list, got {type(value).__name__}")
    return value


def _add_tools(prompt: _Prompt, body: Mapping[str, Any]) -> None:
    for key in ("tools", "functions"):
        tools = _get_list(body, key)
        if tools:
            prompt.tools += len(tools)
            prompt.texts.extend(_compact(tool) for tool in tools)


def _add_messages(prompt: _Prompt, body: Mapping[str, Any], key: str) -> None:
    messages = _get_list(body, key)
    for message in messages or ():
        prompt.messages += 1
        prompt.add(message)


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    )


def _completion_prompts(value: Any) -> list[_Prompt]:
    """`prompt` is a string, token ids, or a batch of either; each is its own sequence."""
    if value is None:
        return [_Prompt([])]
    if isinstance(value, str):
        return [_Prompt([value], messages=1)]
    if _is_token_ids(value):
        return [_Prompt([], messages=1, token_ids=len(value))]
    if isinstance(value, list) and value:
        prompts: list[_Prompt] = []
        for item in value:
            if not isinstance(item, str) and not _is_token_ids(item):
                raise SizingError("prompt: expected a string, token ids, or a list of them")
            prompts.extend(_completion_prompts(item))
        return prompts
    raise SizingError(f"prompt: expected a string or a list, got {type(value).__name__}")


def _prompts_of(path: str, body: Mapping[str, Any]) -> list[_Prompt]:
    if path == "/v1/chat/completions":
        prompt = _Prompt([])
        _add_messages(prompt, body, "messages")
        _add_tools(prompt, body)
        return [prompt]
    if path == "/v1/messages":
        prompt = _Prompt([])
        if body.get("system") is not None:
            prompt.messages += 1
            prompt.add(body["system"])
        _add_messages(prompt, body, "messages")
        _add_tools(prompt, body)
        return [prompt]
    if path == "/v1/responses":
        prompt = _Prompt([])
        if body.get("instructions") is not None:
            prompt.messages += 1
            prompt.add(body["instructions"])
        items = body.get("input")
        if isinstance(items, list):
            for item in items:
                prompt.messages += 1
                prompt.add(item)
        elif items is not None:
            prompt.messages += 1
            prompt.add(items)
        _add_tools(prompt, body)
        return [prompt]
    if path == "/v1/completions":
        prompts = _completion_prompts(body.get("prompt"))
        if isinstance(body.get("suffix"), str):
            for prompt in prompts:
                prompt.texts.append(body["suffix"])
        return prompts
    if path == "/generate":
        # SGLang-style `text`/`input_ids`, or the reference engine's `prompt`/`messages`.
        if "messages" in body:
            prompt = _Prompt([])
            _add_messages(prompt, body, "messages")
            return [prompt]
        for key in ("input_ids", "text", "prompt"):
            if body.get(key) is not None:
                return _completion_prompts(body[key])
        return [_Prompt([])]
    raise SizingError(f"{path}: not a generation route")


def _as_max_tokens(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SizingError(f"{field}: expected an integer, got {type(value).__name__}")
    if isinstance(value, float) and (not math.isfinite(value) or not value.is_integer()):
        raise SizingError(f"{field}: expected an integer, got {value!r}")
    if value < 0:
        raise SizingError(f"{field}: must be >= 0, got {value}")
    return int(value)


def _max_tokens_of(body: Mapping[str, Any]) -> tuple[str, Any] | None:
    for key in ("max_completion_tokens", "max_tokens", "max_output_tokens", "max_new_tokens"):
        if body.get(key) is not None:
            return key, body[key]
    params = body.get("sampling_params")
    if isinstance(params, Mapping) and params.get("max_new_tokens") is not None:
        return "sampling_params.max_new_tokens", params["max_new_tokens"]
    return None


def size_request(
    path: str,
    body: Mapping[str, Any],
    *,
    tokenizer: Callable[[str], int] | None,
    bound: TokenBound,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
) -> RequestSize:
    """Size one request to a generation route; raises `SizingError` for a body it cannot read.

    For a batch (`/v1/completions` with a list of prompts) the largest sequence is returned:
    the server admits each sequence against `max_seq_len` on its own.
    """
    if not isinstance(body, Mapping):
        raise SizingError(f"the body must be a JSON object, got {type(body).__name__}")
    found = _max_tokens_of(body)
    max_tokens = default_max_tokens if found is None else _as_max_tokens(found[1], found[0])
    best: RequestSize | None = None
    for prompt in _prompts_of(path, body):
        stats = TextStats(0, 0)
        for text in prompt.texts:
            stats = stats + text_stats(text)
        overhead = bound.overhead_tokens(prompt.messages, prompt.tools)
        if tokenizer is not None:
            text_tokens = sum(tokenizer(text) for text in prompt.texts)
        else:
            text_tokens = bound.text_tokens(stats)
        size = RequestSize(
            prompt_tokens=text_tokens + overhead + prompt.token_ids,
            max_tokens=max_tokens,
            exact=tokenizer is not None,
            text=stats,
            messages=prompt.messages,
            tools=prompt.tools,
            max_tokens_given=found is not None,
        )
        if best is None or size.total_tokens > best.total_tokens:
            best = size
    assert best is not None  # every route yields at least one prompt
    return best


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


# ---------------------------------------------------------------------------------------------
# Tokenizer files


def load_tokenizer(path: str | Path) -> Callable[[str], int]:
    """A token counter from a tokenizer file; raises `ValueError` naming what is wrong.

    Two formats: `{"kind": "moe-ladder-reference", "vocab_size": 4096}` is the reference
    engine's tokenizer (`engine.reference.tokenizer`); a HuggingFace `tokenizer.json` needs the
    `tokenizers` package. Special tokens are not added: the template overhead covers them.
    """
    file = Path(path)
    try:
        raw = file.read_text(encoding="utf-8")
        doc = json.loads(raw)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{file}: cannot read tokenizer file: {exc}") from exc
    if isinstance(doc, Mapping) and doc.get("kind") == REFERENCE_TOKENIZER_KIND:
        from engine.reference.tokenizer import (  # lazy: the engine is optional
            DEFAULT_VOCAB_SIZE,
            Tokenizer,
        )

        vocab = doc.get("vocab_size", DEFAULT_VOCAB_SIZE)
        if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
            raise ValueError(f"{file}: vocab_size must be a positive integer, got {vocab!r}")
        reference = Tokenizer(vocab_size=vocab)
        return lambda text: reference.count(text)
    if isinstance(doc, Mapping) and "model" in doc:
        try:
            from tokenizers import Tokenizer as HfTokenizer  # type: ignore[import-not-found]
        except ImportError as exc:
            raise ValueError(
                f"{file}: a HuggingFace tokenizer.json needs the `tokenizers` package "
                "(pip install tokenizers)"
            ) from exc
        hf = HfTokenizer.from_str(raw)
        return lambda text: len(hf.encode(text, add_special_tokens=False).ids)
    raise ValueError(
        f"{file}: not a tokenizer file (expected kind {REFERENCE_TOKENIZER_KIND!r} or a "
        "HuggingFace tokenizer.json)"
    )
