"""Tokenizer files: the exact prompt counts of the gate's `tokenizer_path`.

Why a file of its own: it is the one part of request sizing that reads a file and may import
an optional package (`tokenizers`) or the reference engine; `ladder.sizing` and
`ladder.token_bound` stay pure.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

__all__ = ["REFERENCE_TOKENIZER_KIND", "load_tokenizer", "write_reference_tokenizer"]

REFERENCE_TOKENIZER_KIND: Final = "moe-ladder-reference"


def write_reference_tokenizer(path: Path, vocab_size: int) -> None:
    """Write the file that names the reference engine's tokenizer (`load_tokenizer` reads it)."""
    path.write_text(json.dumps({"kind": REFERENCE_TOKENIZER_KIND, "vocab_size": vocab_size}))


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
