"""Which events of an OpenAI-style completion stream carry generated text.

A stream opens (chat) with a role-only delta and ends with a chunk that carries
`finish_reason` and no text, then a usage chunk with `"choices": []` when
`stream_options.include_usage` is set, then `data: [DONE]`. Counting every `data:` line as a
token counts those too; the demo and the benches count tokens and time decode with this one
rule instead. Pure: it reads one line.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["generated_text"]


def generated_text(line: bytes) -> str:
    """The text one SSE line adds to the answer ("" for framing, usage and end chunks)."""
    if not line.startswith(b"data: {"):
        return ""
    try:
        event: Any = json.loads(line[len(b"data: "):])
    except (UnicodeDecodeError, json.JSONDecodeError):
        return ""
    if not isinstance(event, dict):
        return ""
    if "choices" not in event:  # ft serve's /generate: {"text": ...} events
        text = event.get("text")
        return text if isinstance(text, str) else ""
    choices = event.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    choice = choices[0]
    delta = choice.get("delta")
    text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
    return text if isinstance(text, str) else ""
