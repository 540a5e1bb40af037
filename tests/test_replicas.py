"""Two real `runbot serve` on one PostgreSQL database: one leads, the other stands by and answers; the leader
killed with SIGKILL mid-incident, the standby leads within check_every and a few seconds, tells the recovery in the
incident's thread, and nothing is posted twice."""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from tests.slack_stub import SlackStub
from tests.standins import set_age, writer_holding
from tests.test_serve import free_port, serve_env, start_serve

CHECK_EVERY_S = 1.0
TAKEOVER_BOUND_S = CHECK_EVERY_S + 8  # the bound: check_every and a few seconds (a loaded CI machine)


@pytest.fixture(scope="module")
def stub():
    with SlackStub() as s:
        yield s


def role(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
            return json.loads(answer.read()).get("role")
    except OSError:
        return None


def write_config(tmp: Path) -> None:
    (tmp / "bin").mkdir(exist_ok=True)
    (tmp / "train.log").write_text("".join(f"step={i} loss=2.{i} tok/s=14200\n" for i in range(1, 6)))
    (tmp / "runs.toml").write_text(
        f'[bot]\ncheck_every = "{CHECK_EVERY_S:g}s"\nalert_channel = "C0ALERTS"\n'
        f'[runs.alpha]\nhost = "local"\nlog = "{tmp / "train.log"}"\ngpu_samples = 1\nsilence_after = "3s"\n')


def steps(log: Path, first: int) -> None:
    with log.open("a") as f:
        f.write("".join(f"step={i} loss=1.9 tok/s=14100\n" for i in range(first, first + 3)))


def parents(stub: SlackStub) -> list[dict]:
    return [p for p in stub.posts("chat.postMessage") if not p.get("thread_ts")]


def test_the_standby_leads_when_the_leader_is_killed_and_tells_the_recovery_in_its_thread(tmp_path, stub, pg_server):
    stub.reset()
    write_config(tmp_path)
    url = pg_server.database()
    log = tmp_path / "train.log"
    ports = free_port(), free_port()
    procs = []
    try:
        with writer_holding(log):
            leader = start_serve(tmp_path, serve_env(tmp_path, stub, ports[0], RUNBOT_STATE_DB=url))
            procs.append(leader)
            stub.wait_for(lambda: role(ports[0]) == "leader" or leader.poll() is not None, timeout=60)
            assert leader.poll() is None, leader.communicate()
            standby = start_serve(tmp_path, serve_env(tmp_path, stub, ports[1], RUNBOT_STATE_DB=url))
            procs.append(standby)
            stub.wait_for(lambda: role(ports[1]) == "standby" or standby.poll() is not None, timeout=60)
            assert standby.poll() is None, standby.communicate()

            set_age(log, 60)  # alpha goes silent: the leader opens an incident
            [parent] = stub.wait_for(lambda: parents(stub), timeout=30)
            assert parent["text"].startswith("alpha: silent"), parent
            leader.send_signal(signal.SIGKILL)  # mid-incident, no goodbye
            leader.wait(10)
            killed = time.monotonic()
            stub.wait_for(lambda: role(ports[1]) == "leader", timeout=30)
            took = time.monotonic() - killed
            assert took <= TAKEOVER_BOUND_S, f"the standby led {took:.1f} s after the kill"

            steps(log, 6)
            time.sleep(CHECK_EVERY_S * 2)
            steps(log, 9)
            parent_ts = stub.wait_for(lambda: next((m["ts"] for m in stub.channel_messages("C0ALERTS")
                                                    if m.get("text", "").startswith("alpha: silent")), None), timeout=10)
            replies = stub.wait_for(lambda: [p for p in stub.posts("chat.postMessage")
                                             if p.get("thread_ts") == parent_ts and "recovered" in p.get("text", "")],
                                    timeout=30)
        assert len(replies) == 1
        assert len(parents(stub)) == 1  # the alert was posted once, by the leader that died; nothing twice
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.communicate(timeout=30)
            except Exception:  # noqa: BLE001
                proc.kill()
    assert procs[1].returncode == 0


def test_a_database_stopped_under_a_running_bot_is_said_once_and_alerts_are_held_then_sent(tmp_path, stub, pg_server):
    stub.reset()
    write_config(tmp_path)
    url = pg_server.database()
    log = tmp_path / "train.log"
    port = free_port()
    with writer_holding(log):
        proc = start_serve(tmp_path, serve_env(tmp_path, stub, port, RUNBOT_STATE_DB=url))
        try:
            stub.wait_for(lambda: role(port) == "leader" or proc.poll() is not None, timeout=60)
            assert proc.poll() is None, proc.communicate()
            pg_server.stop()  # every session cut, the server gone
            try:
                set_age(log, 60)  # alpha goes silent while the database is away
                notes = lambda: [p for p in stub.posts("chat.postMessage") if "state database is failing" in p.get("text", "")]  # noqa: E731
                stub.wait_for(notes, timeout=30)
                # the lock went with the server: the leader is cut off (/healthz says so), judging on and holding its alert
                assert stub.wait_for(lambda: role(port) == "cut off", timeout=15)
                time.sleep(CHECK_EVERY_S * 3)
            finally:
                pg_server.start()
            [parent] = stub.wait_for(lambda: [p for p in parents(stub) if p["text"].startswith("alpha: silent")], timeout=30)
            stub.wait_for(lambda: [p for p in stub.posts("chat.postMessage") if "written again" in p.get("text", "")],
                          timeout=30)
            assert len(notes()) == 1  # said once, not every sweep
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
    assert len([p for p in parents(stub) if p["text"].startswith("alpha: silent")]) == 1
