"""Expert hits as the engine gets them: its own routing generator, its own LRU replacement.

Why not a hit-rate curve: what a rung is worth depends on which experts stay resident across
requests, concurrent streams and resizes (a shrink evicts the coldest, a `freetoken` rebuild
empties the cache), and a curve fitted per geometry knows none of that. So the replay draws
each request's choices from `engine.reference.routing` (the generator the reference engine
decodes with: same presets, same per-layer popularity, same temporal locality) and replays
them through a cache with `ExpertSlotPool`'s policy: one LRU over all layers, a hit moves
the expert to the hot end, a miss takes a free slot or evicts the coldest, a shrink first
evicts the coldest down to the new size, a grow only adds free slots.

The one difference from the engine: a request's routing seed is derived from its trace
position (`stream_seed`), not from a hash of its prompt's token ids, which the replay never
builds. Streams are still independent per request and the same in every arm.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from engine.reference.routing import PRESETS, Router

__all__ = ["ExpertCache", "RoutingBank", "RoutingShape", "stream_seed"]


def stream_seed(trace_seed: int, index: int) -> int:
    digest = hashlib.blake2b(repr(("replay", trace_seed, index)).encode(),
                             digest_size=8).digest()
    return int.from_bytes(digest, "little")


@dataclass(frozen=True, slots=True)
class RoutingShape:
    """The MoE the routing is drawn for: layers x experts, top-k, a routing preset."""

    num_layers: int
    num_experts: int
    top_k: int
    preset: str
    router_seed: int = 0

    @property
    def lookups_per_token(self) -> int:
        return self.num_layers * self.top_k


@dataclass
class RoutingBank:
    """Every request's expert choices for one trace and seed, drawn once, shared by arms.

    `keys(index, tokens)`: the first `tokens` tokens of request `index`, each a list of
    `layer * num_experts + expert` in the order the decoder looks them up.
    """

    shape: RoutingShape
    trace_seed: int
    _router: Router = field(init=False)
    _drawn: dict[int, np.ndarray] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        s = self.shape
        model = PRESETS[s.preset].with_shape(s.num_layers, s.num_experts, s.top_k)
        self._router = Router(model, s.num_layers, seed=s.router_seed)

    def keys(self, index: int, tokens: int) -> list[list[int]]:
        drawn = self._drawn.get(index)
        if drawn is None or len(drawn) < tokens:
            # Redrawn from the start when more tokens are asked for: a stream is a pure
            # function of its seed, so the prefix is the same.
            stream = self._router.stream(stream_seed(self.trace_seed, index))
            offsets = (np.arange(self.shape.num_layers) * self.shape.num_experts)[:, None]
            drawn = np.stack([stream.step() + offsets for _ in range(tokens)]).reshape(
                tokens, -1)
            self._drawn[index] = drawn
        rows: list[list[int]] = drawn[:tokens].tolist()
        return rows


class ExpertCache:
    """`ExpertSlotPool`'s replacement policy over expert keys, without the weights."""

    __slots__ = ("_lru", "capacity", "evictions", "hits", "misses")

    def __init__(self, slots: int) -> None:
        self.capacity = slots
        self._lru: OrderedDict[int, None] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    @property
    def resident(self) -> int:
        return len(self._lru)

    def token(self, keys: list[int]) -> int:
        """One token's lookups in order; returns its misses."""
        lru = self._lru
        capacity = self.capacity
        misses = 0
        for key in keys:
            if key in lru:
                lru.move_to_end(key)
            else:
                misses += 1
                if len(lru) >= capacity:
                    lru.popitem(last=False)
                    self.evictions += 1
                lru[key] = None
        self.hits += len(keys) - misses
        self.misses += misses
        return misses

    def resize(self, slots: int) -> None:
        """A shrink evicts the coldest down to `slots` at once; a grow adds free slots."""
        while len(self._lru) > slots:
            self._lru.popitem(last=False)
            self.evictions += 1
        self.capacity = slots

    def clear(self) -> None:
        """Every slot reallocated (ft serve's rebuild): the cache restarts cold."""
        self._lru.clear()
