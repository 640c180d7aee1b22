"""How many tokens a generation request needs, without under-counting: the admission gate's core.

Why it exists: a KV shrink lowers ft serve's `max_seq_len`, and the server then refuses a prompt
that no longer fits (`context_length_exceeded`) and, worse, silently clips `max_tokens` to
`max_seq_len - input_len` (ft serve's scheduler.py `Scheduler._process_one_msg`). The gate
(`ladder.gate`) must step the ladder up *before* forwarding such a request, so it needs the
request's size first. A size that is too small is the one mistake that matters (the request is
truncated); a size that is too large only costs a step up that was not needed. Everything here
therefore rounds up.

This module finds every piece of prompt text in a request body, on every generation route, and
`max_tokens` under each of its names. Two ways to count the text:

* exact: a tokenizer file names the served tokenizer (`ladder.tokenizer_file`); the extracted
  text is counted with it. The server's chat template still adds tokens the gate cannot
  render, so the template overhead of `TokenBound` is added in this mode too (set it to 0 for
  a server that adds none, like the reference engine).
* bound: no tokenizer; `ladder.token_bound` counts at most one token a byte, tightened from the
  server's request log.

`max_tokens` absent: the server may then generate up to the whole context, and sizing every
such request to the model context would pin the ladder at its top rung. It is sized as
`default_max_tokens` (4096 unless configured) instead; a generation that runs longer than that
may still hit the live rung's limit. Clients that care should send `max_tokens`.

Pure: no I/O, no clock, no logging.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from ladder.token_bound import TextStats, TokenBound, text_stats

__all__ = ["DEFAULT_MAX_TOKENS", "GENERATION_PATHS", "RequestSize", "SizingError", "size_request"]

DEFAULT_MAX_TOKENS: Final = 4096
GENERATION_PATHS: Final = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses", "/generate"}
)
_NO_TEXT: Final = TextStats(0, 0)


class SizingError(ValueError):
    """A request body the gate cannot size (not an object, wrong field types)."""


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
    text: TextStats = _NO_TEXT
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
