"""Tokenizer files: the reference engine's counts exactly; a bad file is named in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.reference import tokenizer as reference
from ladder.tokenizer_file import load_tokenizer, write_reference_tokenizer


def test_reference_tokenizer_file(tmp_path: Path) -> None:
    path = tmp_path / "tok.json"
    write_reference_tokenizer(path, 4096)
    count = load_tokenizer(path)
    assert count("hello, world") == reference.count("hello, world") == 3


def test_tokenizer_file_errors_are_clear(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read tokenizer file"):
        load_tokenizer(garbage)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"kind": "something-else"}))
    with pytest.raises(ValueError, match="not a tokenizer file"):
        load_tokenizer(other)
    bad_vocab = tmp_path / "bad.json"
    bad_vocab.write_text(json.dumps({"kind": "moe-ladder-reference", "vocab_size": 0}))
    with pytest.raises(ValueError, match="vocab_size"):
        load_tokenizer(bad_vocab)
    with pytest.raises(ValueError, match="cannot read"):
        load_tokenizer(tmp_path / "missing.json")


def test_hf_tokenizer_file_needs_the_tokenizers_package(tmp_path: Path) -> None:
    hf = tmp_path / "tokenizer.json"
    hf.write_text(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {},
                                                          "merges": []}}))
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="tokenizers"):
            load_tokenizer(hf)
    else:
        pytest.skip("the tokenizers package is installed")
