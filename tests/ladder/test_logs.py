"""How often the daemon logs: steady decisions as a heartbeat, repeated warnings backing off,
both counted in the line that is printed; and the controller honouring it on a real engine."""

from __future__ import annotations

import logging
import math
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.reference.runtime import ReferenceEngine
from engine.reference.server import make_app
from ladder.clock import VirtualClock
from ladder.config import merge
from ladder.daemon import build_daemon
from ladder.demo import demo_engine_config
from ladder.logs import LogThrottle


def test_a_warning_backs_off_and_counts_what_it_held_back() -> None:
    throttle = LogThrottle(repeat_s=60.0, first_gap_s=5.0)
    printed = {t: throttle.warning("down", "refused", float(t)) for t in range(200)}
    times = [t for t, held in printed.items() if held is not None]
    assert times == [0, 5, 15, 35, 75, 135, 195]  # gaps 5, 10, 20, 40, then the 60 s cap
    assert [printed[t] for t in times] == [0, 4, 9, 19, 39, 59, 59]


def test_a_new_warning_prints_at_once_and_clear_says_whether_one_was_printed() -> None:
    throttle = LogThrottle(repeat_s=60.0)
    assert throttle.warning("down", "refused", 0.0) == 0
    assert throttle.warning("down", "refused", 1.0) is None
    assert throttle.warning("down", "timed out", 2.0) == 1  # news, with the one held back
    assert throttle.clear("down") is True
    assert throttle.clear("down") is False
    assert throttle.warning("down", "refused", 3.0) == 0


def test_a_state_line_prints_on_change_and_as_a_heartbeat() -> None:
    throttle = LogThrottle(repeat_s=300.0)
    seen = [(t, throttle.state("decision", "hold" if t < 700 else "go", float(t)))
            for t in range(0, 1000, 2)]
    times = [t for t, held in seen if held is not None]
    assert times == [0, 300, 600, 700]
    assert dict(seen)[700] == 49  # the hold lines between 600 and 700 it stood for


@given(st.lists(st.floats(min_value=0.01, max_value=30.0), min_size=1, max_size=400),
       st.floats(min_value=1.0, max_value=600.0))
def test_every_occurrence_is_printed_or_counted_and_prints_are_few(
        gaps_s: list[float], repeat_s: float) -> None:
    throttle = LogThrottle(repeat_s=repeat_s)
    now_s, printed, held_total = 0.0, 0, 0
    for gap_s in gaps_s:
        now_s += gap_s
        held = throttle.warning("k", "same", now_s)
        if held is not None:
            printed += 1
            held_total += held
    tail = throttle._lines["k"].suppressed
    assert printed + held_total + tail == len(gaps_s)
    span_s = now_s - gaps_s[0]
    doublings = math.ceil(math.log2(max(2.0, repeat_s / min(5.0, repeat_s)))) + 1
    assert printed <= doublings + span_s / repeat_s + 1


def _config(url: str) -> Any:
    return merge({"servers": [{"name": "s", "url": url, "ladder": {"kv_floor_tokens": 512}}],
                  "control": {"apply_poll_s": 0.01}})


def _lines(caplog: pytest.LogCaptureFixture, message: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == message]


@pytest.mark.timeout(120)
async def test_ten_steady_minutes_log_a_few_decisions_not_three_hundred(
        aiohttp_server: Any, caplog: pytest.LogCaptureFixture) -> None:
    engine = ReferenceEngine(demo_engine_config())
    url = str((await aiohttp_server(make_app(engine))).make_url("")).rstrip("/")
    clock = VirtualClock()
    caplog.set_level(logging.INFO, logger="ladder.controller")
    async with aiohttp.ClientSession() as session:
        controller = build_daemon(_config(url), session, clock=clock).controllers[0]
        for _ in range(300):  # 10 minutes at the default 2 s poll
            await controller.tick()
            clock.now_s += 2.0
    decisions = _lines(caplog, "decision")
    # The first move onto the ladder, the hold on it, then one heartbeat per 5 minutes.
    assert 2 <= len(decisions) <= 5, [d.__dict__.get("verdict") for d in decisions]
    held = sum(d.__dict__["unchanged_not_logged"] for d in decisions)
    assert len(decisions) + held + controller._log._lines["decision"].suppressed == 300


@pytest.mark.timeout(60)
async def test_a_down_server_warns_with_backoff_and_says_when_it_recovers(
        aiohttp_server: Any, caplog: pytest.LogCaptureFixture) -> None:
    engine = ReferenceEngine(demo_engine_config())
    up = await aiohttp_server(make_app(engine))
    url = str(up.make_url("")).rstrip("/")
    clock = VirtualClock()
    caplog.set_level(logging.INFO, logger="ladder.controller")
    async with aiohttp.ClientSession() as session:
        controller = build_daemon(_config("http://127.0.0.1:9"), session,
                                  clock=clock).controllers[0]
        for _ in range(300):  # 10 minutes of a server that refuses every connection
            await controller.tick()
            clock.now_s += 2.0
        warnings = _lines(caplog, "observation failed")
        # At once, then 5, 10, 20 ... s apart up to 300 s: 7-8 lines, not 300.
        assert 5 <= len(warnings) <= 9
        assert warnings[0].__dict__["repeats_not_logged"] == 0
        assert warnings[-1].__dict__["repeats_not_logged"] > 50
        controller.client = type(controller.client)(url, session=session)
        await controller.tick()
    assert len(_lines(caplog, "observation recovered")) == 1
