"""Ready-made reference-engine configurations: the motivating report's card, scaled.

The report (RTX 5080 16 GB, Qwen3.8-Flash-Next NVFP4): 512 expert slots of 2,772,480 B,
262,144 KV tokens of 7,883 B, 8 mamba slots of 115,644,825 B, a cache budget of 5.11 GB, and,
when the single rebuild call OOMed, 511.5 MiB free beyond what the pools held. `report_config`
keeps every one of those byte proportions at the tiny model's expert size, so the same two
transitions OOM in `freetoken` mode and succeed in `incremental` mode, on a CPU in tens of MB.
"""

from __future__ import annotations

import math

from engine.reference.decoder import ModelSpec
from engine.reference.runtime import EngineConfig, RebuildMode

__all__ = ["REPORT", "ReportScale", "report_config"]

_MIB = 1 << 20


class ReportScale:
    """The report's figures (bytes) and how they map onto a tiny model."""

    expert_bytes = 2_772_480
    moe_slots = 512
    kv_bytes = 262_144 * 7_883
    mamba_slots = 8
    mamba_bytes = 8 * 115_644_825
    cache_budget_bytes = 5_110_000_000
    free_at_oom_bytes = int(511.5 * _MIB)


REPORT = ReportScale()


def report_config(mode: RebuildMode = "incremental", *, device: str = "cpu",
                  layers: int = 8, experts: int = 64, hidden: int = 64,
                  expert_hidden: int = 128, head_dim: int = 32, page_size: int = 16,
                  max_running_requests: int = 4) -> EngineConfig:
    """The report's geometry at the tiny model's scale (expert slots counted from the floor).

    The report runs 512 slots = num_experts; here that is `experts` slots. KV tokens, mamba
    slot size and the budget keep their byte ratio to one expert slot.
    """
    probe = ModelSpec(num_layers=layers, num_experts=experts, hidden=hidden,
                      expert_hidden=expert_hidden, head_dim=head_dim, page_size=page_size)
    scale = probe.expert_bytes / REPORT.expert_bytes * (experts / REPORT.moe_slots)
    # The mamba slot keeps its size relative to an expert slot: pick the head count.
    mamba_slot_bytes = REPORT.mamba_bytes / REPORT.mamba_slots * scale
    state_heads = max(1, round(mamba_slot_bytes / (layers * head_dim**2 * 4)))
    spec = ModelSpec(num_layers=layers, num_experts=experts, hidden=hidden,
                     expert_hidden=expert_hidden, head_dim=head_dim, state_heads=state_heads,
                     page_size=page_size)
    kv_pages = math.ceil(REPORT.kv_bytes * scale / spec.kv_bytes_per_token / page_size)
    budget = int(REPORT.cache_budget_bytes * scale)
    weights = spec.dense_weight_bytes
    card = weights + budget + int(REPORT.free_at_oom_bytes * scale)
    return EngineConfig(model=spec, device=device, device_memory_bytes=card,
                        cache_budget_bytes=budget, moe_cache_size=experts,
                        num_pages=kv_pages, num_mamba_slots=REPORT.mamba_slots,
                        max_running_requests=max_running_requests, rebuild_mode=mode,
                        chunk_bytes=_MIB, max_seq_len=kv_pages * page_size * 4)
