"""The watchdog's SQLite file: run states, incidents and their threads, the outbox, watches (shell)."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from decimal import Decimal

from bot.alerts import RunState, Status

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE runs (                 -- the alert state machine's memory, one row per run
    run TEXT PRIMARY KEY,
    status TEXT NOT NULL, concern TEXT, seq INTEGER NOT NULL, announced INTEGER NOT NULL,
    opened_at REAL, changed_at REAL, notified_at REAL, closed_at REAL, healthy INTEGER NOT NULL,
    headline TEXT NOT NULL, muted_until REAL, muted_by TEXT, streaks TEXT NOT NULL
);
CREATE TABLE incidents (            -- one per parent message: where its thread lives
    run TEXT NOT NULL, seq INTEGER NOT NULL,
    channel TEXT NOT NULL, parent_ts TEXT, opened_at REAL NOT NULL,
    PRIMARY KEY (run, seq)
);
CREATE TABLE outbox (               -- every message, written before it is sent
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL UNIQUE,       -- the client key, sent as message metadata
    run TEXT NOT NULL, seq INTEGER NOT NULL,
    op TEXT NOT NULL CHECK (op IN ('post', 'reply', 'update')),
    payload TEXT NOT NULL,          -- {"text", "blocks"}
    created_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    tried_at REAL,                  -- set before each attempt, cleared by its known outcome: set = in doubt
    last_error TEXT,
    sent_at REAL, ts TEXT
);
CREATE INDEX outbox_pending ON outbox (run, id) WHERE sent_at IS NULL;
CREATE TABLE watches (              -- /run watch: at most one per run
    run TEXT PRIMARY KEY, channel TEXT NOT NULL, ts TEXT NOT NULL, started_at REAL NOT NULL, user TEXT
);
"""


@dataclass(frozen=True)
class Outgoing:
    """A message to queue: op "post" opens incident `seq` in `channel`; "reply"/"update" go to its thread."""

    op: str
    payload: dict
    channel: str | None = None  # posts only


@dataclass(frozen=True)
class Pending:
    """An outbox row not yet known to be sent, with the thread it belongs to."""

    id: int
    key: str
    run: str
    seq: int
    op: str
    payload: dict
    channel: str
    parent_ts: str | None
    attempts: int
    tried_at: float | None  # not None: an earlier attempt's outcome is unknown (look before re-posting)


@dataclass(frozen=True)
class Watch:
    run: str
    channel: str
    ts: str
    started_at: float
    user: str | None = None


class StoreError(RuntimeError):
    """The state file cannot be used (newer schema, not a runbot file)."""


class Store:
    """Every write is one transaction; the watchdog is one thread, so one connection serves."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            self._db.row_factory = sqlite3.Row
            if self.path != ":memory:":
                self._db.execute("PRAGMA journal_mode=WAL")  # readers (a second bot, sqlite3 CLI) never block writes
            self._db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL survives kill -9; only power loss may drop the last commit
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
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    # --- run states ---------------------------------------------------------------------------

    def state(self, run: str) -> RunState | None:
        row = self._db.execute("SELECT * FROM runs WHERE run = ?", (run,)).fetchone()
        return _state(row) if row else None

    def states(self) -> dict[str, RunState]:
        return {row["run"]: _state(row) for row in self._db.execute("SELECT * FROM runs")}

    def commit(self, run: str, state: RunState, messages: list[Outgoing] = (), now: float = 0.0) -> list[int]:
        """Save a run's new state and queue its messages, all or nothing. Returns the outbox ids."""
        with self._tx() as db:
            _put_state(db, run, state)
            return [self._queue(db, run, state.seq, m, now) for m in messages]

    def _queue(self, db: sqlite3.Connection, run: str, seq: int, m: Outgoing, now: float) -> int:
        if m.op == "post":
            db.execute("INSERT OR REPLACE INTO incidents (run, seq, channel, parent_ts, opened_at) VALUES (?, ?, ?, NULL, ?)",
                       (run, seq, m.channel, now))
        elif m.op == "update":  # an edit shows the whole current state: an older unsent edit is moot
            db.execute("DELETE FROM outbox WHERE run = ? AND seq = ? AND op = 'update' AND sent_at IS NULL", (run, seq))
        cur = db.execute("INSERT INTO outbox (key, run, seq, op, payload, created_at) VALUES (hex(randomblob(8)), ?, ?, ?, ?, ?)",
                         (run, seq, m.op, json.dumps(m.payload), now))
        # Stable for the row's life: a retry sends the same key, so it can look for an earlier attempt.
        db.execute("UPDATE outbox SET key = ? WHERE id = ?", (f"{run}#{seq}:{cur.lastrowid}", cur.lastrowid))
        return int(cur.lastrowid)

    # --- the outbox ---------------------------------------------------------------------------

    def pending(self, run: str | None = None) -> list[Pending]:
        """Unsent messages, oldest first (per run, the order they must go out in)."""
        where, args = ("AND o.run = ?", (run,)) if run is not None else ("", ())
        rows = self._db.execute(
            "SELECT o.*, i.channel, i.parent_ts FROM outbox o JOIN incidents i ON i.run = o.run AND i.seq = o.seq "
            f"WHERE o.sent_at IS NULL {where} ORDER BY o.id", args)
        return [Pending(r["id"], r["key"], r["run"], r["seq"], r["op"], json.loads(r["payload"]), r["channel"],
                        r["parent_ts"], r["attempts"], r["tried_at"]) for r in rows]

    def trying(self, row_id: int, now: float) -> None:
        """Written before the call: if the bot dies now, the row is known to be in doubt."""
        with self._tx() as db:
            db.execute("UPDATE outbox SET attempts = attempts + 1, tried_at = ? WHERE id = ?", (now, row_id))

    def sent(self, row: Pending, ts: str | None, now: float, channel: str | None = None) -> None:
        """Written after the call. A post's ts becomes its incident's thread (and its channel id)."""
        with self._tx() as db:
            db.execute("UPDATE outbox SET sent_at = ?, ts = ?, tried_at = NULL, last_error = NULL WHERE id = ?",
                       (now, ts, row.id))
            if row.op == "post":
                db.execute("UPDATE incidents SET parent_ts = ?, channel = coalesce(?, channel) WHERE run = ? AND seq = ?",
                           (ts, channel, row.run, row.seq))

    def failed(self, row_id: int, error: str, *, in_doubt: bool) -> None:
        """The call failed. `in_doubt`: it may have reached Slack anyway (a timeout, a dropped connection)."""
        with self._tx() as db:
            db.execute("UPDATE outbox SET last_error = ?, tried_at = CASE WHEN ? THEN tried_at END WHERE id = ?",
                       (error[:500], in_doubt, row_id))

    def last_ts(self, run: str, seq: int) -> str | None:
        """Slack's ts of the newest message known to be in an incident's thread (the parent's when none)."""
        # Compared as Decimal, never as float: a 16-digit ts loses its last microsecond in a double,
        # and "after the parent" could then skip the very reply being looked for.
        rows = self._db.execute(
            "SELECT ts FROM outbox WHERE run = ? AND seq = ? AND op IN ('post', 'reply') AND sent_at IS NOT NULL "
            "AND ts IS NOT NULL UNION SELECT parent_ts FROM incidents WHERE run = ? AND seq = ? AND parent_ts IS NOT NULL",
            (run, seq, run, seq)).fetchall()
        stamps = [r[0] for r in rows if _is_ts(r[0])]
        return max(stamps, key=Decimal) if stamps else None

    def thread(self, run: str, seq: int) -> tuple[str, str | None] | None:
        """(channel, parent ts) of a run's incident, or None."""
        row = self._db.execute("SELECT channel, parent_ts FROM incidents WHERE run = ? AND seq = ?", (run, seq)).fetchone()
        return (row["channel"], row["parent_ts"]) if row else None

    def prune(self, before: float) -> int:
        """Forget sent messages older than `before` (the outbox would otherwise grow forever)."""
        with self._tx() as db:
            return db.execute("DELETE FROM outbox WHERE sent_at IS NOT NULL AND sent_at < ?", (before,)).rowcount

    # --- watches ------------------------------------------------------------------------------

    def watches(self) -> list[Watch]:
        return [Watch(**dict(r)) for r in self._db.execute("SELECT * FROM watches ORDER BY started_at")]

    def start_watch(self, watch: Watch, stale_before: float) -> Watch | None:
        """Record a watch unless a live one exists for the run; returns the one in the way, else None."""
        with self._tx() as db:
            row = db.execute("SELECT * FROM watches WHERE run = ?", (watch.run,)).fetchone()
            if row and row["started_at"] >= stale_before:
                return Watch(**dict(row))
            db.execute("INSERT OR REPLACE INTO watches VALUES (?, ?, ?, ?, ?)",
                       (watch.run, watch.channel, watch.ts, watch.started_at, watch.user))
        return None

    def end_watch(self, run: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM watches WHERE run = ?", (run,))


def _is_ts(value: object) -> bool:
    try:
        return isinstance(value, str) and Decimal(value).is_finite()
    except ArithmeticError:
        return False


_STATE_FIELDS = [f.name for f in fields(RunState)]


def _put_state(db: sqlite3.Connection, run: str, state: RunState) -> None:
    values = asdict(state)
    values["status"] = state.status.value
    values["streaks"] = json.dumps(state.streaks)
    cols = ", ".join(_STATE_FIELDS)
    marks = ", ".join("?" for _ in _STATE_FIELDS)
    db.execute(f"INSERT OR REPLACE INTO runs (run, {cols}) VALUES (?, {marks})", (run, *(values[f] for f in _STATE_FIELDS)))


def _state(row: sqlite3.Row) -> RunState:
    values = {f: row[f] for f in _STATE_FIELDS}
    values["status"] = Status(values["status"])
    values["announced"] = bool(values["announced"])
    values["streaks"] = tuple((c, n) for c, n in json.loads(values["streaks"]))
    return RunState(**values)
