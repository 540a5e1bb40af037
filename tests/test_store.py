"""The watchdog's memory: the ledger's outbox rules, and the state file that keeps it across restarts (a test taking
`state_db` runs on both engines: an SQLite file and a PostgreSQL database)."""

from __future__ import annotations

import json
import sqlite3

import pytest

from bot.core.alerts import RunState, Status
from bot.core.digest import Fold
from bot.core.ledger import Ledger, Outgoing, Watch
from bot.core.verdict import Concern, Worry
from bot.service.state_file import StateFile, StateFileError
from bot.service.store import SCHEMA_VERSION, Store, StoreError

T0 = 1_800_000_000.0
STATE = RunState(Status.OPEN, Concern(Worry.THREAD_DIED, "drafter-1"), seq=3, announced=True, opened_at=T0, changed_at=T0,
                 notified_at=T0, headline="training, but…", muted_until=T0 + 60, muted_by="U1",
                 streaks=((Concern(Worry.THREAD_DIED, "drafter-1"), 2), (Concern(Worry.GPU_IDLE, "x"), 1)))


@pytest.fixture
def ledger():
    return Ledger()


async def test_a_state_survives_a_restart(state_db):
    path = state_db
    first = StateFile.open(path)
    first.ledger.commit("dflash", STATE)
    assert await first.flush()
    first.close()  # (kill -9 is the e2e test's business; WAL commits are durable on their own)
    again = StateFile.open(path)
    assert again.ledger.state("dflash") == STATE
    assert again.ledger.states == {"dflash": STATE}
    assert again.ledger.state("other") is None
    again.close()


def test_queued_messages_wait_for_their_parent(ledger):
    ledger.commit("a", STATE, [Outgoing("post", {"text": "p"}, "C1"), Outgoing("reply", {"text": "r"})], now=T0)
    rows = ledger.pending("a")
    assert [(r.op, r.payload["text"], r.channel, r.parent_ts) for r in rows] == [("post", "p", "C1", None), ("reply", "r", "C1", None)]
    assert len({r.key for r in rows}) == 2 and rows[0].key.startswith("a#3:")
    ledger.trying(rows[0].id, T0)
    assert ledger.pending("a")[0].tried_at == T0  # in doubt until the outcome is written
    ledger.sent(rows[0], "111.1", T0 + 1, channel="C1ID")
    assert ledger.thread("a", 3) == ("C1ID", "111.1")
    [reply] = ledger.pending("a")
    assert (reply.op, reply.parent_ts, reply.channel) == ("reply", "111.1", "C1ID")


def test_a_failure_keeps_the_row_and_says_whether_it_is_in_doubt(ledger):
    [rid] = ledger.commit("a", STATE, [Outgoing("post", {"text": "p"}, "C1")], now=T0)
    ledger.trying(rid, T0)
    ledger.failed(rid, "HTTP 500", in_doubt=False)
    [row] = ledger.pending()
    assert (row.attempts, row.tried_at) == (1, None)
    ledger.trying(rid, T0 + 5)
    ledger.failed(rid, "timed out", in_doubt=True)
    [row] = ledger.pending()
    assert (row.attempts, row.tried_at) == (2, T0 + 5)


def test_only_the_latest_unsent_edit_is_kept(ledger):
    ledger.commit("a", STATE, [Outgoing("post", {"text": "p"}, "C1")], now=T0)
    ledger.commit("a", STATE, [Outgoing("update", {"text": "u1"})], now=T0 + 1)
    ledger.commit("a", STATE, [Outgoing("reply", {"text": "r"}), Outgoing("update", {"text": "u2"})], now=T0 + 2)
    assert [r.payload["text"] for r in ledger.pending("a")] == ["p", "r", "u2"]


def test_a_commit_is_all_or_nothing(ledger):
    ledger.commit("a", STATE)
    with pytest.raises(ValueError):
        ledger.commit("a", RunState(seq=9), [Outgoing("reply", {}), Outgoing("bogus", {})])
    assert ledger.state("a") == STATE and ledger.pending() == []


def test_watches_one_per_run(ledger):
    w = Watch("a", "C1", "1.1", T0, "U1")
    assert ledger.start_watch(w, stale_before=T0 - 1800) is None
    assert ledger.start_watch(Watch("a", "C2", "2.2", T0 + 5), stale_before=T0 - 1800) == w
    assert ledger.start_watch(Watch("a", "C2", "2.2", T0 + 2000), stale_before=T0 + 1) is None  # the old one expired
    assert [x.channel for x in ledger.watches()] == ["C2"]
    ledger.end_watch("a")
    assert ledger.watches() == []


def test_prune_forgets_old_sent_rows_only(ledger):
    [_, r] = ledger.commit("a", STATE, [Outgoing("post", {"text": "p"}, "C1"), Outgoing("reply", {"text": "r"})], now=T0)
    ledger.sent(ledger.pending()[0], "1.1", T0)
    assert ledger.prune(T0 + 1) == 1
    assert [x.id for x in ledger.pending()] == [r]


def test_the_last_ts_of_a_thread_is_exact():
    # Compared as decimals: as doubles, 1796118161.000001 and .000002 can round to one value.
    ledger = Ledger()
    [post, reply] = ledger.commit("a", STATE, [Outgoing("post", {}, "C1"), Outgoing("reply", {})], now=T0)
    ledger.sent(ledger.pending()[0], "1796118161.000001", T0)
    assert ledger.last_ts("a", 3) == "1796118161.000001"
    ledger.sent(ledger.pending()[0], "1796118161.000002", T0)
    assert ledger.last_ts("a", 3) == "1796118161.000002"


async def test_every_row_round_trips_through_the_file(state_db):
    path = state_db
    sf = StateFile.open(path)
    led = sf.ledger
    led.commit("a", STATE, [Outgoing("post", {"text": "p", "blocks": [{"type": "x"}]}, "C1"),
                            Outgoing("reply", {"text": "r"})], now=T0)
    led.trying(led.pending()[0].id, T0)
    led.sent(led.pending()[0], "1.000100", T0 + 1, channel="C1ID")
    led.start_watch(Watch("a", "C1", "1.1", T0, "U1"), stale_before=0)
    assert await sf.flush()
    sf.close()
    again = StateFile.open(path)
    assert again.ledger.messages == led.messages and again.ledger.incidents == led.incidents
    assert again.ledger.watch_rows == led.watch_rows and again.ledger.states == led.states
    [reply] = again.ledger.commit("a", STATE, [Outgoing("reply", {"text": "r2"})], now=T0)
    assert reply > max(led.messages)  # ids go on from the file's, keys never repeat
    again.close()


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
    with pytest.raises(StateFileError, match="newer runbot"):  # refused, not moved aside: a newer runbot's file
        StateFile.open(path)
    other = tmp_path / "other.sqlite3"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE x (y)")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="not a runbot state file"):
        Store(other)
    with pytest.raises(StateFileError, match="not a runbot state file"):  # someone else's database is left alone
        StateFile.open(other)


SCHEMA_1 = """
CREATE TABLE runs (run TEXT PRIMARY KEY, status TEXT NOT NULL, concern TEXT, seq INTEGER NOT NULL,
    announced INTEGER NOT NULL, opened_at REAL, changed_at REAL, notified_at REAL, closed_at REAL,
    healthy INTEGER NOT NULL, headline TEXT NOT NULL, muted_until REAL, muted_by TEXT, streaks TEXT NOT NULL);
CREATE TABLE incidents (run TEXT NOT NULL, seq INTEGER NOT NULL, channel TEXT NOT NULL, parent_ts TEXT,
    opened_at REAL NOT NULL, PRIMARY KEY (run, seq));
CREATE TABLE outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL UNIQUE, run TEXT NOT NULL,
    seq INTEGER NOT NULL, op TEXT NOT NULL CHECK (op IN ('post', 'reply', 'update')), payload TEXT NOT NULL,
    created_at REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, tried_at REAL, last_error TEXT, sent_at REAL, ts TEXT);
CREATE INDEX outbox_pending ON outbox (run, id) WHERE sent_at IS NULL;
CREATE TABLE watches (run TEXT PRIMARY KEY, channel TEXT NOT NULL, ts TEXT NOT NULL, started_at REAL NOT NULL, user TEXT);
PRAGMA user_version=1;
"""


def test_a_schema_1_file_is_read_and_upgraded(tmp_path):
    # The file the previous runbot wrote: an open incident must keep its thread across the upgrade.
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(SCHEMA_1)
    db.execute("INSERT INTO runs VALUES ('a', 'open', 'silent', 3, 1, ?, ?, ?, NULL, 0, 'silent 2 min', NULL, NULL, ?)",
               (T0, T0, T0, json.dumps([["silent", 4]])))
    db.execute("INSERT INTO incidents VALUES ('a', 3, 'C1', '1.1', ?)", (T0,))
    db.execute("INSERT INTO outbox (key, run, seq, op, payload, created_at) VALUES ('a#3:1', 'a', 3, 'reply', '{}', ?)", (T0,))
    db.commit()
    db.close()
    sf = StateFile.open(path)
    state = sf.ledger.state("a")
    assert (state.status, state.concern, state.seq, state.announced, state.streaks) == \
        (Status.OPEN, Concern(Worry.SILENT), 3, True, ((Concern(Worry.SILENT), 4),))
    [row] = sf.ledger.pending("a")
    assert (row.key, row.parent_ts) == ("a#3:1", "1.1")
    sf.close()



async def test_a_schema_3_file_gains_the_digest_columns_and_a_digest_round_trips(tmp_path):
    # Schema 3, as the runbot before channel digests wrote it: no incidents.digest, no outbox.note.
    path = tmp_path / "old.sqlite3"
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE incidents DROP COLUMN digest")
    db.execute("ALTER TABLE outbox DROP COLUMN note")
    db.execute("DROP TABLE formats")  # schema 5's
    db.execute("INSERT INTO incidents (run, seq, channel, parent_ts, opened_at) VALUES ('a', 3, 'C1', '1.1', ?)", (T0,))
    db.execute("INSERT INTO outbox (key, run, seq, op, payload, created_at) VALUES ('a#3:1', 'a', 3, 'reply', '{}', ?)", (T0,))
    db.execute("PRAGMA user_version=3")
    db.commit()
    db.close()
    sf = StateFile.open(path)
    [row] = sf.ledger.pending("a")
    assert (row.parent_ts, row.note, row.digest) == ("1.1", "", None)  # its own thread, as before
    # A storm's digest and a run told in it survive a restart: its thread is the digest's.
    sf.ledger.commit("b", STATE, [Outgoing("post", {"text": "b"}, "C1", note="opened")], now=T0)
    sf.ledger.fold("C1", Fold(drop=(sf.ledger.pending("b")[0].id,), attach=(("b", 3),)), T0)
    [(channel, seq)] = sf.ledger.take_stale()
    sf.ledger.tell_digest(channel, seq, {"text": "1 run changed at once"}, T0, calm=False)
    assert await sf.flush()
    sf.close()
    again = StateFile.open(path)
    assert again.ledger.incidents == sf.ledger.incidents and again.ledger.messages == sf.ledger.messages
    assert again.ledger.members("C1", 1) == [("b", 3)] and again.ledger.open_digest("C1").seq == 1
    again.close()

# A row exactly as the previous runbot wrote it, when concerns were "kind:subject" strings.
OLD_ROW = {"status": "open", "concern": "thread_died:drafter-1", "seq": 3, "announced": True, "opened_at": T0,
           "changed_at": T0, "notified_at": T0, "closed_at": None, "healthy": 0, "headline": "training, but…",
           "muted_until": None, "muted_by": None, "streaks": [["thread_died:drafter-1", 2], ["gpu_idle:x", 1], ["held", 5]],
           "bad": True, "flips": [T0 - 30, T0], "flapping": False}


def _file_with_row(path, row: dict) -> None:
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute("INSERT INTO runs VALUES ('a', ?)", (json.dumps(row),))
    db.commit()
    db.close()


def test_a_state_the_previous_runbot_wrote_loads_typed_and_is_written_back_the_same(tmp_path):
    path = tmp_path / "s.sqlite3"
    _file_with_row(path, OLD_ROW)
    store = Store(path)
    state = store.load().states["a"]
    assert state.concern == Concern(Worry.THREAD_DIED, "drafter-1")
    assert state.streaks == ((Concern(Worry.THREAD_DIED, "drafter-1"), 2), (Concern(Worry.GPU_IDLE, "x"), 1),
                             (Concern(Worry.HELD), 5))
    assert all(type(c) is Concern and type(c.kind) is Worry for c, _ in state.streaks)
    assert state.flips == (T0 - 30, T0) and state.bad is True and state.status is Status.OPEN
    store.dump(store.load())  # written back by this runbot
    store.close()
    db = sqlite3.connect(path)
    [(text,)] = db.execute("SELECT state FROM runs WHERE run = 'a'").fetchall()
    db.close()
    assert json.loads(text) == OLD_ROW

    quiet = {**OLD_ROW, "status": "quiet", "concern": None, "streaks": []}  # no incident: null, as before
    _file_with_row(tmp_path / "quiet.sqlite3", quiet)
    store = Store(tmp_path / "quiet.sqlite3")
    state = store.load().states["a"]
    assert (state.concern, state.streaks) == (None, ())
    store.dump(store.load())
    store.close()
    db = sqlite3.connect(tmp_path / "quiet.sqlite3")
    [(text,)] = db.execute("SELECT state FROM runs WHERE run = 'a'").fetchall()
    db.close()
    assert json.loads(text) == quiet


def test_a_concern_a_newer_runbot_wrote_loads_without_raising(tmp_path):
    path = tmp_path / "s.sqlite3"
    _file_with_row(path, {**OLD_ROW, "concern": "gpu_on_fire:0", "streaks": [["gpu_on_fire:0", 2], ["silent", 1]]})
    store = Store(path)
    state = store.load().states["a"]
    store.close()
    assert isinstance(state.concern, Concern) and isinstance(state.concern.kind, Worry)
    assert [n for _, n in state.streaks] == [2, 1] and all(isinstance(c, Concern) for c, _ in state.streaks)
    assert state.streaks[1][0] == Concern(Worry.SILENT)
    assert (state.status, state.seq, state.headline) == (Status.OPEN, 3, "training, but…")  # the rest as it was


TABLES = ("runs", "incidents", "outbox", "watches", "point_runs", "words", "points", "tallies")


async def _every_kind_of_row(sf: StateFile) -> None:
    """A decision with its post, a watch, a point and a tally: one write to every table."""
    from bot.core.history import Point, RoleLoad, Tally  # noqa: PLC0415
    from bot.core.verdict import Phase  # noqa: PLC0415

    sf.ledger.commit("dflash", STATE, [Outgoing("post", {"text": "dflash: crashed"}, "C1")], T0)
    sf.ledger.start_watch(Watch("dflash", "C1", "1.1", T0), T0 - 60)
    sf.record("dflash", [Point(T0, Phase.TRAINING, 0, 5, 10, 2.0, 3.0, "it/s", 0, (RoleLoad("target", 0.5, 1.0),))],
              Tally(0, T0, T0, 5, 5, 2.0, 2.0, 3.0, 1, "it/s"))
    assert await sf.flush() and sf.healthy


@pytest.mark.parametrize("table", TABLES)
async def test_a_column_a_newer_minor_or_a_hand_added_is_left_alone(tmp_path, table):
    # A runs or watches table with one more column used to fail every write for good ("table runs has 3 columns
    # but 2 values were supplied"), and its rows at start ("unexpected keyword argument"). Writes name their columns.
    path = tmp_path / "state.sqlite3"
    StateFile.open(path).close()
    db = sqlite3.connect(path)
    db.execute(f"ALTER TABLE {table} ADD COLUMN added_later TEXT DEFAULT 'theirs'")
    db.commit()
    db.close()
    sf = StateFile.open(path)
    await _every_kind_of_row(sf)
    sf.close()
    again = StateFile.open(path)
    assert again.ledger.state("dflash") == STATE
    assert list(again.ledger.watch_rows) == ["dflash"] and len(again.ledger.messages) == 1
    from bot.service.history import History  # noqa: PLC0415

    memory = History(again, clock=lambda: T0 + 60)
    assert [p.step for p in memory.recent("dflash")] == [5] and memory.tally("dflash").last_step == 5
    again.close()
    db = sqlite3.connect(path)
    assert {v for (v,) in db.execute(f"SELECT added_later FROM {table}")} == {"theirs"}  # their column, left to its default
    db.close()


@pytest.mark.parametrize("change, says", [
    ("ALTER TABLE runs ADD COLUMN owner TEXT NOT NULL DEFAULT 'x'", None),  # a default: runbot's writes leave it be
    ("ALTER TABLE incidents DROP COLUMN concern", "table incidents lacks concern"),
    ("DROP TABLE tallies", "no table tallies"),
    ("ALTER TABLE watches RENAME COLUMN user TO who", "table watches lacks user"),
])
def test_a_table_runbot_cannot_write_is_refused_at_start_not_failed_at_every_write(tmp_path, change, says):
    path = tmp_path / "state.sqlite3"
    StateFile.open(path).close()
    db = sqlite3.connect(path)
    db.execute(change)
    db.commit()
    db.close()
    if says is None:
        StateFile.open(path).close()
        return
    with pytest.raises(StateFileError, match=f"not a runbot state file this runbot can write \\({says}\\)"):
        StateFile.open(path)
    assert path.exists() and not list(tmp_path.glob("*.corrupt-*"))  # refused, like a foreign file: left as it is


def test_an_extra_column_runbot_could_never_fill_is_refused(tmp_path):
    # Only a CREATE can make one (ALTER TABLE needs a default for NOT NULL): a newer runbot's table, unversioned.
    path = tmp_path / "state.sqlite3"
    StateFile.open(path).close()
    db = sqlite3.connect(path)
    db.executescript("ALTER TABLE watches RENAME TO w; CREATE TABLE watches (run TEXT PRIMARY KEY, channel TEXT NOT NULL, "
                     "ts TEXT NOT NULL, started_at REAL NOT NULL, user TEXT, team TEXT NOT NULL); DROP TABLE w;")
    db.close()
    with pytest.raises(StateFileError, match=r"table watches has columns this runbot cannot fill \(team: NOT NULL"):
        StateFile.open(path)
