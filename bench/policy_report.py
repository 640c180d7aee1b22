"""What a policy-bench run's figures follow from: ratios, targets, the miss model, tables, plots.

Why apart from the runs: every figure here is derived from the per-arm measurements a run
writes (bench/policy_arms.py), so `bench/policy_bench.py --report FILE` re-derives them from a
written JSON without running anything, and the same code writes them at the end of a run.

The miss model: what a miss cost in decode (`miss_cost`, a fit over the arms) beside one
expert's copy alone (`expert_copy_us`, measured by the run), and what the misses alone predict
(`miss_model`: each miss at one copy, the rest the same in every arm; its ratios set apart what
a ladder gains from a call's noise, and `no_miss_vs_grow_only` bounds any ladder over
grow-only where misses are all that rungs change, which small residuals confirm and large ones
deny). The targets (moe-ladder >= 1.3x static-full, >= 1.1x grow-only, >= 0.95x oracle, 0
refused and 0 truncated; bench/seeds.py `target_bounds`) are meant for the GPU run, not for
the CPU numbers.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench.policy_arms import MEASURED_WINDOW_S, MOE_LADDER_ARMS, per_request_tps
from bench.round_profile import shared_fit
from bench.seeds import FREETOKEN, target_bounds

__all__ = ["common_requests", "derived", "miss_cost", "miss_model", "plot", "ratios",
           "render_table", "rerate_requests"]


def ratios(arms: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Each arm's decode tokens/s over static-full's, grow-only's and the oracle's."""
    def ratio(a: str, b: str) -> float | None:
        if a not in arms or b not in arms or not arms[b]["decode_tps"]:
            return None
        return round(arms[a]["decode_tps"] / arms[b]["decode_tps"], 3)

    return {a: {"vs_static_full": ratio(a, "static-full"), "vs_grow_only": ratio(a, "grow-only"),
                "vs_oracle": ratio(a, "oracle")} for a in arms}


def _targets(trace_kind: str, arms: dict[str, dict[str, Any]],
             ratios: dict[str, dict[str, float | None]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in (*MOE_LADDER_ARMS, f"{FREETOKEN}headroom"):
        if a not in arms:
            continue
        verdict: dict[str, bool | None] = {
            f"{key}>={bound:g}": None if ratios[a][key] is None else ratios[a][key] >= bound
            for key, bound in target_bounds(trace_kind, a).items()}
        verdict["refused==0"] = arms[a]["refused"] == 0
        verdict["truncated==0"] = arms[a]["truncated"] == 0
        out[a] = verdict
    return out


def miss_cost(arms: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """What a miss costs in decode: the least-squares line of seconds per token against
    misses per token over the arms that served the whole trace (the same tokens over the same
    contexts, so the misses are what differs). None when fewer than two distinct points."""
    points = [(a["expert_misses"] / a["decode_tokens"], a["decode_s"] / a["decode_tokens"])
              for a in _full_arms(arms).values()]
    if len({round(x, 6) for x, _ in points}) < 2:
        return None
    slope, intercept = statistics.linear_regression([x for x, _ in points],
                                                    [y for _, y in points])
    return {"us_per_miss": round(slope * 1e6, 1),
            "ms_per_token_without_misses": round(intercept * 1e3, 2), "arms": len(points)}


def _full_arms(arms: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The arms that served the whole trace: the same tokens over the same contexts."""
    return {a: v for a, v in arms.items()
            if v["refused"] == 0 and v["truncated"] == 0 and v["decode_tokens"] > 0}


def miss_model(arms: dict[str, dict[str, Any]],
               expert_copy_us: float | None) -> dict[str, Any] | None:
    """What the expert misses alone predict, to tell a ladder's gain from call noise.

    Each miss costs one expert's measured copy (`expert_copy_us`, not the fit, which noise
    moves); everything else costs the same per token in every arm that served the whole
    trace (their mean). On that model: each arm's tokens/s and ratios; its residual
    (measured / modelled decode seconds - 1: noise, plus any cost other than misses, e.g.
    another request's prefill inside a decode window); and `no_miss_vs_grow_only`, the
    ratio a run without a single miss would have over grow-only: the ceiling of any ladder
    against it if misses are all that the rung changes (residuals far from 0 say they are
    not)."""
    full = _full_arms(arms)
    if not full or expert_copy_us is None:
        return None
    miss_s = {a: v["expert_misses"] * expert_copy_us * 1e-6 for a, v in full.items()}
    base_s = statistics.fmean((v["decode_s"] - miss_s[a]) / v["decode_tokens"]
                              for a, v in full.items())
    modelled_s = {a: v["decode_tokens"] * base_s + miss_s[a] for a, v in full.items()}
    tps = {a: {"decode_tps": round(v["decode_tokens"] / modelled_s[a], 2)}
           for a, v in full.items()}
    ceiling = None
    if "grow-only" in full:
        ceiling = round(modelled_s["grow-only"] / (full["grow-only"]["decode_tokens"] * base_s),
                        3)
    return {"us_per_miss": expert_copy_us, "ms_per_token_without_misses": round(base_s * 1e3, 2),
            "arms": {a: t["decode_tps"] for a, t in tps.items()}, "ratios": ratios(tps),
            "residual": {a: round(full[a]["decode_s"] / modelled_s[a] - 1, 3) for a in full},
            "no_miss_vs_grow_only": ceiling}


def derived(trace_kind: str, arms: dict[str, dict[str, Any]],
            per_request: dict[str, list[dict[str, Any]]],
            expert_copy_us: float | None,
            transitions: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """What a run's figures follow from its per-arm measurements (written, and re-derived by
    `--report`)."""
    arm_ratios = ratios(arms)
    return {"ratios": arm_ratios, "targets": _targets(trace_kind, arms, arm_ratios),
            "miss_cost": miss_cost(arms),
            "miss_model": miss_model(arms, expert_copy_us),
            "common": common_requests(per_request),
            "round_fit": shared_fit(arms, transitions)}


def common_requests(per_request: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """Each arm's aggregate decode tokens/s over the requests every arm served, and the
    ratios: the like-for-like comparison when an arm refused some (static-short, which refuses
    by design, is left out)."""
    compared = [a for a in per_request if a != "static-short"]
    if not compared:
        return None
    served = set.intersection(*({row["index"] for row in per_request[a] if not row["refused"]}
                                for a in compared))
    tps: dict[str, dict[str, Any]] = {}
    for a in compared:
        rows = [row for row in per_request[a] if row["index"] in served]
        tokens = sum(max(0, row["completion_tokens"] - 1) for row in rows)
        seconds = sum(row["decode_s"] for row in rows)
        tps[a] = {"decode_tps": round(tokens / seconds, 2) if seconds > 0 else 0.0}
    return {"requests": len(served), "arms": {a: t["decode_tps"] for a, t in tps.items()},
            "ratios": ratios(tps)}


def rerate_requests(run: dict[str, Any]) -> None:
    """Each arm's per-request summary again, without the rates of windows shorter than
    MEASURED_WINDOW_S (files written before that rule rated one network read as decode). A
    row keeps its rate otherwise: it was taken from the unrounded window."""
    for arm, rows in run["per_request"].items():
        for row in rows:
            if row["decode_s"] < MEASURED_WINDOW_S:
                row["decode_tps"] = None
        run["arms"][arm].update(per_request_tps([row["decode_tps"] for row in rows]))


def _ratio_cells(r: dict[str, float | None]) -> str:
    return " ".join(f"{'-' if v is None else f'{v:.2f}':>6}"
                    for v in (r["vs_static_full"], r["vs_grow_only"], r["vs_oracle"]))


def render_table(run: dict[str, Any]) -> str:
    again = f", pass {run['pass']}" if run.get("pass", 1) > 1 else ""
    lines = [f"trace {run['trace']} ({run['requests']} requests{again})",
             f"  {'arm':<13} {'tok/s':>8} {'xfull':>6} {'xgrow':>6} {'xorac':>6} {'refused':>7} "
             f"{'trunc':>5} {'trans':>5} {'trans_s':>7} {'hit':>5} {'ttft_p50':>8}"]
    for arm, a in run["arms"].items():
        ttft = "-" if a["ttft_median_s"] is None else f"{a['ttft_median_s']:.3f}"
        hit = "-" if a["hit_rate"] is None else f"{a['hit_rate']:.0%}"
        lines.append(f"  {arm:<13} {a['decode_tps']:>8.1f} {_ratio_cells(run['ratios'][arm])} "
                     f"{a['refused']:>7} {a['truncated']:>5} {a['transitions']:>5} "
                     f"{a['transition_s']:>7.2f} {hit:>5} {ttft:>8}")
    common = run.get("common")
    if common is not None and common["requests"] < run["requests"]:
        lines.append(f"  like for like, the {common['requests']} requests every arm but "
                     f"static-short served:")
        for arm, tps in common["arms"].items():
            r = common["ratios"][arm]
            lines.append(f"  {arm:<13} {tps:>8.1f} {_ratio_cells(r)}")
    if (cost := run.get("miss_cost")) is not None:
        lines.append(f"  a miss costs {cost['us_per_miss']:.1f} us of decode (fit over "
                     f"{cost['arms']} arms); one expert's copy alone "
                     f"{run['expert_copy_us']:.1f} us")
    if (model := run.get("miss_model")) is not None:
        lines.append(f"  misses alone (each {model['us_per_miss']:.1f} us, the rest "
                     f"{model['ms_per_token_without_misses']:.2f} ms a token): "
                     "tok/s xfull xgrow xorac residual")
        for arm, tps in model["arms"].items():
            r = model["ratios"][arm]
            lines.append(f"  {arm:<13} {tps:>8.1f} {_ratio_cells(r)} "
                         f"{model['residual'][arm]:>+8.1%}")
        if model["no_miss_vs_grow_only"] is not None:
            lines.append(f"  no miss at all would be {model['no_miss_vs_grow_only']:.2f}x "
                         "grow-only: any ladder's ceiling, if misses are all a rung changes")
    lines.extend(_profile_lines(run["arms"]))
    if probes := run.get("probes"):
        lines.append("  speed probe (bench/probe.py), tok/s: " + ", ".join(
            f"{p['decode_tps']:.1f} {'before ' + p['before'] if p['before'] else 'after'}"
            for p in probes))
    if (fit := run.get("round_fit")) is not None:
        c = fit["coefficients"]
        lines.append(f"  one model of every arm's rounds: {c['ms_per_token']:.2f} ms a token, "
                     f"{c['us_per_1k_context_tokens']:.1f} us per 1k context, "
                     f"{c['us_per_miss']:.1f} us a miss, {c['us_per_miss_layer']:.1f} us a "
                     "layer that waited")
        lines.append(f"  {'residual ms':<13} {'overall':>8} {'near':>8} {'elsewhere':>9}  "
                     f"(near: within {fit['after_s']:g} s after a transition began)")
        for arm, r in fit["arms"].items():
            cells = [r["residual_ms_per_token"], r["residual_ms_per_token_after_transitions"],
                     r["residual_ms_per_token_elsewhere"]]
            lines.append(f"  {arm:<13} " + " ".join(
                f"{'-' if v is None else f'{v:+.2f}':>8}" for v in cells)
                + f"  ({r['rounds_after_transitions']} of {r['rounds']} rounds near one)")
    return "\n".join(lines)


def _profile_lines(arms: dict[str, Any]) -> list[str]:
    """Where each arm's decode time went, ms a token (bench/round_profile.py): the decode
    itself, the event loop's other tasks between rounds, prefills and rebuild work."""
    profiled = {arm: a for arm, a in arms.items() if a.get("engine_profile")}
    if not profiled:
        return []
    lines = [f"  {'ms a token':<13} {'decode':>7} {'elsewhere':>9} {'prefill':>7} "
             f"{'rebuild':>7} {'context':>8} {'kv_runs':>7}  allocator retries/device allocs"]
    for arm, a in profiled.items():
        p = a["engine_profile"]
        alloc = a.get("allocator")
        counters = "-" if alloc is None else (f"{alloc['num_alloc_retries']}/"
                                              f"{alloc['num_device_alloc']}")
        lines.append(f"  {arm:<13} {p['decode_ms_per_token']:>7.2f} "
                     f"{p['yielded_ms_per_token']:>9.2f} {p['admit_ms_per_token']:>7.2f} "
                     f"{p['rebuild_ms_per_token']:>7.2f} {p['context_tokens_mean']:>8,} "
                     f"{p['kv_runs_mean']:>7.1f}  {counters}")
    return lines


def plot(doc: dict[str, Any], path: str) -> bool:
    """Rung and live context over time per arm, and tokens/s per arm; False without
    matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = list(doc["runs"].values())
    arms = list(runs[0]["arms"]) if runs else []
    fig, axes = plt.subplots(len(arms) + 1, len(runs), figsize=(6 * len(runs),
                                                                 2.0 * (len(arms) + 1)),
                             squeeze=False)
    for col, run in enumerate(runs):
        for row, arm in enumerate(arms):
            ax = axes[row][col]
            timeline = run["timeline"].get(arm, [])
            t = [s[0] for s in timeline]
            ax.step(t, [s[2] for s in timeline], where="post", label="KV capacity")
            ax.plot(t, [s[3] for s in timeline], label="live context")
            ax.set_ylabel("tokens")
            ax.set_title(f"{run['trace']}: {arm}", fontsize=9)
            twin = ax.twinx()
            twin.step(t, [s[1] for s in timeline], where="post", color="tab:gray",
                      alpha=0.5, linestyle=":")
            twin.set_ylabel("rung", fontsize=8)
            if row == 0:
                ax.legend(fontsize=7, loc="upper left")
        ax = axes[len(arms)][col]
        names = list(run["arms"])
        ax.bar(names, [run["arms"][a]["decode_tps"] for a in names])
        ax.set_ylabel("decode tok/s")
        ax.tick_params(axis="x", labelrotation=30, labelsize=7)
        ax.set_title(f"{run['trace']}: aggregate decode tokens/s", fontsize=9)
    fig.suptitle(f"policy bench on {doc['meta']['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True
