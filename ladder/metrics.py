"""The daemon's Prometheus metrics, on a private registry (`ladder_` prefix, base units).

ft serve has no /metrics of its own, so the daemon also re-exports the server's `/v1/stats`,
labelled by server name (a bounded set: one per `[[servers]]`): levels as gauges, and the
server's running total of completion tokens as a counter (`_total`), so `rate()` works on it
and handles a server restart as a counter reset. `ladder_live_*` are the sizes the server holds
now, on a rung or not; `ladder_rung` says which rung that is.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.ftserve.budget import MemoryModel
from engine.ftserve.geometry import Geometry
from engine.ftserve.wire import Stats

__all__ = ["DaemonMetrics"]


class DaemonMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.rung = Gauge("ladder_rung", "Index of the live rung (-1 when off the ladder)",
                          ["server"], registry=r)
        self.live_kv_tokens = Gauge("ladder_live_kv_tokens", "KV tokens the server holds now",
                                    ["server"], registry=r)
        self.live_expert_slots = Gauge("ladder_live_expert_slots",
                                       "Expert slots the server holds now", ["server"], registry=r)
        self.live_mamba_slots = Gauge("ladder_live_mamba_slots",
                                      "Mamba slots the server holds now", ["server"], registry=r)
        self.rungs = Gauge("ladder_rungs", "Rungs on the ladder", ["server"], registry=r)
        self.budget_bytes = Gauge("ladder_budget_bytes", "Budget every instant must fit in",
                                  ["server"], registry=r)
        self.allocated_bytes = Gauge("ladder_allocated_bytes",
                                     "Bytes the live geometry holds (physical)", ["server"],
                                     registry=r)
        self.transitions = Counter("ladder_transitions_total", "Rung transitions",
                                   ["server", "direction", "outcome"], registry=r)
        self.transition_seconds = Histogram(
            "ladder_transition_seconds", "Wall time of a whole rung transition", ["server"],
            registry=r, buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300))
        self.planned_peak_bytes = Gauge("ladder_planned_peak_bytes",
                                        "Planned peak of the last transition", ["server"],
                                        registry=r)
        self.observed_peak_bytes = Gauge(
            "ladder_observed_peak_bytes",
            "Largest geometry read back during the last transition (physical bytes)",
            ["server"], registry=r)
        self.rebuild_calls = Counter("ladder_rebuild_calls_total", "Rebuild calls sent",
                                     ["server", "kind"], registry=r)
        self.decisions = Counter("ladder_decisions_total", "Policy decisions",
                                 ["server", "policy", "verdict"], registry=r)
        self.read_failures = Counter("ladder_read_failures_total", "Failed observations",
                                     ["server"], registry=r)
        self.gate_holds = Counter("ladder_gate_holds_total", "Requests the gate held",
                                  ["server"], registry=r)
        self.gate_held = Gauge("ladder_gate_held_requests", "Requests held right now",
                               ["server"], registry=r)
        self.gate_refused = Counter("ladder_gate_refused_total", "Requests the gate refused",
                                    ["server"], registry=r)
        self.server_decode_tps = Gauge("ladder_server_decode_tokens_per_second",
                                       "ft serve /v1/stats throughput.decode_tps", ["server"],
                                       registry=r)
        self.server_active = Gauge("ladder_server_active_requests",
                                   "ft serve /v1/stats requests.active", ["server"], registry=r)
        self.server_kv_used_pages = Gauge("ladder_server_kv_used_pages",
                                          "ft serve /v1/stats kv.used_pages (last known)",
                                          ["server"], registry=r)
        self.server_vram_bytes = Gauge("ladder_server_vram_bytes", "ft serve /v1/stats vram_bytes",
                                       ["server"], registry=r)
        self.server_completion_tokens = _ServerTotal(
            "ladder_server_completion_tokens",
            "ft serve /v1/stats requests.completion_tokens_total (the server's own counter)")
        r.register(self.server_completion_tokens)

    def observe_geometry(self, server: str, model: MemoryModel, g: Geometry,
                         rung: int | None, rungs: int) -> None:
        self.rung.labels(server).set(-1 if rung is None else rung)
        self.live_kv_tokens.labels(server).set(g.num_pages * model.shape.page_size)
        self.live_expert_slots.labels(server).set(g.moe_cache_size)
        self.live_mamba_slots.labels(server).set(g.num_mamba_slots)
        self.rungs.labels(server).set(rungs)
        self.budget_bytes.labels(server).set(model.budget_bytes)
        self.allocated_bytes.labels(server).set(model.total_bytes(g))

    def observe_stats(self, server: str, stats: Stats) -> None:
        # Missing means unknown: leave the gauge as it was rather than report a false zero.
        if stats.decode_tps is not None:
            self.server_decode_tps.labels(server).set(stats.decode_tps)
        if stats.requests_active is not None:
            self.server_active.labels(server).set(stats.requests_active)
        if stats.kv is not None:
            self.server_kv_used_pages.labels(server).set(stats.kv.used_pages)
        if stats.vram_bytes is not None:
            self.server_vram_bytes.labels(server).set(stats.vram_bytes)
        if stats.completion_tokens_total is not None:
            self.server_completion_tokens.values[server] = stats.completion_tokens_total


class _ServerTotal(Collector):
    """A counter whose value is another process's running total, read as it is.

    prometheus_client's Counter can only be incremented; this one is set from the last
    observation and exported with counter type, so a server restart reads as a reset."""

    def __init__(self, name: str, documentation: str) -> None:
        self.name, self.documentation = name, documentation
        self.values: dict[str, float] = {}

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.name, self.documentation, labels=["server"])

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=["server"])
        for server, value in sorted(self.values.items()):
            family.add_metric([server], value)
        yield family
