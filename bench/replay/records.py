"""The GPU records the replay is fitted on and checked against, and how to replay each as the
code that measured it ran.

Why: the fidelity check replays every record already in bench/results. Two kinds:

- the four H200 ladder records (bench/results/h200/ladder-*.json), measured by earlier versions
  of the bench (docs/results.md): before the pause budget (one chunk operation per decode
  round), with the bench's first oracle (the lowest rung holding each request), two of them
  before the gate counted forwarded, unanswered requests as live demand, and one before the
  geometric ladder's steps were capped at 32k tokens; each arm of them may have run in a
  different device call;
- every per-seed run of bench/gpu_run.sh `policy_seeds` (bench/results/CARD/seeds/TRACE-SEED),
  one device call each, measured by today's daemon and engine (those before `oracle_waits_for`
  entered their meta with an oracle that sent its next request only at this one's first token).

A replay of a record takes each of those as the record ran it; everything else (trace, seed,
request count, output scale, time compression, engine) comes from the record's own `meta`.
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

__all__ = ["RECORDS", "RESULTS", "RecordSetup", "load_record", "record_options", "replay_record",
           "replay_run"]

RESULTS = Path(__file__).resolve().parent.parent / "results"


@dataclass(frozen=True, slots=True)
class RecordSetup:
    file: str  # relative to bench/results
    # The fix of 2026-12-03 (docs/results.md): the gate's forwarded requests count as live
    # demand, and the engine re-admits waiting requests after a rebuild.
    fixed_demand: bool = True
    # The ladder step of a record whose meta does not name its own (all before 2026-12-07).
    kv_step_tokens: int = 32_768
    # None: the engine's own default (bench/policy_arms.py gpu_engine_config).
    pause_budget_s: float | None = None
    priced_oracle: bool = True
    note: str = ""

    @property
    def group(self) -> str:
        """Which kind of record (the fidelity summary reports each)."""
        return "seed_runs" if "/seeds/" in self.file else "ladder_records"


def _seed_runs() -> list[tuple[str, RecordSetup]]:
    """Every committed `policy_seeds` run, named CARD/TRACE-SEED, in name order."""
    out = []
    for path in sorted(RESULTS.glob("*/seeds/*/ladder-seeds.json")):
        card, _, run_dir = path.relative_to(RESULTS).parts[:3]
        out.append((f"{card}/{run_dir}",
                    RecordSetup(str(path.relative_to(RESULTS)),
                                note=f"policy_seeds on the {card.upper()}; one device call")))
    return out


def _ladder_record(file: str, note: str, *, fixed_demand: bool = True,
                   kv_step_tokens: int = 32_768) -> RecordSetup:
    """An H200 ladder record: run before the pause budget, with the bench's first oracle."""
    return RecordSetup(f"h200/{file}", fixed_demand=fixed_demand, kv_step_tokens=kv_step_tokens,
                       pause_budget_s=0.0, priced_oracle=False, note=note)


RECORDS: dict[str, RecordSetup] = {
    "ladder-agentic": _ladder_record("ladder-agentic.json", "one agentic session and a "
                                     "second one; three device calls"),
    "ladder-mixed": _ladder_record("ladder-mixed.json", "two agentic sessions beside 19 "
                                   "chats; two device calls"),
    "ladder-mixed-earlier-calls": _ladder_record(
        "ladder-mixed-earlier-calls.json", "the mixed trace before the forwarded-demand fix; "
        "four device calls", fixed_demand=False),
    "ladder-agentic-uncapped-rungs": _ladder_record(
        "ladder-agentic-uncapped-rungs.json", "before the 32k cap on the default ladder's "
        "steps; one device call", fixed_demand=False, kv_step_tokens=10**9),
    **dict(_seed_runs()),
}


def load_record(name: str) -> tuple[RecordSetup, dict[str, Any], dict[str, Any]]:
    """(setup, meta, the record's one run)."""
    setup = RECORDS[name]
    doc = json.loads((RESULTS / setup.file).read_text())
    (run,) = doc["runs"].values()
    return setup, doc["meta"], run


def replay_record(name: str, costs: Costs, arms: Sequence[str] | None = None,
                  ) -> dict[str, Any]:
    """Every arm of record `name` (or `arms`) replayed as it ran, priced by `costs`."""
    return replay_run(*load_record(name), costs, arms)


def record_options(setup: RecordSetup, meta: Any, run: Any) -> BenchOptions:
    """The bench options `run` (of a file with `meta`) was measured with. A setting the meta
    does not name ran as the code of its day did: the setup's ladder step (32k before the
    default became 16k on 2026-12-07), and an oracle that waited for each request's first
    token before sending the next."""
    return BenchOptions(device="cuda", scale=meta["scale"], compress=meta["compress"],
                        seed=run.get("seed", meta["seed"]), arms=(), quiet=True, threads=None,
                        kv_step_tokens=meta.get("kv_step_tokens", setup.kv_step_tokens),
                        oracle_waits_for=meta.get("oracle_waits_for", "first-token"))


def replay_run(setup: RecordSetup, meta: Any, run: Any, costs: Costs,
               arms: Sequence[str] | None = None) -> dict[str, Any]:
    """Every arm of `run` (or `arms`), a run of a policy_bench file with its `meta`, replayed
    as `setup` says the code that measured it ran."""
    config = gpu_engine_config()
    if setup.pause_budget_s is not None:
        config = replace(config, rebuild_pause_budget_s=setup.pause_budget_s)
    spec = replace(ServerSpec.from_engine_config(config), readmit_waiting=setup.fixed_demand)
    world = World("h200-bench", spec, costs)
    opts = record_options(setup, meta, run)
    trace = build_trace(run["trace"], run["requests"], seed=opts.seed, scale=meta["scale"],
                        output_scale=meta["output_scale"])
    return replay_trace(run["trace"], trace, opts, world, list(arms or run["arms"]),
                        priced_oracle=setup.priced_oracle,
                        forwarded_demand=setup.fixed_demand)
