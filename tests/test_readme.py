"""The README's promise: its two quickstart commands are what CI and a newcomer run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from policies.api import LadderView, Observation, RungView
from policies.registry import load_policy

ROOT = Path(__file__).resolve().parent.parent


def quickstart_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```\n(.+?)\n```", section)


def test_quickstart_has_exactly_two_commands() -> None:
    commands = quickstart_commands()
    assert len(commands) == 2
    assert "ladder " in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert quickstart_commands()[1] in ci.splitlines()


def test_readme_policy_example_is_a_working_plugin(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    text = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.+?)\n```", text.split("### Policies", 1)[1], re.S)
    assert code is not None
    assert len(code.group(1).splitlines()) <= 22
    (tmp_path / "readme_policy.py").write_text(code.group(1))
    monkeypatch.syspath_prepend(str(tmp_path))
    policy = load_policy("readme_policy:Multiple", {"factor": 3.0})
    ladder = LadderView((RungView(0, 1000, 100, 4), RungView(1, 4000, 60, 4)))
    decision = policy.decide(Observation(now_s=0.0, rung=0, live_kv_tokens=500,
                                         pending_kv_tokens=0, active_requests=1,
                                         decode_tps=None), ladder)
    assert decision.rung == 1
    with pytest.raises(ValueError, match="factor"):
        load_policy("readme_policy:Multiple", {"factor": 0.5})
