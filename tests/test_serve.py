"""`runbot serve` (HTTP and Socket Mode), its hooks and clean stop, and `runbot preview`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import types
import urllib.parse
from pathlib import Path

import aiohttp
import pytest

from bot import cli
from bot.service import serve, watchdog
from bot.service.state_file import StateFile
from config.registry import load_registry
from config.settings import Settings
from tests.slack_stub import (
    APP_TOKEN,
    BOT_TOKEN,
    SECRET,
    SlackStub,
    action_envelope,
    post,
    sign,
    slash_body,
    slash_envelope,
)
from tests.standins import fake_nvidia_smi, path_with, remount_read_only, small_filesystem, writer_holding

REPO = Path(__file__).resolve().parents[1]
RUNBOT = Path(sys.executable).with_name("runbot")
SMI = "0, 31395, 143771, 97\n1, 18211, 143771, 88\n"


@pytest.fixture(scope="module")
def stub():
    with SlackStub() as s:
        yield s


@pytest.fixture
def slack(stub):
    stub.reset()
    return stub


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(autouse=True)
def training(tmp_path):
    """The run's training process, holding its log open as a real one does."""
    with writer_holding(tmp_path / "train.log"):
        yield


def setup_run(tmp: Path, *, smi_delay: float = 0) -> Path:
    (tmp / "train.log").write_text("step=41 loss=2.25 tok/s=14100\nstep=42 loss=2.21 tok/s=14200 <!channel>\n")
    fake_nvidia_smi(tmp / "bin", [SMI])
    if smi_delay:
        (tmp / "bin" / "nvidia-smi").rename(tmp / "bin" / "nvidia-smi.real")
        (tmp / "bin" / "nvidia-smi").write_text(f'#!/usr/bin/env bash\nsleep {smi_delay}\nexec "$(dirname "$0")/nvidia-smi.real" "$@"\n')
        (tmp / "bin" / "nvidia-smi").chmod(0o755)
    config = tmp / "runs.toml"
    config.write_text(f'[runs.dflash]\nhost = "local"\nlog = "{tmp / "train.log"}"\ngpu_samples = 1\nsilence_after = "1h"\n'
                      "[runs.dflash.gpus]\ntarget = [0]\ndrafter = [1]\n")
    return config


def serve_env(tmp: Path, stub: SlackStub, port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "RUNBOT_"))}
    env.update(PORT=str(port), SLACK_BOT_TOKEN=BOT_TOKEN, SLACK_SIGNING_SECRET=SECRET, SLACK_API_BASE_URL=stub.api_url,
               RUNBOT_CONFIG=str(tmp / "runs.toml"), PATH=f"{tmp / 'bin'}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=str(REPO))  # this checkout's packages, however the venv was installed
    env.update(extra)
    return env


def start_serve(tmp: Path, env: dict[str, str]) -> subprocess.Popen:
    cmd = [str(RUNBOT)] if RUNBOT.exists() else [sys.executable, "-m", "bot"]
    return subprocess.Popen([*cmd, "serve"], cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def healthy(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            return b" 200 " in s.recv(100).split(b"\r\n")[0]
    except OSError:
        return False


async def ahealthy(port: int) -> bool:
    """healthy() for a server on this test's own event loop."""
    try:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/healthz") as resp:
            return resp.status == 200
    except aiohttp.ClientError:
        return False


# -- the real command, as a subprocess ----------------------------------------------------------


def test_runbot_serve_http_mode_end_to_end(tmp_path, slack):
    setup_run(tmp_path)
    port = free_port()
    proc = start_serve(tmp_path, serve_env(tmp_path, slack, port))
    try:
        slack.wait_for(lambda: healthy(port) or proc.poll() is not None, timeout=30)
        assert proc.poll() is None, proc.communicate()
        url = f"http://127.0.0.1:{port}/slack/events"
        body = slash_body("status dfl here", response_url=slack.response_url("e2e"))
        started = time.monotonic()
        status, _ = post(url, body, sign(body))
        assert status == 200 and time.monotonic() - started < 2.0
        answer = slack.wait_for(lambda: slack.responses_to("e2e"))[0]
        assert answer["response_type"] == "in_channel"
        assert answer["text"].splitlines()[0].startswith("dflash: step 42 · 14.2K tok/s · loss 2.21")
        forged = post(url, body, sign(body, secret="wrong"))
        assert forged[0] == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    records = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert len(records) == len(err.splitlines()), err  # every log line is one JSON object
    command = next(r for r in records if r.get("event") == "command")
    assert command["user"] == "U0ALICE" and command["channel"] == "C0TEAM" and command["command"] == "status"
    assert command["run"] == "dflash" and command["outcome"] == "ok"
    events = [r.get("event") for r in records]
    assert events.index("ready") < events.index("command") < events.index("stopping") < events.index("stopped")


def test_sigterm_lets_answers_in_flight_go_out(tmp_path, slack):
    setup_run(tmp_path, smi_delay=1.5)
    port = free_port()
    proc = start_serve(tmp_path, serve_env(tmp_path, slack, port))
    try:
        slack.wait_for(lambda: healthy(port) or proc.poll() is not None, timeout=30)
        body = slash_body("status dflash", response_url=slack.response_url("late"))
        assert post(f"http://127.0.0.1:{port}/slack/events", body, sign(body))[0] == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert slack.responses_to("late")[0]["text"].startswith("dflash: step 42")


def test_serve_without_a_signing_secret_says_so(tmp_path, slack):
    setup_run(tmp_path)
    env = serve_env(tmp_path, slack, free_port())
    del env["SLACK_SIGNING_SECRET"]
    proc = start_serve(tmp_path, env)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert "SLACK_SIGNING_SECRET" in err and "Socket Mode" in err


def test_serve_with_the_bot_token_as_app_token_refuses_before_asking_slack(tmp_path, slack):
    setup_run(tmp_path)
    proc = start_serve(tmp_path, serve_env(tmp_path, slack, free_port(), SLACK_APP_TOKEN=BOT_TOKEN))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert "SLACK_APP_TOKEN: is the bot token" in err and BOT_TOKEN not in err
    assert not slack.calls  # refused locally: no auth.test, no apps.connections.open


def test_serve_logs_at_runbot_log_level(tmp_path, slack):
    setup_run(tmp_path)
    port = free_port()
    proc = start_serve(tmp_path, serve_env(tmp_path, slack, port, RUNBOT_LOG_LEVEL="warning"))
    try:
        deadline = time.monotonic() + 20
        while not healthy(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert healthy(port)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    events = [json.loads(line).get("event") for line in err.splitlines() if line.startswith("{")]
    assert "ready" not in events and "stopped" not in events  # info records, below the level asked for


def test_serve_on_a_busy_port_says_so(tmp_path, slack):
    setup_run(tmp_path)
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        proc = start_serve(tmp_path, serve_env(tmp_path, slack, taken.getsockname()[1]))
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "cannot listen" in err


def test_serve_with_a_state_file_it_cannot_open_says_so_in_one_line(tmp_path, slack):
    setup_run(tmp_path)
    state = tmp_path / "no-such-folder" / "state.sqlite3"
    proc = start_serve(tmp_path, serve_env(tmp_path, slack, free_port(), RUNBOT_STATE_DB=str(state)))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2, err
    assert err.splitlines() == [err.strip()] and err.startswith(f"runbot: {state}: "), err  # no traceback
    assert slack.posts("auth.test") == []  # the state file is checked before Slack is asked anything


# -- in-process: hooks and Socket Mode -------------------------------------------------------------


class Hook:
    def __init__(self, events: list) -> None:
        self.events = events

    async def on_start(self, services) -> None:
        self.events.append(("start", services.registry.names()))

    def on_stop(self, services) -> None:  # plain functions work too
        self.events.append(("stop", services.registry.names()))


async def test_startup_hooks_start_and_stop_with_the_server(tmp_path, slack, monkeypatch):
    registry = load_registry(setup_run(tmp_path))
    port = free_port()
    settings = Settings(_env_file=None, slack_bot_token=BOT_TOKEN, slack_signing_secret=SECRET, slack_app_token=None,
                        slack_api_base_url=slack.api_url, port=port)
    events: list = []
    module = types.ModuleType("tests_fake_watchdog")
    module.on_start = lambda services: events.append(("module start", type(services).__name__))
    monkeypatch.setattr(serve, "STARTUP_HOOKS", [Hook(events), module])  # an object, or a module
    stop = asyncio.Event()
    task = asyncio.create_task(serve.serve_async(registry, settings, local_env=path_with(tmp_path / "bin"), stop=stop,
                                                 host="127.0.0.1"))
    await slack.until(lambda: len(events) == 2)
    assert events == [("start", ["dflash"]), ("module start", "Services")]
    assert await ahealthy(port)
    stop.set()
    assert await asyncio.wait_for(task, 15) == 0
    assert events[-1] == ("stop", ["dflash"])
    assert not await ahealthy(port)


async def test_socket_mode_answers_commands_and_buttons(tmp_path, slack):
    registry = load_registry(setup_run(tmp_path))
    settings = Settings(_env_file=None, slack_bot_token=BOT_TOKEN, slack_app_token=APP_TOKEN, slack_signing_secret=None,
                        slack_api_base_url=slack.api_url)
    assert settings.socket_mode
    stop = asyncio.Event()
    task = asyncio.create_task(serve.serve_async(registry, settings, local_env=path_with(tmp_path / "bin"), stop=stop))
    try:
        await slack.until(lambda: slack.socket_clients, timeout=15)
        assert slack.posts("apps.connections.open")
        envelope = slash_envelope("status dflash", response_url=slack.response_url("sock"))
        slack.socket_send(envelope)
        ack = await slack.until(lambda: [m for m in slack.socket_received if m.get("envelope_id") == envelope["envelope_id"]])
        assert ack[0]["envelope_id"] == envelope["envelope_id"]
        answer = (await slack.until(lambda: slack.responses_to("sock")))[0]
        assert answer["text"].startswith("dflash: step 42")
        slack.socket_send(action_envelope("runbot.gpus", "dflash", response_url=slack.response_url("sock-click")))
        update = (await slack.until(lambda: slack.posts("chat.update")))[0]
        assert "target:" in json.dumps(update["blocks"])
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 15) == 0


async def test_socket_mode_with_a_bad_app_token_fails_cleanly(tmp_path, slack):
    registry = load_registry(setup_run(tmp_path))
    settings = Settings(_env_file=None, slack_bot_token=BOT_TOKEN, slack_app_token=APP_TOKEN, slack_api_base_url=slack.api_url)
    slack.fail_until_cleared(status=200, method="apps.connections.open")  # HTTP 200 with ok: false
    try:
        assert await asyncio.wait_for(serve.serve_async(registry, settings), 15) == 1
    finally:
        slack.clear_failures()


# -- runbot preview ----------------------------------------------------------------------------------


def test_preview_prints_block_kit_and_a_builder_link(tmp_path, monkeypatch, capsys):
    config = setup_run(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert cli.main(["--config", str(config), "preview", "dfl"]) == 0
    out = capsys.readouterr().out
    blocks_json, link = out.rsplit("\n\n", 1)
    message = json.loads(blocks_json)
    assert message["text"].splitlines()[0].startswith("dflash: step 42")
    assert "&lt;!channel&gt;" not in blocks_json  # status shows no tail
    link = link.strip()
    assert link.startswith("https://app.slack.com/block-kit-builder/#")
    assert json.loads(urllib.parse.unquote(link.split("#", 1)[1])) == {"blocks": message["blocks"]}
    assert cli.main(["--config", str(config), "preview", "dflash", "--view", "tail"]) == 0
    assert "&lt;!channel&gt;" in capsys.readouterr().out


def test_the_manifest_and_procfile_say_what_the_docs_say():
    manifest = (REPO / "slack-app-manifest.yml").read_text()
    code = [line.split("#")[0].rstrip() for line in manifest.splitlines() if line.split("#")[0].strip()]
    assert "    - command: /run" in code
    assert [line.strip() for line in code if line.startswith("      - ")] == [
        "- commands", "- chat:write", "- chat:write.public", "- channels:history", "- groups:history", "- files:write",
        "- channels:read", "- groups:read"]
    assert "  socket_mode_enabled: true" in code and "    is_enabled: true" in code
    procs = [line for line in (REPO / "Procfile").read_text().splitlines() if line and not line.startswith("#")]
    assert procs == ["web: runbot serve", "worker: runbot serve"]
    assert "## Connect to Slack" in (REPO / "docs" / "slack.md").read_text()


# -- the state file, and the order of a stop ---------------------------------------------------------


def _settings(slack, port: int | None = None) -> Settings:
    return Settings(_env_file=None, slack_bot_token=BOT_TOKEN, slack_signing_secret=SECRET, slack_app_token=None,
                    slack_api_base_url=slack.api_url, port=port or free_port())


@pytest.mark.parametrize("content, says", [
    ("newer", "written by a newer runbot"),
    ("foreign", "not a runbot state file"),
    ("nofolder", "does its folder exist"),
    ("dropped", "not a runbot state file this runbot can write (table watches lacks user)"),  # every write would fail
])
async def test_a_bad_state_file_is_one_line_and_exit_2_before_slack_is_asked(tmp_path, slack, capsys, content, says):
    import sqlite3

    state = tmp_path / "state.sqlite3"
    if content == "nofolder":
        state = tmp_path / "gone" / "state.sqlite3"
    elif content == "dropped":
        StateFile.open(state).close()
        db = sqlite3.connect(state)
        db.execute("ALTER TABLE watches DROP COLUMN user")
        db.close()
    else:
        db = sqlite3.connect(state)
        db.execute("CREATE TABLE notes (x)" if content == "foreign" else "PRAGMA user_version = 99")
        db.commit()
        db.close()
    config = setup_run(tmp_path)
    config.write_text(f'[bot]\nstate_db = "{state}"\n' + config.read_text())
    code = await asyncio.wait_for(serve.serve_async(load_registry(config), _settings(slack), host="127.0.0.1"), 15)
    err = capsys.readouterr().err
    assert code == 2
    assert err.splitlines() == [err.strip()] and err.startswith(f"runbot: {state}: ") and says in err, err
    assert err.count(str(state)) == 1
    assert slack.posts("auth.test") == []


async def test_a_state_file_on_a_read_only_disk_starts_and_says_so_in_the_alert_channel(tmp_path, slack):
    # A read-only file used to refuse to start (exit 2) while a corrupt one started empty: no watchdog at all
    # after a disk remounted itself read-only. It starts from what the file holds, and says so once.
    with small_filesystem(tmp_path / "disk") as disk:
        if disk is None:
            pytest.skip("needs root and mount (a tmpfs remounted read-only): as root, permissions stop no write")
        state = disk / "state.sqlite3"
        StateFile.open(state).close()
        assert remount_read_only(disk)
        config = setup_run(tmp_path)
        config.write_text(f'[bot]\nstate_db = "{state}"\nalert_channel = "C0ALERTS"\n' + config.read_text())
        port = free_port()
        stop = asyncio.Event()
        task = asyncio.create_task(serve.serve_async(load_registry(config), _settings(slack, port),
                                                     local_env=path_with(tmp_path / "bin"), stop=stop, host="127.0.0.1"))
        try:
            note = await slack.until(lambda: [p for p in slack.posts("chat.postMessage") if "cannot be written" in p["text"]],
                                     15)
            assert await ahealthy(port)
        finally:
            stop.set()
            assert await asyncio.wait_for(task, 15) == 0
    assert note[0]["channel"] == "C0ALERTS" and len(note) == 1
    assert note[0]["text"].startswith(f":warning: runbot's state file {state} cannot be written (attempt to write a readonly")


async def test_a_corrupt_state_file_is_moved_aside_and_said_in_the_alert_channel(tmp_path, slack):
    # Corrupt used to be silent while running and exit 2 on restart: no watchdog until someone deleted it.
    slack.reset()
    state = tmp_path / "state.sqlite3"
    state.write_bytes(b"this is not sqlite at all, " * 100)
    config = setup_run(tmp_path)
    config.write_text(f'[bot]\nstate_db = "{state}"\nalert_channel = "C0ALERTS"\n' + config.read_text())
    stop = asyncio.Event()
    task = asyncio.create_task(serve.serve_async(load_registry(config), _settings(slack),
                                                 local_env=path_with(tmp_path / "bin"), stop=stop, host="127.0.0.1"))
    note = await slack.until(lambda: [p for p in slack.posts("chat.postMessage") if "was corrupt" in p["text"]], 15)
    stop.set()
    assert await asyncio.wait_for(task, 15) == 0
    [aside] = [p for p in tmp_path.iterdir() if p.name.startswith("state.sqlite3.corrupt-")]
    assert aside.read_bytes().startswith(b"this is not sqlite") and aside.name in note[0]["text"]
    assert note[0]["channel"] == "C0ALERTS"
    sqlite3_ok = StateFile.open(state)  # the new file is a sound, empty state file
    assert sqlite3_ok.ledger.states == {}
    sqlite3_ok.close()


async def test_a_stop_lets_work_in_flight_finish_before_the_hooks_stop(tmp_path, slack, monkeypatch):
    """A /run mute in flight at SIGTERM still finds the watchdog and its store open."""
    registry = load_registry(setup_run(tmp_path))
    events: list = []
    entered = asyncio.Event()

    class InFlight:
        async def on_start(self, services) -> None:
            async def mute_soon() -> None:
                with services.tracking():
                    entered.set()
                    await asyncio.sleep(0.5)
                    try:
                        await services.watchdog.mute(registry.runs["dflash"], time.time() + 60, "U1")
                        events.append("muted")
                    except Exception as exc:  # noqa: BLE001 - the test's point
                        events.append(f"{type(exc).__name__}: {exc}")

            self.task = asyncio.create_task(mute_soon())

        def on_stop(self, services) -> None:
            events.append(("stop", services.store.ledger.state("dflash") is not None))

    monkeypatch.setattr(serve, "STARTUP_HOOKS", [watchdog, InFlight()])
    stop = asyncio.Event()
    task = asyncio.create_task(serve.serve_async(registry, _settings(slack), local_env=path_with(tmp_path / "bin"),
                                                 stop=stop, host="127.0.0.1"))
    await asyncio.wait_for(entered.wait(), 15)
    stop.set()
    assert await asyncio.wait_for(task, 15) == 0
    assert events == ["muted", ("stop", True)]
