"""Fidelity: the replay's predicted decode tokens/s for every arm of every H200 record, beside
what the record measured.

Why it runs before any replay result is used: a replay that cannot reproduce the runs it was
calibrated on says nothing about the runs it was not. Two predictions per arm:

- `in_sample`: priced by the calibration file's profile (fitted on all four records);
- `held_out`: the decode and prefill terms refitted without the record being predicted, so
  the error is the one a new run would see (the chunk costs come from transition.json, not
  from any ladder record, and stay).

An arm the replay cannot finish (`VirtualTimeExceeded`: a request left waiting for pages no
rung gives back) is reported `stalled`: the two records measured before the forwarded-demand
fix ran a daemon and engine whose other code is gone, and today's code with only their demand
accounting put back can deadlock where theirs did not.

An arm that served nothing (static-short, whose short context refuses every request) has no
decode speed; its served count is compared instead. The arms' order is each arm's rank by
decode tokens/s; `discordant` lists the pairs the replay orders otherwise than the record,
with the measured gap, so a swap of two arms the device itself could not tell apart reads
as what it is.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from bench.replay.calibration import Costs, Parameter
from bench.replay.fit import LADDER_RECORDS, h200_parameters
from bench.replay.records import RECORDS, load_record, replay_record
from bench.replay.vloop import VirtualTimeExceeded

__all__ = ["device_repeatability", "fidelity_doc", "record_fidelity"]

# Arms that run no daemon: the same trace and seed on them is the same work in every call.
_NO_DAEMON = ("static-full", "static-short")


def _costs(params: Mapping[str, Parameter]) -> Costs:
    return Costs(**{k: p.value for k, p in params.items()})


def _order(tps: Mapping[str, float]) -> list[str]:
    return sorted(tps, key=lambda arm: -tps[arm])


def record_fidelity(predicted: Mapping[str, Mapping[str, Any]],
                    measured: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Per arm: measured and predicted decode tokens/s, the relative error, hit rates and
    served counts; the two orders and the pairs they disagree on."""
    arms: dict[str, Any] = {}
    m_tps: dict[str, float] = {}
    p_tps: dict[str, float] = {}
    for arm, m in measured.items():
        p = predicted.get(arm)
        if p is None:
            arms[arm] = {"measured_tps": m["decode_tps"], "stalled": True}
            continue
        row: dict[str, Any] = {"measured_served": m["served"], "predicted_served": p["served"]}
        if m["served"] and p["served"]:
            m_tps[arm], p_tps[arm] = m["decode_tps"], p["decode_tps"]
            row.update(measured_tps=m["decode_tps"], predicted_tps=p["decode_tps"],
                       error=round(p["decode_tps"] / m["decode_tps"] - 1, 4),
                       measured_hit_rate=m["hit_rate"], predicted_hit_rate=p["hit_rate"])
        arms[arm] = row
    discordant = [
        {"pair": [a, b], "measured_gap": round(m_tps[a] / m_tps[b] - 1, 4),
         "predicted_gap": round(p_tps[a] / p_tps[b] - 1, 4)}
        for a, b in itertools.combinations(_order(m_tps), 2) if p_tps[a] < p_tps[b]]
    errors = [abs(r["error"]) for r in arms.values() if "error" in r]
    rows = [r for r in arms.values() if not r.get("stalled")]
    return {"arms": arms,
            "measured_order": _order(m_tps), "predicted_order": _order(p_tps),
            "discordant": discordant, "max_abs_error": max(errors),
            "served_match": all(r["measured_served"] == r["predicted_served"] for r in rows),
            "stalled": [arm for arm, r in arms.items() if r.get("stalled")]}


def _replay_arms(name: str, costs: Costs, arms: Sequence[str]) -> dict[str, Any]:
    """Each arm's summary, replayed alone (the records' oracle is the unpriced one, so no arm
    depends on another); a stalled arm is left out."""
    out = {}
    for arm in arms:
        with contextlib.suppress(VirtualTimeExceeded):
            out[arm] = replay_record(name, costs, [arm])["arms"][arm]
    return out


def device_repeatability(names: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The device against itself: every no-daemon arm measured in two records of the same
    trace, seed and engine (different device calls), and how far apart the two landed. No
    model of the work can predict both closer than this."""
    seen: dict[tuple[str, str], list[tuple[str, float]]] = {}
    for name in names or list(RECORDS):
        _, meta, run = load_record(name)
        for arm in _NO_DAEMON:
            m = run["arms"].get(arm)
            if m and m["served"]:
                key = (f"{run['trace']}/seed{meta['seed']}/{run['requests']}", arm)
                seen.setdefault(key, []).append((RECORDS[name].file, m["decode_tps"]))
    return [{"trace": key[0], "arm": key[1], "records": [f for f, _ in got],
             "measured_tps": [t for _, t in got],
             "spread": round(max(t for _, t in got) / min(t for _, t in got) - 1, 4)}
            for key, got in seen.items() if len(got) > 1]


def fidelity_doc(costs: Costs, names: Sequence[str] | None = None, *,
                 held_out: bool = True) -> dict[str, Any]:
    """Every record in `names` (all four by default) replayed arm by arm, in sample and (with
    `held_out`) with its own record left out of the decode fit."""
    out: dict[str, Any] = {}
    for name in names or list(RECORDS):
        _, _, run = load_record(name)
        entry: dict[str, Any] = {
            "record": RECORDS[name].file, "note": RECORDS[name].note,
            "in_sample": record_fidelity(_replay_arms(name, costs, run["arms"]), run["arms"])}
        if held_out:
            others = [r for r in LADDER_RECORDS if r != RECORDS[name].file]
            refit = _costs(h200_parameters(records=others))
            entry["held_out"] = record_fidelity(_replay_arms(name, refit, run["arms"]),
                                                run["arms"])
        out[name] = entry
    summary = {
        kind: {"max_abs_error": max(e[kind]["max_abs_error"] for e in out.values()),
               "arms_within_10pct": sum(abs(r["error"]) <= 0.10 for e in out.values()
                                        for r in e[kind]["arms"].values() if "error" in r),
               "arms_compared": sum("error" in r for e in out.values()
                                    for r in e[kind]["arms"].values()),
               "discordant_pairs": sum(len(e[kind]["discordant"]) for e in out.values())}
        for kind in ("in_sample", "held_out") if all(kind in e for e in out.values())}
    return {"records": out, "summary": summary,
            "device_repeatability": device_repeatability(names)}
