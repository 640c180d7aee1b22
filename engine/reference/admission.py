"""Admission as ft serve's scheduler does it: the context a request may use, and FIFO fit.

Pure rules, kept apart from the scheduler so that bench/replay's simulated server admits
requests exactly as the reference engine does (same clip, same refusal text, same FIFO
ceiling during a shrink).
"""

from __future__ import annotations

__all__ = ["AdmissionError", "ceiling", "fits", "fitted_max_tokens", "state_refusal"]


class AdmissionError(Exception):
    """A generation the engine refuses, with ft serve's HTTP status and message."""

    def __init__(self, http_status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.http_status = http_status
        self.message = message
        self.code = code


def fitted_max_tokens(prompt_tokens: int, max_tokens: int, limit: int) -> int:
    """ft serve's admission against the live context (scheduler.py
    `Scheduler._process_one_msg`): a prompt it cannot hold is refused with
    `context_length_exceeded` and ft serve's message (the phrase agents match on), and
    prompt + max_tokens above `limit` is not refused: max_tokens is clipped to what is left.
    The clip is not silent on the wire: the generation ends on its budget and reports
    `finish_reason: "length"` with the tokens it really made in `usage`, streamed too."""
    if prompt_tokens >= limit:
        raise AdmissionError(
            400, f"prompt is too long: {prompt_tokens} tokens > {limit} maximum (prompt + "
                 "generation); shorten the prompt or increase the KV cache budget",
            code="context_length_exceeded")
    return max(1, min(max_tokens, limit - prompt_tokens))


def ceiling(live_units: int, target_units: int | None) -> int:
    """Units admission may fill: during a shrink of the pool, the target's."""
    if target_units is not None and target_units < live_units:
        return target_units
    return live_units


def fits(need_pages: int, used_pages: int, page_ceiling: int, used_slots: int,
         slot_ceiling: int) -> bool:
    """Whether the head of the waiting FIFO is admitted now (it is never overtaken)."""
    return used_pages + need_pages <= page_ceiling and used_slots + 1 <= slot_ceiling


def state_refusal(state: str, mode: str) -> AdmissionError | None:
    """The 503 a new generation gets in `state`; None when it is admitted. An incremental
    engine keeps serving while it rebuilds; ft serve (`mode` "freetoken") does not."""
    if state == "serving" or (state == "rebuilding" and mode == "incremental"):
        return None
    if state == "failed":
        return AdmissionError(503, "server unavailable: maintenance failed (restart required)")
    if state == "loading":
        return AdmissionError(503, "model is still loading")
    return AdmissionError(503, "server unavailable: cache rebuild in progress")
