"""Fit the replay's cost model from what was measured, and write bench/calibration/h200.json.

Two profiles, every parameter with its source:

* `h200-bench`: the policy bench's engine (bench/policy_arms.py `gpu_engine_config`), fitted
  from the GPU records of bench/replay/records.py (the H200 ladder records and every
  per-seed run, H200 and H100: the two cards' calls overlap, see `DecodeFit`):
  - decode: least squares, weighted by tokens, over every request's decode window in the
    records (all arms, every trace) that no transition overlapped and that ran alone (a
    round of one request) or beside exactly one other for all of it (a round of two):
    seconds per token = `round_s` + requests in the round x the record's own `request_s` +
    their live context x `context_token_s` + the engine's misses per token in the window x
    `miss_s`, with every coefficient held >= 0; the profile's `request_s` is the median
    record's;
  - prefill: TTFT of the requests the no-daemon arms sent to an idle engine, less the first
    token's round as the decode fit prices it (at the median speed), against the prompt's
    tokens (Theil-Sen: robust to the few that waited behind something else);
  - chunk operations: the per-operation pauses of bench/results/h200/transition.json;
  - `freetoken_rebuild_s` 0: the reference engine in `freetoken` mode is priced by its
    operations (reallocating each touched pool).
* `rtx5080-report`: the motivating report's RTX 5080 beside the real ft serve, a machine
  nobody here can measure, so every figure is derived from published ones (FreeToken PR 300's
  two decode speeds on an RTX 5090, solved for a fixed cost and a miss cost with the routing
  generator's LRU hit rates at those two slot counts; memory bandwidths from the vendors'
  data sheets; PCIe Gen5) and from the real ft serve's measured rebuilds
  (bench/results/h200/ftserve-e2e.json). Its numbers are estimates, and the file says so.

Pure arithmetic over the records (numpy); `python -m bench.replay fit` runs it.
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.replay.calibration import SCHEMA, Parameter, profile_doc
from bench.replay.records import RECORDS
from bench.replay.records import RESULTS as RECORD_FILES
from engine.reference.routing import PRESET_B, simulate_lru_hit_rate

__all__ = ["DecodeFit", "calibration_doc", "decode_fit", "decode_samples", "fit_decode",
           "h200_parameters", "main"]

RESULTS = RECORD_FILES / "h200"
_NO_DAEMON_ARMS = ("static-full", "static-short")


def _windows(rows: Sequence[Mapping[str, Any]]) -> list[tuple[float, float, Mapping[str, Any]]]:
    out = []
    for row in rows:
        if row["refused"] or row["ttft_s"] is None:
            continue
        first = row["sent_s"] + row["ttft_s"]
        out.append((first, first + row["decode_s"], row))
    return out


def decode_samples(run: Mapping[str, Any]) -> Iterator[tuple[list[float], float, int]]:
    """(terms, seconds per token, tokens) of each usable decode window of a run; terms as
    `_DECODE_TERMS`: 1, requests in the round, their live context, misses per token."""
    for arm, rows in run["per_request"].items():
        windows = _windows(rows)
        steps = [(t["t_s"], t["t_s"] + t["seconds"]) for t in run["transitions"].get(arm, ())]
        for start, end, row in windows:
            tokens = row["completion_tokens"] - 1
            lookups = row.get("window_hits", 0) + row.get("window_misses", 0)
            if tokens < 10 or not lookups or end <= start:
                continue
            if any(t0 < end and t1 > start for t0, t1 in steps):
                continue
            overlaps = [((min(end, e) - max(start, s)) / (end - start), other)
                        for s, e, other in windows
                        if other is not row and s < end and e > start]
            if not overlaps:
                batch, context = 1, row["prompt_tokens"] + tokens / 2
            elif len(overlaps) == 1 and overlaps[0][0] > 0.97:
                other = overlaps[0][1]
                batch = 2
                context = (row["prompt_tokens"] + tokens / 2 + other["prompt_tokens"]
                           + other["completion_tokens"] / 2)
            else:
                continue
            yield ([1.0, float(batch), context, row["window_misses"] / tokens],
                   row["decode_s"] / tokens, tokens)


def _nonnegative_lstsq(x: np.ndarray, y: np.ndarray, w: np.ndarray, kept: int) -> np.ndarray:
    """Weighted least squares with every coefficient >= 0: the best fit over the subsets of
    the shared terms (the columns after the first `kept`, which every fit keeps) whose own fit
    is non-negative (three shared terms: eight small fits)."""
    sw = np.sqrt(w)
    best: tuple[float, np.ndarray] | None = None
    n = x.shape[1]
    for k in range(n - kept + 1):
        for shared in itertools.combinations(range(kept, n), k):
            cols = [*range(kept), *shared]
            coef, *_ = np.linalg.lstsq(x[:, cols] * sw[:, None], y * sw, rcond=None)
            if (coef < 0).any():
                continue
            full = np.zeros(n)
            full[cols] = coef
            err = float(np.sum(w * (x @ full - y) ** 2))
            if best is None or err < best[0]:
                best = (err, full)
    assert best is not None, "no non-negative fit"
    return best[1]


@dataclass(frozen=True, slots=True)
class DecodeFit:
    """The decode terms: `round_s`, `context_token_s` and `miss_s` shared by every record, and
    each record's own cost per request in a round. Why one per record: the same work on the
    same card runs up to 28 % apart from one device call to the next (the A/A rows of the
    fidelity table) while a miss costs the same in every call, so a common per-request cost
    would charge every call's speed to the context and miss terms instead. A replay of a new
    call is priced at the median record's speed."""

    request_s_by_record: Mapping[str, float]
    round_s: float
    context_token_s: float
    miss_s: float
    windows: int
    median_residual: float

    @property
    def request_s(self) -> float:
        return float(statistics.median(self.request_s_by_record.values()))


def fit_decode(runs_by_record: Mapping[str, Sequence[Mapping[str, Any]]]) -> DecodeFit:
    """The decode fit over every usable window of the runs of each record (a record without
    one is left out); its residual is token-weighted, each window priced at its own record's
    speed."""
    samples = {name: [s for run in runs for s in decode_samples(run)]
               for name, runs in runs_by_record.items()}
    names = [name for name, got in samples.items() if got]
    rows = [([float(name == own) * terms[1] for own in names] + [1.0, terms[2], terms[3]],
             seconds, tokens) for name in names for terms, seconds, tokens in samples[name]]
    x = np.array([r[0] for r in rows])
    y = np.array([r[1] for r in rows])
    w = np.array([r[2] for r in rows], dtype=float)
    coef = _nonnegative_lstsq(x, y, w, kept=len(names))
    residual = np.abs(x @ coef / y - 1)
    order = np.argsort(residual)
    cumulative = np.cumsum(w[order])
    median = float(residual[order][np.searchsorted(cumulative, cumulative[-1] / 2)])
    round_s, context_token_s, miss_s = map(float, coef[len(names):])
    return DecodeFit(dict(zip(names, map(float, coef[:len(names)]), strict=True)), round_s,
                     context_token_s, miss_s, len(rows), median)


def _idle_prefills(run: Mapping[str, Any]) -> Iterator[tuple[int, float, float]]:
    """(prompt tokens, TTFT, its misses per lookup) of requests a no-daemon arm sent while
    nothing else ran or waited."""
    for arm in _NO_DAEMON_ARMS:
        rows = [r for r in run["per_request"].get(arm, ()) if not r["refused"]]
        spans = [(r["sent_s"], r["sent_s"] + (r["ttft_s"] or 0.0) + r["decode_s"], r)
                 for r in rows]
        for sent, _, row in spans:
            if row["ttft_s"] is None or any(s < sent < e for s, e, o in spans if o is not row):
                continue
            yield row["prompt_tokens"], row["ttft_s"], run["arms"][arm]["hit_rate"] or 0.0


def _theil_sen(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """(intercept, slope): the median of the pairwise slopes, then the median intercept. A
    prefill that waited behind something else (a rebuild, a held request) is an outlier a
    least-squares line bends to: two such of 148 doubled its intercept."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    i, j = np.triu_indices(len(xs), 1)
    apart = xs[i] != xs[j]
    slope = float(np.median((ys[j] - ys[i])[apart] / (xs[j] - xs[i])[apart]))
    return float(np.median(ys - slope * xs)), slope


def fit_prefill(runs: Sequence[Mapping[str, Any]], decode: DecodeFit,
                lookups_per_token: int) -> tuple[float, float, int]:
    points = []
    for run in runs:
        for prompt, ttft, hit_rate in _idle_prefills(run):
            first_round = (decode.round_s + decode.request_s + decode.context_token_s * prompt
                           + decode.miss_s * lookups_per_token * (1 - hit_rate))
            points.append((prompt, max(0.0, ttft - first_round)))
    intercept, slope = _theil_sen([p for p, _ in points], [t for _, t in points])
    return max(0.0, intercept), max(0.0, slope), len(points)


def _chunk_costs(transition: Mapping[str, Any]) -> dict[str, Parameter]:
    by_op = transition["incremental"]["transition"]["chunk_pauses_by_op"]
    bandwidth = transition["bandwidth"]

    def mean_ms(*keys: str) -> float:
        count = sum(by_op[k]["count"] for k in keys if k in by_op)
        return sum(by_op[k]["sum_ms"] for k in keys if k in by_op) / count

    source = "bench/results/h200/transition.json (3 GiB KV -> experts on the H200)"
    h2d = bandwidth["h2d_pinned_bytes_per_s"]
    moved = transition["incremental"]["transition"].get("moved_bytes", 9.4e6)
    move_ms = max(0.0, mean_ms("kv:move") - 2 * moved / h2d * 1e3)
    return {
        "alloc_s": Parameter(mean_ms("kv:alloc", "moe:alloc") / 1e3, "s",
                             f"{source}: mean of its kv and moe alloc pauses"),
        "free_s": Parameter(mean_ms("kv:free", "moe:free") / 1e3, "s",
                            f"{source}: mean of its free pauses"),
        "move_s": Parameter(move_ms / 1e3, "s",
                            f"{source}: its one move pause less its bytes' round trip over "
                            "the pinned host link (one sample)"),
        "d2d_bytes_per_s": Parameter(float(bandwidth["d2d_bytes_per_s"]), "B/s",
                                     f"{source}: device-to-device copy bandwidth"),
        "h2d_bytes_per_s": Parameter(float(h2d), "B/s",
                                     f"{source}: pinned host-to-device bandwidth"),
    }


def _ftserve_rebuild_steps(doc: Any) -> Iterator[float]:
    if isinstance(doc, Mapping):
        for key, value in doc.items():
            if key == "steps" and isinstance(value, list):
                yield from (s["seconds"] for s in value if isinstance(s, Mapping)
                            and isinstance(s.get("seconds"), int | float))
            else:
                yield from _ftserve_rebuild_steps(value)
    elif isinstance(doc, list):
        for value in doc:
            yield from _ftserve_rebuild_steps(value)


# Published figures behind the rtx5080-report profile (see ../shared/docs/reference-numbers.md).
PR300_RTX5090 = {"slots_262k": 4627, "tps_262k": 63.0, "slots_65k": 6425, "tps_65k": 83.8}
RTX5090_BYTES_PER_S = 1.792e12  # GDDR7, vendor data sheet
RTX5080_BYTES_PER_S = 0.960e12
QWEN38_LAYERS, QWEN38_TOP_K = 48, 10
REPORT_KV_BYTES_PER_TOKEN = 7883  # tests/fixtures/seed-rtx5080-status.json (nvfp4 KV)


def _report_profile(h200: Mapping[str, Parameter], ftserve_steps: Sequence[float],
                    hit_tokens: int) -> dict[str, Parameter]:
    p = PR300_RTX5090
    lookups = QWEN38_LAYERS * QWEN38_TOP_K
    hit = {n: simulate_lru_hit_rate(PRESET_B, QWEN38_LAYERS, n, hit_tokens, seed=1,
                                    warmup_tokens=hit_tokens // 2)
           for n in (p["slots_262k"], p["slots_65k"])}
    misses = {n: lookups * (1 - h) for n, h in hit.items()}
    t_262k, t_65k = 1 / p["tps_262k"], 1 / p["tps_65k"]
    miss_s = (t_262k - t_65k) / (misses[p["slots_262k"]] - misses[p["slots_65k"]])
    fixed_5090 = t_65k - misses[p["slots_65k"]] * miss_s
    pr300 = (f"FreeToken PR 300 on an RTX 5090 (Qwen3.8-Flash-Next NVFP4): "
             f"{p['tps_262k']} tok/s at {p['slots_262k']} slots, {p['tps_65k']} at "
             f"{p['slots_65k']}; routing preset B's LRU gives hit rates "
             f"{hit[p['slots_262k']]:.3f} and {hit[p['slots_65k']]:.3f} there")
    chunk = {k: Parameter(v.value, v.unit, f"assumed as on the H200 ({v.source}): no chunked "
                          "engine runs on this card") for k, v in h200.items()
             if k in ("alloc_s", "free_s", "move_s", "d2d_bytes_per_s")}
    return {
        "round_s": Parameter(0.0, "s", "batch 1 (--max-running-requests 1): folded into "
                             "request_s"),
        "request_s": Parameter(fixed_5090 * RTX5090_BYTES_PER_S / RTX5080_BYTES_PER_S, "s",
                               f"estimate: the fixed cost solved from {pr300} "
                               f"({fixed_5090 * 1e3:.2f} ms), scaled by memory bandwidth "
                               f"{RTX5090_BYTES_PER_S / 1e12:g} -> "
                               f"{RTX5080_BYTES_PER_S / 1e12:g} TB/s (batch-1 decode is "
                               "memory-bound)"),
        "context_token_s": Parameter(REPORT_KV_BYTES_PER_TOKEN / RTX5080_BYTES_PER_S, "s",
                                     "lower bound: one read of a context token's KV "
                                     "(7,883 B nvfp4) at the RTX 5080's 0.96 TB/s"),
        "miss_s": Parameter(miss_s, "s", f"solved from {pr300}; the link is PCIe 5.0 x16 on "
                            "both cards (pure transfer of a 2.77 MB expert: ~54 us)"),
        "prefill_s": Parameter(0.0, "s", "assumption (no published figure); at batch 1 a "
                               "prefill only delays the next request, it never stalls a decode"),
        "prefill_token_s": Parameter(1 / 5000, "s", "assumption: 5,000 prompt tokens/s (no "
                                     "published figure; see prefill_s)"),
        **chunk,
        "h2d_bytes_per_s": Parameter(5.2e10, "B/s", "PCIe 5.0 x16 pinned, ~52 GB/s (reference "
                                     "numbers: 51-56 GB/s measured on Gen5 x16)"),
        "freetoken_rebuild_s": Parameter(statistics.median(ftserve_steps), "s",
                                         f"median of the real ft serve 0.1.2's "
                                         f"{len(ftserve_steps)} rebuild calls in "
                                         "bench/results/h200/ftserve-e2e.json "
                                         f"({min(ftserve_steps):.2f}-{max(ftserve_steps):.2f} s)"),
    }


def _record_runs(records: Sequence[str]) -> dict[str, list[Mapping[str, Any]]]:
    return {name: list(json.loads((RECORD_FILES / RECORDS[name].file).read_text())["runs"]
                       .values()) for name in records}


def decode_fit(records: Sequence[str] | None = None) -> DecodeFit:
    """The decode fit over `records` (names of bench/replay/records.py; default all)."""
    return fit_decode(_record_runs(records or list(RECORDS)))


def h200_parameters(records: Sequence[str] | None = None) -> dict[str, Parameter]:
    """The h200-bench profile, its decode and prefill terms fitted from `records` alone
    (default all; the fidelity check leaves one out to predict it)."""
    by_record = _record_runs(records or list(RECORDS))
    runs = [run for got in by_record.values() for run in got]
    decode = fit_decode(by_record)
    lookups = 24 * 8  # gpu_engine_config: 24 layers, top-8
    prefill_s, prefill_token_s, prefills = fit_prefill(runs, decode, lookups)
    speeds = sorted(decode.request_s_by_record.values())
    fit = (f"least squares (>= 0) over {decode.windows} decode windows of "
           f"{len(by_record)} GPU records ({', '.join(by_record)}; bench/replay/records.py) "
           f"(median |residual| {decode.median_residual:.1%})")
    return {
        "round_s": Parameter(decode.round_s, "s", f"{fit}: once per round"),
        "request_s": Parameter(decode.request_s, "s", f"{fit}: per request in the round, the "
                               f"median of the {len(speeds)} records' own values "
                               f"({speeds[0] * 1e3:.2f}-{speeds[-1] * 1e3:.2f} ms; each "
                               "device call runs at its own speed: request_s_by_record)"),
        "context_token_s": Parameter(decode.context_token_s, "s",
                                     f"{fit}: per live context token of each request"),
        "miss_s": Parameter(decode.miss_s, "s", f"{fit}: per expert miss"),
        "prefill_s": Parameter(prefill_s, "s", f"TTFT of {prefills} requests sent to an idle "
                               "engine by the no-daemon arms of the same records, less the "
                               "first round: Theil-Sen intercept (median of the pairwise "
                               "slopes, then of the intercepts)"),
        "prefill_token_s": Parameter(prefill_token_s, "s", "the same fit: slope per prompt "
                                     "token"),
        **_chunk_costs(json.loads((RESULTS / "transition.json").read_text())),
        "freetoken_rebuild_s": Parameter(0.0, "s", "0: priced by the reference engine's own "
                                         "operations in freetoken mode (each touched pool "
                                         "freed, then reallocated)"),
    }


def calibration_doc(*, hit_tokens: int = 400) -> dict[str, Any]:
    """Both profiles, fitted from the records."""
    h200 = h200_parameters()
    speeds = decode_fit().request_s_by_record
    steps = list(_ftserve_rebuild_steps(json.loads((RESULTS / "ftserve-e2e.json").read_text())))
    return {
        "schema": SCHEMA,
        "written_by": "python -m bench.replay fit",
        "profiles": {
            "h200-bench": {**profile_doc(
                "The policy bench's reference engine on the H200 (emulated 16 GB card, 24 "
                "layers x 128 experts top-8, 2 MiB experts), fitted from its H200 records and "
                "the H100 per-seed runs: the card does not set a call's speed "
                "(request_s_by_record).", h200),
                # Not a cost the replay charges: the records' own speeds, which the fidelity
                # check's in-sample predictions use.
                "request_s_by_record": speeds},
            "rtx5080-report": profile_doc(
                "The motivating report's RTX 5080 16 GB beside the real ft serve 0.1.2 "
                "(Qwen3.8-Flash-Next NVFP4, tests/fixtures/seed-rtx5080-status.json): "
                "estimates from published figures, not a measurement.",
                _report_profile(h200, steps, hit_tokens)),
        },
    }


def main(out: str) -> int:
    doc = calibration_doc()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")
    for name, profile in doc["profiles"].items():
        print(name)
        for key, p in profile["parameters"].items():
            print(f"  {key:<20} {p['value']:<14.6g} {p['unit']:<4} {p['source'][:90]}")
    return 0

