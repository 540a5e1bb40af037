"""The SQLite store: states round-trip, the outbox keeps order and doubt, schema versions are checked."""

from __future__ import annotations

import sqlite3

import pytest

from bot.alerts import RunState, Status
from bot.store import SCHEMA_VERSION, Outgoing, Store, StoreError, Watch

T0 = 1_800_000_000.0
STATE = RunState(Status.OPEN, "thread_died:drafter-1", seq=3, announced=True, opened_at=T0, changed_at=T0,
                 notified_at=T0, headline="training, but…", muted_until=T0 + 60, muted_by="U1",
                 streaks=(("thread_died:drafter-1", 2), ("gpu_idle:x", 1)))


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "state.sqlite3")
    yield s
    s.close()


def test_a_state_survives_a_restart(tmp_path):
    path = tmp_path / "state.sqlite3"
    first = Store(path)
    first.commit("dflash", STATE)
    first.close()  # (kill -9 is the e2e test's business; WAL commits are durable on their own)
    again = Store(path)
    assert again.state("dflash") == STATE
    assert again.states() == {"dflash": STATE}
    assert again.state("other") is None


def test_queued_messages_wait_for_their_parent(store):
    store.commit("a", STATE, [Outgoing("post", {"text": "p"}, "C1"), Outgoing("reply", {"text": "r"})], now=T0)
    rows = store.pending("a")
    assert [(r.op, r.payload["text"], r.channel, r.parent_ts) for r in rows] == [("post", "p", "C1", None), ("reply", "r", "C1", None)]
    assert len({r.key for r in rows}) == 2 and rows[0].key.startswith("a#3:")
    store.trying(rows[0].id, T0)
    assert store.pending("a")[0].tried_at == T0  # in doubt until the outcome is written
    store.sent(rows[0], "111.1", T0 + 1, channel="C1ID")
    assert store.thread("a", 3) == ("C1ID", "111.1")
    [reply] = store.pending("a")
    assert (reply.op, reply.parent_ts, reply.channel) == ("reply", "111.1", "C1ID")


def test_a_failure_keeps_the_row_and_says_whether_it_is_in_doubt(store):
    [rid] = store.commit("a", STATE, [Outgoing("post", {"text": "p"}, "C1")], now=T0)
    store.trying(rid, T0)
    store.failed(rid, "HTTP 500", in_doubt=False)
    [row] = store.pending()
    assert (row.attempts, row.tried_at) == (1, None)
    store.trying(rid, T0 + 5)
    store.failed(rid, "timed out", in_doubt=True)
    [row] = store.pending()
    assert (row.attempts, row.tried_at) == (2, T0 + 5)


def test_only_the_latest_unsent_edit_is_kept(store):
    store.commit("a", STATE, [Outgoing("post", {"text": "p"}, "C1")], now=T0)
    store.commit("a", STATE, [Outgoing("update", {"text": "u1"})], now=T0 + 1)
    store.commit("a", STATE, [Outgoing("reply", {"text": "r"}), Outgoing("update", {"text": "u2"})], now=T0 + 2)
    assert [r.payload["text"] for r in store.pending("a")] == ["p", "r", "u2"]


def test_a_commit_is_all_or_nothing(store):
    store.commit("a", STATE)
    with pytest.raises(sqlite3.IntegrityError):
        store.commit("a", RunState(seq=9), [Outgoing("bogus", {})])
    assert store.state("a") == STATE and store.pending() == []


def test_watches_one_per_run(store):
    w = Watch("a", "C1", "1.1", T0, "U1")
    assert store.start_watch(w, stale_before=T0 - 1800) is None
    assert store.start_watch(Watch("a", "C2", "2.2", T0 + 5), stale_before=T0 - 1800) == w
    assert store.start_watch(Watch("a", "C2", "2.2", T0 + 2000), stale_before=T0 + 1) is None  # the old one expired
    assert [x.channel for x in store.watches()] == ["C2"]
    store.end_watch("a")
    assert store.watches() == []


def test_schema_is_versioned(tmp_path):
    path = tmp_path / "s.sqlite3"
    Store(path).close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="newer runbot"):
        Store(path)
    other = tmp_path / "other.sqlite3"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE x (y)")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="not a runbot state file"):
        Store(other)


def test_prune_forgets_old_sent_rows_only(store):
    [_, r] = store.commit("a", STATE, [Outgoing("post", {"text": "p"}, "C1"), Outgoing("reply", {"text": "r"})], now=T0)
    store.sent(store.pending()[0], "1.1", T0)
    assert store.prune(T0 + 1) == 1
    assert [x.id for x in store.pending()] == [r]
