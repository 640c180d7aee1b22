"""Bad input to the CLI: exit status 2 and one line on stderr naming what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ladder.cli import main

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "seed-rtx5080-status.json"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        raise SystemExit(main(argv))
    err = capsys.readouterr().err
    return int(info.value.code or 0), err


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(("toml", "names"), [
    ("[safeguards\ncooldown_s = 1\n", "toml"),
    ("[safeguards]\ncooldown = 5\n", "cooldown"),
    ("[[servers]]\nurl = \"http://127.0.0.1:1919\"\nbogus_key = 1\n", "bogus_key"),
    ("[control]\npoll_s = \"2 minutes\"\n", "poll_s"),
    ("[[servers]]\n[servers.ladder]\nkv_floor_tokens = \"lots\"\n", "kv_floor_tokens"),
    ("[[servers]]\n[servers.ladder]\nkv_floor_tokens = 4096\nkv_max_tokens = 2048\n",
     "kv_max_tokens"),
])
def test_config_check_rejects(tmp_path: Path, capsys: pytest.CaptureFixture[str], toml: str,
                              names: str) -> None:
    path = tmp_path / "ladder.toml"
    path.write_text(toml)
    code, err = run(["config", "check", str(path)], capsys)
    assert code == 2
    assert names in one_line(err).lower()


def test_config_check_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["config", "check", str(tmp_path / "nope.toml")], capsys)
    assert code == 2 and "nope.toml" in one_line(err)


@pytest.mark.parametrize("content", [None, "{not json", json.dumps({"state": "serving"}),
                                     "\udcff"])
def test_unreadable_status_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                content: str | None) -> None:
    path = tmp_path / "status.json"
    if content == "\udcff":
        path.write_bytes(b"\xff\xfe\x00garbage")
    elif content is not None:
        path.write_text(content)
    code, err = run(["plan", "--status", str(path), "--to", "moe=1024"], capsys)
    assert code == 2
    assert "--status" in one_line(err)


@pytest.mark.parametrize("to", ["moe=", "kv=lots", "moe=1024,moe=2", "gpu=3", "moe=-5", "",
                                "kv=64q"])
def test_bad_to_values(capsys: pytest.CaptureFixture[str], to: str) -> None:
    code, err = run(["plan", "--status", str(FIXTURE), "--to", to], capsys)
    assert code == 2, err
    one_line(err)


def test_bad_units_in_flags(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["plan", "--status", str(FIXTURE), "--to", "moe=1024", "--reserve", "5 GB!"],
                    capsys)
    assert code == 2 and "reserve" in one_line(err)
