"""Request sizing: every route's text is found, and the size never under-counts."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.reference import tokenizer as reference
from ladder.sizing import DEFAULT_MAX_TOKENS, RequestSize, SizingError, size_request
from ladder.token_bound import TextStats, TokenBound

BOUND = TokenBound()
NO_OVERHEAD = TokenBound(per_message_tokens=0, base_tokens=0, tools_tokens=0)


def size(path: str, body: dict[str, Any], *, bound: TokenBound = BOUND,
         default_max_tokens: int = DEFAULT_MAX_TOKENS) -> RequestSize:
    return size_request(path, body, tokenizer=None, bound=bound,
                        default_max_tokens=default_max_tokens)


# ---------------------------------------------------------------------------------------------
# Routes


def test_chat_counts_bytes_plus_template_overhead() -> None:
    result = size("/v1/chat/completions", {
        "messages": [{"role": "system", "content": "be brief"},
                     {"role": "user", "content": "héllo"}],
        "max_tokens": 100,
    })
    assert result.text == TextStats(letter_bytes=len("bebrief ") + 4, other_bytes=2)
    assert result.prompt_tokens == 8 + 6 + 64 + 2 * 16
    assert result.max_tokens == 100 and result.max_tokens_given and not result.exact
    assert result.total_tokens == result.prompt_tokens + 100


def test_chat_finds_parts_tool_calls_and_tools() -> None:
    body = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "alpha"},
                                         {"type": "image_url", "image_url": {"url": "u://x"}}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "lookup", "arguments": "{\"q\": \"beta\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "gamma"},
        ],
        "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {
            "type": "object", "properties": {"q": {"type": "string", "description": "delta"}}}}}],
        "max_completion_tokens": 7,
    }
    result = size("/v1/chat/completions", body, bound=NO_OVERHEAD)
    seen = json.dumps(body)
    for word in ("alpha", "u://x", "lookup", "beta", "gamma", "delta"):
        assert word in seen
    # Every word is counted: bytes of the extracted text cover each of them.
    assert result.text.total_bytes >= sum(len(w) for w in ("alpha", "lookup", "beta", "gamma",
                                                           "delta"))
    assert result.tools == 1 and result.messages == 3 and result.max_tokens == 7
    tooled = size("/v1/chat/completions", body)
    assert tooled.prompt_tokens - result.prompt_tokens == 64 + 16 * 3 + 256 + 16


def test_anthropic_messages_system_blocks_and_tool_use() -> None:
    body = {
        "system": [{"type": "text", "text": "you are terse"}],
        "messages": [
            {"role": "user", "content": "what is the weather"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [
                    {"type": "text", "text": "sunny"}]}]},
        ],
        "max_tokens": 300,
    }
    result = size("/v1/messages", body, bound=NO_OVERHEAD)
    assert result.messages == 4  # system + three turns
    assert result.max_tokens == 300
    expected = sum(len(w) for w in ("you are terse", "what is the weather", "weather",
                                     "Paris", "city", "sunny"))
    assert result.prompt_tokens >= expected


def test_responses_input_and_max_output_tokens() -> None:
    as_text = size("/v1/responses", {"input": "hello there", "instructions": "shout",
                                     "max_output_tokens": 50}, bound=NO_OVERHEAD)
    assert as_text.prompt_tokens == len("hello there") + len("shout")
    assert as_text.max_tokens == 50 and as_text.messages == 2
    as_items = size("/v1/responses", {"input": [
        {"role": "user", "content": [{"type": "input_text", "text": "abc"}]},
        {"type": "function_call_output", "call_id": "x", "output": "defg"}]}, bound=NO_OVERHEAD)
    assert as_items.prompt_tokens >= len("abc") + len("defg")
    assert not as_items.max_tokens_given and as_items.max_tokens == DEFAULT_MAX_TOKENS


def test_completions_batch_sizes_the_largest_sequence_and_token_ids_exactly() -> None:
    result = size("/v1/completions", {"prompt": ["short", "a much longer prompt", [1, 2, 3]],
                                      "max_tokens": 5}, bound=NO_OVERHEAD)
    assert result.prompt_tokens == len("a much longer prompt")
    ids = size("/v1/completions", {"prompt": list(range(40)), "max_tokens": 5},
               bound=NO_OVERHEAD)
    assert ids.prompt_tokens == 40


def test_generate_reads_sglang_and_reference_shapes() -> None:
    sglang = size("/generate", {"text": "abcd", "sampling_params": {"max_new_tokens": 9}},
                  bound=NO_OVERHEAD)
    assert (sglang.prompt_tokens, sglang.max_tokens) == (4, 9)
    ids = size("/generate", {"input_ids": [5, 6, 7]}, bound=NO_OVERHEAD, default_max_tokens=11)
    assert (ids.prompt_tokens, ids.max_tokens) == (3, 11)
    ref = size("/generate", {"prompt": "xyz", "max_tokens": 2}, bound=NO_OVERHEAD)
    assert (ref.prompt_tokens, ref.max_tokens) == (3, 2)


def test_absent_max_tokens_uses_the_configured_default() -> None:
    result = size("/v1/chat/completions", {"messages": []}, default_max_tokens=1234)
    assert result.max_tokens == 1234 and not result.max_tokens_given


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": "not a list"}),
    ("/v1/chat/completions", {"messages": [], "max_tokens": "many"}),
    ("/v1/chat/completions", {"messages": [], "max_tokens": -1}),
    ("/v1/chat/completions", {"messages": [], "max_tokens": 1.5}),
    ("/v1/chat/completions", {"messages": [], "max_tokens": True}),
    ("/v1/completions", {"prompt": {"a": 1}}),
    ("/v1/completions", {"prompt": [{"a": 1}]}),
    ("/v1/embeddings", {"input": "x"}),
])
def test_unsizable_bodies_raise_sizing_error(path: str, body: dict[str, object]) -> None:
    with pytest.raises(SizingError):
        size(path, body)


def test_exact_mode_matches_the_reference_engine() -> None:
    messages = [{"role": "user", "content": "The quick brown fox, 42 times!"},
                {"role": "assistant", "content": "w12 w7 w3"}]
    result = size_request("/v1/chat/completions", {"messages": messages, "max_tokens": 3},
                          tokenizer=reference.count, bound=NO_OVERHEAD)
    # The reference engine joins message contents with newlines and counts pieces.
    engine_count = reference.count("\n".join(m["content"] for m in messages))
    assert result.exact and result.prompt_tokens == engine_count


# ---------------------------------------------------------------------------------------------
# Never under-counts


@given(st.lists(st.text(), max_size=6), st.integers(min_value=1, max_value=10_000))
def test_chat_size_never_under_counts_the_reference_engine(
        contents: list[str], max_tokens: int) -> None:
    body = {"messages": [{"role": "user", "content": c} for c in contents],
            "max_tokens": max_tokens}
    result = size("/v1/chat/completions", body, bound=NO_OVERHEAD)
    assert result.prompt_tokens >= reference.count("\n".join(contents))
    assert result.max_tokens == max_tokens
