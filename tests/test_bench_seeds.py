"""bench/seeds.py: many seeds summed up per trace, targets on medians (agentic: every seed)."""

from __future__ import annotations

from typing import Any

from bench.seeds import render_summary, run_key, summarize, target_bounds


def _run(trace: str, seed: int, tps: dict[str, float], refused: int = 0) -> dict[str, Any]:
    def ratio(arm: str, base: str) -> float | None:
        return round(tps[arm] / tps[base], 3) if arm in tps and base in tps else None

    return {"trace": trace, "seed": seed,
            "arms": {a: {"decode_tps": v, "refused": refused if a == "headroom" else 0,
                         "truncated": 0} for a, v in tps.items()},
            "ratios": {a: {"vs_static_full": ratio(a, "static-full"),
                           "vs_grow_only": ratio(a, "grow-only"),
                           "vs_oracle": ratio(a, "oracle")} for a in tps}}


def test_summary_keeps_each_seed_and_takes_median_and_spread() -> None:
    runs = {run_key("mixed", s): _run("mixed", s, {"static-full": 10.0, "grow-only": g,
                                                   "headroom": 15.0, "oracle": 15.0,
                                                   "freetoken-headroom": f})
            for s, g, f in ((2, 12.0, 13.0), (0, 10.0, 11.0), (1, 15.0, 12.0))}
    mixed = summarize(runs, "headroom")["mixed"]
    assert mixed["seeds"] == [0, 1, 2]
    assert mixed["arms"]["grow-only"] == [10.0, 15.0, 12.0]
    assert mixed["headroom_vs_grow_only"] == [1.5, 1.0, 1.25]
    assert mixed["median"]["headroom_vs_grow_only"] == 1.25
    assert mixed["spread"]["headroom_vs_grow_only"] == [1.0, 1.5]
    assert mixed["freetoken_vs_static_full"] == [1.1, 1.2, 1.3]
    assert mixed["noise_aa"] == [None, None, None]  # no freetoken-static-full arm here
    targets = mixed["targets"]
    assert targets["headroom_vs_static_full>=1.3"]["met"] is True
    assert targets["headroom_vs_grow_only>=1.1"] == {"on": "median", "value": 1.25,
                                                    "met": True}
    assert targets["headroom_vs_oracle>=0.95"]["met"] is True
    assert targets["freetoken_vs_static_full>=1.2"]["met"] is True
    assert targets["headroom refused+truncated==0"]["met"] is True
    assert "trace mixed, seeds 0, 1, 2" in render_summary({"mixed": mixed})


def test_the_a_a_pair_measures_the_noise_floor() -> None:
    runs = {run_key("handoff", s): _run("handoff", s, {"static-full": 10.0,
                                                       "freetoken-static-full": v})
            for s, v in ((0, 9.0), (1, 12.0))}
    handoff = summarize(runs, "headroom")["handoff"]
    assert handoff["noise_aa"] == [0.9, 1.2]
    assert handoff["spread"]["noise_aa"] == [0.9, 1.2]
    assert "noise_aa" in render_summary({"handoff": handoff})


def test_agentic_must_match_grow_only_on_every_seed_and_refusals_count() -> None:
    runs = {run_key("agentic", s): _run("agentic", s, {"static-full": 10.0, "grow-only": 20.0,
                                                       "headroom": h}, refused=r)
            for s, h, r in ((0, 21.0, 0), (1, 19.0, 1), (2, 22.0, 0))}
    targets = summarize(runs, "headroom")["agentic"]["targets"]
    # The median (1.05) passes 0.98, but seed 1 (0.95) does not.
    assert targets["headroom_vs_grow_only>=0.98"] == {"on": "every seed", "value": 0.95,
                                                     "met": False}
    assert targets["headroom refused+truncated==0"] == {"on": "every seed", "value": 1,
                                                       "met": False}
    assert "MISSED" in render_summary(summarize(runs, "headroom"))


def test_target_bounds_follow_the_issue() -> None:
    assert target_bounds("agentic", "headroom")["vs_grow_only"] == 0.98
    assert target_bounds("handoff", "headroom") == {"vs_static_full": 1.3,
                                                    "vs_grow_only": 1.1, "vs_oracle": 0.95}
    assert target_bounds("mixed", "freetoken-headroom") == {"vs_static_full": 1.2}
