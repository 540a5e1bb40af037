"""`runbot serve` end to end: a real bot process, a writer process, the local stand-in for Slack's Web API."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.slack_stub import BOT_TOKEN, SECRET, SlackStub
from tests.standins import REPO

pytestmark = pytest.mark.slow

WRITER = r"""
import pathlib, sys, time
log, ctl = sys.argv[1], pathlib.Path(sys.argv[2])
out = open(log, "a", buffering=1)  # held open, like `python train.py >> train.log`
step = 0
while True:
    mode = ctl.read_text().strip()
    if mode == "run":
        step += 1
        out.write(f"step={step} loss=2.01 tok/s=14200\n")
    elif mode == "crash":
        out.write("Traceback (most recent call last):\n  File \"train.py\", line 40, in <module>\n"
                  "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 372.53 GiB.\n")
        sys.exit(1)
    time.sleep(0.2)
"""

CONFIG = """
[bot]
check_every = "1s"
alert_channel = "C0ALERTS"
state_db = "state.sqlite3"
probe_timeout = "10s"

[defaults]
gpu_samples = 1
silence_after = "3s"

[runs.dflash]
host = "local"
log = "train.log"
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Bot:
    """`runbot serve` in its own process; its JSON log lines go to a file we can count sweeps in."""

    def __init__(self, folder: Path, stub: SlackStub) -> None:
        self.folder, self.stub, self.proc, self.starts = folder, stub, None, 0

    def start(self) -> None:
        self.starts += 1
        self.log = self.folder / f"bot{self.starts}.log"
        env = {**os.environ, "SLACK_BOT_TOKEN": BOT_TOKEN, "SLACK_SIGNING_SECRET": SECRET,
               "SLACK_API_BASE_URL": self.stub.api_url, "PORT": str(free_port()), "SLACK_APP_TOKEN": ""}
        env.pop("RUNBOT_STATE_DB", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "bot", "--config", str(self.folder / "runs.toml"), "serve"],
                                     cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=self.log.open("wb"))

    def sweeps(self) -> int:
        return self.log.read_text(errors="replace").count('"msg": "sweep: ')

    def wait_sweeps(self, n: int, timeout: float = 20.0) -> None:
        target = self.sweeps() + n
        deadline = time.monotonic() + timeout
        while self.sweeps() < target:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"no {n} sweeps in {timeout} s:\n" + self.log.read_text()[-3000:]
            time.sleep(0.1)

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(20)


def query(folder: Path, sql: str):
    with contextlib.closing(sqlite3.connect(folder / "state.sqlite3")) as db:
        return db.execute(sql).fetchone()[0]


def unsent(folder: Path) -> int:
    return query(folder, "SELECT count(*) FROM outbox WHERE sent_at IS NULL")


def parents(stub: SlackStub) -> list[dict]:
    return [p for p in stub.posts("chat.postMessage") if not p.get("thread_ts")]


def thread(stub: SlackStub, ts: str) -> list[str]:
    return [p["text"] for p in stub.posts("chat.postMessage") if p.get("thread_ts") == ts]


def test_serve_alerts_survive_kill_9_and_a_slack_outage(tmp_path):
    (tmp_path / "runs.toml").write_text(CONFIG)
    (tmp_path / "writer.py").write_text(WRITER)
    ctl = tmp_path / "ctl"
    ctl.write_text("run")
    writer = subprocess.Popen([sys.executable, str(tmp_path / "writer.py"), str(tmp_path / "train.log"), str(ctl)])
    with SlackStub() as stub:
        bot = Bot(tmp_path, stub)
        bot.start()
        try:
            bot.wait_sweeps(2)
            assert parents(stub) == []  # healthy: nothing to say

            ctl.write_text("pause")  # alive, holding the log, writing nothing
            [parent] = stub.wait_for(lambda: parents(stub), timeout=20)
            assert parent["channel"] == "C0ALERTS" and "dflash: silent" in parent["text"]
            assert parent["metadata"]["event_payload"]["key"].startswith("dflash#1:")
            assert [b["type"] for b in parent["blocks"]][-1] == "actions"

            # The bot writes "sent" right after Slack answers; a kill inside that millisecond leaves the post
            # in doubt, which the bot settles by looking in the channel (tests/test_watchdog.py) — the stub
            # has no conversations.history, so here the kill comes once the answer is on disk.
            stub.wait_for(lambda: unsent(tmp_path) == 0)
            bot.kill9()  # no goodbye, no flush
            bot.start()
            bot.wait_sweeps(3)
            assert parents(stub) == [parent]  # the restarted bot knows the incident
            ts = query(tmp_path, "SELECT parent_ts FROM incidents WHERE run = 'dflash' AND seq = 1")

            ctl.write_text("run")
            stub.wait_for(lambda: any("recovered" in t for t in thread(stub, ts)), timeout=20)
            stub.wait_for(lambda: [u for u in stub.posts("chat.update") if u["ts"] == ts and "recovered" in u["text"]])

            stub.fail_until_cleared(500, method="chat.postMessage")
            ctl.write_text("crash")
            writer.wait(10)
            stub.wait_for(lambda: sum(1 for m, p, s in stub.attempts if m == "chat.postMessage" and s == 500) >= 2,
                          timeout=20)
            bot.wait_sweeps(1)
            assert not any("crashed" in t for t in thread(stub, ts))  # held while Slack is down
            stub.clear_failures()
            stub.wait_for(lambda: any("crashed" in t for t in thread(stub, ts)), timeout=20)
            bot.wait_sweeps(3)
            replies = thread(stub, ts)
            # The crash once, then the run's end-of-run summary once, last in the thread.
            crash = [t for t in replies if "crashed" in t and "summary" not in t]
            assert len(crash) == 1 and "OutOfMemoryError" in crash[0]
            assert sum("dflash: summary — crashed" in t for t in replies) == 1 and "summary" in replies[-1]
            assert parents(stub) == [parent]  # one incident, one thread, start to end
        finally:
            code = bot.stop()
            if writer.poll() is None:
                writer.kill()
                writer.wait()
    assert code == 0
