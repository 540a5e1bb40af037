"""The ways teams run the bot as a service (issue 22): the systemd unit passes `systemd-analyze verify` and is
hardened as documented; the Procfile's processes are real runbot commands."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "docs" / "deploy" / "runbot.service"
RUNBOT = Path(sys.executable).with_name("runbot")  # the venv's, which the unit's /opt/runbot stands for


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # systemd's keys are case-sensitive
    parser.read_string(UNIT.read_text())
    return parser


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed (.ci/run installs it)")
def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    """verify exits 0 even on a key it ignores: a clean unit is one it has nothing to say about."""
    copy = tmp_path / "runbot.service"
    copy.write_text(UNIT.read_text().replace("/opt/runbot/bin/runbot", str(RUNBOT)))
    done = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_the_unit_runs_as_its_own_user_on_a_read_only_system() -> None:
    service = unit()["Service"]
    assert service["User"] == "runbot" and service["ProtectSystem"] == "strict" and service["ProtectHome"] == "yes"
    assert service["StateDirectory"] == "runbot" and service["ReadOnlyPaths"] == "/etc/runbot"
    assert "RUNBOT_STATE_DB=/var/lib/runbot/" in UNIT.read_text()  # the state file inside the one writable folder
    assert service["Restart"] == "on-failure" and service["RestartPreventExitStatus"] == "2"
    assert service["NoNewPrivileges"] == "yes" and service["CapabilityBoundingSet"] == ""
    assert shlex.split(service["ExecStart"])[1:] == ["serve"]


def test_each_procfile_process_is_a_runbot_command() -> None:
    for line in (ROOT / "Procfile").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        kind, command = line.split(":", 1)
        argv = shlex.split(command)
        assert kind in ("web", "worker") and argv[0] == "runbot"
        done = subprocess.run([str(RUNBOT), *argv[1:], "--help"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
