"""ladder/units.py: counts and bytes as `ft ctl` users type them, both ways."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ladder.units import format_count, parse_bytes, parse_count


def test_counts_parse_with_binary_suffixes() -> None:
    assert parse_count("65536") == parse_count("64k") == 65_536
    assert parse_count("1m") == 1 << 20
    assert parse_count("1.5k") == 1536
    with pytest.raises(ValueError, match="not a count"):
        parse_count("64 tokens")
    with pytest.raises(ValueError, match="whole number"):
        parse_count("1.0001k")
    assert parse_bytes("512MiB") == 512 << 20


def test_format_count_uses_the_largest_exact_suffix() -> None:
    assert format_count(4096) == "4k"
    assert format_count(32_768) == "32k"
    assert format_count(1 << 20) == "1m"
    assert format_count(1000) == "1000"
    assert format_count(0) == "0"


@given(st.integers(0, 1 << 40))
def test_format_count_round_trips(value: int) -> None:
    assert parse_count(format_count(value)) == value
