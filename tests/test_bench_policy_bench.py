"""bench/policy_bench.py smoke run (CI): every arm on a handful of requests, on the CPU engine.

A short chat, a long agentic turn that only the larger rungs hold, more chat, and the next
agentic turn: the moe-ladder arms must serve everything whole, the static short geometry must
refuse or cut the long turns, and the oracle (the best rung per request) must hit the expert
cache at least as often as the static full-context geometry, which has the fewest slots.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
from pathlib import Path

import pytest

pytest.importorskip("torch")

from bench import policy_arms
from bench import policy_bench as bench
from bench.probe import PROBE_MAX_TOKENS
from bench.traces import TraceRequest


def _tiny_trace() -> list:
    r = TraceRequest
    return [
        r(0.0, "chat-0", 20, 8, "chat"),
        r(0.1, "agentic-0", 1500, 16, "agentic"),
        r(0.3, "chat-1", 40, 6, "chat"),
        r(1.5, "agentic-0", 1700, 12, "agentic"),
        r(1.6, "chat-2", 120, 24, "chat"),
    ]


@pytest.mark.timeout(90)
async def test_every_arm_on_a_tiny_trace() -> None:
    opts = policy_arms.BenchOptions(compress=1.0, quiet=True)
    run = await bench.run_bench("tiny", _tiny_trace(), opts)
    json.dumps(run)  # one JSON object, serialisable as it is
    arms = run["arms"]
    assert set(arms) == set(policy_arms.ARMS)
    for arm in policy_arms.ARMS:
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
    # Every token any arm decoded was one of the engine's reported rounds (the profile of
    # where decode time went); the CPU has no CUDA allocator counters.
    for arm in policy_arms.ARMS:
        profile = arms[arm]["engine_profile"]
        assert profile["tokens"] == arms[arm]["completion_tokens"], arm
        assert profile["decode_s"] > 0 and profile["kv_runs_mean"] >= 1
        assert "allocator" not in arms[arm]
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


@pytest.mark.timeout(120)
def test_seeds_write_one_summary_per_trace(tmp_path: Path,
                                           capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "seeds.json"
    assert bench.main(["--trace", "chat", "--seeds", "3,4", "--requests", "3", "--arms",
                       "static-full,grow-only,pinned-0,oracle", "--quiet",
                       "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["runs"]) == {"chat/seed3", "chat/seed4"}
    assert [doc["runs"][k]["seed"] for k in ("chat/seed3", "chat/seed4")] == [3, 4]
    chat = doc["traces"]["chat"]
    assert chat["seeds"] == [3, 4]
    for arm in ("static-full", "grow-only", "pinned-0", "oracle"):
        assert chat["arms"][arm] == [doc["runs"][k]["arms"][arm]["decode_tps"]
                                     for k in ("chat/seed3", "chat/seed4")]
    # The default policy's ratios, under the `headroom_vs_*` keys whatever its name.
    assert bench.DEFAULT_ARM == "pinned-0"
    assert chat["headroom_vs_grow_only"] == [
        doc["runs"][k]["ratios"]["pinned-0"]["vs_grow_only"] for k in ("chat/seed3",
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
    assert doc["meta"]["oracle_waits_for"] == "queue"  # records replay with the rule they ran
    assert set(doc["runs"]["chat"]["arms"]) == {"static-full", "oracle"}
    # On the CPU the speed probe is off unless asked for.
    assert doc["meta"]["probe"] is False and "probes" not in doc["runs"]["chat"]
    assert bench.main(["--trace", "nope"]) == 2


def test_the_probe_runs_before_every_arm_and_after_the_last(tmp_path: Path) -> None:
    """On the reference engine over loopback: each call's probes bracket its arms, a resumed
    call adds its own after the first call's, and no probe is counted as an arm."""
    first, out = tmp_path / "first.json", tmp_path / "both.json"
    common = ["--trace", "chat", "--requests", "2", "--quiet", "--probe"]
    assert bench.main([*common, "--arms", "static-full", "--out", str(first)]) == 0
    assert bench.main([*common, "--arms", "static-full,oracle", "--resume", str(first),
                       "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    run = doc["runs"]["chat"]
    assert doc["meta"]["probe"] is True
    assert [p["before"] for p in run["probes"]] == ["static-full", None, "oracle", None]
    assert set(run["arms"]) == {"static-full", "oracle"}
    for probe in run["probes"]:
        assert probe["served"] == 4 and probe["decode_tps"] > 0
        # What the host did meanwhile; no card on the CPU, so no card readings.
        assert probe["host"]["process_cores"] > 0 and probe["host"]["gpu_end"] is None
        rows = probe["per_request"]
        assert [r["prompt_tokens"] for r in rows] == [round(2048 / 36)] * 4  # --scale 36
        assert all(r["completion_tokens"] == PROBE_MAX_TOKENS for r in rows)
    # The resumed call's probes ran after the first call's were written.
    assert run["probes"][:2] == json.loads(first.read_text())["runs"]["chat"]["probes"]


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
    assert err.startswith("bench/policy_bench: cannot resume") and "seed 0 here 1" in err
    assert "\n" not in err
    assert out.read_text() == before
    assert bench.main([*common, "--resume", str(tmp_path / "missing.json")]) == 2



def test_kv_step_sets_the_moe_ladder_arms_ladder_and_is_recorded(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run.json"
    common = ["--trace", "chat", "--requests", "3", "--quiet", "--arms", "static-full,pinned-0"]
    assert bench.main([*common, "--kv-step", "8k", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["meta"]["kv_step_tokens"] == 8192
    kv = [r["kv_tokens"] for r in doc["runs"]["chat"]["ladders"]["pinned-0"]]
    scaled_step = 8192 / doc["meta"]["scale"]
    page = 16
    assert max(b - a for a, b in itertools.pairwise(kv[:-1])) <= scaled_step + page
    # Resuming under another step is another setup; a bad step is one line, nothing written.
    assert bench.main([*common, "--resume", str(out)]) == 2
    assert "kv_step_tokens 8192 here 16384" in capsys.readouterr().err
    for bad in ("0", "lots"):
        assert bench.main([*common, "--kv-step", bad, "--out", str(tmp_path / "x.json")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("bench/policy_bench: --kv-step:") and "\n" not in err
    assert not (tmp_path / "x.json").exists()

@pytest.mark.timeout(60)
async def test_a_signal_mid_trace_interrupts_the_arm_instead_of_recording_refusals() -> None:
    r = TraceRequest
    trace = [r(0.0, "s", 20, 4, "chat"), r(30.0, "s", 20, 4, "chat")]  # 30 s apart
    loop = asyncio.get_running_loop()
    # Until serve() installs its own handler, a SIGTERM must not end the test run.
    loop.add_signal_handler(signal.SIGTERM, lambda: None)
    try:
        loop.call_later(4.0, os.kill, os.getpid(), signal.SIGTERM)
        started = loop.time()
        with pytest.raises(policy_arms.ArmInterrupted, match=r"static-full: the engine was stopped "
                           r"by a signal mid-trace, \d s in, 1 of 2 requests sent"):
            await bench.run_bench("t", trace, policy_arms.BenchOptions(
                compress=1.0, quiet=True, arms=("static-full",)))
        assert loop.time() - started < 20  # it woke from the 30 s gap, not after it
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


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
    printed = capsys.readouterr().out
    assert "trace chat (3 requests)" in printed
    # Where each arm's decode time went, from the engine's rounds (no allocator on the CPU).
    decode_ms = run["arms"]["static-full"]["engine_profile"]["decode_ms_per_token"]
    assert any(line.split()[:2] == ["static-full", f"{decode_ms:.2f}"] and line.endswith("-")
               for line in printed.splitlines())
    again = json.loads(out.read_text())["runs"]["chat"]
    assert again["ratios"]["oracle"]["vs_static_full"] == round(
        again["arms"]["oracle"]["decode_tps"] / again["arms"]["static-full"]["decode_tps"], 3)
    assert again["common"]["requests"] == 3
    assert set(again["miss_model"]["arms"]) == {"static-full", "oracle"}
    assert bench.main(["--report", str(tmp_path / "missing.json")]) == 2


@pytest.mark.timeout(120)
def test_passes_run_the_arms_again_in_the_same_call(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "passes.json"
    assert bench.main(["--trace", "chat", "--seeds", "3", "--passes", "2", "--requests", "3",
                       "--arms", "static-full,pinned-0", "--quiet", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["meta"]["passes"] == 2
    first, second = doc["runs"]["chat/seed3"], doc["runs"]["chat/seed3/pass2"]
    assert (first["pass"], second["pass"]) == (1, 2)
    assert set(first["arms"]) == set(second["arms"]) == {"static-full", "pinned-0"}
    # The same requests both times: the same prompts and lengths, so the same work.
    assert [r["prompt_tokens"] for r in first["per_request"]["pinned-0"]] == [
        r["prompt_tokens"] for r in second["per_request"]["pinned-0"]]
    chat = doc["traces"]["chat"]
    assert (chat["seeds"], chat["passes"]) == ([3, 3], [1, 2])
    assert chat["arms"]["pinned-0"] == [first["arms"]["pinned-0"]["decode_tps"],
                                        second["arms"]["pinned-0"]["decode_tps"]]
    printed = capsys.readouterr().out
    assert "trace chat (3 requests, pass 2)" in printed
    assert "trace chat, seeds 3, 3 (passes 1, 2)" in printed
    assert bench.main(["--trace", "chat", "--passes", "0"]) == 2
