"""A call's speed from its probes (or its static-full arm): solved back from work replayed at
a known speed, and a run priced at it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench.policy_arms import BenchOptions, gpu_engine_config
from bench.policy_bench import probe_record
from bench.probe import PROBE, PROBE_PROMPT_TOKENS, probe_trace
from bench.replay.arms import World, replay_arm
from bench.replay.calibration import DEFAULT_CALIBRATION, Costs, load_profile
from bench.replay.compare import compare_run
from bench.replay.experts import RoutingBank
from bench.replay.probe import arm_request_s, probe_request_s, probe_summary
from bench.replay.records import RecordSetup, replay_run
from bench.replay.server import ServerSpec
from bench.replay.vloop import run_virtual

SPEC = ServerSpec.from_engine_config(gpu_engine_config())
COSTS, _ = load_profile(DEFAULT_CALIBRATION, "h200-bench")
OPTS = BenchOptions(device="cuda", scale=1.0, quiet=True, threads=None)
RUN = (Path(__file__).resolve().parents[3] / "bench" / "results" / "h100" / "seeds"
       / "mixed-2" / "ladder-seeds.json")


def replayed_probe(costs: Costs, before: str | None) -> dict:
    """A probe as the bench records it, run on the simulated server priced by `costs`."""
    world = World("probe", SPEC, costs)
    result = run_virtual(replay_arm(PROBE, probe_trace(PROBE_PROMPT_TOKENS), OPTS, world,
                                    RoutingBank(SPEC.routing, 0)))
    return probe_record(result, before, 0.0, None)


@pytest.mark.parametrize("speed", [0.6, 1.0, 1.5])
def test_a_probe_gives_back_the_speed_it_ran_at(speed: float) -> None:
    costs = dataclasses.replace(COSTS, request_s=COSTS.request_s * speed)
    probe = replayed_probe(costs, "static-full")
    assert probe["served"] == 4 and probe["decode_tps"] > 0
    # Held at the calibration's other costs, one unknown: the request cost it ran at.
    assert probe_request_s(probe, COSTS) == pytest.approx(costs.request_s, rel=0.01)


def test_each_arm_is_priced_by_the_probes_around_it() -> None:
    slow, fast = (replayed_probe(dataclasses.replace(COSTS, request_s=COSTS.request_s * f), b)
                  for f, b in ((1.4, "static-full"), (0.8, "pinned-0")))
    after = replayed_probe(COSTS, None)
    run = {"probes": [slow, fast, after]}
    speeds = [probe_request_s(p, COSTS) for p in run["probes"]]
    got = arm_request_s(run, COSTS)
    assert got == pytest.approx({"static-full": (speeds[0] + speeds[1]) / 2,
                                 "pinned-0": (speeds[1] + speeds[2]) / 2})
    summary = probe_summary(run, COSTS)
    assert summary is not None
    assert summary["before"] == ["static-full", "pinned-0", None]
    assert summary["call_request_s"] == pytest.approx(speeds[2], abs=1e-6)  # the median
    assert summary["spread"] == pytest.approx(speeds[0] / speeds[1] - 1, abs=1e-3)
    assert probe_summary({}, COSTS) is None


def test_a_call_priced_at_its_probes_loses_the_speed_error() -> None:
    """A call 35 % slower than the profile's speed: at the profile's speed every arm is
    predicted far too fast; at its probes', within a point."""
    doc = json.loads(RUN.read_text())
    measured_run = doc["runs"]["mixed/seed2"]
    slow = dataclasses.replace(COSTS, request_s=COSTS.request_s * 1.35)
    arms = ["static-full", "pinned-0"]
    # The "device" is the replay itself at the slow speed, so only the speed differs.
    device = replay_run(RecordSetup(file=""), doc["meta"], measured_run, slow, arms)
    probes = [replayed_probe(slow, "static-full"), replayed_probe(slow, "pinned-0"),
              replayed_probe(slow, None)]
    run = {**measured_run, **{k: device[k] for k in ("arms", "per_request", "transitions")},
           "probes": probes}
    got = compare_run(run, doc["meta"], COSTS)
    for arm in arms:
        assert got["tps"]["arms"][arm]["error"] > 0.15
        assert abs(got["tps_at_call_probe"]["arms"][arm]["error"]) < 0.01
        assert abs(got["tps_at_arm_probes"]["arms"][arm]["error"]) < 0.01
    assert got["probe"]["spread"] < 0.01
    # Static-full never rebuilds: priced at the speed it ran, it measures the call the same.
    assert got["static_full_request_s"] == pytest.approx(slow.request_s, rel=0.01)
    assert set(got["tps_at_static_full_speed"]["arms"]) == {"pinned-0"}
    assert abs(got["tps_at_static_full_speed"]["arms"]["pinned-0"]["error"]) < 0.01
