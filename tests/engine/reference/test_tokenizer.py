"""The built-in tokenizer: stable ids, consistent counts, `w<id>` round trips."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.reference import tokenizer as tok_module
from engine.reference.tokenizer import DEFAULT_VOCAB_SIZE, SPECIAL_TOKENS, Tokenizer

TOK = Tokenizer()


def test_splits_words_and_punctuation() -> None:
    assert TOK.pieces("Hello, world! It's 42.") == [
        "Hello", ",", "world", "!", "It", "'", "s", "42", ".",
    ]
    assert TOK.count("Hello, world!") == 4


def _blake2b_id(piece: str, vocab_size: int = DEFAULT_VOCAB_SIZE) -> int:
    digest = hashlib.blake2b(piece.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % vocab_size


def test_ids_are_stable_across_processes() -> None:
    # blake2b, not hash(): PYTHONHASHSEED would change a salted hash's ids between processes.
    assert TOK.encode("hello world") == [_blake2b_id("hello"), _blake2b_id("world")]
    assert TOK.encode("hello world") == Tokenizer().encode("hello world")


def test_generated_words_round_trip() -> None:
    ids = [0, 123, 7, DEFAULT_VOCAB_SIZE - 1]
    text = TOK.decode(ids)
    assert text == f"w0 w123 w7 w{DEFAULT_VOCAB_SIZE - 1}"
    assert TOK.encode(text) == ids


def test_non_canonical_generated_words_are_hashed() -> None:
    assert TOK.piece_id("w7") == 7
    assert TOK.piece_id("w07") == _blake2b_id("w07")
    assert TOK.piece_id(f"w{DEFAULT_VOCAB_SIZE}") == _blake2b_id(f"w{DEFAULT_VOCAB_SIZE}")


def test_specials() -> None:
    assert TOK.total_size == DEFAULT_VOCAB_SIZE + len(SPECIAL_TOKENS)
    assert [TOK.pad_id, TOK.bos_id, TOK.eos_id, TOK.unk_id] == list(
        range(DEFAULT_VOCAB_SIZE, DEFAULT_VOCAB_SIZE + 4)
    )
    assert TOK.decode([5, TOK.eos_id]) == "w5"
    assert TOK.decode([5, TOK.eos_id], skip_special=False) == "w5 <eos>"
    assert TOK.decode([-1, 10**9]) == "<unk> <unk>"
    assert TOK.encode("a b", add_bos=True)[0] == TOK.bos_id
    assert TOK.count("a b", add_bos=True) == 3


def test_empty_text() -> None:
    assert TOK.encode("") == []
    assert TOK.count("   \n\t ") == 0
    assert TOK.decode([]) == ""


def test_invalid_vocab_size() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        Tokenizer(vocab_size=0)


def test_module_functions_use_the_default_vocab() -> None:
    assert tok_module.encode("w5 hi") == TOK.encode("w5 hi")
    assert tok_module.decode([5]) == "w5"
    assert tok_module.count("w5 hi") == 2


@given(text=st.text(max_size=200), vocab_size=st.integers(1, 10_000))
def test_count_equals_len_encode_and_ids_in_range(text: str, vocab_size: int) -> None:
    tok = Tokenizer(vocab_size)
    ids = tok.encode(text)
    assert tok.count(text) == len(ids)
    assert all(0 <= i < vocab_size for i in ids)
    assert tok.encode(text) == ids


@given(ids=st.lists(st.integers(0, DEFAULT_VOCAB_SIZE - 1), max_size=100))
def test_decode_then_encode_is_identity_on_piece_ids(ids: list[int]) -> None:
    assert TOK.encode(TOK.decode(ids)) == ids
