"""The watchdog's SQLite file: the ledger's rows on disk, loaded at start and written change by change (shell)."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import asdict, fields

from bot.core.alerts import RunState, Status
from bot.core.history import Point, RoleLoad, Tally
from bot.core.verdict import Concern, Phase
from bot.core.ledger import (
    Change,
    DropMessages,
    DropWatch,
    Incident,
    Ledger,
    Message,
    PutIncident,
    PutMessage,
    PutState,
    PutWatch,
    Watch,
)

SCHEMA_VERSION = 4
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
# Rows are small and many (500 runs x a probe a minute): a phase is stored as its place in this list.
# Append only, never reorder: the file's integers point into it.
PHASES = tuple(Phase)
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
""" + _POINTS

# Schema 1 kept RunState's fields as columns; its other tables are the same.
_FROM_1 = ["ALTER TABLE runs RENAME TO runs_v1", _SCHEMA.split(";")[0],
           "DROP INDEX IF EXISTS outbox_pending", "ALTER TABLE outbox ADD COLUMN priority INTEGER NOT NULL DEFAULT 0"]
_FROM_2 = [x for x in _POINTS.split(";") if x.strip()] + ["ALTER TABLE incidents ADD COLUMN concern TEXT",
                                                          "ALTER TABLE incidents ADD COLUMN closed_at REAL"]
_FROM_3 = ["ALTER TABLE incidents ADD COLUMN digest INTEGER", "ALTER TABLE outbox ADD COLUMN note TEXT NOT NULL DEFAULT ''"]


class StoreError(RuntimeError):
    """The state file cannot be used (newer schema, not a runbot file)."""


class Store:
    """One SQLite connection, used from one thread at a time (the state file's worker thread)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            self._db.row_factory = sqlite3.Row
            # A rollback journal, not WAL: WAL's index is a memory-mapped -shm file, and a write into that
            # mapping on a full or immutable filesystem kills the whole bot with SIGBUS (seen in
            # tests/test_state_disk.py), where a journal write fails as an error the state file handles.
            # One writer, in one worker thread: WAL's concurrent readers bought nothing here.
            self._db.execute("PRAGMA journal_mode=DELETE")
            self._db.execute("PRAGMA synchronous=FULL")  # survives kill -9 and power loss; writes are off the event loop
            self._db.execute("PRAGMA busy_timeout=5000")
            self._migrate()
        except BaseException:  # a file we cannot use (StoreError, "file is not a database"): leave no handle open
            self._db.close()
            raise

    def close(self) -> None:
        self._db.close()

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

    def _migrate(self) -> None:
        with self._tx() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(f"{self.path}: written by a newer runbot (schema {version}, this one knows {SCHEMA_VERSION})")
            if version == 0:
                if db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                    raise StoreError(f"{self.path}: not a runbot state file (it has tables but no schema version)")
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
            if version == 1:
                for statement in _FROM_1:
                    db.execute(statement)
                for row in db.execute("SELECT * FROM runs_v1").fetchall():
                    db.execute("INSERT INTO runs VALUES (?, ?)", (row["run"], _state_json(_state_v1(row))))
                db.execute("DROP TABLE runs_v1")
            if version in (1, 2):
                for statement in _FROM_2:
                    db.execute(statement)
            if version in (1, 2, 3):
                for statement in _FROM_3:
                    db.execute(statement)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def writable(self) -> None:
        """Raise unless this file can take a write now (read-only file or folder, full disk…)."""
        with self._tx() as db:
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")  # a real write, the same value

    def check(self) -> str | None:
        """What SQLite's own quick check says is wrong with the file, or None when it is sound."""
        said = [r[0] for r in self._db.execute("PRAGMA quick_check").fetchall()]
        return None if said == ["ok"] else "; ".join(said)[:300]

    # --- whole ledgers --------------------------------------------------------------------------

    def load(self) -> Ledger:
        db = self._db
        states = {r["run"]: _state(r["state"]) for r in db.execute("SELECT * FROM runs")}
        incidents = {(r["run"], r["seq"]): Incident(r["run"], r["seq"], r["channel"], r["parent_ts"], r["opened_at"],
                                                         _concern(r["concern"]), r["closed_at"], r["digest"])
                     for r in db.execute("SELECT * FROM incidents")}
        messages = {r["id"]: Message(r["id"], r["key"], r["run"], r["seq"], r["op"], json.loads(r["payload"]),
                                     r["created_at"], r["attempts"], r["tried_at"], r["last_error"], r["sent_at"], r["ts"],
                                     r["priority"], r["note"])
                    for r in db.execute("SELECT * FROM outbox ORDER BY id")}
        watches = {r["run"]: Watch(**dict(r)) for r in db.execute("SELECT * FROM watches")}
        return Ledger(states, incidents, messages, watches)

    def apply(self, changes: Iterable[Change], points: Iterable[tuple[str, Point]] = (),
              tallies: Iterable[tuple[str, Tally]] = ()) -> None:
        """One transaction: the ledger's row changes, the runs' new points and their tallies."""
        points, tallies = list(points), list(tallies)
        with self._tx() as db:
            for change in changes:
                _write(db, change)
            if points or tallies:
                ids = self._ids(db, "point_runs", "run", {run for run, _ in points} | {run for run, _ in tallies})
                words = self._ids(db, "words", "word", {p.unit for _, p in points if p.unit is not None}
                                  | {g.role for _, p in points for g in p.gpus})
                db.executemany("INSERT OR REPLACE INTO points VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                               [_point_row(ids[run], p, words) for run, p in points])
                db.executemany("INSERT OR REPLACE INTO tallies VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                               [(ids[run], *(getattr(t, f) for f in _TALLY_FIELDS)) for run, t in tallies])

    @staticmethod
    def _ids(db: sqlite3.Connection, table: str, column: str, names: set[str]) -> dict[str, int]:
        """The ids of names in a table of names (point_runs, words), adding the new ones."""
        if not names:
            return {}
        db.executemany(f"INSERT OR IGNORE INTO {table} ({column}) VALUES (?)", [(n,) for n in names])
        marks = ",".join("?" * len(names))
        return {r[1]: r[0] for r in db.execute(f"SELECT id, {column} FROM {table} WHERE {column} IN ({marks})", list(names))}

    def _words(self) -> dict[int, str]:
        return {r[0]: r[1] for r in self._db.execute("SELECT id, word FROM words")}

    # --- the runs' memory -------------------------------------------------------------------------

    def points(self, run: str, since: float, until: float | None = None) -> list[Point]:
        rows = self._db.execute("SELECT p.* FROM points p JOIN point_runs r ON r.id = p.run WHERE r.run = ? AND p.t >= ? "
                                "AND p.t <= ? ORDER BY p.t", (run, int(since), until if until is not None else 1 << 62))
        words = self._words()
        return [_point(r, words) for r in rows]

    def recent(self, since: float) -> dict[str, list[Point]]:
        """Every run's points since `since` (what the bot reloads at start)."""
        out: dict[str, list[Point]] = {}
        words = self._words()
        for r in self._db.execute("SELECT r.run AS name, p.* FROM points p JOIN point_runs r ON r.id = p.run "
                                  "WHERE p.t >= ? ORDER BY r.run, p.t", (int(since),)):
            out.setdefault(r["name"], []).append(_point(r, words))
        return out

    def tallies(self) -> dict[str, Tally]:
        """Each run's current segment in a few numbers (what the bot reloads at start for end-of-run summaries)."""
        rows = self._db.execute("SELECT r.run AS name, t.* FROM tallies t JOIN point_runs r ON r.id = t.run")
        return {r["name"]: Tally(*(r[f] for f in _TALLY_FIELDS)) for r in rows}

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
            db.execute(f"DELETE FROM tallies WHERE run IN (SELECT id FROM point_runs WHERE run NOT IN ({marks}))", names)
            db.execute(f"DELETE FROM point_runs WHERE run NOT IN ({marks})", names)
            return gone


    def dump(self, ledger: Ledger) -> None:
        """Make the file hold exactly what the ledger holds (after the file was lost or replaced)."""
        with self._tx() as db:
            for table in ("runs", "incidents", "outbox", "watches"):
                db.execute(f"DELETE FROM {table}")
            for run, state in ledger.states.items():
                _write(db, PutState(run, state))
            for incident in ledger.incidents.values():
                _write(db, PutIncident(incident))
            for message in ledger.messages.values():
                _write(db, PutMessage(message))
            for watch in ledger.watch_rows.values():
                _write(db, PutWatch(watch))


def _write(db: sqlite3.Connection, change: Change) -> None:
    match change:
        case PutState(run, state):
            db.execute("INSERT OR REPLACE INTO runs VALUES (?, ?)", (run, _state_json(state)))
        case PutIncident(i):
            db.execute("INSERT OR REPLACE INTO incidents (run, seq, channel, parent_ts, opened_at, concern, closed_at, "
                       "digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (i.run, i.seq, i.channel, i.parent_ts, i.opened_at, i.concern.key if i.concern is not None else None,
                        i.closed_at, i.digest))
        case PutMessage(m):
            db.execute("INSERT OR REPLACE INTO outbox (id, key, run, seq, op, payload, created_at, attempts, tried_at, "
                       "last_error, sent_at, ts, priority, note) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (m.id, m.key, m.run, m.seq, m.op, json.dumps(m.payload), m.created_at, m.attempts, m.tried_at,
                        m.last_error, m.sent_at, m.ts, m.priority, m.note))
        case DropMessages(ids):
            db.executemany("DELETE FROM outbox WHERE id = ?", [(i,) for i in ids])
        case PutWatch(w):
            db.execute("INSERT OR REPLACE INTO watches VALUES (?, ?, ?, ?, ?)", (w.run, w.channel, w.ts, w.started_at, w.user))
        case DropWatch(run):
            db.execute("DELETE FROM watches WHERE run = ?", (run,))
        case _:
            raise TypeError(f"not a ledger change: {change!r}")


_STATE_FIELDS = {f.name for f in fields(RunState)}
_TALLY_FIELDS = tuple(f.name for f in fields(Tally))  # the tallies table's columns after run, in order


def _point_row(run_id: int, p: Point, words: dict[str, int]) -> tuple:
    gpus = ";".join(f"{words[g.role]}:{round(g.busy * 100)}:{'' if g.mem_gib is None else round(g.mem_gib, 1)}" for g in p.gpus)
    return (run_id, int(p.t), p.segment, PHASES.index(p.phase), p.level, p.step, p.total, p.loss, p.rate,
            words.get(p.unit) if p.unit is not None else None, gpus or None)


def _point(r: sqlite3.Row, words: dict[int, str]) -> Point:
    phase = PHASES[r["phase"]] if 0 <= r["phase"] < len(PHASES) else Phase.TRAINING  # a phase a newer runbot knows
    gpus = []
    for item in (r["gpus"] or "").split(";"):
        role, _, rest = item.partition(":")
        busy, _, mem = rest.partition(":")
        if role.isdigit() and busy.isdigit():
            gpus.append(RoleLoad(words.get(int(role), "GPUs"), int(busy) / 100, float(mem) if mem else None))
    unit = words.get(r["unit"]) if r["unit"] is not None else None
    return Point(float(r["t"]), phase, r["level"], r["step"], r["total"], r["loss"], r["rate"], unit, r["segment"],
                 tuple(gpus))


def _state_json(state: RunState) -> str:
    """RunState as JSON; a concern is spelt as its key ("thread_died:drafter-1"), as every runbot has written it."""
    values = asdict(state)
    values["status"] = state.status.value
    values["concern"] = state.concern.key if state.concern is not None else None
    values["streaks"] = [[c.key, n] for c, n in state.streaks]
    return json.dumps(values)


def _concern(key: str | None) -> Concern | None:
    return Concern.from_key(key) if key is not None else None


def _streaks(pairs: Iterable[list]) -> tuple[tuple[Concern, int], ...]:
    return tuple((Concern.from_key(key), n) for key, n in pairs)


def _state(text: str) -> RunState:
    """A RunState from its JSON; fields a newer or older runbot wrote and this one lacks are ignored."""
    values = {k: v for k, v in json.loads(text).items() if k in _STATE_FIELDS}
    values["status"] = Status(values.get("status", "quiet"))
    if "concern" in values:
        values["concern"] = _concern(values["concern"])
    if "streaks" in values:
        values["streaks"] = _streaks(values["streaks"])
    if "flips" in values:
        values["flips"] = tuple(values["flips"])
    return RunState(**values)


def _state_v1(row: sqlite3.Row) -> RunState:
    values = {k: row[k] for k in row.keys() if k in _STATE_FIELDS}
    values["status"] = Status(values["status"])
    values["announced"] = bool(values["announced"])
    values["concern"] = _concern(values.get("concern"))
    values["streaks"] = _streaks(json.loads(values["streaks"]))
    return RunState(**values)
