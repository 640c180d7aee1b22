"""Many seeds of the policy bench, summed up per trace: a result that holds on one seed is not one.

`bench/policy_bench.py --seeds 0,1,2` runs every arm of each (trace, seed) in one go (on the GPU,
one device call per seed) and keeps each run under `runs["TRACE/seedN"]`; this module turns
those runs into the `traces` block: per trace, each arm's decode tokens/s per seed, the
default policy's ratios against `static-full`, `grow-only` and `oracle` per seed (under the
`headroom_vs_*` keys whatever the default policy is named; `meta.default_arm` names it), the
freetoken-mode ladder against `static-full`, the A/A ratio of `freetoken-static-full` to
`static-full` (`noise_aa`: both never rebuild, so any gap between them is the machine's noise,
the floor under every other ratio), refusals and truncations, median and spread
(min, max), and issue 18's targets checked on the medians (agentic's grow-only bound on
every seed). Pure: run documents in, a summary out.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["FREETOKEN", "render_summary", "run_key", "summarize", "target_bounds"]

FREETOKEN = "freetoken-"


def run_key(trace: str, seed: int) -> str:
    return f"{trace}/seed{seed}"


def target_bounds(trace_kind: str, arm: str) -> dict[str, float]:
    """Issue 18's targets for one arm of one trace: the lowest ratio each comparison may
    reach. On agentic a ladder can only match grow-only (every turn is long), elsewhere it
    must beat it; in freetoken mode only static-full is compared."""
    if arm.startswith(FREETOKEN):
        return {"vs_static_full": 1.2}
    return {"vs_static_full": 1.3, "vs_grow_only": 0.98 if trace_kind == "agentic" else 1.1,
            "vs_oracle": 0.95}


def _spread(values: Sequence[float | None]) -> tuple[float | None, list[float] | None]:
    known = [v for v in values if v is not None]
    if not known:
        return None, None
    return round(statistics.median(known), 3), [min(known), max(known)]


def _per_seed(runs: Sequence[Mapping[str, Any]], arm: str, field: str) -> list[Any]:
    return [run["arms"][arm][field] if arm in run["arms"] else None for run in runs]


def _ratio_series(runs: Sequence[Mapping[str, Any]], arm: str, key: str) -> list[float | None]:
    return [run["ratios"].get(arm, {}).get(key) for run in runs]


def summarize(runs: Mapping[str, Mapping[str, Any]], default_arm: str) -> dict[str, Any]:
    """The `traces` block of a many-seed run (see the module docstring)."""
    by_trace: dict[str, list[Mapping[str, Any]]] = {}
    for run in runs.values():
        by_trace.setdefault(run["trace"], []).append(run)
    out: dict[str, Any] = {}
    for trace, group in by_trace.items():
        group.sort(key=lambda run: (run["seed"], run.get("pass", 1)))
        arms = list(dict.fromkeys(a for run in group for a in run["arms"]))

        series: dict[str, list[float | None]] = {
            f"headroom_{key}": _ratio_series(group, default_arm, key)
            for key in ("vs_grow_only", "vs_static_full", "vs_oracle")}
        series["freetoken_vs_static_full"] = _ratio_series(group, f"{FREETOKEN}{default_arm}",
                                                           "vs_static_full")
        # Two arms that never rebuild, so they do the same work: how far apart they land is
        # what the machine alone moves a ratio (an A/A test), the floor under every other one.
        series["noise_aa"] = _ratio_series(group, f"{FREETOKEN}static-full", "vs_static_full")
        tps = {arm: _per_seed(group, arm, "decode_tps") for arm in arms}
        summary: dict[str, Any] = {
            "seeds": [run["seed"] for run in group],
            "arms": tps, **series,
            "refused": {arm: _per_seed(group, arm, "refused") for arm in arms},
            "truncated": {arm: _per_seed(group, arm, "truncated") for arm in arms},
            "median": {}, "spread": {},
        }
        passes = [run.get("pass", 1) for run in group]
        if any(p > 1 for p in passes):
            # A seed run again in the same call (`--passes`): one more sample of it.
            summary["passes"] = passes
        for name, values in [*tps.items(), *series.items()]:
            summary["median"][name], summary["spread"][name] = _spread(values)
        summary["targets"] = _targets(trace, default_arm, summary)
        out[trace] = summary
    return out


def _targets(trace: str, default_arm: str, summary: Mapping[str, Any]) -> dict[str, Any]:
    checks: dict[str, Any] = {}
    for arm, prefix in ((default_arm, "headroom_"), (f"{FREETOKEN}{default_arm}",
                                                     "freetoken_")):
        for key, bound in target_bounds(trace, arm).items():
            name = f"{prefix}{key}"
            values = [v for v in summary.get(name, ()) if v is not None]
            if not values:
                continue
            # Matching grow-only on agentic is promised on every seed, the rest on the median.
            every_seed = trace == "agentic" and key == "vs_grow_only"
            reached = min(values) if every_seed else summary["median"][name]
            checks[f"{name}>={bound:g}"] = {
                "on": "every seed" if every_seed else "median", "value": reached,
                "met": reached >= bound}
        lost = [summary[field][arm] for field in ("refused", "truncated")
                if arm in summary[field]]
        if lost:
            checks[f"{arm} refused+truncated==0"] = {
                "on": "every seed", "value": sum(v or 0 for series in lost for v in series),
                "met": all(not v for series in lost for v in series)}
    return checks


def _cell(median: float | None, spread: list[float] | None, digits: int) -> str:
    if median is None or spread is None:
        return "-"
    return f"{median:.{digits}f} [{spread[0]:.{digits}f}-{spread[1]:.{digits}f}]"


def render_summary(traces: Mapping[str, Mapping[str, Any]]) -> str:
    """Median [min-max] over seeds: each arm's tokens/s, then the default policy's ratios and
    the targets."""
    lines = []
    for trace, s in traces.items():
        passes = s.get("passes")
        again = f" (passes {', '.join(map(str, passes))})" if passes else ""
        lines.append(f"trace {trace}, seeds {', '.join(map(str, s['seeds']))}{again}: decode "
                     "tok/s, median [min-max]")
        for arm in s["arms"]:
            refused = sum(v or 0 for v in s["refused"][arm])
            truncated = sum(v or 0 for v in s["truncated"][arm])
            lines.append(f"  {arm:<22} {_cell(s['median'][arm], s['spread'][arm], 1):>22}"
                         f"  refused {refused}  truncated {truncated}")
        lines.extend(f"  {name:<26} {_cell(s['median'][name], s['spread'][name], 2):>18}"
                     for name in ("headroom_vs_static_full", "headroom_vs_grow_only",
                                  "headroom_vs_oracle", "freetoken_vs_static_full",
                                  "noise_aa"))
        for name, check in s["targets"].items():
            value = "-" if check["value"] is None else f"{check['value']:g}"
            lines.append(f"  target {name}: {value} on {check['on']}: "
                         f"{'met' if check['met'] else 'MISSED'}")
    return "\n".join(lines)
