"""`python -m bench.replay`: the calibrated virtual-time replay's commands.

- `fit`: refit bench/calibration/h200.json from the GPU records (pure arithmetic);
- `fidelity`: replay every arm of every GPU record (the H200 ladder records and every per-seed
  run) and print measured, predicted and error, in sample and held out
  (bench/results/replay-fidelity.json);
- `seeds`: every workload x seed x arm, over worker processes, with bootstrap intervals and
  the targets (bench/results/replay-seeds.json); `--kv-step` replays the moe-ladder arms on
  another ladder step (bench/results/replay-kv-step/STEP.json);
- `tables`: the Markdown tables of the README and docs/results.md, from those files (the
  fidelity summary, the full fidelity table, the many-seed ratios, the targets, the steps,
  the GPU runs, the probed calls and their arms run twice);
- `compare FILE...`: GPU many-seed files (bench/gpu_run.sh policy_seeds) beside the replay of
  the same trace and seed (bench/results/replay-vs-gpu.json), with each arm's share of decode
  rounds in the host's slow state and, for a call that ran its arms twice, the pairs.

Each writes its JSON document and prints a short table; `--json` prints the document instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.output import report_json
from bench.policy_arms import DEFAULT_ARM, BenchOptions
from bench.replay import fit
from bench.replay.arms import REPLAY_ARMS
from bench.replay.calibration import DEFAULT_CALIBRATION, CalibrationError, load_profile
from bench.replay.seeds import WORKLOADS, default_workers, replay_seeds, summarize_replay
from bench.replay.tables import (
    fidelity_markdown,
    fidelity_summary_markdown,
    gpu_markdown,
    kv_step_markdown,
    passes_markdown,
    probe_markdown,
    seeds_markdown,
    targets_markdown,
)
from ladder.units import parse_count

RESULTS = Path(__file__).resolve().parent.parent / "results"


def _shown(path: str) -> str:
    """A path as the document records it: relative to the repository when inside it, so a
    file written from any checkout is the same file."""
    resolved = Path(path).resolve()
    root = RESULTS.parent.parent
    return str(resolved.relative_to(root)) if resolved.is_relative_to(root) else path


def _seeds_arg(text: str) -> list[int]:
    """`30` (seeds 0..29), `0,3,7` or `5-9`."""
    try:
        if "," in text:
            return [int(s) for s in text.split(",")]
        if "-" in text:
            lo, hi = map(int, text.split("-"))
            return list(range(lo, hi + 1))
        return list(range(int(text)))
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds: a count, a list (0,3,7) or a range (5-9), "
                                         f"not {text!r}") from None


def _kv_step_arg(text: str) -> int:
    """`16k`, `32768`: a positive token count."""
    try:
        tokens = parse_count(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"kv-step: {exc}") from None
    if tokens < 1:
        raise argparse.ArgumentTypeError(f"kv-step: {text!r} is not a positive count")
    return tokens


def _names(allowed: Sequence[str], what: str):  # type: ignore[no-untyped-def]
    def parse(text: str) -> list[str]:
        names = [n for n in text.split(",") if n]
        unknown = [n for n in names if n not in allowed]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"{what}: {', '.join(unknown) or 'none given'} "
                                             f"(known: {', '.join(allowed)})")
        return names
    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fit", help="refit the calibration file from the GPU records")
    f.add_argument("--out", default=str(DEFAULT_CALIBRATION), help="where to write it")
    for name, help_text, out in (
            ("fidelity", "measured vs predicted decode tok/s on every GPU record",
             "replay-fidelity.json"),
            ("seeds", "every workload x seed x arm, with bootstrap intervals and targets",
             "replay-seeds.json")):
        s = sub.add_parser(name, help=help_text)
        s.add_argument("--calibration", default=str(DEFAULT_CALIBRATION),
                       help="calibration file (default: %(default)s)")
        s.add_argument("--out", default=str(RESULTS / out), help="where to write the JSON "
                       "document (default: %(default)s)")
        s.add_argument("--json", action="store_true", help="print the document, not a table")
    t = sub.add_parser("tables", help="the docs' Markdown tables, from the JSON files")
    t.add_argument("--fidelity", default=str(RESULTS / "replay-fidelity.json"))
    t.add_argument("--seeds", default=str(RESULTS / "replay-seeds.json"))
    t.add_argument("--kv-steps", default=str(RESULTS / "replay-kv-step"), metavar="DIR",
                   help="`seeds --kv-step` documents of other steps, tabled beside --seeds "
                        "(default: %(default)s)")
    t.add_argument("--gpu", nargs="*", default=[str(RESULTS / "replay-vs-gpu-step16k.json")],
                   metavar="FILE", help="`compare` documents, a row a GPU run "
                   "(default: %(default)s)")
    t.add_argument("--probes", nargs="*",
                   default=[str(RESULTS / "h100" / "probe" / "replay-compare.json")],
                   metavar="FILE", help="`compare` documents of probed GPU runs, an arm a row "
                   "at each price, and an arm run twice in one call (--passes 2) a row "
                   "(default: %(default)s)")
    c = sub.add_parser("compare", help="GPU many-seed runs beside the replay of the same seed")
    c.add_argument("files", nargs="+", help="ladder-seeds.json files of GPU runs")
    c.add_argument("--calibration", default=str(DEFAULT_CALIBRATION))
    c.add_argument("--out", default=str(RESULTS / "replay-vs-gpu.json"))
    fid = sub.choices["fidelity"]
    fid.add_argument("--no-held-out", action="store_true",
                     help="skip the leave-one-record-out refit (half the time)")
    seeds = sub.choices["seeds"]
    seeds.add_argument("--seeds", type=_seeds_arg, default=_seeds_arg("30"),
                       help="a count (30: seeds 0-29), a list (0,3,7) or a range (5-9)")
    seeds.add_argument("--workloads", type=_names(list(WORKLOADS), "unknown workload"),
                       default=list(WORKLOADS), help="comma-separated (default: all: "
                       f"{','.join(WORKLOADS)})")
    seeds.add_argument("--arms", type=_names(REPLAY_ARMS, "unknown arm"),
                       default=list(REPLAY_ARMS), help="comma-separated (default: all)")
    seeds.add_argument("--workers", type=int, default=default_workers(),
                       help="worker processes (default: %(default)s)")
    seeds.add_argument("--kv-step", type=_kv_step_arg, default=BenchOptions.kv_step_tokens,
                       metavar="TOKENS", help="largest step of the moe-ladder arms' ladder "
                       "(default the daemon's, %(default)s; grow-only keeps PR #300's 32k)")
    return p


def _fidelity_table(doc: dict[str, Any]) -> str:
    lines = [f"{'record':<30} {'arm':<14} {'measured':>9} {'in-sample':>10} {'err':>7} "
             f"{'held-out':>9} {'err':>7}"]
    for name, entry in doc["records"].items():
        held = entry.get("held_out", {}).get("arms", {})
        for arm, r in entry["in_sample"]["arms"].items():
            if r.get("stalled"):
                lines.append(f"{name:<30} {arm:<14} {r['measured_tps']:>9.2f} {'stalled':>10}")
                continue
            if "error" not in r:
                lines.append(f"{name:<30} {arm:<14} served {r['measured_served']} measured, "
                             f"{r['predicted_served']} predicted")
                continue
            h = held.get(arm, {})
            held_cells = (f"{h['predicted_tps']:>9.2f} {h['error']:>+7.1%}" if "error" in h
                          else "")
            lines.append(f"{name:<30} {arm:<14} {r['measured_tps']:>9.2f} "
                         f"{r['predicted_tps']:>10.2f} {r['error']:>+7.1%} {held_cells}")
    for group, kinds in doc["summary"].items():
        for kind, s in kinds.items():
            lines.append(f"{group} {kind}: {s['arms_within_10pct']}/{s['arms_compared']} arms "
                         f"within 10 %, max |error| {s['max_abs_error']:.1%}, "
                         f"{s['discordant_pairs']} arm pairs ordered otherwise "
                         f"({s['discordant_pairs_clear']} measured more than 5 % apart)")
    aa = doc["device_repeatability"]
    lines.extend(f"device A/A across calls: {r['trace']} {r['arm']} measured "
                 f"{r['measured_tps']} in {', '.join(r['records'])}: {r['spread']:.1%} apart"
                 for r in aa["across_calls"])
    lines.extend(f"device A/A within a call: {r['record']} {' vs '.join(r['arms'])} measured "
                 f"{r['measured_tps']}: {r['spread']:.1%} apart" for r in aa["within_call"])
    return "\n".join(lines)


def _seeds_table(traces: dict[str, Any]) -> str:
    lines = []
    for workload, s in traces.items():
        lines.append(f"{workload}: {len(s['seeds'])} seeds, decode tok/s median [p5]")
        for arm, st in s["stats_tps"].items():
            if st["n"]:
                lines.append(f"  {arm:<22} {st['median']:>8.2f} [{st['p5']:.2f}]")
        for name, st in s["stats"].items():
            if st["n"]:
                lines.append(f"  {name:<26} median {st['median']:.3f} "
                             f"{st['median_ci95']}  p5 {st['p5']:.3f}  min {st['min']:.3f}")
        for name, check in s["targets"].items():
            lines.append(f"  target {name}: {check['value']:.3f} "
                         f"{'met' if check['met'] else 'MISSED by ' + format(-check['by'], '.3f')}")
    return "\n".join(lines)


def _tables(fidelity: str, seeds: str, kv_steps: str, gpu: Sequence[str],
            probes: Sequence[str]) -> int:
    docs = {}
    steps = sorted(Path(kv_steps).glob("*.json"))
    for name, path in (("fidelity", fidelity), ("seeds", seeds), *(
            (f"step {p.name}", str(p)) for p in steps), *((f"gpu {p}", p) for p in gpu),
            *((f"probes {p}", p) for p in probes)):
        try:
            docs[name] = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            print(f"error: {path}: {exc}", file=sys.stderr)
            return 2
    tables = [fidelity_summary_markdown(docs["fidelity"]), fidelity_markdown(docs["fidelity"]),
              seeds_markdown(docs["seeds"]), targets_markdown(docs["seeds"])]
    if steps:  # the seeds file is the default step's row
        tables.append(kv_step_markdown([d for n, d in docs.items()
                                        if n == "seeds" or n.startswith("step ")]))
    tables += [gpu_markdown(d, DEFAULT_ARM) for n, d in docs.items() if n.startswith("gpu ")]
    for name, doc in docs.items():
        if name.startswith("probes "):
            tables.append(probe_markdown(doc))
            if doc.get("passes"):
                tables.append(passes_markdown(doc))
    print("\n\n".join(tables))
    return 0


# How `compare` prices a run: at the profile's speed, then at speeds of the run's own call.
_PRICES = (("tps", "the profile's speed"), ("tps_at_static_full_speed", "static-full's speed"),
           ("tps_at_call_probe", "the call's probes"), ("tps_at_arm_probes", "its probes"))


def _within(runs: Iterable[Mapping[str, Any]], key: str) -> dict[str, Any]:
    """Arms within 10 % and the largest error over `runs`, priced as `key` says."""
    got = [r[key] for r in runs if key in r]
    return {"runs": len(got), "arms_within_10pct": sum(g["arms_within_10pct"] for g in got),
            "arms_compared": sum(g["arms_compared"] for g in got),
            "max_abs_error": max((g["max_abs_error"] for g in got), default=None),
            "arms_with_interval": sum(g.get("arms_with_interval", 0) for g in got),
            "arms_inside_noise": sum(g.get("arms_inside_noise", 0) for g in got)}


def _compare(files: Sequence[str], calibration: str, out: str) -> int:
    from bench.replay.compare import compare_file, pass_pairs

    try:
        costs, _ = load_profile(calibration, "h200-bench")
    except CalibrationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    doc: dict[str, Any] = {"meta": {"calibration": _shown(calibration)}, "runs": {}}
    for path in files:
        try:
            runs = compare_file(Path(path), costs)
        except (OSError, ValueError, KeyError) as exc:
            print(f"error: {path}: not a policy_bench many-seed file ({exc})", file=sys.stderr)
            return 2
        doc["runs"].update({f"{_shown(path)}:{key}": r for key, r in runs.items()})
    doc["summary"] = summary = {doc_key: _within(doc["runs"].values(), doc_key)
                                for doc_key, _ in _PRICES}
    doc["passes"] = pass_pairs(doc["runs"])
    report_json(doc, out, indent=1, emit=None)
    for key, r in doc["runs"].items():
        probe = r.get("probe")
        print(key if probe is None else
              f"{key}  (probes {', '.join(f'{s * 1e3:.2f}' for s in probe['request_s'])} ms a "
              f"request, spread {probe['spread']:.1%})")
        if states := r.get("speed_states"):
            # A ratio of two arms that spent different shares of rounds in the slow state
            # measures the host as much as the policies.
            shares = ", ".join(f"{arm} {share:.0%}" for arm, share in states["slow_share"].items())
            print(f"  decode rounds at two speeds, {states['fast_ms']:.1f} and "
                  f"{states['slow_ms']:.1f} ms ({states['ratio']:.2f}x); in the slow one: "
                  f"{shares}")
        for arm, row in r["tps"]["arms"].items():
            ratio = r["vs_static_full"].get(arm)
            if "error" in row:
                # A run without static-full has no ratio to it: say so, not 0.
                vs_full = "no static-full arm" if ratio is None else (
                    f"x static-full {ratio['measured']:.3f} measured "
                    f"{ratio['predicted'] or 0:.3f} predicted")
                probed = "".join(
                    f"; at {label} {got['error']:+.1%}" for doc_key, label in _PRICES[1:]
                    if (got := r.get(doc_key, {}).get("arms", {}).get(arm, {})).get("error")
                    is not None)
                print(f"  {arm:<22} tok/s {row['measured_tps']:>7.2f} measured "
                      f"{row['predicted_tps']:>7.2f} predicted ({row['error']:+.1%}{probed});  "
                      + vs_full)
    for doc_key, label in _PRICES:
        got = summary[doc_key]
        if got["arms_compared"]:
            print(f"at {label}: {got['arms_within_10pct']} of {got['arms_compared']} arms "
                  f"within 10 %, max {got['max_abs_error']:.1%}; {got['arms_inside_noise']} of "
                  f"{got['arms_with_interval']} inside their requests' noise")
    for pair in doc["passes"]:
        print(f"{pair['run']} {pair['arm']}: pass 2 / pass 1 {pair['measured']:.3f} measured, "
              f"{pair['at_arm_probes']} at its probes, {pair['at_call_probe']} at the call's")
    print(f"wrote {out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "fit":
        return fit.main(args.out)
    if args.command == "tables":
        return _tables(args.fidelity, args.seeds, args.kv_steps, args.gpu, args.probes)
    if args.command == "compare":
        return _compare(args.files, args.calibration, args.out)
    started = time.perf_counter()
    try:
        if args.command == "fidelity":
            from bench.replay.fidelity import fidelity_doc

            costs, _ = load_profile(args.calibration, "h200-bench")
            doc = fidelity_doc(costs, held_out=not args.no_held_out)
            table = _fidelity_table(doc)
        else:
            for workload in args.workloads:  # fail before any work on a bad file
                load_profile(args.calibration, WORKLOADS[workload].world)
            runs = replay_seeds(args.workloads, args.seeds, workers=args.workers,
                                arms=args.arms, calibration=Path(args.calibration),
                                kv_step_tokens=args.kv_step)
            traces = summarize_replay(runs, DEFAULT_ARM)
            doc = {"meta": {"schema": "moe-ladder.replay-seeds.v1",
                            "default_arm": DEFAULT_ARM, "calibration": _shown(args.calibration),
                            "workloads": {w: asdict(WORKLOADS[w]) for w in args.workloads},
                            "arms": args.arms, "workers": args.workers,
                            "kv_step_tokens": args.kv_step},
                   "traces": traces,
                   # Each run's per-arm summary and ratios (its per-request rows and timeline
                   # would make the file tens of megabytes; a rerun of one seed gives them).
                   "runs": {k: {f: run[f] for f in ("trace", "seed", "arms", "ratios")}
                            for k, run in runs.items()}}
            table = _seeds_table(traces)
    except CalibrationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    doc.setdefault("meta", {})["wall_s"] = round(time.perf_counter() - started, 1)
    report_json(doc, args.out, indent=1, emit=print if args.json else None)
    if not args.json:
        print(f"{table}\nwrote {args.out} ({doc['meta']['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
