"""LocalRunner: a probe that is given up on (timeout, cancellation) leaves no process behind."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from bot.probe.runners import LocalRunner, probe_environment


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent to reap it counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def _started(pids: Path) -> list[int]:
    for _ in range(500):
        if pids.exists() and len(pids.read_text().split()) == 2:
            return [int(p) for p in pids.read_text().split()]
        await asyncio.sleep(0.01)
    raise AssertionError("the probe never started")


async def _gone(pids: list[int]) -> bool:
    for _ in range(300):
        if not any(map(alive, pids)):
            return True
        await asyncio.sleep(0.01)
    return False


SCRIPT = 'sleep 30 & echo "$$ $!" > "{pids}"; wait'


async def test_a_cancelled_probe_kills_bash_and_its_children(tmp_path):
    pids_file = tmp_path / "pids"
    task = asyncio.create_task(LocalRunner().run(SCRIPT.format(pids=pids_file), timeout=60))
    pids = await _started(pids_file)  # bash, and its `sleep 30`
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _gone(pids), [p for p in pids if alive(p)]


async def test_a_probe_abandoned_by_wait_for_kills_its_processes(tmp_path):
    pids_file = tmp_path / "pids"
    started = time.monotonic()
    with pytest.raises(TimeoutError):  # the watchdog's backstop over the runner's own timeout
        await asyncio.wait_for(LocalRunner().run(SCRIPT.format(pids=pids_file), timeout=60), 1.0)
    assert time.monotonic() - started < 5
    assert await _gone([int(p) for p in pids_file.read_text().split()])


async def test_a_timed_out_probe_kills_its_processes(tmp_path):
    pids_file = tmp_path / "pids"
    result = await LocalRunner().run(SCRIPT.format(pids=pids_file), timeout=1.0)
    assert result.failure_kind == "timeout"
    assert await _gone([int(p) for p in pids_file.read_text().split()])


async def test_a_local_probe_never_sees_the_bots_secrets(monkeypatch, tmp_path):
    # A log path of /proc/self/environ printed the signing secret before probes got their own environment.
    monkeypatch.setenv("SLACK_SIGNING_SECRET", "s3cr3t-signing-value")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-0000-secret-token")
    monkeypatch.setenv("SOME_OTHER_SETTING", "also-not-for-probes")
    result = await LocalRunner({"EXTRA": "given"}).run("cat /proc/self/environ | tr '\\0' '\\n'", timeout=10)
    seen = dict(line.split("=", 1) for line in result.stdout.decode().splitlines() if "=" in line)
    assert not {"SLACK_SIGNING_SECRET", "SLACK_BOT_TOKEN", "SOME_OTHER_SETTING"} & seen.keys()
    assert seen["EXTRA"] == "given" and seen["PATH"]  # what the caller gives and what tools need stay


def test_the_probe_environment_keeps_only_what_tools_need():
    base = {"PATH": "/bin", "HOME": "/root", "SLACK_APP_TOKEN": "xapp-1", "AWS_SECRET_ACCESS_KEY": "x", "LANG": "C.UTF-8"}
    assert probe_environment(None, base) == {"PATH": "/bin", "HOME": "/root", "LANG": "C.UTF-8"}
    assert probe_environment({"PATH": "/stand-in:/bin"}, base)["PATH"] == "/stand-in:/bin"
    assert probe_environment(None, {})["PATH"]  # never an empty PATH: bash must find coreutils
