"""Prometheus metrics of the reference engine, on a private registry.

Most values are read from the engine at scrape time by a collector (no bookkeeping twice);
the rebuild pauses are histograms fed by the engine's event listener: per chunk operation (what
the chunk-operation target is measured on) and per decode round (what running requests felt:
several operations may share a round, up to the pause budget).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.reference.rebuild import ChunkPause, RebuildPause
from engine.reference.runtime import ReferenceEngine

__all__ = ["EngineMetrics"]

_PAUSE_BUCKETS_S = (1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1.0)


class _EngineCollector(Collector):
    def __init__(self, engine: ReferenceEngine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        e = self.engine
        pools = GaugeMetricFamily("reference_engine_pool_bytes",
                                  "Bytes each pool holds on the device", labels=["pool"])
        pools.add_metric(["moe"], e.experts.nbytes)
        pools.add_metric(["kv"], e.kv.nbytes)
        pools.add_metric(["mamba"], e.states.nbytes)
        yield pools
        yield GaugeMetricFamily("reference_engine_allocated_bytes",
                                "Bytes the pools' allocator holds", value=e.memory.allocated_bytes)
        yield GaugeMetricFamily("reference_engine_cache_budget_bytes",
                                "The budget the fit-check uses",
                                value=e.memory_model.cache_budget_bytes)
        sizes = GaugeMetricFamily("reference_engine_pool_units", "Pool sizes in their units",
                                  labels=["pool"])
        g = e.geometry()
        sizes.add_metric(["moe_slots"], g.moe_cache_size)
        sizes.add_metric(["kv_pages"], g.num_pages)
        sizes.add_metric(["mamba_slots"], g.num_mamba_slots)
        yield sizes
        lookups = CounterMetricFamily("reference_engine_expert_lookups",
                                      "Expert lookups by result", labels=["result"])
        lookups.add_metric(["hit"], e.experts.hits)
        lookups.add_metric(["miss"], e.experts.misses)
        yield lookups
        yield CounterMetricFamily("reference_engine_decode_tokens", "Tokens decoded",
                                  value=e.served.completion_tokens_total + sum(
                                      r.decode.generated for r in e.running.values()))
        yield GaugeMetricFamily("reference_engine_decode_tokens_per_second",
                                "Aggregate decode tokens/s over the last 5 s",
                                value=e.stats_doc()["throughput"]["decode_tps"])
        yield GaugeMetricFamily("reference_engine_running_requests", "Requests decoding",
                                value=len(e.running))
        transitions = CounterMetricFamily("reference_engine_rebuilds",
                                          "Rebuild calls by mode and status",
                                          labels=["mode", "status"])
        for (mode, status), count in sorted(e.transitions.items()):
            transitions.add_metric([mode, status], count)
        yield transitions


class EngineMetrics:
    """The registry `/metrics` serves, wired to one engine."""

    def __init__(self, engine: ReferenceEngine) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine))
        self.chunk_pause = Histogram(
            "reference_engine_chunk_pause_seconds",
            "How long one chunk operation of an incremental rebuild took",
            labelnames=["pool", "op"], registry=self.registry, buckets=_PAUSE_BUCKETS_S)
        self.rebuild_pause = Histogram(
            "reference_engine_rebuild_pause_seconds",
            "How long running requests' decode waited in one round for the rebuild's chunk "
            "operations (up to the pause budget)",
            registry=self.registry, buckets=_PAUSE_BUCKETS_S)
        engine.listeners.append(self._on_event)

    def _on_event(self, event: str, payload: Any) -> None:
        if event == "chunk" and isinstance(payload, ChunkPause):
            self.chunk_pause.labels(payload.pool, payload.op).observe(payload.seconds)
        elif event == "rebuild_pause" and isinstance(payload, RebuildPause):
            self.rebuild_pause.observe(payload.seconds)
