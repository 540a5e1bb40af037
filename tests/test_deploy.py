"""The ways teams run the bot as a service (issue 22): the systemd unit passes `systemd-analyze verify` and is
hardened as documented; the Procfile's processes are real runbot commands."""

from __future__ import annotations

import configparser
import json
import re
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


DOCKERFILE = ROOT / "docs" / "deploy" / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments left out."""
    text = re.sub(r"\\\n", " ", "\n".join(l for l in DOCKERFILE.read_text().splitlines() if not l.lstrip().startswith("#")))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in text.splitlines() if line.strip()]


def test_the_image_is_slim_python_and_runs_as_its_own_user() -> None:
    steps = _instructions()
    assert steps[0][0] == "FROM" and re.fullmatch(r"python:3\.1[1-9]-slim", steps[0][1])
    users = [args for op, args in steps if op == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert ("VOLUME", '["/var/lib/runbot"]') in steps
    assert json.loads(dict(steps)["ENTRYPOINT"]) == ["runbot"] and json.loads(dict(steps)["CMD"]) == ["serve"]


def test_the_healthcheck_asks_the_bot_itself() -> None:
    check = dict(_instructions())["HEALTHCHECK"]
    assert "/healthz" in check and "127.0.0.1" in check and "RUNBOT_HEALTH_PORT" in check


def test_the_build_context_holds_what_the_image_copies_and_leaves_the_rest_out() -> None:
    copied = [src for op, args in _instructions() if op == "COPY" for src in args.split()[:-1]]
    assert copied and all((ROOT / src).exists() for src in copied), copied
    ignored = {l.strip() for l in (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().splitlines()
               if l.strip() and not l.startswith("#")}
    assert {".git", ".venv", ".env", "tests"} <= ignored and not {"bot", "handlers", "config", "pyproject.toml"} & ignored


def test_the_image_entrypoint_is_what_a_plain_install_gives() -> None:
    """The image runs `pip install .`, which CI proves (.ci/wheel-check); its ENTRYPOINT is that install's runbot."""
    done = subprocess.run([str(RUNBOT), "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "metrics_listen" in done.stdout  # the listener the HEALTHCHECK asks
