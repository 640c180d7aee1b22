"""The calibration file: every parameter named, sourced and valid, and exactly what the fit
writes from the records; a bad file is one clear error naming the file and the key."""

from __future__ import annotations

import json
import statistics
from dataclasses import fields
from pathlib import Path

import pytest

from bench.replay.calibration import (
    DEFAULT_CALIBRATION,
    SCHEMA,
    CalibrationError,
    Costs,
    load_profile,
)
from bench.replay.fit import _theil_sen, calibration_doc, decode_fit, h200_parameters

PROFILES = ("h200-bench", "rtx5080-report")


def _leaves(doc: object, path: str = "") -> dict[str, object]:
    if isinstance(doc, dict):
        return {k: v for key, value in doc.items()
                for k, v in _leaves(value, f"{path}/{key}").items()}
    if isinstance(doc, list):
        return {k: v for i, value in enumerate(doc)
                for k, v in _leaves(value, f"{path}/{i}").items()}
    return {path: doc}


def test_the_committed_file_is_what_the_fit_writes() -> None:
    """Refitting from bench/results/h200 reproduces bench/calibration/h200.json: every key,
    every text, and every number to 1e-9 relative (numpy releases move least squares in the
    last digits; a hand edit moves far more)."""
    committed = _leaves(json.loads(DEFAULT_CALIBRATION.read_text()))
    refitted = _leaves(json.loads(json.dumps(calibration_doc())))
    assert committed.keys() == refitted.keys()
    for path, value in committed.items():
        if isinstance(value, float):
            assert refitted[path] == pytest.approx(value, rel=1e-9), path
        else:
            assert refitted[path] == value, path


@pytest.mark.parametrize("name", PROFILES)
def test_every_profile_prices_every_cost_with_a_source(name: str) -> None:
    costs, params = load_profile(DEFAULT_CALIBRATION, name)
    assert set(params) == {f.name for f in fields(Costs)}
    assert all(p.source.strip() and p.unit for p in params.values())
    assert costs.miss_s > 0 and costs.request_s > 0
    assert costs.with_misses_free().miss_s == 0
    assert costs.with_misses_free().request_s == costs.request_s


def test_the_decode_fit_is_token_weighted_and_mostly_tight() -> None:
    """The fit's own report: how many windows and their median residual (in the source)."""
    params = h200_parameters()
    source = params["request_s"].source
    assert "decode windows" in source
    windows = int(source.split(" over ")[1].split()[0])
    residual = float(source.split("median |residual| ")[1].split("%")[0])
    assert windows >= 100 and residual < 15.0
    # Leaving a record out changes the fit but keeps it in the same regime.
    held = h200_parameters(records=("ladder-agentic", "ladder-mixed"))
    assert held["miss_s"].value == pytest.approx(params["miss_s"].value, rel=0.5)


def test_each_record_is_priced_at_its_own_speed() -> None:
    """One cost per request a record (a device call's speed), the profile's the median; the
    miss cost is shared, and the file keeps every record's speed."""
    fit = decode_fit()
    speeds = sorted(fit.request_s_by_record.values())
    assert fit.request_s == pytest.approx(speeds[len(speeds) // 2] if len(speeds) % 2 else
                                          (speeds[len(speeds) // 2 - 1]
                                           + speeds[len(speeds) // 2]) / 2)
    assert speeds[-1] / speeds[0] > 1.2  # calls differ; a common cost would hide it
    assert 20e-6 < fit.miss_s < 80e-6
    doc = json.loads(DEFAULT_CALIBRATION.read_text())["profiles"]["h200-bench"]
    assert doc["request_s_by_record"] == pytest.approx(fit.request_s_by_record)
    costs, _ = load_profile(DEFAULT_CALIBRATION, "h200-bench")
    assert costs.request_s == pytest.approx(fit.request_s)


def _write(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "cal.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def _good() -> dict:  # type: ignore[type-arg]
    return json.loads(DEFAULT_CALIBRATION.read_text())


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: "{not json", "not JSON"),
    (lambda d: {**d, "schema": "other"}, "not a replay calibration"),
    (lambda d: {**d, "profiles": {}}, "no profile 'h200-bench' (it has )"),
    (lambda d: d["profiles"]["h200-bench"]["parameters"].pop("miss_s") and d,
     "missing ['miss_s']"),
    (lambda d: d["profiles"]["h200-bench"]["parameters"].update(extra_s={}) or d,
     "unknown ['extra_s']"),
    (lambda d: d["profiles"]["h200-bench"]["parameters"]["miss_s"].update(value=-1) or d,
     "parameter 'miss_s': value must be a finite number >= 0"),
    (lambda d: d["profiles"]["h200-bench"]["parameters"]["d2d_bytes_per_s"].update(value=0)
     or d, "> 0 for bandwidths"),
    (lambda d: d["profiles"]["h200-bench"]["parameters"]["miss_s"].update(source=" ") or d,
     "source must say where the number comes from"),
    (lambda d: d["profiles"]["h200-bench"]["parameters"]["miss_s"].pop("unit") and d,
     "needs value, unit and source"),
])
def test_bad_files_are_one_clear_error(tmp_path: Path, mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    path = _write(tmp_path, mutate(_good()))
    with pytest.raises(CalibrationError) as info:
        load_profile(path, "h200-bench")
    assert message in str(info.value) and str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_a_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match="cannot read it"):
        load_profile(tmp_path / "absent.json", "h200-bench")
    assert SCHEMA in json.dumps(_good())


def test_the_prefill_line_ignores_prefills_that_waited() -> None:
    """Theil-Sen: a line through most points, whatever two far above it do (a least-squares
    line doubles its intercept for them)."""
    prompts = [float(p) for p in range(1_000, 101_000, 5_000)]
    seconds = [0.06 + 1.4e-6 * p for p in prompts]
    seconds[1] += 0.4
    seconds[2] += 0.4
    intercept, slope = _theil_sen(prompts, seconds)
    assert intercept == pytest.approx(0.06, rel=0.02)
    assert slope == pytest.approx(1.4e-6, rel=0.02)
    assert statistics.linear_regression(prompts, seconds).intercept > 0.09
