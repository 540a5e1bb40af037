"""The state in a real PostgreSQL server: refused when it is not runbot's, kept across kill -9, and a database lost
under the bot is a fault like a failing disk (answers from memory, written whole once it is back, said once each)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import psycopg
import pytest

from bot.core.alerts import RunState, Status
from bot.core.ledger import Outgoing
from bot.service.state_file import StateFile, StateFileError
from bot.service.store import SCHEMA_VERSION
from bot.service.store_pg import PgStore
from tests.test_store import STATE, T0


def _sql(url: str, statement: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement)


def test_a_database_with_tables_named_as_runbots_but_not_runbots_is_refused(pg_server):
    url = pg_server.database()
    _sql(url, "CREATE TABLE runs (id int)")
    with pytest.raises(StateFileError, match="not a runbot database"):
        StateFile.open(url)


def test_other_tables_beside_runbots_are_left_alone(pg_server):
    url = pg_server.database()
    _sql(url, "CREATE TABLE their_own (x int)")
    StateFile.open(url).close()
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM their_own").fetchone() == (0,)


def test_a_newer_runbots_database_is_refused(pg_server):
    url = pg_server.database()
    StateFile.open(url).close()
    _sql(url, f"UPDATE runbot_meta SET value = '{SCHEMA_VERSION + 1}' WHERE key = 'schema'")
    with pytest.raises(StateFileError, match="newer runbot"):
        StateFile.open(url)


def test_a_server_that_cannot_be_reached_at_start_is_refused_without_its_password():
    # Port 9 (discard) on loopback: nothing listens there.
    with pytest.raises(StateFileError) as caught:
        StateFile.open("postgresql://runbot:hunter2@127.0.0.1:9/runbot")
    assert "cannot be used" in str(caught.value) and "hunter2" not in str(caught.value)
    assert "runbot:***@127.0.0.1:9" in str(caught.value)


def test_two_replicas_starting_at_once_create_the_schema_once(pg_server):
    url, opened, failed = pg_server.database(), [], []

    def start():
        try:
            opened.append(PgStore(url))
        except Exception as exc:  # noqa: BLE001
            failed.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failed and len(opened) == 4
    for store in opened:
        store.close()


async def test_a_flush_that_returned_survives_kill_9(pg_server):
    url = pg_server.database()
    child = textwrap.dedent(f"""
        import asyncio, sys, time
        from bot.service.state_file import StateFile
        from tests.test_store import STATE
        async def main():
            sf = StateFile.open({url!r})
            sf.ledger.commit("dflash", STATE)
            assert await sf.flush()
            print("flushed", flush=True)
            time.sleep(60)
        asyncio.run(main())
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "flushed"
    finally:
        proc.kill()  # SIGKILL: no close, no goodbye
        proc.wait()
    again = StateFile.open(url)
    assert again.ledger.states == {"dflash": STATE}
    again.close()


async def test_a_database_lost_under_the_bot_is_a_fault_said_once_and_rewritten_when_back(pg_server):
    url = pg_server.database()
    notes: list[str] = []
    sf = StateFile.open(url, on_note=notes.append)
    sf.ledger.commit("a", STATE, [Outgoing("post", {"text": "opened"}, "C1")], now=T0)
    assert await sf.flush()
    pg_server.stop()
    try:
        later = RunState(Status.OPEN, STATE.concern, seq=4, opened_at=T0 + 60, changed_at=T0 + 60)
        sf.ledger.commit("b", later, [Outgoing("post", {"text": "another"}, "C1")], now=T0 + 60)
        assert not await sf.flush() and not sf.healthy
        assert sf.ledger.state("b") == later  # answers keep coming from memory
        assert not await sf.flush()
        assert len(notes) == 1 and "state database is failing" in notes[0], notes
    finally:
        pg_server.start()
    assert await sf.flush() and sf.healthy  # the pool's dropped connections are replaced; the ledger written whole
    assert len(notes) == 2 and "written again" in notes[1]
    sf.close()
    again = StateFile.open(url)
    assert again.ledger.states == {"a": STATE, "b": later}
    assert sorted(m.payload["text"] for m in again.ledger.messages.values()) == ["another", "opened"]
    again.close()
