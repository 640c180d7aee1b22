"""Fidelity: the replay's predicted decode tokens/s for every arm of every GPU record (the H200
ladder records and every per-seed run, bench/replay/records.py), beside what it measured.

Why it runs before any replay result is used: a replay that cannot reproduce the runs it was
calibrated on says nothing about the runs it was not. Two predictions per arm:

- `in_sample`: priced by the calibration file's profile (fitted on every record) at the
  record's own speed (`DecodeFit`: one cost per request a record, the same for all its arms);
  a record with no usable decode window is priced at the median speed;
- `held_out`: the decode and prefill terms refitted without the record being predicted and
  priced at the other records' median speed, so the error is the one a new device call would
  see (the chunk costs come from transition.json, not from any ladder record, and stay);
- `held_out_at_static_full_speed`: the same refit, priced at the speed the record's own
  static-full arm decoded at, and compared on its other arms: what the replay predicts when
  told only the call's speed on work no policy touches (static-full runs no daemon and never
  rebuilds; it ran first in each call, so a call whose speed moved after it shows).

An arm the replay cannot finish (`VirtualTimeExceeded`: a request left waiting for pages no
rung gives back) is reported `stalled`: the two records measured before the forwarded-demand
fix ran a daemon and engine whose other code is gone, and today's code with only their demand
accounting put back can deadlock where theirs did not.

Each arm's error also gets the interval its own requests' noise spreads it over
(bench/replay/noise.py), so an error the noise explains reads apart from a systematic one.

The device's own repeatability bounds both: `device_repeatability` lists the same no-daemon
work measured twice, across calls (two records of one trace and seed) and within one call
(static-full beside freetoken-static-full, which never rebuilds either).

An arm that served nothing (static-short, whose short context refuses every request) has no
decode speed; its served count is compared instead. The arms' order is each arm's rank by
decode tokens/s; `discordant` lists the pairs the replay orders otherwise than the record,
with the measured gap, so a swap of two arms the device itself could not tell apart reads
as what it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

from bench.replay.calibration import Costs, Parameter
from bench.replay.fit import decode_fit, h200_parameters
from bench.replay.noise import error_interval
from bench.replay.probe import window_request_s
from bench.replay.records import RECORDS, load_record, replay_record
from bench.replay.vloop import VirtualTimeExceeded

__all__ = ["FIDELITY_KINDS", "arms_apart", "at_static_full_speed", "device_repeatability",
           "fidelity_doc",
           "record_fidelity", "run_fidelity"]

# Arms that run no daemon: the same trace and seed on them is the same work in every call.
_NO_DAEMON = ("static-full", "static-short")
# Two arms of one call that do the same work: a static geometry never rebuilds in either mode.
_SAME_WORK = ("static-full", "freetoken-static-full")


def _costs(params: Mapping[str, Parameter]) -> Costs:
    return Costs(**{k: p.value for k, p in params.items()})


def _order(tps: Mapping[str, float]) -> list[str]:
    return sorted(tps, key=lambda arm: -tps[arm])


def record_fidelity(predicted: Mapping[str, Mapping[str, Any]],
                    measured: Mapping[str, Mapping[str, Any]], *,
                    predicted_rows: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
                    measured_rows: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
                    ) -> dict[str, Any]:
    """Per arm: measured and predicted decode tokens/s, the relative error, hit rates and
    served counts, and, given both arms' per-request rows, the interval the error spreads
    over on its requests' noise (bench/replay/noise.py); the two orders and the pairs they
    disagree on."""
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
            m_rows, p_rows = (measured_rows or {}).get(arm), (predicted_rows or {}).get(arm)
            if m_rows is not None and p_rows is not None:
                interval = error_interval(m_rows, p_rows)
                if interval is not None:
                    row["error_ci95"] = interval
        arms[arm] = row
    discordant = [
        {"pair": [a, b], "measured_gap": round(m_tps[a] / m_tps[b] - 1, 4),
         "predicted_gap": round(p_tps[a] / p_tps[b] - 1, 4)}
        for a, b in itertools.combinations(_order(m_tps), 2) if p_tps[a] < p_tps[b]]
    errors = [abs(r["error"]) for r in arms.values() if "error" in r]
    rows = [r for r in arms.values() if not r.get("stalled")]
    intervals = [r["error_ci95"] for r in arms.values() if "error_ci95" in r]
    return {"arms": arms,
            "measured_order": _order(m_tps), "predicted_order": _order(p_tps),
            "discordant": discordant, "max_abs_error": max(errors),
            "arms_within_10pct": sum(e <= 0.10 for e in errors), "arms_compared": len(errors),
            **({"arms_with_interval": len(intervals),
                "arms_inside_noise": sum(lo <= 0 <= hi for lo, hi in intervals)}
               if intervals else {}),
            "served_match": all(r["measured_served"] == r["predicted_served"] for r in rows),
            "stalled": [arm for arm, r in arms.items() if r.get("stalled")]}


def run_fidelity(predicted: Mapping[str, Any], measured: Mapping[str, Any],
                 arms: Collection[str] | None = None) -> dict[str, Any]:
    """`record_fidelity` of a replay and the record it replays (each with its `arms` and
    `per_request`), on the measured arms in `arms` (all by default)."""
    compared = {a: m for a, m in measured["arms"].items() if arms is None or a in arms}
    return record_fidelity(predicted["arms"], compared,
                           predicted_rows=predicted.get("per_request"),
                           measured_rows=measured.get("per_request"))


def arms_apart(replays: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """One replay document (`arms`, `per_request`) of arms replayed apart: each arm's summary
    and requests taken from its own replay."""
    out: dict[str, Any] = {"arms": {}, "per_request": {}}
    for arm, replay in replays:
        for key, by_arm in out.items():
            by_arm[arm] = replay[key][arm]
    return out


def _replay_arms(name: str, costs: Costs) -> dict[str, Any]:
    """Each arm's summary and requests. A record whose oracle was priced by its other arms is
    replayed whole; the others arm by arm, so a stalled arm is left out and no other with
    it."""
    if RECORDS[name].priced_oracle:
        return replay_record(name, costs)

    def each() -> Iterator[tuple[str, Mapping[str, Any]]]:
        for arm in load_record(name)[2]["arms"]:
            with contextlib.suppress(VirtualTimeExceeded):
                yield arm, replay_record(name, costs, [arm])

    return arms_apart(each())


def _spread(values: Sequence[float]) -> float:
    return round(max(values) / min(values) - 1, 4)


def device_repeatability(names: Sequence[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """The device against itself: the same no-daemon work measured twice, in two records of
    one trace, seed and engine (`across_calls`) and by two arms of one record
    (`within_call`), and how far apart each pair landed. No model of the work can predict
    both closer than this."""
    seen: dict[tuple[str, str], list[tuple[str, float]]] = {}
    within = []
    for name in names or list(RECORDS):
        _, meta, run = load_record(name)
        for arm in _NO_DAEMON:
            m = run["arms"].get(arm)
            if m and m["served"]:
                key = (f"{run['trace']}/seed{run.get('seed', meta['seed'])}/{run['requests']}",
                       arm)
                seen.setdefault(key, []).append((name, m["decode_tps"]))
        pair = [run["arms"][a]["decode_tps"] for a in _SAME_WORK if a in run["arms"]]
        if len(pair) == 2:
            within.append({"record": name, "arms": list(_SAME_WORK), "measured_tps": pair,
                           "spread": _spread(pair)})
    across = [{"trace": key[0], "arm": key[1], "records": [n for n, _ in got],
               "measured_tps": [t for _, t in got], "spread": _spread([t for _, t in got])}
              for key, got in seen.items() if len(got) > 1]
    return {"across_calls": across, "within_call": within}


# A gap the device itself cannot resolve (its within-call A/A reaches 11 %) is no evidence
# that the replay orders two arms wrongly.
_CLEAR_GAP = 0.05


def _summary(entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {"max_abs_error": max(e["max_abs_error"] for e in entries),
            "arms_within_10pct": sum(e["arms_within_10pct"] for e in entries),
            "arms_compared": sum(e["arms_compared"] for e in entries),
            "discordant_pairs": sum(len(e["discordant"]) for e in entries),
            "arms_with_interval": sum(e.get("arms_with_interval", 0) for e in entries),
            "arms_inside_noise": sum(e.get("arms_inside_noise", 0) for e in entries),
            "discordant_pairs_clear": sum(abs(d["measured_gap"]) > _CLEAR_GAP
                                          for e in entries for d in e["discordant"])}


# The predictions each record gets, in the order the tables show them.
FIDELITY_KINDS = ("in_sample", "held_out", "held_out_at_static_full_speed")


def at_static_full_speed(run: Mapping[str, Any], costs: Costs,
                         replay: Callable[[Costs], Mapping[str, Any]],
                         ) -> tuple[float, dict[str, Any]] | None:
    """`run`'s other arms priced at the speed its static-full arm decoded at: (that per-request
    cost, solved from its windows as a probe's are with `costs`' other terms held, and the
    fidelity of the replay `replay(costs at that speed)` gives). Static-full runs no daemon
    and never rebuilds, so it measures the call like a probe, in every run recorded before
    the probe existed; it ran first in each call, so a call whose speed moved after it shows. None
    without a usable static-full window or another arm."""
    rows = run.get("per_request", {}).get("static-full")
    request_s = None if rows is None else window_request_s(rows, costs)
    arms = {a: m for a, m in run["arms"].items() if a != "static-full"}
    if request_s is None or not arms:
        return None
    predicted = replay(dataclasses.replace(costs, request_s=request_s))
    return request_s, run_fidelity(predicted, run, arms)


def fidelity_doc(costs: Costs, names: Sequence[str] | None = None, *,
                 held_out: bool = True) -> dict[str, Any]:
    """Every record in `names` (all by default) replayed, in sample and (with `held_out`)
    with its own record left out of the decode fit."""
    speeds = decode_fit().request_s_by_record
    out: dict[str, Any] = {}
    for name in names or list(RECORDS):
        _, _, run = load_record(name)
        own = dataclasses.replace(costs, request_s=speeds.get(name, costs.request_s))
        entry: dict[str, Any] = {
            "record": RECORDS[name].file, "note": RECORDS[name].note,
            "request_s": own.request_s,
            "in_sample": run_fidelity(_replay_arms(name, own), run)}
        if held_out:
            refit = _costs(h200_parameters(records=[r for r in RECORDS if r != name]))
            entry["held_out"] = run_fidelity(_replay_arms(name, refit), run)
            got = at_static_full_speed(run, refit, lambda c, name=name: _replay_arms(name, c))
            if got is not None:
                entry["static_full_request_s"], entry["held_out_at_static_full_speed"] = got
        out[name] = entry
    summary = {
        group: {kind: _summary([e[kind] for n, e in out.items() if kind in e
                                and (group == "all" or RECORDS[n].group == group)])
                for kind in FIDELITY_KINDS if any(kind in e for e in out.values())}
        for group in ("all", *dict.fromkeys(RECORDS[n].group for n in out))}
    return {"records": out, "summary": summary,
            "device_repeatability": device_repeatability(names)}
