"""bench/ladder.py smoke run (CI): every arm on a handful of requests, on the CPU engine.

A short chat, a long agentic turn that only the larger rungs hold, more chat, and the next
agentic turn: the moe-ladder arms must serve everything whole, the static short geometry must
refuse or cut the long turns, and the oracle (the best rung per request) must hit the expert
cache at least as often as the static full-context geometry, which has the fewest slots.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("torch")


def _load_bench() -> ModuleType:
    # bench/ is not a package (and is not installed); load the file itself.
    path = Path(__file__).resolve().parents[1] / "bench" / "ladder.py"
    spec = importlib.util.spec_from_file_location("bench_ladder", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses look the module up, and the daemon loads `bench_ladder:GrowOnly` by name.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = _load_bench()


def _tiny_trace() -> list:
    r = bench.TraceRequest
    return [
        r(0.0, "chat-0", 20, 8, "chat"),
        r(0.1, "agentic-0", 1500, 16, "agentic"),
        r(0.3, "chat-1", 40, 6, "chat"),
        r(1.5, "agentic-0", 1700, 12, "agentic"),
        r(1.6, "chat-2", 120, 24, "chat"),
    ]


@pytest.mark.timeout(90)
async def test_every_arm_on_a_tiny_trace() -> None:
    opts = bench.BenchOptions(compress=1.0, quiet=True)
    run = await bench.run_bench("tiny", _tiny_trace(), opts)
    json.dumps(run)  # one JSON object, serialisable as it is
    arms = run["arms"]
    assert set(arms) == set(bench.ARMS)
    for arm in bench.ARMS:
        assert arms[arm]["requests"] == 5
        assert len(run["per_request"][arm]) == 5
        assert set(run["ratios"][arm]) == {"vs_static_full", "vs_grow_only", "vs_oracle"}
    for arm in ("headroom", "throughput", "pinned-0", "grow-only", "static-full", "oracle",
                "freetoken-static-full", "freetoken-grow-only", "freetoken-headroom"):
        assert arms[arm]["refused"] == 0, (arm, run["per_request"][arm])
        assert arms[arm]["truncated"] == 0, (arm, run["per_request"][arm])
        assert arms[arm]["decode_tps"] > 0
    # The bottom rung holds 128 KV tokens: both agentic turns are refused there, and the
    # 120-token chat (plus its 24 tokens out) is cut short or refused.
    short = run["per_request"]["static-short"]
    assert all(row["refused"] for row in short if row["kind"] == "agentic")
    assert short[4]["refused"] or short[4]["truncated"]
    assert arms["static-short"]["refused"] + arms["static-short"]["truncated"] >= 3
    # Each request's hit rate over its own decode window (None when the client read all its
    # tokens at once): within the arm's lookups.
    for arm in ("static-full", "headroom"):
        rates = [r["window_hit_rate"] for r in run["per_request"][arm]
                 if r["window_hit_rate"] is not None]
        assert rates and all(0.0 <= rate <= 1.0 for rate in rates)
        window = sum(r["window_hits"] + r["window_misses"] for r in run["per_request"][arm])
        assert 0 < window <= arms[arm]["expert_hits"] + arms[arm]["expert_misses"]
    # The best rung for each request has at least the slots of the top rung.
    assert arms["oracle"]["hit_rate"] >= arms["static-full"]["hit_rate"]
    assert arms["oracle"]["bench_driven"] is True
    # The oracle ran last and was priced with what the other arms measured.
    assert list(arms)[-1] == "oracle"
    plan = run["oracle_plan"]
    assert plan["live_set_from"] == "static-full" and plan["measured_rungs"]
    ladder = run["ladders"]["headroom"]
    assert len(plan["rungs"]) == 5
    for request, rung in zip(_tiny_trace(), plan["rungs"], strict=True):
        # No planned rung is one the request alone does not fit (the page rounding aside).
        assert ladder[rung]["kv_tokens"] >= request.prompt_tokens + request.max_tokens - 16
    assert arms["oracle"]["transitions"] == arms["oracle"]["engine_rebuilds"]
    # The moe-ladder arms stepped up for the long turns, through the daemon, on both engines.
    assert arms["headroom"]["transitions"] >= 1
    assert arms["freetoken-headroom"]["transitions"] >= 1
    assert run["targets"].keys() == {"headroom", "throughput", "freetoken-headroom"}
    assert set(run["targets"]["freetoken-headroom"]) == {
        "vs_static_full>=1.2", "refused==0", "truncated==0"}


def test_grow_only_never_steps_down() -> None:
    from policies.api import LadderView, Observation, RungView

    view = LadderView(tuple(RungView(i, kv, 100 - 10 * i, 4)
                            for i, kv in enumerate((1824, 2736, 3648))))
    policy = bench.GrowOnly()

    def decide(live: int, pending: int = 0) -> int:
        return policy.decide(Observation(now_s=0.0, rung=None, live_kv_tokens=live,
                                         pending_kv_tokens=pending, active_requests=0,
                                         decode_tps=None), view).rung

    assert decide(0) == 0
    assert decide(2000) == 1
    assert decide(1000, 2000) == 2
    assert decide(0) == 2
    with pytest.raises(ValueError, match="unknown option"):
        bench.GrowOnly(step=3)


def test_the_default_arm_is_the_daemons_default_policy() -> None:
    from ladder.config import ServerConfig

    assert ServerConfig().policy == bench.DEFAULT_ARM


@pytest.mark.timeout(120)
def test_seeds_write_one_summary_per_trace(tmp_path: Path,
                                           capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "seeds.json"
    assert bench.main(["--trace", "chat", "--seeds", "3,4", "--requests", "3", "--arms",
                       "static-full,grow-only,headroom,oracle", "--quiet",
                       "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["runs"]) == {"chat/seed3", "chat/seed4"}
    assert [doc["runs"][k]["seed"] for k in ("chat/seed3", "chat/seed4")] == [3, 4]
    chat = doc["traces"]["chat"]
    assert chat["seeds"] == [3, 4]
    for arm in ("static-full", "grow-only", "headroom", "oracle"):
        assert chat["arms"][arm] == [doc["runs"][k]["arms"][arm]["decode_tps"]
                                     for k in ("chat/seed3", "chat/seed4")]
    assert chat["headroom_vs_grow_only"] == [
        doc["runs"][k]["ratios"]["headroom"]["vs_grow_only"] for k in ("chat/seed3",
                                                                        "chat/seed4")]
    assert len(chat["headroom_vs_static_full"]) == len(chat["headroom_vs_oracle"]) == 2
    assert "trace chat, seeds 3, 4" in capsys.readouterr().out
    # The two seeds replayed different requests.
    sizes = [[row["prompt_tokens"] for row in doc["runs"][k]["per_request"]["static-full"]]
             for k in ("chat/seed3", "chat/seed4")]
    assert sizes[0] != sizes[1]
    assert bench.main(["--trace", "chat", "--seeds", "x"]) == 2


def test_cli_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    assert bench.main(["--trace", "chat", "--requests", "3", "--arms", "static-full,oracle",
                       "--quiet", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["meta"]["schema"] == bench.SCHEMA
    assert set(doc["runs"]["chat"]["arms"]) == {"static-full", "oracle"}
    assert bench.main(["--trace", "nope"]) == 2


def test_resume_keeps_measured_arms_and_runs_the_rest(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    first = tmp_path / "first.json"
    common = ["--trace", "chat", "--requests", "3", "--quiet"]
    assert bench.main([*common, "--arms", "static-full", "--out", str(first)]) == 0
    measured = json.loads(first.read_text())["runs"]["chat"]
    out = tmp_path / "both.json"
    assert bench.main([*common, "--arms", "static-full,oracle", "--resume", str(first),
                       "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    run = doc["runs"]["chat"]
    assert list(run["arms"]) == ["static-full", "oracle"]
    # static-full was not run again: its figures are the first call's, to the sample.
    assert run["arms"]["static-full"] == measured["arms"]["static-full"]
    assert run["per_request"]["static-full"] == measured["per_request"]["static-full"]
    assert run["ratios"]["oracle"]["vs_static_full"] == round(
        run["arms"]["oracle"]["decode_tps"] / run["arms"]["static-full"]["decode_tps"], 3)
    assert len(doc["meta"]["previous_calls"]) == 1
    assert doc["meta"]["previous_calls"][0]["arms"] == ["static-full"]

    # Another setup is refused in one line, and the file is left as it was.
    before = out.read_text()
    assert bench.main([*common, "--seed", "1", "--resume", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bench/ladder: cannot resume") and "seed 0 here 1" in err
    assert "\n" not in err
    assert out.read_text() == before
    assert bench.main([*common, "--resume", str(tmp_path / "missing.json")]) == 2


def test_miss_cost_is_the_fitted_slope() -> None:
    def arm(misses_per_token: float, refused: int = 0) -> dict:
        # 5 ms a token plus 40 us a miss, over 1,000 tokens.
        return {"expert_misses": int(misses_per_token * 1000), "decode_tokens": 1000,
                "decode_s": 1000 * (5e-3 + misses_per_token * 40e-6), "refused": refused,
                "truncated": 0}

    cost = bench._miss_cost({"a": arm(10), "b": arm(100), "c": arm(150),
                             "short": arm(1, refused=3)})
    assert cost == {"us_per_miss": 40.0, "ms_per_token_without_misses": 5.0, "arms": 3}
    assert bench._miss_cost({"a": arm(10), "b": arm(10)}) is None


def test_miss_model_prices_each_miss_at_one_copy_and_shows_the_residual() -> None:
    def arm(misses: int, extra_s: float = 0.0, refused: int = 0) -> dict:
        # 10 ms a token plus 50 us a miss, over 1,000 tokens; `extra_s` is noise.
        return {"expert_misses": misses, "decode_tokens": 1000, "refused": refused,
                "truncated": 0, "decode_s": 1000 * 10e-3 + misses * 50e-6 + extra_s}

    model = bench._miss_model({"static-full": arm(100_000), "grow-only": arm(20_000),
                               "headroom": arm(10_000), "static-short": arm(0, refused=5)},
                              expert_copy_us=50.0)
    assert model["ms_per_token_without_misses"] == 10.0
    assert model["arms"] == {"static-full": 66.67, "grow-only": 90.91, "headroom": 95.24}
    assert model["residual"] == {"static-full": 0.0, "grow-only": 0.0, "headroom": 0.0}
    assert model["ratios"]["headroom"]["vs_grow_only"] == 1.048
    assert model["no_miss_vs_grow_only"] == 1.1  # 11 s with its misses, 10 s without

    # Noise in one arm moves its measured figure, not what its misses predict.
    noisy = bench._miss_model({"grow-only": arm(20_000, extra_s=-1.5),
                               "headroom": arm(10_000, extra_s=1.5)}, expert_copy_us=50.0)
    assert noisy["arms"] == {"grow-only": 90.91, "headroom": 95.24}
    assert noisy["residual"] == {"grow-only": -0.136, "headroom": 0.143}
    assert bench._miss_model({"grow-only": arm(1)}, expert_copy_us=None) is None


@pytest.mark.timeout(60)
async def test_a_signal_mid_trace_interrupts_the_arm_instead_of_recording_refusals() -> None:
    r = bench.TraceRequest
    trace = [r(0.0, "s", 20, 4, "chat"), r(30.0, "s", 20, 4, "chat")]  # 30 s apart
    loop = asyncio.get_running_loop()
    # Until serve() installs its own handler, a SIGTERM must not end the test run.
    loop.add_signal_handler(signal.SIGTERM, lambda: None)
    try:
        loop.call_later(4.0, os.kill, os.getpid(), signal.SIGTERM)
        started = loop.time()
        with pytest.raises(bench.ArmInterrupted, match=r"static-full: the engine was stopped "
                           r"by a signal mid-trace, \d s in, 1 of 2 requests sent"):
            await bench.run_bench("t", trace, bench.BenchOptions(
                compress=1.0, quiet=True, arms=("static-full",)))
        assert loop.time() - started < 20  # it woke from the 30 s gap, not after it
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def test_common_compares_the_requests_every_arm_served() -> None:
    def rows(*served: tuple[int, int, float]) -> list[dict]:
        return [{"index": i, "refused": tokens == 0, "completion_tokens": tokens,
                 "decode_s": seconds} for i, tokens, seconds in served]

    common = bench._common({
        "static-full": rows((0, 11, 1.0), (1, 21, 2.0), (2, 11, 1.0)),
        "headroom": rows((0, 11, 0.5), (1, 21, 1.0), (2, 0, 0.0)),  # cut before request 2
        "static-short": rows((0, 11, 0.1), (1, 0, 0.0), (2, 0, 0.0)),  # left out
    })
    assert common["requests"] == 2
    assert common["arms"] == {"static-full": 10.0, "headroom": 20.0}
    assert common["ratios"]["headroom"]["vs_static_full"] == 2.0


def test_report_rederives_a_written_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run_json = tmp_path / "run.json"
    assert bench.main(["--trace", "chat", "--requests", "3", "--arms", "static-full,oracle",
                       "--quiet", "--out", str(run_json)]) == 0
    doc = json.loads(run_json.read_text())
    run = doc["runs"]["chat"]
    del run["ratios"], run["common"]
    run_json.write_text(json.dumps(doc))
    capsys.readouterr()
    out = tmp_path / "again.json"
    assert bench.main(["--report", str(run_json), "--out", str(out)]) == 0
    assert "trace chat (3 requests)" in capsys.readouterr().out
    again = json.loads(out.read_text())["runs"]["chat"]
    assert again["ratios"]["oracle"]["vs_static_full"] == round(
        again["arms"]["oracle"]["decode_tps"] / again["arms"]["static-full"]["decode_tps"], 3)
    assert again["common"]["requests"] == 3
    assert set(again["miss_model"]["arms"]) == {"static-full", "oracle"}
    assert bench.main(["--report", str(tmp_path / "missing.json")]) == 2


def test_a_window_of_one_network_read_has_no_per_request_rate() -> None:
    row = bench.RequestRow(0, "chat-0", "chat", 20, 2, status=200, completion_tokens=2,
                           decode_s=bench.MEASURED_WINDOW_S / 100)
    assert row.decode_tps is None
    run = {"per_request": {"a": [
        {**row.to_json(), "decode_tps": 115593.6},  # as a file from before the rule has it
        {**bench.RequestRow(1, "chat-1", "chat", 20, 11, status=200, completion_tokens=11,
                            decode_s=0.5).to_json()}]},
        "arms": {"a": {"per_request_tps_median": 57796.8, "per_request_tps_mean": 57796.8}}}
    bench._rerate_requests(run)
    assert [r["decode_tps"] for r in run["per_request"]["a"]] == [None, 20.0]
    assert run["arms"]["a"] == {"per_request_tps_median": 20.0, "per_request_tps_mean": 20.0}
