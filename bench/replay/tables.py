"""The replay's Markdown tables, rendered from its JSON files, never typed by hand.

Why: the README's fidelity table and docs/results.md's many-seed tables are what a reader
trusts; `python -m bench.replay tables` prints them from bench/results/replay-fidelity.json
and bench/results/replay-seeds.json, and a test holds the documents to that output, so a
number in the docs is a number a command wrote.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from bench.replay.fidelity import FIDELITY_KINDS
from bench.seeds import FREETOKEN

__all__ = ["fidelity_markdown", "fidelity_summary_markdown", "gpu_markdown",
           "kv_step_markdown", "passes_markdown", "probe_markdown", "seeds_markdown",
           "targets_markdown"]


def _pct(value: float) -> str:
    return f"{value:+.1%}".replace("%", " %")


def _interval(row: Mapping[str, Any]) -> str:
    """An arm's error interval on its requests' noise (bench/replay/noise.py); "-" without."""
    if "error_ci95" not in row:
        return "-"
    low, high = row["error_ci95"]
    return f"{low:+.1%} to {high:+.1%}".replace("%", " %")


def fidelity_markdown(doc: Mapping[str, Any]) -> str:
    """Per record and arm: measured decode tok/s, the in-sample prediction, its error and the
    interval its requests' noise spreads that error over, and the held-out prediction and its
    error."""
    lines = ["| record | arm | measured | in sample | error | on its requests' noise, 95 % | "
             "held out | error |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, entry in doc["records"].items():
        held = entry.get("held_out", {}).get("arms", {})
        for arm, r in entry["in_sample"]["arms"].items():
            if r.get("stalled"):
                lines.append(f"| {name} | {arm} | {r['measured_tps']:.1f} | stalled | | | | |")
            elif "error" not in r:
                lines.append(f"| {name} | {arm} | served {r['measured_served']} | served "
                             f"{r['predicted_served']} | | | | |")
            else:
                h = held.get(arm, {})
                cells = (f"{h['predicted_tps']:.1f} | {_pct(h['error'])}" if "error" in h
                         else " | ")
                lines.append(f"| {name} | {arm} | {r['measured_tps']:.1f} | "
                             f"{r['predicted_tps']:.1f} | {_pct(r['error'])} | {_interval(r)} | "
                             f"{cells} |")
    return "\n".join(lines)


def _within(summary: Mapping[str, Any]) -> str:
    return (f"{summary['arms_within_10pct']}/{summary['arms_compared']}, max "
            f"{summary['max_abs_error']:.1%}".replace("%", " %"))


_GROUPS = {"ladder_records": "H200 ladder records", "seed_runs": "per-seed runs",
           "all": "all records"}


def _noise(summary: Mapping[str, Any]) -> str:
    return (f"{summary['arms_inside_noise']}/{summary['arms_with_interval']}"
            if summary.get("arms_with_interval") else "-")


def fidelity_summary_markdown(doc: Mapping[str, Any]) -> str:
    """Per record: its arms within 10 % and the largest error, in sample and held out, and in
    sample the arms whose error its requests' noise explains (the interval holds 0); then
    each group's totals, with the arm pairs ordered otherwise that the device measured more
    than 5 % apart."""
    lines = ["| record | in sample: arms within 10 %, max error | in sample: error inside "
             "its requests' noise | held out | held out, at static-full's speed (its other "
             "arms) | speed (ms per request): fitted, static-full's |",
             "|---|---|---:|---|---|---:|"]
    for name, entry in doc["records"].items():
        cells = [_within(got) if (got := entry.get(kind)) else "-" for kind in FIDELITY_KINDS]
        cells.insert(1, _noise(entry["in_sample"]))
        own = entry.get("static_full_request_s")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {entry['request_s'] * 1e3:.2f}, "
                     + ("-" if own is None else f"{own * 1e3:.2f}") + " |")
    for group, kinds in doc["summary"].items():
        cells = [f"**{_within(s)}**, {s['discordant_pairs_clear']} clear swaps"
                 if (s := kinds.get(kind)) else "-" for kind in FIDELITY_KINDS]
        cells.insert(1, f"**{_noise(kinds['in_sample'])}**")
        lines.append(f"| **{_GROUPS[group]}** | " + " | ".join(cells) + " | |")
    return "\n".join(lines)


def _cell(stats: Mapping[str, Any]) -> str:
    if not stats.get("n"):
        return "-"
    return f"{stats['median']:.3f} [{stats['median_ci95'][0]:.3f}-{stats['median_ci95'][1]:.3f}]"


_RATIOS = (("headroom_vs_grow_only", "x grow-only"), ("headroom_vs_oracle", "x oracle"),
           ("headroom_vs_static_full", "x static-full"),
           ("freetoken_vs_static_full", "freetoken x static-full"),
           ("headroom_gap_captured", "gap captured"))


def seeds_markdown(doc: Mapping[str, Any]) -> str:
    """Per workload: the default policy's ratios, median [95 % bootstrap interval] and 5th
    percentile over seeds."""
    lines = ["| workload | seeds | " + " | ".join(label for _, label in _RATIOS) + " |",
             "|---|---:|" + "---|" * len(_RATIOS)]
    for workload, s in doc["traces"].items():
        cells = [f"{_cell(s['stats'][key])}, p5 {s['stats'][key]['p5']:.3f}"
                 if s["stats"][key].get("n") else "-" for key, _ in _RATIOS]
        lines.append(f"| {workload} | {len(s['seeds'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def targets_markdown(doc: Mapping[str, Any]) -> str:
    """Every target of every workload: the value reached and met, or missed by how much."""
    lines = ["| workload | target | value | |", "|---|---|---:|---|"]
    for workload, s in doc["traces"].items():
        for name, check in s["targets"].items():
            verdict = "met" if check["met"] else f"**missed by {-check['by']:.3f}**"
            lines.append(f"| {workload} | {name} | {check['value']:.3f} | {verdict} |")
    return "\n".join(lines)


def kv_step_markdown(docs: Sequence[Mapping[str, Any]]) -> str:
    """The same seeds on several ladder steps (`seeds --kv-step`), widest step first: per
    workload the default policy against grow-only (worst seed and median), the oracle (p5)
    and static-full, freetoken mode, and the transitions a run takes (median)."""
    lines = ["| step | workload | x grow-only, worst | median | x oracle, p5 | x static-full | "
             "freetoken x static-full | transitions a run | freetoken |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    default_arms = {doc["meta"]["default_arm"] for doc in docs}
    (default,) = default_arms  # one policy's steps, not two policies'
    for doc in sorted(docs, key=lambda d: -d["meta"]["kv_step_tokens"]):
        step = f"{doc['meta']['kv_step_tokens'] // 1024}k"
        for workload, t in doc["traces"].items():
            stats = t["stats"]
            runs = [r for r in doc["runs"].values() if r["trace"] == workload]

            def transitions(arm: str, runs: list[Any] = runs) -> str:
                counts = [r["arms"][arm]["transitions"] for r in runs if arm in r["arms"]]
                return f"{statistics.median(counts):g}" if counts else "-"

            lines.append(
                f"| {step} | {workload} | {stats['headroom_vs_grow_only']['min']:.3f} | "
                f"{stats['headroom_vs_grow_only']['median']:.3f} | "
                f"{stats['headroom_vs_oracle']['p5']:.3f} | "
                f"{stats['headroom_vs_static_full']['median']:.3f} | "
                f"{stats['freetoken_vs_static_full']['median']:.3f} | "
                f"{transitions(default)} | {transitions(FREETOKEN + default)} |")
    return "\n".join(lines)


def gpu_markdown(doc: Mapping[str, Any], default_arm: str) -> str:
    """A `compare` document, a row a GPU run: its ladder step, the measured decode tok/s of
    static-full, grow-only and `default_arm`, the default against grow-only measured and
    predicted (a ratio inside one device call, so the call's own speed cancels), and the worst
    arm's tok/s error."""
    shown = ["static-full", "grow-only", default_arm]
    lines = ["| run | step | " + " | ".join(shown) + " | x grow-only, measured | predicted | "
             "max tok/s error |", "|---|---:|" + "---:|" * (len(shown) + 3)]
    for run in doc["runs"].values():
        rows = run["tps"]["arms"]
        measured = [f"{rows[a]['measured_tps']:.1f}" if a in rows else "-" for a in shown]
        ratio = {side: rows[default_arm][f"{side}_tps"] / rows["grow-only"][f"{side}_tps"]
                 for side in ("measured", "predicted")}
        worst = max(abs(r["error"]) for r in rows.values() if "error" in r)
        lines.append(f"| {run['trace']} seed {run['seed']} | {run['kv_step_tokens'] // 1024}k | "
                     + " | ".join(measured) + f" | {ratio['measured']:.3f} | "
                     f"{ratio['predicted']:.3f} | {worst:.1%} |".replace("%", " %"))
    return "\n".join(lines)


_PROBE_PRICES = ("tps", "tps_at_static_full_speed", "tps_at_call_probe", "tps_at_arm_probes")


def probe_markdown(doc: Mapping[str, Any]) -> str:
    """A `compare` document of probed GPU runs: per run, its probes' per-request cost in order
    (fixed work: the call's drift); per arm, measured tok/s and hit rate (the replay's), and
    the tok/s error at each price: the profile's speed, static-full's, the call's probes',
    the arm's own probes' (with the interval its requests' noise spreads that error over),
    and its share of decode rounds in the host's slow state (bench/replay/states.py)."""
    lines = ["| run | arm | measured tok/s | hit rate (replay) | at the profile's speed | at "
             "static-full's | at the call's probes | at its own probes | rounds in the slow "
             "state |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for key, run in doc["runs"].items():
        if "probe" not in run:
            continue
        probe, states = run["probe"], run.get("speed_states")
        speeds = ", ".join(f"{s * 1e3:.1f}" for s in probe["request_s"])
        name = f"{run['trace']} seed {run['seed']}" + (", pass 2" if key.endswith("/pass2")
                                                        else "")
        two = ("-" if states is None else
               f"{states['fast_ms']:.1f} / {states['slow_ms']:.1f} ms")
        lines.append(f"| {name} | probes, ms a request | {speeds} "
                     f"| spread {probe['spread']:.1%} | | | | | {two} |".replace("%", " %"))
        for arm, row in run["tps"]["arms"].items():
            if "error" not in row:
                continue
            cells = [_pct(got["error"]) if (got := run.get(key, {}).get("arms", {}).get(
                arm, {})).get("error") is not None else "-" for key in _PROBE_PRICES]
            own = run.get(_PROBE_PRICES[-1], {}).get("arms", {}).get(arm, {})
            if "error_ci95" in own:
                cells[-1] += f" ({_interval(own)})"
            share = (states or {}).get("slow_share", {}).get(arm)
            cells.append("-" if share is None else f"{share:.0%}".replace("%", " %"))
            lines.append(f"| | {arm} | {row['measured_tps']:.1f} | "
                         f"{row['measured_hit_rate']:.3f} ({row['predicted_hit_rate']:.3f}) | "
                         + " | ".join(cells) + " |")
    return "\n".join(lines)


def passes_markdown(doc: Mapping[str, Any]) -> str:
    """A `compare` document's arms run twice in one call: pass 2 over pass 1, measured and at
    the arm's own probes and the call's, and each pass's share of slow-state rounds."""
    lines = ["| run | arm | pass 2 / pass 1, measured | at its own probes | at the call's "
             "probes | rounds in the slow state, pass 1 -> 2 |", "|---|---|---:|---:|---:|---:|"]
    for pair in doc.get("passes", ()):
        first, second = doc["runs"][pair["run"]], doc["runs"][pair["run"] + "/pass2"]
        shares = [r.get("speed_states", {}).get("slow_share", {}).get(pair["arm"])
                  for r in (first, second)]
        moved = ("-" if None in shares else
                 f"{shares[0]:.0%} -> {shares[1]:.0%}".replace("%", " %"))
        cells = [f"{pair[k]:.3f}" if pair[k] is not None else "-"
                 for k in ("measured", "at_arm_probes", "at_call_probe")]
        lines.append(f"| {first['trace']} seed {first['seed']} | {pair['arm']} | "
                     + " | ".join(cells) + f" | {moved} |")
    return "\n".join(lines)
