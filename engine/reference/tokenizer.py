"""A tiny built-in tokenizer for the reference engine: stable, dependency-free, countable.

The reference engine needs token ids to size prompts against the KV budget and to feed its toy
model; it does not need a learned vocabulary. Words and punctuation are split by a regex and
each piece is hashed (blake2b, so ids are stable across processes and Python versions, unlike
`hash()`) into `vocab_size` ids; a few specials sit just above them.

Generated ids decode to `w<id>` words, like ft serve's tiny test checkpoint ("w123 w7 ..."), and
`encode` maps a `w<id>` word back to `<id>`, so `encode(decode(ids)) == ids` for any ids below
`vocab_size`: outputs can be fed back as the next turn's prompt and compared id for id. Other
text is one-way (hash collisions are expected and harmless for sizing).
`count(text) == len(encode(text))` always: admission control and the engine agree on lengths.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["DEFAULT_VOCAB_SIZE", "SPECIAL_TOKENS", "Tokenizer", "count", "decode", "encode"]

DEFAULT_VOCAB_SIZE = 4096
# Offsets above vocab_size; order is part of the id contract.
SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<bos>", "<eos>", "<unk>")

# A word (letters, digits, underscore; any script) or one non-space, non-word character.
_PIECE = re.compile(r"\w+|[^\w\s]", re.UNICODE)
# ASCII digits only: `\d` would accept other scripts' digits that int() reads differently.
_GENERATED = re.compile(r"w([0-9]+)")


@dataclass(frozen=True)
class Tokenizer:
    """Regex pieces hashed into `vocab_size` ids; specials at `vocab_size + i`."""

    vocab_size: int = DEFAULT_VOCAB_SIZE

    def __post_init__(self) -> None:
        if self.vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {self.vocab_size}")

    @property
    def total_size(self) -> int:
        """Ids a model's embedding must cover: pieces plus specials."""
        return self.vocab_size + len(SPECIAL_TOKENS)

    @property
    def pad_id(self) -> int:
        return self.vocab_size

    @property
    def bos_id(self) -> int:
        return self.vocab_size + 1

    @property
    def eos_id(self) -> int:
        return self.vocab_size + 2

    @property
    def unk_id(self) -> int:
        return self.vocab_size + 3

    def is_special(self, token_id: int) -> bool:
        return self.vocab_size <= token_id < self.total_size

    def piece_id(self, piece: str) -> int:
        """The id of one regex piece: `w<n>` with n < vocab_size is n, anything else a hash."""
        match = _GENERATED.fullmatch(piece)
        if match is not None:
            # Leading zeros would make "w07" and "w7" one id yet decode differently: only the
            # canonical spelling round-trips, the rest is hashed like any word.
            digits = match.group(1)
            if digits == str(int(digits)) and int(digits) < self.vocab_size:
                return int(digits)
        digest = hashlib.blake2b(piece.encode("utf-8"), digest_size=8).digest()
        return int.from_bytes(digest, "little") % self.vocab_size

    def pieces(self, text: str) -> list[str]:
        return _PIECE.findall(text)

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        ids = [self.piece_id(p) for p in self.pieces(text)]
        return [self.bos_id, *ids] if add_bos else ids

    def count(self, text: str, *, add_bos: bool = False) -> int:
        """Tokens `encode(text)` yields, without building the list's ids."""
        return len(self.pieces(text)) + (1 if add_bos else 0)

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        """Space-joined `w<id>` words; specials dropped (or named), unknown ids as `<unk>`."""
        words: list[str] = []
        for token_id in ids:
            if 0 <= token_id < self.vocab_size:
                words.append(f"w{token_id}")
            elif self.is_special(token_id):
                if not skip_special:
                    words.append(SPECIAL_TOKENS[token_id - self.vocab_size])
            else:
                words.append(SPECIAL_TOKENS[3])
        return " ".join(words)


_DEFAULT = Tokenizer()


def encode(text: str, *, add_bos: bool = False) -> list[int]:
    """`Tokenizer().encode` with the default vocabulary."""
    return _DEFAULT.encode(text, add_bos=add_bos)


def decode(ids: Iterable[int], *, skip_special: bool = True) -> str:
    """`Tokenizer().decode` with the default vocabulary."""
    return _DEFAULT.decode(ids, skip_special=skip_special)


def count(text: str, *, add_bos: bool = False) -> int:
    """`Tokenizer().count` with the default vocabulary."""
    return _DEFAULT.count(text, add_bos=add_bos)
