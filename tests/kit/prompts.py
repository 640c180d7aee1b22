"""Prompts the tests send: words of the reference tokenizer's vocabulary, one token each.

Why deterministic words and not `ladder.demo.random_words`: a test that counts tokens or
compares two runs wants the same prompt for the same arguments, with no generator to thread.
"""

from __future__ import annotations

__all__ = ["words"]


def words(n: int, offset: int = 0) -> str:
    """`n` tokens: `w0 w7 w14 ...` shifted by `offset`, within the 4,000-word vocabulary."""
    return " ".join(f"w{(i * 7 + offset) % 4000}" for i in range(n))
