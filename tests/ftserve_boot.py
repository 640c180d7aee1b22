"""`/v1/cache/status` documents of servers booted the way `ft serve` 0.1.2 boots them.

Re-derived from FreeToken 0.1.2's source on its own, sharing no code with `engine/`, so a
planner bug cannot hide in a fixture built by the planner's own arithmetic:

- default boot, no `--num-tokens` (engine.py:343-345, `KVCache.solve_num_pages`): KV gets
  `(available - fixed) // cache_per_page` usable pages, where `available` is the memory-ratio
  share of a free-memory reading less the experts and the GDN state pool at its physical size.
  The reading is not `cache_budget_bytes`: the report's boot landed 2 MiB above it.
- `--moe-cache-auto` (cache_budget.py `plan_cache_budget`): from the budget less the state
  pool, experts get what an 8k-token KV reserve leaves, clamped to [E (2E with prefill
  overlap), min(E x layers, the quantisation's slot cap)], and KV the rest, in usable pages.
- the GDN pool (hybrid radix): `4 x max_running_req + max(4, int(ratio x max_running_req))`
  usable slots beside one sink slot; its floor is `4 x max_running_req`.

Either way KV is sized in usable pages, so with the dummy page the physical bytes land up to a
page above the budget, and more with a positive drift.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

Boot = Literal["default", "auto"]
MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class BootModel:
    """A model on a card, as ft serve sees it at boot."""

    name: str
    page_size: int
    kv_per_token: int
    moe_per_expert: int
    mamba_per_slot: int
    num_experts: int
    num_moe_layers: int
    max_slots: int
    cache_budget_bytes: int
    boot_moe_slots: int
    max_running_requests: int = 1

    @property
    def has_mamba(self) -> bool:
        return self.mamba_per_slot > 0

    @property
    def mamba_slots(self) -> int:
        mr = self.max_running_requests
        return 4 * mr + max(4, int(1.0 * mr)) if self.has_mamba else 0

    @property
    def mamba_floor(self) -> int:
        return 4 * self.max_running_requests if self.has_mamba else 0

    def without_mamba(self) -> BootModel:
        return replace(self, name=f"{self.name}-no-mamba", mamba_per_slot=0)


# The H200 recipe's tiny Qwen3.5-MoE (bf16; the boot of the report of issue 16).
TINY_QWEN35_H200 = BootModel("tiny-qwen35-moe-h200", page_size=1, kv_per_token=2048,
                             moe_per_expert=6_291_456, mamba_per_slot=1_609_728,
                             num_experts=64, num_moe_layers=8, max_slots=64 * 8,
                             cache_budget_bytes=8_920_242_585, boot_moe_slots=128)
# The motivating report: Qwen3.8-Flash-Next NVFP4 on an RTX 5080 16 GB (nvfp4_marlin caps
# the slot count at 992).
QWEN38_RTX5080 = BootModel("qwen38-flash-next-nvfp4-rtx5080", page_size=64, kv_per_token=7883,
                           moe_per_expert=2_772_480, mamba_per_slot=115_644_825,
                           num_experts=512, num_moe_layers=48, max_slots=992,
                           cache_budget_bytes=5_110_000_000, boot_moe_slots=512)
# A gemma-4-26B-A4B-like model on an RTX 4080 SUPER 16 GB (bench/geometries), no GDN pool.
GEMMA_LIKE_RTX4080S = BootModel("gemma-4-26b-a4b-like-rtx4080super", page_size=64,
                                kv_per_token=75_202, moe_per_expert=3_345_717,
                                mamba_per_slot=0, num_experts=128, num_moe_layers=30,
                                max_slots=128 * 30, cache_budget_bytes=12_190_000_000,
                                boot_moe_slots=694)

MODELS = (TINY_QWEN35_H200, TINY_QWEN35_H200.without_mamba(), QWEN38_RTX5080,
          QWEN38_RTX5080.without_mamba(), GEMMA_LIKE_RTX4080S)
# (boot, drift of the free-memory reading from cache_budget_bytes)
BOOTS: tuple[tuple[Boot, int], ...] = (("default", 0), ("default", 2 * MIB),
                                       ("default", -2 * MIB), ("auto", 0), ("auto", 2 * MIB))


def state_pool_bytes(model: BootModel) -> int:
    return (model.mamba_slots + 1) * model.mamba_per_slot if model.has_mamba else 0


def boot_geometry(model: BootModel, boot: Boot, drift_bytes: int = 0,
                  kv_reserve_tokens: int = 8192, prefill_overlap: bool = True) -> tuple[int, int]:
    """(expert slots, usable KV pages) ft serve boots with."""
    cache_per_page = model.page_size * model.kv_per_token
    available = model.cache_budget_bytes + drift_bytes - state_pool_bytes(model)
    if boot == "default":
        moe = model.boot_moe_slots
        return moe, (available - moe * model.moe_per_expert) // cache_per_page
    e = model.num_experts
    hi = min(e * model.num_moe_layers, model.max_slots)
    lo = 2 * e if prefill_overlap and hi >= 2 * e else e
    reserve_pages = -(-kv_reserve_tokens // model.page_size)
    moe = (available - reserve_pages * cache_per_page) // model.moe_per_expert
    moe = max(lo, min(hi, moe))
    pages = max((available - moe * model.moe_per_expert) // cache_per_page, reserve_pages)
    return moe, pages


def physical_bytes(model: BootModel, moe: int, pages: int, mamba: int) -> int:
    kv = (pages + 1) * model.page_size * model.kv_per_token
    state = (mamba + 1) * model.mamba_per_slot if mamba else 0
    return moe * model.moe_per_expert + kv + state


def boot_status(model: BootModel, boot: Boot, drift_bytes: int = 0) -> dict[str, Any]:
    """The `/v1/cache/status` body right after such a boot."""
    moe, pages = boot_geometry(model, boot, drift_bytes)
    budget = model.cache_budget_bytes
    slots_cap = model.num_experts * model.num_moe_layers
    return {
        "state": "serving",
        "last_rebuild": None,
        "geometry": {
            "num_pages": pages, "page_size": model.page_size, "moe_cache_size": moe,
            "num_mamba_slots": model.mamba_slots, "num_experts": model.num_experts,
            "num_moe_layers": model.num_moe_layers, "moe_cache_policy": "lru",
            "unit_bytes": {"kv_per_token": model.kv_per_token,
                           "moe_per_expert": model.moe_per_expert,
                           "mamba_per_slot": model.mamba_per_slot, "swa_per_token": 0},
            "swa_full_tokens_ratio": 0.0, "swa_page_size": 0, "num_swa_pages": 0,
            "cache_budget_bytes": budget, "reasoning": None,
            # ft serve's single-pool maxima: the whole budget to one pool.
            "limits": {
                "kv_tokens": {"min": model.page_size, "max": budget // model.kv_per_token},
                "moe_experts": {"min": model.num_experts,
                                "max": min(slots_cap, budget // model.moe_per_expert)},
                "mamba_slots": {"min": model.mamba_floor,
                                "max": budget // model.mamba_per_slot if model.has_mamba
                                else 0},
                "swa_tokens": {"min": 0, "max": 0},
            },
        },
    }
