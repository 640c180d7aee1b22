"""Human sizes in, integers out: token counts with `k`/`m` as `ft ctl` reads them, byte sizes.

Sizes are accepted in human form only at the edges (flags, TOML) and stored as integers.
"""

from __future__ import annotations

import re

__all__ = ["format_bytes", "format_count", "parse_bytes", "parse_count", "parse_target"]

_COUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")
# Longest suffix first, so "GiB" is not read as "G" + "iB".
_BYTE_SUFFIXES = (
    ("kib", 1024), ("mib", 1024**2), ("gib", 1024**3), ("tib", 1024**4),
    ("kb", 1000), ("mb", 1000**2), ("gb", 1000**3), ("tb", 1000**4),
    ("k", 1024), ("m", 1024**2), ("g", 1024**3), ("t", 1024**4), ("b", 1),
)


def parse_count(text: str) -> int:
    """`65536`, `64k` (x1024), `1m` (x1024**2) -> int, as `ft ctl cache` parses counts."""
    match = _COUNT.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a count (examples: 8192, 64k, 1m)")
    number, suffix = match.groups()
    scale = {"": 1, "k": 1024, "m": 1024**2}[suffix.lower()]
    value = float(number) * scale
    if not value.is_integer():
        raise ValueError(f"{text!r} is not a whole number")
    return int(value)


def format_count(value: int) -> str:
    """The inverse of `parse_count` where it is exact: 4096 -> `4k`, 32768 -> `32k`, 1000 ->
    `1000` (help texts show defaults the way users type them)."""
    for suffix, scale in (("m", 1024**2), ("k", 1024)):
        if value and value % scale == 0:
            return f"{value // scale}{suffix}"
    return str(value)


def parse_bytes(text: str) -> int:
    """`1073741824`, `512MiB`, `1.5GiB`, `24GB` -> bytes (binary for bare k/m/g)."""
    raw = text.strip().lower().replace(" ", "")
    number, scale = raw, 1
    for suffix, suffix_scale in _BYTE_SUFFIXES:
        if raw.endswith(suffix):
            number, scale = raw[: -len(suffix)], suffix_scale
            break
    try:
        value = float(number) * scale
    except ValueError:
        raise ValueError(f"{text!r} is not a byte size (examples: 512MiB, 1.5GiB)") from None
    if value < 0 or value != value or value == float("inf"):
        raise ValueError(f"{text!r} is not a byte size (examples: 512MiB, 1.5GiB)")
    return int(value)


def format_bytes(nbytes: int) -> str:
    """GiB from 1 GiB up, else MiB with one decimal, as `ft ctl cache` prints sizes."""
    if abs(nbytes) >= 1024**3:
        return f"{nbytes / 1024**3:.1f} GiB"
    return f"{nbytes / 1024**2:.1f} MiB"


_TARGET_KEYS = {"moe": "moe", "kv": "kv", "mamba": "mamba", "kv_pages": "kv_pages"}


def parse_target(text: str) -> dict[str, int]:
    """`moe=1024,kv=64k[,mamba=4]` -> {"moe": 1024, "kv": 65536, "mamba": 4}.

    `kv` is in tokens; `kv_pages=N` gives KV in pages instead. Omitted pools keep their size.
    """
    target: dict[str, int] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in _TARGET_KEYS:
            raise ValueError(
                f"{part.strip()!r} in --to is not pool=size (pools: moe, kv, kv_pages, mamba)")
        if key in target:
            raise ValueError(f"--to names {key} twice")
        try:
            target[key] = parse_count(value)
        except ValueError as exc:
            raise ValueError(f"--to {key}: {exc}") from None
    if "kv" in target and "kv_pages" in target:
        raise ValueError("--to takes kv (tokens) or kv_pages, not both")
    return target
