"""The H200 ladder records, and how to replay each as the code that measured it ran.

Why: the fidelity check replays every record already in bench/results/h200, and those were
measured by earlier versions of the bench (docs/results.md): before the pause budget (one
chunk operation per decode round), with the bench's first oracle (the lowest rung holding each
request), two of them before the gate counted forwarded, unanswered requests as live demand,
and one before the geometric ladder's steps were capped at 32k tokens. A replay of a record
takes each of those as the record ran it; everything else (trace, seed, request count, output
scale, time compression, engine) comes from the record's own `meta`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.policy_arms import BenchOptions, build_trace, gpu_engine_config
from bench.replay.arms import World, replay_trace
from bench.replay.calibration import Costs
from bench.replay.server import ServerSpec

__all__ = ["RECORDS", "RESULTS", "RecordSetup", "load_record", "replay_record"]

RESULTS = Path(__file__).resolve().parent.parent / "results" / "h200"


@dataclass(frozen=True, slots=True)
class RecordSetup:
    file: str
    # The fix of 2026-12-03 (docs/results.md): the gate's forwarded requests count as live
    # demand, and the engine re-admits waiting requests after a rebuild.
    fixed_demand: bool
    kv_step_tokens: int = 32_768
    pause_budget_s: float = 0.0
    priced_oracle: bool = False
    note: str = ""


RECORDS: dict[str, RecordSetup] = {s.file.removesuffix(".json"): s for s in (
    RecordSetup("ladder-agentic.json", fixed_demand=True,
                note="one agentic session and a second one; three device calls"),
    RecordSetup("ladder-mixed.json", fixed_demand=True,
                note="two agentic sessions beside 19 chats; two device calls"),
    RecordSetup("ladder-mixed-earlier-calls.json", fixed_demand=False,
                note="the mixed trace before the forwarded-demand fix; four device calls"),
    RecordSetup("ladder-agentic-uncapped-rungs.json", fixed_demand=False,
                kv_step_tokens=10**9,
                note="before the 32k cap on the default ladder's steps; one device call"),
)}


def load_record(name: str) -> tuple[RecordSetup, dict[str, Any], dict[str, Any]]:
    """(setup, meta, the record's one run)."""
    setup = RECORDS[name]
    doc = json.loads((RESULTS / setup.file).read_text())
    (run,) = doc["runs"].values()
    return setup, doc["meta"], run


def replay_record(name: str, costs: Costs, arms: Sequence[str] | None = None,
                  ) -> dict[str, Any]:
    """Every arm of record `name` (or `arms`) replayed as it ran, priced by `costs`."""
    setup, meta, run = load_record(name)
    config = replace(gpu_engine_config(), rebuild_pause_budget_s=setup.pause_budget_s)
    spec = replace(ServerSpec.from_engine_config(config), readmit_waiting=setup.fixed_demand)
    world = World("h200-bench", spec, costs)
    opts = BenchOptions(device="cuda", scale=meta["scale"], compress=meta["compress"],
                        seed=meta["seed"], arms=(), quiet=True, threads=None,
                        kv_step_tokens=setup.kv_step_tokens)
    trace = build_trace(run["trace"], run["requests"], seed=meta["seed"], scale=meta["scale"],
                        output_scale=meta["output_scale"])
    return replay_trace(run["trace"], trace, opts, world, list(arms or run["arms"]),
                        priced_oracle=setup.priced_oracle,
                        forwarded_demand=setup.fixed_demand)
