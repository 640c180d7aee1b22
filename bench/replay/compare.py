"""A GPU many-seed run beside the replay's prediction for the same trace, seed and requests.

Why: the replay decides policy on the CPU, so every GPU run it did not see is a test of it.
For each `TRACE/seedN` run of a `bench/policy_bench.py --seeds` file (bench/gpu_run.sh
`policy_seeds`), the same trace (kind, request count, seed, scale, output scale) is replayed
on every arm the run measured, and each arm is compared twice: its decode tokens/s (which
carries the card's speed: the H200 profile predicting an H100 run is off by the cards' gap)
and its ratio to static-full in the same run (which cancels a card's common speed, and is
what the targets are made of).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.policy_arms import BenchOptions, build_trace
from bench.replay.arms import replay_trace
from bench.replay.calibration import DEFAULT_CALIBRATION
from bench.replay.fidelity import record_fidelity
from bench.replay.seeds import world_for

__all__ = ["compare_file", "compare_run"]


def _vs_static_full(arms: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    base = arms.get("static-full", {}).get("decode_tps")
    return {arm: round(a["decode_tps"] / base, 4) for arm, a in arms.items()
            if base and a.get("served") and a.get("decode_tps")}


def compare_run(run: Mapping[str, Any], meta: Mapping[str, Any],
                calibration: Path = DEFAULT_CALIBRATION) -> dict[str, Any]:
    opts = BenchOptions(device="cuda", scale=meta["scale"], compress=meta["compress"],
                        seed=run["seed"], arms=(), quiet=True, threads=None)
    trace = build_trace(run["trace"], run["requests"], seed=run["seed"], scale=meta["scale"],
                        output_scale=meta["output_scale"])
    predicted = replay_trace(run["trace"], trace, opts, world_for("h200-bench", calibration),
                             list(run["arms"]))["arms"]
    measured_ratio, predicted_ratio = _vs_static_full(run["arms"]), _vs_static_full(predicted)
    return {"trace": run["trace"], "seed": run["seed"], "requests": run["requests"],
            "tps": record_fidelity(predicted, run["arms"]),
            "vs_static_full": {arm: {"measured": measured_ratio[arm],
                                     "predicted": predicted_ratio.get(arm),
                                     "error": None if arm not in predicted_ratio else round(
                                         predicted_ratio[arm] / measured_ratio[arm] - 1, 4)}
                               for arm in measured_ratio}}


def compare_file(path: Path, calibration: Path = DEFAULT_CALIBRATION) -> dict[str, Any]:
    doc = json.loads(path.read_text())
    return {key: compare_run(run, doc["meta"], calibration) for key, run in doc["runs"].items()}
