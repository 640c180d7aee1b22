"""What the host and the card were doing while a speed probe ran: the suspects for a call's drift.

Why: the same fixed work ran 47-65 % apart within one device call (docs/results.md, the speed
probe). The replay can price each arm at the probes around it, but that only removes the drift
it can see, and it cannot say where the drift comes from. Each probe therefore keeps what could
move its speed: this process's CPU use, the whole host's busy and steal time (a shared host's
other tenants), and the card's SM clock, power and temperature. If the drift follows the SM
clock it is the card; if it follows steal or the host's busy time, the host; if neither moves,
it is this process (the allocator, the garbage collector, the event loop) or the host CPU it
runs on, which is kept too.

`take_sample` is the I/O (`/proc/stat`, `nvidia-smi`, the process clock); `host_during` and
`parse_proc_stat` are pure arithmetic over two samples.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["GPU_FIELDS", "HostSample", "host_during", "parse_on_cpu", "parse_proc_stat",
           "take_sample"]

# nvidia-smi --query-gpu names, and the keys they are kept under.
GPU_FIELDS = {"clocks.sm": "sm_mhz", "clocks.mem": "mem_mhz", "power.draw": "power_w",
              "temperature.gpu": "temp_c", "utilization.gpu": "util_pct"}
# /proc/stat's aggregate "cpu" line, in the kernel's order (proc(5)).
_CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
_NVIDIA_SMI_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class HostSample:
    """One instant: the wall and process clocks, the host's CPU time by kind (jiffies, None
    off Linux) and the card's readings (None without nvidia-smi)."""

    wall_s: float
    process_cpu_s: float
    cpu_jiffies: dict[str, int] | None
    gpu: dict[str, float] | None
    # The host CPU this process last ran on (/proc/self/stat); None off Linux.
    on_cpu: int | None = None


def parse_proc_stat(text: str) -> dict[str, int] | None:
    """The aggregate `cpu` line of /proc/stat as jiffies by kind; None when it is missing."""
    for line in text.splitlines():
        name, *values = line.split()
        if name == "cpu":
            return dict(zip(_CPU_FIELDS, map(int, values), strict=False))
    return None


def parse_on_cpu(self_stat: str) -> int | None:
    """The `processor` field of /proc/self/stat (the 39th; the command name, field 2, may
    hold spaces, so fields are counted after its closing parenthesis)."""
    fields = self_stat.rsplit(")", 1)[-1].split()
    return int(fields[36]) if len(fields) > 36 else None


def _read_on_cpu() -> int | None:
    try:
        return parse_on_cpu(Path("/proc/self/stat").read_text())
    except OSError:
        return None


def _read_proc_stat() -> dict[str, int] | None:
    try:
        return parse_proc_stat(Path("/proc/stat").read_text())
    except OSError:
        return None


def _read_gpu(index: int) -> dict[str, float] | None:
    """The card's readings now; None without nvidia-smi or when it fails (a probe is never
    lost for a missing reading)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, f"--id={index}", f"--query-gpu={','.join(GPU_FIELDS)}",
             "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=_NVIDIA_SMI_TIMEOUT_S, check=True).stdout
        values = [float(v) for v in out.strip().split(",")]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return dict(zip(GPU_FIELDS.values(), values, strict=True)) if len(values) == len(
        GPU_FIELDS) else None


def take_sample(gpu_index: int | None) -> HostSample:
    """Read the clocks, /proc/stat and, when `gpu_index` is given, the card."""
    return HostSample(wall_s=time.perf_counter(), process_cpu_s=time.process_time(),
                      cpu_jiffies=_read_proc_stat(),
                      gpu=None if gpu_index is None else _read_gpu(gpu_index),
                      on_cpu=_read_on_cpu())


def host_during(start: HostSample, end: HostSample) -> dict[str, Any]:
    """What happened between two samples: this process's CPU use (in cores), the host's busy
    and steal fractions of all its CPU time (None without /proc/stat), the card's readings
    at the start and at the end (None without a card) and the host CPU the process was on at
    each."""
    wall_s = end.wall_s - start.wall_s
    out: dict[str, Any] = {
        "process_cores": round((end.process_cpu_s - start.process_cpu_s) / wall_s, 3)
        if wall_s > 0 else None,
        "host_busy_frac": None, "host_steal_frac": None}
    if start.cpu_jiffies is not None and end.cpu_jiffies is not None:
        delta = {k: end.cpu_jiffies.get(k, 0) - start.cpu_jiffies.get(k, 0)
                 for k in _CPU_FIELDS}
        total = sum(delta.values())
        if total > 0:
            out["host_busy_frac"] = round(1 - (delta["idle"] + delta["iowait"]) / total, 4)
            out["host_steal_frac"] = round(delta["steal"] / total, 4)
    out["gpu_start"], out["gpu_end"] = start.gpu, end.gpu
    out["on_cpu"] = [start.on_cpu, end.on_cpu]
    return out
