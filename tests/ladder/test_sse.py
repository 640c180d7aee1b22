"""Counting generated tokens in a stream: text chunks count; the role chunk, the last chunk
with `finish_reason`, the usage chunk and `[DONE]` do not."""

from __future__ import annotations

from typing import Any

import pytest

from engine.reference.runtime import ReferenceEngine
from engine.reference.server import make_app
from ladder.demo import demo_engine_config
from ladder.sse import generated_text
from tests.conftest import FIXTURES


def test_ft_serves_captured_generate_stream_counts_one_per_text_event() -> None:
    lines = (FIXTURES / "freetoken-0.1.2" / "generate.sse.txt").read_bytes().splitlines()
    pieces = [generated_text(line) for line in lines]
    assert sum(1 for p in pieces if p) == 7
    assert "".join(pieces) == "w903 w281 w740 w606 w615 w706 w503"


@pytest.mark.parametrize("line", [b"", b"data: [DONE]", b": keep-alive", b"data: {broken",
                                  b'data: {"choices": []}', b'data: ["x"]',
                                  b'data: {"choices": [{"delta": {"role": "assistant"}}]}',
                                  b'data: {"choices": [{"text": "", "finish_reason": "length"}]}'])
def test_framing_and_garbage_add_no_text(line: bytes) -> None:
    assert generated_text(line) == ""


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", {"prompt": "w1 w2 w3", "max_tokens": 9}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w1 w2"}],
                              "max_tokens": 9}),
])
async def test_a_real_stream_counts_exactly_max_tokens(
        aiohttp_client: Any, path: str, body: dict[str, Any]) -> None:
    client = await aiohttp_client(make_app(ReferenceEngine(demo_engine_config())))
    resp = await client.post(path, json={**body, "stream": True,
                                         "stream_options": {"include_usage": True}})
    lines = (await resp.read()).splitlines()
    assert sum(1 for line in lines if generated_text(line)) == 9
    assert len([line for line in lines if line.startswith(b"data: {")]) > 9  # framing exists
