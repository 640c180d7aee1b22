"""The host and card readings each speed probe keeps (bench/host_state.py)."""

from __future__ import annotations

import os
import time

from bench.host_state import HostSample, host_during, parse_on_cpu, parse_proc_stat, take_sample

STAT = """cpu  100 5 50 800 20 1 2 22 0 0
cpu0 50 2 25 400 10 0 1 11 0 0
intr 12345
"""


def test_proc_stat_is_read_from_its_aggregate_line() -> None:
    assert parse_proc_stat(STAT) == {"user": 100, "nice": 5, "system": 50, "idle": 800,
                                     "iowait": 20, "irq": 1, "softirq": 2, "steal": 22}
    assert parse_proc_stat("cpu0 1 2 3\n") is None


def test_host_during_prices_what_moved_between_two_samples() -> None:
    start = HostSample(10.0, 1.0, parse_proc_stat(STAT), {"sm_mhz": 1980.0}, on_cpu=3)
    # 200 jiffies later: 60 idle, 10 iowait, 30 steal, 100 user.
    later = {"user": 200, "nice": 5, "system": 50, "idle": 860, "iowait": 30, "irq": 1,
             "softirq": 2, "steal": 52}
    end = HostSample(14.0, 3.0, later, {"sm_mhz": 1410.0}, on_cpu=11)
    assert host_during(start, end) == {
        "process_cores": 0.5, "host_busy_frac": round(1 - 70 / 200, 4),
        "host_steal_frac": 0.15, "gpu_start": {"sm_mhz": 1980.0},
        "gpu_end": {"sm_mhz": 1410.0}, "on_cpu": [3, 11]}


def test_missing_readings_are_none_not_an_error() -> None:
    start, end = HostSample(1.0, 0.0, None, None), HostSample(1.0, 0.0, None, None)
    assert host_during(start, end) == {"process_cores": None, "host_busy_frac": None,
                                       "host_steal_frac": None, "gpu_start": None,
                                       "gpu_end": None, "on_cpu": [None, None]}


def test_a_real_sample_of_this_host_reads_back_sane_fractions() -> None:
    start = take_sample(None)
    deadline = time.perf_counter() + 0.2
    while time.perf_counter() < deadline:  # busy: this process uses about one core
        pass
    during = host_during(start, take_sample(None))
    assert 0.5 < during["process_cores"] <= 1.2
    assert 0 < during["host_busy_frac"] <= 1 and 0 <= during["host_steal_frac"] <= 1
    assert during["gpu_start"] is None and during["gpu_end"] is None
    assert all(0 <= cpu < (os.cpu_count() or 1) for cpu in during["on_cpu"])


def test_the_cpu_field_is_counted_past_a_command_name_with_spaces() -> None:
    fields = " ".join(str(i) for i in range(3, 53))  # fields 3..52; field 39 holds 39
    assert parse_on_cpu(f"1234 (python3 bench x) {fields}") == 39
    assert parse_on_cpu("1234 (short) 1 2 3") is None
