"""The watchdog's SQLite file: the ledger's rows on disk, loaded at start and written change by change (shell)."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import sqlite3
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, fields
from typing import TypeVar

from bot.core import state_rows as rows
from bot.core.alerts import RunState
from bot.core.history import Point, Tally
from bot.core.learned import Learned, to_record
from bot.core.state_rows import PHASES, Unreadable
from bot.core.ledger import (
    Change,
    DropMessages,
    DropWatch,
    Ledger,
    PutIncident,
    PutMessage,
    PutState,
    PutWatch,
)

log = logging.getLogger("runbot.state")
T = TypeVar("T")

SCHEMA_VERSION = 5
_POINTS = """
CREATE TABLE point_runs (id INTEGER PRIMARY KEY, run TEXT NOT NULL UNIQUE);
CREATE TABLE words (id INTEGER PRIMARY KEY, word TEXT NOT NULL UNIQUE);  -- units and role names, once each
CREATE TABLE points (               -- each run's memory, one point per probe (bot.core.history.Point)
    run INTEGER NOT NULL,           -- point_runs.id: the name once, not in every row
    t INTEGER NOT NULL,             -- the bot's clock, whole seconds
    segment INTEGER NOT NULL,
    phase INTEGER NOT NULL,         -- the Phase's place in PHASES
    level INTEGER NOT NULL,
    step INTEGER, total INTEGER, loss REAL, rate REAL,
    unit INTEGER,                   -- words.id
    gpus TEXT,                      -- role:busy%:GiB per role, role a words.id (a semicolon between them)
    PRIMARY KEY (run, t)
) WITHOUT ROWID;
CREATE TABLE tallies (              -- each run's current segment in a few numbers (bot.core.history.Tally)
    run INTEGER PRIMARY KEY,        -- point_runs.id
    segment INTEGER NOT NULL, started REAL NOT NULL, last_t REAL NOT NULL, first_step INTEGER, last_step INTEGER,
    final_loss REAL, best_loss REAL, rate_sum REAL NOT NULL, rate_n INTEGER NOT NULL, unit TEXT
);
"""
_FORMATS = """
CREATE TABLE formats (              -- each run's format as its own log taught it (bot.core.learned.Learned)
    run INTEGER PRIMARY KEY,        -- point_runs.id
    learned TEXT NOT NULL           -- JSON: replaced at each look that learns, dropped with the run
);
"""
_SCHEMA = """
CREATE TABLE runs (                 -- the alert state machine's memory, one row per run
    run TEXT PRIMARY KEY,
    state TEXT NOT NULL             -- RunState as JSON: fields can be added without a new schema
);
CREATE TABLE incidents (            -- one per parent message: where its thread lives
    run TEXT NOT NULL, seq INTEGER NOT NULL,
    channel TEXT NOT NULL, parent_ts TEXT, opened_at REAL NOT NULL,
    concern TEXT,                   -- Concern.key of the worst it told (NULL: a finished run's note)
    closed_at REAL,
    digest INTEGER,                 -- told in its channel digest of this number (a storm folded it), NULL: its own thread
    PRIMARY KEY (run, seq)
);
CREATE TABLE outbox (               -- every message, written before it is sent
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,       -- the client key, sent as message metadata
    run TEXT NOT NULL, seq INTEGER NOT NULL,
    op TEXT NOT NULL CHECK (op IN ('post', 'reply', 'update')),
    payload TEXT NOT NULL,          -- {"text", "blocks"}
    created_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    tried_at REAL,                  -- set before each attempt, cleared by its known outcome: set = in doubt
    last_error TEXT,
    sent_at REAL, ts TEXT,
    priority INTEGER NOT NULL DEFAULT 0, -- the concern's severity: first out when Slack is busy
    note TEXT NOT NULL DEFAULT ''   -- what it says ("opened", "recovered", "summary"…): a storm folds by it
);
CREATE TABLE watches (              -- /run watch: at most one per run
    run TEXT PRIMARY KEY, channel TEXT NOT NULL, ts TEXT NOT NULL, started_at REAL NOT NULL, user TEXT
);
""" + _POINTS + _FORMATS

# Schema 1 kept RunState's fields as columns; its other tables are the same.
_FROM_1 = ["ALTER TABLE runs RENAME TO runs_v1", _SCHEMA.split(";")[0],
           "DROP INDEX IF EXISTS outbox_pending", "ALTER TABLE outbox ADD COLUMN priority INTEGER NOT NULL DEFAULT 0"]
_FROM_2 = [x for x in _POINTS.split(";") if x.strip()] + ["ALTER TABLE incidents ADD COLUMN concern TEXT",
                                                          "ALTER TABLE incidents ADD COLUMN closed_at REAL"]
_FROM_3 = ["ALTER TABLE incidents ADD COLUMN digest INTEGER", "ALTER TABLE outbox ADD COLUMN note TEXT NOT NULL DEFAULT ''"]
_FROM_4 = [_FORMATS]


# What quick_check says of one row rather than of the file (SQLite's own wording, sqlite3/src/pragma.c).
_ROW_FAULT = re.compile(r"CHECK constraint failed in \S+$|NULL value in \S+$")


class StoreError(RuntimeError):
    """The state file cannot be used (newer schema, not a runbot file, a table lacking a column runbot writes)."""


class NotReadable(StoreError):
    """A file opened read-only that this runbot cannot read as it is: empty, or an older schema (its upgrade is a write)."""


@functools.cache
def columns() -> dict[str, tuple[str, ...]]:
    """Each table's columns, in order, as the schema above declares them: writes name them, so a column
    added by a newer minor or by hand is left to its default instead of failing every write."""
    db = sqlite3.connect(":memory:")
    try:
        db.executescript(_SCHEMA)
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: tuple(r[1] for r in db.execute(f"PRAGMA table_info({t})")) for t in tables}
    finally:
        db.close()


@functools.cache
def primary_keys() -> dict[str, tuple[str, ...]]:
    """Each table's primary key, as the schema above declares it (what an upsert on another engine names)."""
    db = sqlite3.connect(":memory:")
    try:
        db.executescript(_SCHEMA)
        return {t: tuple(r[1] for r in sorted(db.execute(f"PRAGMA table_info({t})"), key=lambda r: r[5]) if r[5])
                for t in columns()}
    finally:
        db.close()


def _insert(table: str) -> str:
    names = columns()[table]
    return f"INSERT OR REPLACE INTO {table} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})"


class Store:
    """One SQLite connection, used from one thread at a time (the state file's worker thread).

    `skipped` counts the rows each table held that could not be read (bot.core.state_rows): they are left
    out of what is loaded, and left in the file (a later write of the same key replaces them).

    Another engine (bot.service.store_pg) subclasses it: the queries are shared, the dialect's few words
    (`upsert`, `add_names`, transactions, the schema's version) are its own."""

    # What a failing store raises: the state file keeps the ledger in memory and retries on these.
    errors: tuple[type[BaseException], ...] = (sqlite3.Error, OSError)
    upsert = staticmethod(_insert)  # a row replacing the one of its key
    add_names = "INSERT OR IGNORE INTO {table} ({column}) VALUES (?)"

    def __init__(self, path: str | os.PathLike[str], *, read_only: bool = False) -> None:
        self.path = str(path)
        self.skipped: Counter[str] = Counter()
        if read_only:  # a file runbot cannot write: read what it holds, change nothing (not even its journal mode)
            uri = f"file:{urllib.parse.quote(os.path.abspath(self.path))}?mode=ro"
            self._db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        else:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA busy_timeout=5000")
            if read_only:
                self._check_version(upgrade=False)
                self._check_columns()
                return
            # A rollback journal, not WAL: WAL's index is a memory-mapped -shm file, and a write into that
            # mapping on a full or immutable filesystem kills the whole bot with SIGBUS (seen in
            # tests/test_state_disk.py), where a journal write fails as an error the state file handles.
            # One writer, in one worker thread: WAL's concurrent readers bought nothing here.
            self._db.execute("PRAGMA journal_mode=DELETE")
            self._db.execute("PRAGMA synchronous=FULL")  # survives kill -9 and power loss; writes are off the event loop
            self._migrate()
            self._check_columns()
        except BaseException:  # a file we cannot use (StoreError, "file is not a database"): leave no handle open
            self._db.close()
            raise

    def close(self) -> None:
        self._db.close()

    @contextlib.contextmanager
    def _session(self) -> Iterator[sqlite3.Connection]:
        """The connection reads go through (one here; a pooled one on a server)."""
        yield self._db

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _check_version(self, *, upgrade: bool) -> int:
        """The file's schema version, refusing a newer runbot's file and someone else's database."""
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(f"{self.path}: written by a newer runbot (schema {version}, this one knows {SCHEMA_VERSION})")
        if version == 0 and self._db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            raise StoreError(f"{self.path}: not a runbot state file (it has tables but no schema version)")
        if not upgrade and version < SCHEMA_VERSION:
            raise NotReadable(f"{self.path}: an empty file" if version == 0 else
                              f"{self.path}: an older runbot's file (schema {version}), which cannot be upgraded while "
                              "it cannot be written")
        return version

    def _check_columns(self) -> None:
        """Every column runbot writes is there, and any other one can be left empty (a new file has none yet).

        A column added by a newer minor or by hand is harmless: writes name their columns. One missing, or
        an extra one that must be filled, would fail every write for good: refused, as a foreign file is."""
        for table, wanted in columns().items():
            have = {r["name"]: r for r in self._db.execute(f"PRAGMA table_info({table})")}
            missing = [c for c in wanted if c not in have]
            if missing:
                lacks = f"no table {table}" if not have else f"table {table} lacks {', '.join(missing)}"
                raise StoreError(f"{self.path}: not a runbot state file this runbot can write ({lacks})")
            unfilled = [n for n, r in have.items() if n not in wanted and r["notnull"] and r["dflt_value"] is None]
            if unfilled:
                raise StoreError(f"{self.path}: table {table} has columns this runbot cannot fill "
                                 f"({', '.join(unfilled)}: NOT NULL without a default)")

    def _migrate(self) -> None:
        with self._tx() as db:
            version = self._check_version(upgrade=True)
            if version == 0:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
            if version == 1:
                for statement in _FROM_1:
                    db.execute(statement)
                for row in db.execute("SELECT * FROM runs_v1").fetchall():
                    try:
                        db.execute("INSERT INTO runs (run, state) VALUES (?, ?)",
                                   (rows.text(row["run"]), _state_json(_state_v1(row))))
                    except Unreadable:
                        self.skipped["runs"] += 1
                db.execute("DROP TABLE runs_v1")
            if version in (1, 2):
                for statement in _FROM_2:
                    db.execute(statement)
            if version in (1, 2, 3):
                for statement in _FROM_3:
                    db.execute(statement)
            if version in (1, 2, 3, 4):
                for statement in _FROM_4:
                    db.execute(statement)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def writable(self) -> None:
        """Raise unless this file can take a write now (read-only file or folder, full disk…)."""
        with self._tx() as db:
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")  # a real write, the same value

    def check(self) -> str | None:
        """What SQLite's own quick check says is wrong with the file's structure, or None when it is sound.

        A row that breaks a CHECK or NOT NULL constraint (written with the checks off, or under another schema)
        is that row's problem, not the file's: the row is skipped when read (bot.core.state_rows), where moving
        the file aside would forget every other row."""
        said = [r[0] for r in self._db.execute("PRAGMA quick_check").fetchall()]
        damage = [line for line in said if line != "ok" and not _ROW_FAULT.match(line)]
        return "; ".join(damage)[:300] or None

    # --- whole ledgers --------------------------------------------------------------------------

    def _read(self, table: str, query: Iterable[sqlite3.Row], decode: Callable[[sqlite3.Row], T]) -> list[T]:
        """The rows a query finds, typed; a row that cannot be (bot.core.state_rows) is counted and left out."""
        out = []
        for r in query:
            try:
                out.append(decode(r))
            except Unreadable as exc:
                self.skipped[table] += 1
                log.debug("%s: a row of %s cannot be read (%s): skipped", self.path, table, exc)
        return out

    def load(self) -> Ledger:
        with self._session() as db:
            states = dict(self._read("runs", db.execute("SELECT run, state FROM runs"),
                                     lambda r: (rows.text(r["run"]), rows.state(r["state"]))))
            incidents = {(i.run, i.seq): i for i in self._read("incidents", db.execute("SELECT * FROM incidents"), rows.incident)}
            messages = {m.id: m for m in self._read("outbox", db.execute("SELECT * FROM outbox ORDER BY id"), rows.message)}
            watches = {w.run: w for w in self._read("watches", db.execute("SELECT * FROM watches"), rows.watch)}
        return Ledger(states, incidents, messages, watches)

    def apply(self, changes: Iterable[Change], points: Iterable[tuple[str, Point]] = (),
              tallies: Iterable[tuple[str, Tally]] = (), formats: Iterable[tuple[str, Learned]] = ()) -> None:
        """One transaction: the ledger's row changes, the runs' new points, their tallies and learned formats."""
        points, tallies, formats = list(points), list(tallies), list(formats)
        with self._tx() as db:
            for change in changes:
                _write(db, change, self.upsert)
            if formats:
                ids = self._ids(db, "point_runs", "run", {run for run, _ in formats})
                db.executemany(self.upsert("formats"), [(ids[run], json.dumps(to_record(f))) for run, f in formats])
            if points or tallies:
                ids = self._ids(db, "point_runs", "run", {run for run, _ in points} | {run for run, _ in tallies})
                words = self._ids(db, "words", "word", {p.unit for _, p in points if p.unit is not None}
                                  | {g.role for _, p in points for g in p.gpus})
                db.executemany(self.upsert("points"), [_point_row(ids[run], p, words) for run, p in points])
                db.executemany(self.upsert("tallies"), [(ids[run], *(getattr(t, f) for f in _TALLY_FIELDS)) for run, t in tallies])

    def _ids(self, db: sqlite3.Connection, table: str, column: str, names: set[str]) -> dict[str, int]:
        """The ids of names in a table of names (point_runs, words), adding the new ones."""
        if not names:
            return {}
        db.executemany(self.add_names.format(table=table, column=column), [(n,) for n in sorted(names)])
        marks = ",".join("?" * len(names))
        found = db.execute(f"SELECT id, {column} FROM {table} WHERE {column} IN ({marks})", list(names))
        return {r[column]: r["id"] for r in found}

    def _words(self, db: sqlite3.Connection) -> dict[int, str]:
        """Units and role names by id; one that is not text is left out (its points read it as unknown)."""
        return dict(self._read("words", db.execute("SELECT id, word FROM words"),
                               lambda r: (rows.whole(r["id"], 0, rows.MAX_ID), rows.text(r["word"]))))

    # --- the runs' memory -------------------------------------------------------------------------

    def points(self, run: str, since: float, until: float | None = None) -> list[Point]:
        with self._session() as db:
            found = db.execute("SELECT p.* FROM points p JOIN point_runs r ON r.id = p.run WHERE r.run = ? AND p.t >= ? "
                               "AND p.t <= ? ORDER BY p.t", (run, int(since), int(until) if until is not None else 1 << 62))
            words = self._words(db)
            return self._read("points", found, lambda r: rows.point(r, words))

    def recent(self, since: float) -> dict[str, list[Point]]:
        """Every run's points since `since` (what the bot reloads at start)."""
        out: dict[str, list[Point]] = {}
        with self._session() as db:
            words = self._words(db)
            found = db.execute("SELECT r.run AS name, p.* FROM points p JOIN point_runs r ON r.id = p.run "
                               "WHERE p.t >= ? ORDER BY r.run, p.t", (int(since),))
            for name, p in self._read("points", found, lambda r: (rows.text(r["name"]), rows.point(r, words))):
                out.setdefault(name, []).append(p)
        return out

    def formats(self) -> dict[str, Learned]:
        """Each run's learned format (what the bot reloads at start: a restart does not forget a run's format)."""
        with self._session() as db:
            found = db.execute("SELECT r.run AS name, f.learned FROM formats f JOIN point_runs r ON r.id = f.run")
            return dict(self._read("formats", found, lambda r: (rows.text(r["name"]), rows.learned(r["learned"]))))

    def tallies(self) -> dict[str, Tally]:
        """Each run's current segment in a few numbers (what the bot reloads at start for end-of-run summaries)."""
        with self._session() as db:
            found = db.execute("SELECT r.run AS name, t.* FROM tallies t JOIN point_runs r ON r.id = t.run")
            return dict(self._read("tallies", found, lambda r: (rows.text(r["name"]), rows.tally(r))))

    def prune(self, now: float, full: float, every: float, keep: float) -> int:
        """Retention: every point of the last `full` seconds, then the last one of each `every` bucket, nothing
        older than `keep`. Returns how many points went."""
        with self._tx() as db:
            gone = db.execute("DELETE FROM points WHERE t < ?", (int(now - keep),)).rowcount
            # A point goes when a later one of its run and segment falls in the same bucket: a range seek on
            # the primary key per point (a NOT IN over the grouped table took 30 s for 144k points).
            gone += db.execute(
                "DELETE FROM points WHERE t < :cut AND EXISTS (SELECT 1 FROM points q WHERE q.run = points.run "
                "AND q.t > points.t AND q.t < (points.t / :every + 1) * :every AND q.segment = points.segment)",
                {"cut": int(now - full), "every": max(1, int(every))}).rowcount
        return gone

    def forget(self, keep_runs: Iterable[str]) -> int:
        """Drop the memory of runs no longer configured (a rename starts afresh unless told)."""
        names = list(keep_runs)
        marks = ",".join("?" * len(names)) or "''"
        with self._tx() as db:
            gone = db.execute(f"DELETE FROM points WHERE run IN (SELECT id FROM point_runs WHERE run NOT IN ({marks}))",
                              names).rowcount
            for table in ("tallies", "formats"):
                db.execute(f"DELETE FROM {table} WHERE run IN (SELECT id FROM point_runs WHERE run NOT IN ({marks}))", names)
            db.execute(f"DELETE FROM point_runs WHERE run NOT IN ({marks})", names)
            return gone

    def dump(self, ledger: Ledger) -> None:
        """Make the file hold exactly what the ledger holds (after the file was lost or replaced)."""
        with self._tx() as db:
            for table in ("runs", "incidents", "outbox", "watches"):
                db.execute(f"DELETE FROM {table}")
            for run, state in ledger.states.items():
                _write(db, PutState(run, state), self.upsert)
            for incident in ledger.incidents.values():
                _write(db, PutIncident(incident), self.upsert)
            for message in ledger.messages.values():
                _write(db, PutMessage(message), self.upsert)
            for watch in ledger.watch_rows.values():
                _write(db, PutWatch(watch), self.upsert)


def _write(db: sqlite3.Connection, change: Change, upsert: Callable[[str], str]) -> None:
    match change:
        case PutState(run, state):
            db.execute(upsert("runs"), (run, _state_json(state)))
        case PutIncident(i):
            db.execute(upsert("incidents"), (i.run, i.seq, i.channel, i.parent_ts, i.opened_at,
                                              i.concern.key if i.concern is not None else None, i.closed_at, i.digest))
        case PutMessage(m):
            db.execute(upsert("outbox"),
                       (m.id, m.key, m.run, m.seq, m.op, json.dumps(m.payload), m.created_at, m.attempts, m.tried_at,
                        m.last_error, m.sent_at, m.ts, m.priority, m.note))
        case DropMessages(ids):
            db.executemany("DELETE FROM outbox WHERE id = ?", [(i,) for i in ids])
        case PutWatch(w):
            db.execute(upsert("watches"), (w.run, w.channel, w.ts, w.started_at, w.user))
        case DropWatch(run):
            db.execute("DELETE FROM watches WHERE run = ?", (run,))
        case _:
            raise TypeError(f"not a ledger change: {change!r}")


_TALLY_FIELDS = tuple(f.name for f in fields(Tally))  # the tallies table's columns after run, in order


def _point_row(run_id: int, p: Point, words: dict[str, int]) -> tuple:
    gpus = ";".join(f"{words[g.role]}:{round(g.busy * 100)}:{'' if g.mem_gib is None else round(g.mem_gib, 1)}" for g in p.gpus)
    return (run_id, int(p.t), p.segment, PHASES.index(p.phase), p.level, p.step, p.total, p.loss, p.rate,
            words.get(p.unit) if p.unit is not None else None, gpus or None)


def _state_json(state: RunState) -> str:
    """RunState as JSON; a concern is spelt as its key ("thread_died:drafter-1"), as every runbot has written it."""
    values = asdict(state)
    values["status"] = state.status.value
    values["concern"] = state.concern.key if state.concern is not None else None
    values["streaks"] = [[c.key, n] for c, n in state.streaks]
    return json.dumps(values)


@rows.guarded
def _state_v1(row: sqlite3.Row) -> RunState:
    """Schema 1 kept RunState's fields as columns: announced as 0/1, streaks as JSON text."""
    values = {k: row[k] for k in row.keys()}
    values["announced"] = bool(rows.whole(values["announced"], 0, 1))
    values["streaks"] = json.loads(rows.text(values["streaks"]))
    return rows.state_of(values)
