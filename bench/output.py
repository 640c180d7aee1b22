"""How every benchmark hands over its result: one JSON object, printed and, with `--out`,
written (its folder made), so each script's last lines are not the same five lines again."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["report_json"]


def report_json(doc: Any, out: str | Path | None, *, indent: int = 2,
                emit: Callable[[str], None] | None = print) -> None:
    """`doc` as JSON to `emit` (None: print nothing) and, when `out` is given, to that file."""
    text = json.dumps(doc, indent=indent)
    if emit is not None:
        emit(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")
