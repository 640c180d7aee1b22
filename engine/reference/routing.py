"""Synthetic top-k expert routing with real models' skew and temporal locality.

The reference engine has no trained router worth measuring: a tiny random checkpoint routes
almost uniformly, so its expert-cache hit rate says nothing about real MoE models. This module
replaces the router's choices with a seeded generator whose LRU hit-rate curve and temporal
locality match published measurements of real MoE routers, so that the ladder's
trade between expert slots and KV cache is exercised in a realistic regime.

The model, a synthetic stand-in for a real router:

* per layer, a static Zipf(s) popularity over a per-layer random permutation of the N experts
  (the permutation is the "model": it depends on the router seed only);
* each request (stream) draws, per layer, a working set of ``w·N`` experts (weighted by that
  popularity, without replacement);
* at each token, each of the previous token's k experts is kept with probability ``rho``; the
  remaining picks come from the working set (popularity-weighted), except that each pick
  escapes to the layer's global popularity with probability ``eps``;
* the k experts of one token at one layer are distinct, and come out in a random order (a real
  router emits them by gate score, which is unrelated to recency), because the order in which a
  layer's lookups reach a sequential LRU decides how much a cache of ~k slots thrashes.

A request's choices depend only on (model, num_layers, router seed, request seed) and the token
index: never on other requests or on cache state. The engine relies on that to show that a
resize never changes outputs.

Calibration. The presets' parameters are fitted with `simulate_lru_hit_rate` to single
self-reported LRU hit-rate measurements of real models; the targets, and how close the curves
come, live in tests/engine/reference/test_routing.py, which checks them. Why the parameters are
what they are:

* A (Qwen3-30B-like, 128 experts top-8), targets at 8/24/49/81 slots per layer (imp PR 1374's
  rungs, "6/19/38/64 %") and a next-token repeat near 0.45 with a median reuse distance of 2.
  More rho lifts the small-cache end (its hit rate is ~0.7 x the next-token repeat, the rest is
  lost to in-token thrash); more eps pulls the 38-64 % end down. rho is capped by the
  reuse-distance target: above ~0.36 the next-token repeat passes 0.5 and the median reuse
  distance drops to 1.
* B (Qwen3-Next-like, 512 experts top-10), targets at 12.5/25/37 % residency. A working set of
  exactly 25 % of the experts makes a 25 % cache nearly complete, so w is wider than that, and
  a higher rho restores the 12.5 % point. Its static skew is weak: a top-6 % list learned on
  one request covers only about a tenth of another's lookups.
* C (DSV4-like, 256 experts top-8): the weak-locality, adversarial regime; it over-states LRU
  at 4.5 % residency (8-18 % reported).
* `with_shape` keeps the parameters, so the tiny engine's 8 x 64 top-4 routes in A's regime.

The residency rungs are *slots per layer* rounded as the sources did (imp's "6 %" is 8 slots of
128, exactly top-k): at fewer than k slots per layer a sequential LRU thrashes to ~0.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, replace

import numpy as np

__all__ = [
    "PRESETS",
    "PRESET_A",
    "PRESET_B",
    "PRESET_C",
    "LocalityStats",
    "Router",
    "RoutingModel",
    "RoutingStream",
    "measure_locality",
    "simulate_lru_hit_rate",
]

# Candidate draws per (token, layer) before falling back to one-at-a-time draws: 3·k covers
# the duplicate rejections of every preset with negligible fallback, and keeps one vectorised
# numpy call per token instead of a Python-level RNG call per pick.
_CANDIDATES_PER_PICK = 3
# SeedSequence takes non-negative words only; callers may pass any int (a hash, say).
_SEED_MOD = 1 << 64


@dataclass(frozen=True)
class RoutingModel:
    """Parameters of the synthetic router (the published tables' column names in brackets).

    `num_layers` is only the default for `Router`; the locality parameters are per layer.
    """

    name: str
    num_experts: int  # [N] routed experts per layer
    top_k: int  # [k] experts selected per token per layer
    zipf_s: float  # [s] static popularity exponent over a per-layer permutation
    keep_prob: float  # [rho] chance each of the previous token's experts is selected again
    working_set_frac: float  # [w] share of a layer's experts a request mostly draws from
    escape_prob: float  # [eps] chance a fresh pick comes from the global popularity instead
    num_layers: int = 48

    def __post_init__(self) -> None:
        if self.num_experts < 1 or self.top_k < 1 or self.num_layers < 1:
            raise ValueError("num_experts, top_k and num_layers must be >= 1")
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k {self.top_k} > num_experts {self.num_experts}")
        for field_name in ("keep_prob", "working_set_frac", "escape_prob"):
            value = getattr(self, field_name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{field_name} must be in [0, 1], got {value}")
        if self.zipf_s < 0.0:
            raise ValueError(f"zipf_s must be >= 0, got {self.zipf_s}")

    @property
    def working_set_size(self) -> int:
        # At least 2·k so a stream can always fill a token from its working set without
        # collapsing into "the same k experts forever" on tiny shapes.
        wanted = math.ceil(self.working_set_frac * self.num_experts)
        return min(self.num_experts, max(wanted, 2 * self.top_k))

    def with_shape(self, num_layers: int, num_experts: int, top_k: int) -> RoutingModel:
        """The same locality regime on another shape (e.g. the tiny engine's 8 x 64, top-4).

        The parameters are shares and probabilities, so they carry over unchanged; the working
        set keeps its share of the experts and hence roughly its ratio to k.
        """
        return replace(self, num_layers=num_layers, num_experts=num_experts, top_k=top_k)


PRESET_A = RoutingModel(
    name="A-qwen3-30b-like", num_experts=128, top_k=8, zipf_s=0.6,
    keep_prob=0.33, working_set_frac=0.25, escape_prob=0.18, num_layers=48,
)
PRESET_B = RoutingModel(
    name="B-qwen3-next-like", num_experts=512, top_k=10, zipf_s=0.2,
    keep_prob=0.55, working_set_frac=0.35, escape_prob=0.10, num_layers=48,
)
PRESET_C = RoutingModel(
    name="C-dsv4-like-weak-locality", num_experts=256, top_k=8, zipf_s=1.0,
    keep_prob=0.05, working_set_frac=0.6, escape_prob=0.10, num_layers=43,
)
PRESETS: dict[str, RoutingModel] = {"A": PRESET_A, "B": PRESET_B, "C": PRESET_C}


def _row_cdfs(weights: np.ndarray) -> np.ndarray:
    """Row-normalised cumulative sums, each row shifted by its index (see `_sample_rows`)."""
    cdf = np.cumsum(weights, axis=1)
    cdf /= cdf[:, -1:]
    cdf[:, -1] = 1.0
    return cdf + np.arange(weights.shape[0], dtype=np.float64)[:, None]


def _sample_rows(shifted_cdf: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF sampling of u[r, :] from row r, all rows in one searchsorted call.

    Row r's CDF lives in (r, r+1], so `r + u` falls inside row r of the flattened array.
    """
    rows, width = shifted_cdf.shape
    offsets = np.arange(rows, dtype=np.float64)[:, None]
    flat_index = np.searchsorted(shifted_cdf.ravel(), (u + offsets).ravel(), side="right")
    local: np.ndarray = flat_index.reshape(u.shape) - (np.arange(rows) * width)[:, None]
    # `r + u` can round up to r + 1 for u just below 1: keep it in the row's last bucket.
    np.clip(local, 0, width - 1, out=local)
    return local


class Router:
    """The synthetic router of one model: per-layer popularity, fixed by `seed`.

    Requests get independent `RoutingStream`s from `stream(seed)`.
    """

    def __init__(self, model: RoutingModel, num_layers: int | None = None, seed: int = 0) -> None:
        self.model = model
        self.num_layers = model.num_layers if num_layers is None else num_layers
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers}")
        self.seed = seed
        n, layers = model.num_experts, self.num_layers
        rng = np.random.default_rng(np.random.SeedSequence([0x524F5554, seed % _SEED_MOD]))
        # rank_to_expert[l, r]: the expert of popularity rank r at layer l.
        self.rank_to_expert = np.stack([rng.permutation(n) for _ in range(layers)])
        rank_weight = np.arange(1, n + 1, dtype=np.float64) ** -model.zipf_s
        rank_weight /= rank_weight.sum()
        # popularity[l, e]: the static share of expert e at layer l.
        self.popularity = np.empty((layers, n))
        np.put_along_axis(self.popularity, self.rank_to_expert, rank_weight[None, :], axis=1)
        self._global_cdf = _row_cdfs(np.broadcast_to(rank_weight, (layers, n)).copy())

    def stream(self, seed: int) -> RoutingStream:
        """A request's routing, a pure function of (model, num_layers, router seed, seed)."""
        return RoutingStream(self, seed)

    def next_token(self, stream_state: RoutingStream) -> np.ndarray:
        """Advance `stream_state` by one token: expert ids, shape (num_layers, top_k)."""
        if stream_state.router is not self:
            raise ValueError("stream belongs to another Router")
        return stream_state.step()

    def global_pick(self, u: np.ndarray) -> np.ndarray:
        """Experts drawn from each layer's static popularity, u of shape (num_layers, m)."""
        ranks = _sample_rows(self._global_cdf, u)
        return np.take_along_axis(self.rank_to_expert, ranks, axis=1)


class RoutingStream:
    """One request's sequence of expert choices; `step()` yields token after token."""

    def __init__(self, router: Router, seed: int) -> None:
        self.router = router
        self.seed = seed
        self.tokens_done = 0
        model = router.model
        layers = router.num_layers
        self._rng = np.random.default_rng(
            np.random.SeedSequence([0x53545245, router.seed % _SEED_MOD, seed % _SEED_MOD])
        )
        ws_size = model.working_set_size
        # Gumbel top-k = weighted sampling without replacement, one vectorised call.
        gumbel = -np.log(-np.log(self._rng.random((layers, model.num_experts))))
        keys = np.log(router.popularity) + gumbel
        self.working_set = np.argsort(-keys, axis=1)[:, :ws_size]
        ws_weight = np.take_along_axis(router.popularity, self.working_set, axis=1)
        self._ws_cdf = _row_cdfs(ws_weight)
        self._prev: np.ndarray | None = None

    def step(self) -> np.ndarray:
        """The next token's experts: int64 array (num_layers, top_k), distinct per row."""
        router, model, rng = self.router, self.router.model, self._rng
        layers, k = router.num_layers, model.top_k
        m = _CANDIDATES_PER_PICK * k
        # Draw every random number of this token up front, in a fixed order, so the stream is
        # reproducible whatever the Python-level loop below does with them.
        keep = rng.random((layers, k)) < model.keep_prob
        escape = rng.random((layers, m)) < model.escape_prob
        u = rng.random((layers, m))
        from_ws = np.take_along_axis(self.working_set, _sample_rows(self._ws_cdf, u), axis=1)
        candidates = np.where(escape, router.global_pick(u), from_ws)

        out = np.empty((layers, k), dtype=np.int64)
        prev = self._prev
        for layer in range(layers):
            chosen: list[int] = []
            if prev is not None:
                chosen = [int(e) for e, kept in zip(prev[layer], keep[layer], strict=True) if kept]
            seen = set(chosen)
            for e in candidates[layer].tolist():
                if len(chosen) == k:
                    break
                if e not in seen:
                    seen.add(e)
                    chosen.append(e)
            while len(chosen) < k:  # rare: duplicates ate all candidates
                e = self._fallback_pick(layer)
                if e not in seen:
                    seen.add(e)
                    chosen.append(e)
            out[layer] = chosen
        out = rng.permuted(out, axis=1)
        self._prev = out
        self.tokens_done += 1
        return out

    def _fallback_pick(self, layer: int) -> int:
        model, rng = self.router.model, self._rng
        if rng.random() < model.escape_prob:
            return int(rng.choice(model.num_experts, p=self.router.popularity[layer]))
        ws = self.working_set[layer]
        return int(ws[rng.integers(ws.size)])

    def take(self, tokens: int) -> np.ndarray:
        """The next `tokens` tokens' choices, shape (tokens, num_layers, top_k)."""
        if tokens == 0:
            return np.empty((0, self.router.num_layers, self.router.model.top_k), np.int64)
        return np.stack([self.step() for _ in range(tokens)])


def simulate_lru_hit_rate(
    model: RoutingModel,
    num_layers: int,
    slots_total: int,
    tokens: int,
    seed: int,
    global_lru: bool = True,
    *,
    warmup_tokens: int = 0,
) -> float:
    """Share of routed lookups an LRU expert cache of `slots_total` slots serves.

    One request of `warmup_tokens + tokens` tokens; lookups of the warm-up are not counted.
    `global_lru` keeps one LRU over all layers (ft serve's pool); otherwise every layer gets
    `slots_total / num_layers` slots (remainder to the first layers) as imp and llama.cpp do.
    Lookups are sequential in the router's output order, like a per-expert cache lookup.
    """
    if slots_total < 0 or tokens < 1 or warmup_tokens < 0:
        raise ValueError("slots_total >= 0, tokens >= 1 and warmup_tokens >= 0 required")
    stream = Router(model, num_layers, seed).stream(seed)
    n = model.num_experts
    if global_lru:
        caches = [OrderedDict[int, None]()]
        capacity = [slots_total]
    else:
        base, extra = divmod(slots_total, num_layers)
        caches = [OrderedDict[int, None]() for _ in range(num_layers)]
        capacity = [base + (1 if layer < extra else 0) for layer in range(num_layers)]
    hits = lookups = 0
    for t in range(warmup_tokens + tokens):
        choices = stream.step()
        counted = t >= warmup_tokens
        for layer, row in enumerate(choices.tolist()):
            index = 0 if global_lru else layer
            cache, cap = caches[index], capacity[index]
            for e in row:
                key = layer * n + e
                if key in cache:
                    cache.move_to_end(key)
                    hits += counted
                elif cap > 0:
                    cache[key] = None
                    if len(cache) > cap:
                        cache.popitem(last=False)
            lookups += counted * len(row)
    return hits / lookups


@dataclass(frozen=True)
class LocalityStats:
    """Temporal locality of a choice sequence, as the published measurements state it."""

    repeat_next: float  # share of selections whose expert was selected at the previous token
    repeat_within: float  # ... at one of the previous `horizon` tokens
    median_reuse_distance_tokens: float  # over selections reused at all (within the trace)
    horizon_tokens: int


def measure_locality(choices: np.ndarray, num_experts: int, horizon: int = 8) -> LocalityStats:
    """Reuse statistics of `choices` (tokens, layers, k), counting from token `horizon` on.

    Counting starts at token `horizon` so every counted selection has a full look-back window.
    """
    tokens, layers, _ = choices.shape
    if tokens <= horizon:
        raise ValueError(f"need more than {horizon} tokens, got {tokens}")
    last_seen = np.full((layers, num_experts), -1, dtype=np.int64)
    layer_index = np.arange(layers)[:, None]
    distances: list[np.ndarray] = []
    for t in range(tokens):
        row = choices[t]
        if t >= horizon:
            seen = last_seen[layer_index, row]
            distances.append(np.where(seen >= 0, t - seen, -1).ravel())
        last_seen[layer_index, row] = t
    d = np.concatenate(distances)
    reused = d[d > 0]
    return LocalityStats(
        repeat_next=float(np.mean(d == 1)),
        repeat_within=float(np.mean((d > 0) & (d <= horizon))),
        median_reuse_distance_tokens=float(np.median(reused)) if reused.size else math.inf,
        horizon_tokens=horizon,
    )
