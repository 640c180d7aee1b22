"""CI's 2-seed replay: every workload on every arm, seeds 0 and 1, must give exactly the
numbers in golden-2-seeds.json. The replay is deterministic (virtual time, seeded routing,
seeded bootstrap), so any change here is a change of the model or of the daemon's behaviour,
and whoever makes it regenerates the file on purpose:

    python -m bench.replay seeds --seeds 2 --workers 1 --out tests/bench/replay/golden-2-seeds.json
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.policy_arms import DEFAULT_ARM, BenchOptions
from bench.replay.seeds import WORKLOADS, replay_seeds, summarize_replay

GOLDEN = Path(__file__).with_name("golden-2-seeds.json")


def test_two_seeds_replay_to_the_golden_numbers() -> None:
    golden = json.loads(GOLDEN.read_text())
    assert golden["meta"]["default_arm"] == DEFAULT_ARM
    assert golden["meta"]["kv_step_tokens"] == BenchOptions.kv_step_tokens
    runs = replay_seeds(list(WORKLOADS), [0, 1], workers=1)
    traces = json.loads(json.dumps(summarize_replay(runs, DEFAULT_ARM)))
    assert set(traces) == set(golden["traces"])
    for workload, got in traces.items():
        want = golden["traces"][workload]
        assert got["seeds"] == want["seeds"] == [0, 1]
        assert got["arms"] == want["arms"], workload  # decode tok/s, arm by arm, seed by seed
        for key in ("headroom_vs_grow_only", "headroom_vs_static_full", "headroom_vs_oracle",
                    "headroom_gap_captured", "freetoken_vs_static_full"):
            assert got[key] == want[key], (workload, key)
        assert got == want, workload
