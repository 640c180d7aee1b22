"""A GPU many-seed run beside the replay's prediction for the same trace, seed and requests.

Why: the replay decides policy on the CPU, so every GPU run it did not see is a test of it.
For each `TRACE/seedN` run of a `bench/policy_bench.py --seeds` file (bench/gpu_run.sh
`policy_seeds`), the same trace (kind, request count, seed, scale, output scale) is replayed
on every arm the run measured, and each arm is compared twice: its decode tokens/s (which
carries the device call's own speed, while the profile prices the median record's) and its
ratio to static-full in the same run (which cancels a call's common speed, and is what the
targets are made of). Two more prices take the call's own speed from work no policy touches:
the speed its static-full arm decoded at (every run has one), and, for a run that probed its
call (bench/probe.py), the probes' speed, the call's and each arm's. A run whose engine
reported its decode rounds also gets each arm's share of rounds in the host's slow state
(bench/replay/states.py), and a call that ran every arm twice (`--passes 2`) the pairs of
`pass_pairs`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.replay.calibration import Costs
from bench.replay.fidelity import arms_apart, at_static_full_speed, run_fidelity
from bench.replay.probe import arm_request_s, probe_summary
from bench.replay.records import RecordSetup, replay_run
from bench.replay.states import speed_states

__all__ = ["compare_file", "compare_run", "pass_pairs"]


def _vs_static_full(arms: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    base = arms.get("static-full", {}).get("decode_tps")
    return {arm: round(a["decode_tps"] / base, 4) for arm, a in arms.items()
            if base and a.get("served") and a.get("decode_tps")}


def _probed(setup: RecordSetup, meta: Mapping[str, Any], run: Mapping[str, Any],
            costs: Costs) -> dict[str, Any]:
    """The run priced at its probes' speeds (bench/replay/probe.py): the call's, and each
    arm's own; {} for a run without probes."""
    summary = probe_summary(run, costs)
    if summary is None:
        return {}
    call = replay_run(setup, meta, run, replace(costs, request_s=summary["call_request_s"]))
    # The oracle is priced by the other arms' replays, so it is replayed with them.
    by_arm = arms_apart(
        (arm, replay_run(setup, meta, run, replace(costs, request_s=request_s),
                         None if arm == "oracle" else [arm]))
        for arm, request_s in arm_request_s(run, costs).items())
    return {"probe": summary, "tps_at_call_probe": run_fidelity(call, run),
            "tps_at_arm_probes": run_fidelity(by_arm, run, by_arm["arms"])}


def _at_static_full_speed(setup: RecordSetup, meta: Mapping[str, Any],
                          run: Mapping[str, Any], costs: Costs) -> dict[str, Any]:
    """`at_static_full_speed` of the run; {} without static-full."""
    got = at_static_full_speed(run, costs, lambda c: replay_run(setup, meta, run, c))
    if got is None:
        return {}
    request_s, fidelity = got
    return {"static_full_request_s": round(request_s, 6), "tps_at_static_full_speed": fidelity}


def compare_run(run: Mapping[str, Any], meta: Mapping[str, Any], costs: Costs,
                ) -> dict[str, Any]:
    """One run of today's bench (its code: `RecordSetup`'s defaults) beside its replay: at the
    profile's speed and, where the run probed its call, at the probes' (`_probed`)."""
    setup = RecordSetup(file="")
    replayed = replay_run(setup, meta, run, costs)
    predicted = replayed["arms"]
    measured_ratio, predicted_ratio = _vs_static_full(run["arms"]), _vs_static_full(predicted)
    return {"trace": run["trace"], "seed": run["seed"], "requests": run["requests"],
            "kv_step_tokens": meta.get("kv_step_tokens", setup.kv_step_tokens),
            "tps": run_fidelity(replayed, run),
            "vs_static_full": {arm: {"measured": measured_ratio[arm],
                                     "predicted": predicted_ratio.get(arm),
                                     "error": None if arm not in predicted_ratio else round(
                                         predicted_ratio[arm] / measured_ratio[arm] - 1, 4)}
                               for arm in measured_ratio},
            **_at_static_full_speed(setup, meta, run, costs),
            **_probed(setup, meta, run, costs),
            **({"speed_states": states} if (states := speed_states(run, costs)) else {})}


def compare_file(path: Path, costs: Costs) -> dict[str, Any]:
    doc = json.loads(path.read_text())
    return {key: compare_run(run, doc["meta"], costs) for key, run in doc["runs"].items()}


def _predicted_ratio(later: Mapping[str, Any], earlier: Mapping[str, Any], price: str,
                     arm: str) -> float | None:
    """`arm`'s predicted tok/s in `later` over `earlier`, both priced as `price` says."""
    got = [r.get(price, {}).get("arms", {}).get(arm, {}).get("predicted_tps")
           for r in (later, earlier)]
    return None if None in got else round(got[0] / got[1], 4)


def pass_pairs(runs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each arm a probed call ran twice (`--passes 2`: A B A B): its second pass's decode
    tokens/s over its first's, measured, and as the replay predicts it priced at the arm's
    own probes and at the call's. The same work on the same code, so a measured ratio off 1
    is the device's drift, and the probes are worth pricing an arm at only if the ratio at
    the arm's probes follows the measured one closer than 1 does."""
    out = []
    for key, first in runs.items():
        second = runs.get(f"{key}/pass2")
        if second is None or "probe" not in first or "probe" not in second:
            continue
        for arm, row in first["tps"]["arms"].items():
            again = second["tps"]["arms"].get(arm, {})
            if "error" not in row or "error" not in again:
                continue
            out.append({"run": key, "arm": arm,
                        "measured": round(again["measured_tps"] / row["measured_tps"], 4),
                        "at_arm_probes": _predicted_ratio(second, first, "tps_at_arm_probes",
                                                          arm),
                        "at_call_probe": _predicted_ratio(second, first, "tps_at_call_probe",
                                                          arm)})
    return out
