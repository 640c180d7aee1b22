"""CI run of bench/ftserve_e2e.py's default-boot phase against the reference engine booted the
way ft serve boots without --num-tokens (KV sized by the server, a little above its budget):
the same script, CLI calls and checks that the H200 run makes against the real ft serve."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ladder.demo import free_port

BENCH = Path(__file__).resolve().parent.parent / "bench" / "ftserve_e2e.py"


def test_default_boot_phase_passes_on_the_reference_engine(tmp_path: Path) -> None:
    out = tmp_path / "e2e"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--reference", "--phases", "default_boot", "--out",
         str(out), "--port", str(free_port()), "--gate-port", str(free_port())],
        capture_output=True, text=True, timeout=300)
    result = json.loads((out / "result.json").read_text())
    assert done.returncode == 0, (done.stderr[-2000:], result.get("error"))
    errors = {name: phase["error"] for name, phase in result["phases"].items() if "error" in phase}
    assert not errors, errors
    cli = result["phases"]["default_boot_cli"]
    daemon = result["phases"]["default_boot_daemon"]
    assert cli["over_budget_bytes"] > 0  # booted like ft serve: above the reported budget
    assert cli["checks"] and all(cli["checks"].values()), cli["checks"]
    assert daemon["checks"] and all(daemon["checks"].values()), daemon["checks"]
    assert daemon["refused"] == 0
    assert set(result["phases"]) == {"default_boot_cli", "default_boot_daemon"}


def test_an_unknown_phase_is_refused_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--reference", "--phases", "default_boot,nosuch",
         "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "pick from fixed,default_boot" in done.stderr.splitlines()[-1]
    assert not (tmp_path / "result.json").exists()
