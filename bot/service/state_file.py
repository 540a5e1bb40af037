"""The watchdog's memory on disk: the ledger answers from memory, one worker thread writes it to SQLite within a deadline (shell).

A failing disk costs durability, never an alert: when a write fails (read-only, full, frozen,
corrupt, the file deleted under the bot) the ledger carries on in memory, the fault is said once
(in the log and, through `on_note`, in the alert channel), and every flush after tries to put the
whole ledger back on disk, saying so once when it can.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass, field
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeVar

from bot.core.history import Point, Tally
from bot.core.learned import Learned
from bot.core.ledger import Ledger
from bot.service.store import NotReadable, Store, StoreError
from config.state_where import is_server, redacted

log = logging.getLogger("runbot.state")

DISK_DEADLINE_S = 5.0  # one write of the state file; past it the disk counts as failing (frozen NFS, a dying disk)
# How often the file's header is looked at: SQLite keeps writing to its WAL without rereading the
# main file, so a file overwritten under the bot would otherwise go unnoticed until a restart.
HEADER_CHECK_EVERY_S = 10.0
SQLITE_HEADER = b"SQLite format 3\0"
MAX_QUEUED_POINTS = 200_000  # new points waiting while the disk fails (~40 MB): the oldest go first
PRUNE_EVERY_S = 3600.0  # the history's retention runs this often, in the worker thread
T = TypeVar("T")
RETRIES = "runbot retries every sweep and says so here when it can write again"


@dataclass(frozen=True)
class Memory:
    """What the state file remembers of the runs, read once at start."""

    points: dict[str, list[Point]] = field(default_factory=dict)
    tallies: dict[str, Tally] = field(default_factory=dict)
    formats: dict[str, Learned] = field(default_factory=dict)


class StateFileError(RuntimeError):
    """The state file cannot be used at start (no such folder, another program's database, a newer schema)."""


def _aside(path: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    return path.with_name(f"{path.name}.corrupt-{stamp}")


class StateFile:
    """The ledger and its SQLite mirror. Reads and mutations go to `ledger` (memory, no waiting);
    `await flush()` writes what changed. Use `StateFile.open(path)`."""

    def __init__(self, path: str | os.PathLike[str] | None, store: Store | None, ledger: Ledger, *,
                 deadline: float = DISK_DEADLINE_S, on_note: Callable[[str], None] | None = None) -> None:
        # An SQLite file (`path`), or a database server (no path: the store is its PgStore): the file's own checks
        # (its header, its inode, moving it aside) have no server counterpart, the rest is the same.
        self.path = Path(path) if path is not None else None
        self.where = str(self.path) if self.path is not None else store.path if store is not None else "?"
        self.kind = "state file" if self.path is not None else "state database"
        self.label = f"{self.kind} {self.where}"
        self._errors: tuple[type[BaseException], ...] = store.errors if store is not None else Store.errors
        self.ledger = ledger
        self.deadline = deadline
        self.on_note = on_note or (lambda text: None)
        self.fault: str | None = None  # what is wrong with the disk right now (None: the file is current)
        self._notes: list[str] = []  # said at start (a corrupt file moved aside, an unwritable one), for the watchdog
        self.unreadable: Counter[str] = Counter()  # rows per table that could not be read at start, and were skipped
        self._store = store
        self._identity = _identity(self.path) if self.path is not None else None
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="runbot-state")
        self._busy: asyncio.Future | None = None  # the write in the worker thread, if any
        self._turn: asyncio.Lock | None = None  # one flush at a time: each returns True only once its changes are written
        self._rewrite = False  # the file no longer holds what the ledger held: write it whole
        self._corrupt = False  # SQLite says the file is damaged: move it aside before rewriting
        self._lost = False  # the file was deleted or replaced under the bot (said once the rewrite is done)
        self._reopen = False  # started on a file it could not write: open it afresh for the next write
        self._header_checked = time.monotonic()
        self._points: list[tuple[str, Point]] = []  # the runs' new points, written with the next flush
        self._tallies: dict[str, Tally] = {}  # and each run's latest tally
        self._formats: dict[str, Learned] = {}  # and each run's newly learned format
        self.retention: tuple[float, float, float] | None = None  # (full, every, keep) seconds: pruned hourly
        self._pruned = 0.0

    # --- opening ------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike[str], **kw) -> StateFile:
        """Load the file (creating it), refusing only what is plainly a mistake, with one clear StateFileError:
        no such folder, someone else's database, a newer runbot's file.

        A watchdog that refuses to start alerts nobody: a corrupt file is moved aside and runbot starts with
        an empty memory (as Alertmanager does); one it cannot write (a read-only disk, an unwritable folder)
        is read as it is and runbot starts from that, in memory; rows it cannot read are skipped and counted.
        Each is said in `notes`."""
        if is_server(str(path)):
            return cls._open_server(str(path), **kw)
        path = Path(path)
        notes = []
        try:
            store = _open_checked(path)
        except StoreError as exc:
            raise StateFileError(str(exc)) from None
        except (sqlite3.DatabaseError, OSError) as exc:
            if not path.parent.is_dir():
                raise StateFileError(f"{path}: {exc} (does its folder exist?)") from None
            if not _corrupt(exc):
                return cls._unwritable(path, str(exc), notes, **kw)
            try:
                moved = _move_aside(path)
            except OSError as again:
                return cls._unwritable(path, f"{exc}, and it cannot be moved aside: {again.strerror or again}", notes,
                                       corrupt=True, **kw)
            note = (f"runbot's state file {path} was corrupt ({exc}); it was moved aside to {moved.name} and runbot "
                    "started with no memory of earlier alerts: an incident still open may be posted again")
            log.error(note)
            notes.append(note)
            try:
                store = _open_checked(path)
            except StoreError as again:
                raise StateFileError(str(again)) from None
            except (sqlite3.Error, OSError) as again:
                return cls._unwritable(path, str(again), notes, **kw)
        try:
            ledger = store.load()
        except (sqlite3.Error, OSError) as exc:  # read after a write that worked: a disk that fails as it goes
            store.close()
            return cls._unwritable(path, str(exc), notes, **kw)
        state_file = cls(path, store, ledger, **kw)
        state_file._notes = notes
        state_file._count(store)
        return state_file

    @classmethod
    def _open_server(cls, url: str, **kw) -> StateFile:
        """Connect and load. A server that cannot be reached at start is refused, unlike a file that cannot be
        written: the file can still be read, and what runbot rewrites is what it read, where a bot started
        without the database's memory would write its empty memory over the incidents the database holds.
        The service manager's restart is the retry (docs/decisions.md)."""
        from bot.service.store_pg import PgStore  # noqa: PLC0415  (psycopg only where a server is named)

        try:
            store = PgStore(url)
            ledger = store.load()
        except StoreError as exc:
            raise StateFileError(str(exc)) from None
        except PgStore.errors as exc:
            raise StateFileError(f"state database {redacted(url)} cannot be used: {exc}".strip()) from None
        state_file = cls(None, store, ledger, **kw)
        state_file._count(store)
        return state_file

    @classmethod
    def _unwritable(cls, path: Path, fault: str, notes: list[str], *, corrupt: bool = False, **kw) -> StateFile:
        """Start on a file that cannot be written now: from what it holds, read-only, and from memory after
        that; every flush tries to write the whole memory (as for a disk that fails while running)."""
        store, ledger, read = None, Ledger(), "no memory of earlier alerts"
        if not path.exists():
            read = "no memory of earlier alerts (there is no file yet)"
        elif not corrupt:
            try:
                store = Store(path, read_only=True)
            except StoreError as exc:
                if not isinstance(exc, NotReadable):
                    raise StateFileError(str(exc)) from None  # a newer runbot's, someone else's: refused as ever
                read = f"no memory of earlier alerts ({exc})"
            except (sqlite3.Error, OSError) as exc:
                read = f"no memory of earlier alerts (it cannot be read either: {exc})"
        if store is not None:
            try:
                ledger = store.load()
                open_ = sum(i.closed_at is None for i in ledger.incidents.values())
                read = f"what it could read ({_plural(len(ledger.states), 'run')}, {_plural(open_, 'incident')} open)"
            except (sqlite3.Error, OSError) as exc:
                store.close()
                store, read = None, f"no memory of earlier alerts (it cannot be read either: {exc})"
        note = (f"runbot's state file {path} cannot be written ({fault}); runbot started with {read} and keeps "
                f"alerts in memory, but a restart now would forget what changed since. {RETRIES}")
        log.error(note)
        state_file = cls(path, store, ledger, **kw)
        state_file._notes = [*notes, note]
        state_file.fault, state_file._rewrite, state_file._reopen, state_file._corrupt = fault, True, True, corrupt
        if store is not None:
            state_file._count(store)
        return state_file

    @property
    def notes(self) -> list[str]:
        """What the watchdog says once at start: a corrupt file moved aside, a file it cannot write, rows it cannot read."""
        if not self.unreadable:
            return list(self._notes)
        return [*self._notes, f"runbot's {self.label} holds {unreadable_words(self.unreadable)} it cannot read "
                              "(values runbot never writes: edited by hand, or by another program?); they were skipped "
                              "and the rest loaded. An incident among them may be posted again"]

    def memory(self, since: float, runs: Iterable[str] | None = None) -> Memory:
        """Each run's points since `since`, its tally and its learned format, read at start (nothing else uses the
        file yet); `runs`: forget the runs no longer configured first. Empty when the file cannot be read."""
        store = self._store
        if store is None:
            return Memory()
        if runs is not None and self.fault is None:
            try:
                store.forget(runs)  # a run renamed in the config starts afresh: no stale memory under the old name
            except self._errors as exc:  # a write: the disk may refuse it, which the next flush will say
                log.warning("%s: could not forget the runs no longer configured: %s", self.label, exc)
        try:
            return Memory(store.recent(since), store.tallies(), store.formats())
        except self._errors as exc:
            log.error("%s: the runs' memory cannot be read (%s); it starts empty", self.label, exc)
            return Memory()
        finally:
            self._count(store)

    def _count(self, store: Store) -> None:
        """Take the rows the store could not read into `unreadable`, saying them in the log."""
        new, store.skipped = +store.skipped, Counter()
        if new:
            self.unreadable.update(new)
            log.warning("%s: skipped %s it could not read", self.label, unreadable_words(new))

    # --- writing ------------------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        return self.fault is None

    async def flush(self, *, decisions_only: bool = False) -> bool:
        """Write what changed since the last flush; True when the file now holds the whole ledger.

        `decisions_only`: write only when the ledger changed (the queued points then go along); points
        alone wait for the next full flush, so a sweep's history is one transaction, not one a run.

        Never raises, and waits at most about two deadlines (its turn, then its write). While the
        disk fails this returns False and the ledger keeps everything; each call tries again
        (unless the last write is still stuck in the worker thread)."""
        self._turn = self._turn or asyncio.Lock()
        try:
            await asyncio.wait_for(self._turn.acquire(), self.deadline)
        except asyncio.TimeoutError:
            return False
        try:
            return await self._flush(decisions_only)
        finally:
            self._turn.release()

    async def _flush(self, decisions_only: bool = False) -> bool:
        if self._busy is not None and not self._busy.done():
            return False  # a write is stuck (a frozen disk): do not pile more on it
        if decisions_only and not self.ledger.changed and not self._rewrite and self.fault is None:
            return True
        changes = self.ledger.take_changes()
        if self.path is not None:
            self._check_file(self.path)
        points: list[tuple[str, Point]] = []
        tallies: dict[str, Tally] = {}
        formats: dict[str, Learned] = {}
        if self._rewrite or self.fault is not None:
            snapshot = self.ledger.snapshot()  # taken here: the loop goes on changing the ledger meanwhile
            job: Callable[[], None] = lambda: self._write_all(snapshot)  # noqa: E731
        elif not changes and not self._points and not self._tallies and not self._formats and not self._prune_due():
            return True
        else:
            prune = self._prune_due()
            points, self._points, tallies, self._tallies = self._points, [], self._tallies, {}
            formats, self._formats = self._formats, {}
            job = lambda: self._apply(changes, points, list(tallies.items()), prune, list(formats.items()))  # noqa: E731
        self._busy = asyncio.get_running_loop().run_in_executor(self._pool, job)
        try:
            await asyncio.wait_for(asyncio.shield(self._busy), self.deadline)
        except asyncio.TimeoutError:
            self._requeue(points, tallies, formats)
            self._fail(f"a write to {self.where} took longer than {self.deadline:g} s")
            return False
        except (*self._errors, ValueError, OverflowError) as exc:  # Overflow: a number past SQLite's integers
            self._requeue(points, tallies, formats)
            self._fail(f"{self.where}: {str(exc).strip()}", corrupt=_corrupt(exc))
            return False
        self._recovered()
        return True

    def _check_file(self, path: Path) -> None:
        """What only a file can suffer: overwritten by something else, deleted or replaced under the bot."""
        if time.monotonic() - self._header_checked >= HEADER_CHECK_EVERY_S:
            self._header_checked = time.monotonic()
            if path.exists() and not _looks_like_sqlite(path):
                self._fail(f"{path} is no longer an SQLite file (overwritten or damaged)", corrupt=True)
        if not self._lost and _identity(path) != self._identity:
            self._lost, self._rewrite = True, True
            log.error("state file %s was deleted or replaced while runbot was running; rewriting it from memory", path)

    # --- the runs' memory ----------------------------------------------------------------------

    def record(self, run: str, points: Sequence[Point], tally: Tally | None = None,
               learned: Learned | None = None) -> None:
        """Queue a run's new points (its tally, its newly learned format) for the next flush (one transaction with
        the sweep's decisions). While the disk fails the queue is bounded: history is kept best-effort, alerts are not."""
        self._points.extend((run, p) for p in points)
        if tally is not None:
            self._tallies[run] = tally
        if learned is not None:
            self._formats[run] = learned
        if len(self._points) > MAX_QUEUED_POINTS:
            del self._points[: len(self._points) - MAX_QUEUED_POINTS]

    def _requeue(self, points: list[tuple[str, Point]], tallies: dict[str, Tally], formats: dict[str, Learned]) -> None:
        """A write that failed gives its points back, ahead of the newer ones (a write that only timed out may
        still land: rows are keyed by run and second, so writing them twice is harmless)."""
        self._points[:0] = points
        del self._points[: max(0, len(self._points) - MAX_QUEUED_POINTS)]
        self._tallies = {**tallies, **self._tallies}
        self._formats = {**formats, **self._formats}

    async def read(self, query: Callable[[Store], T]) -> T | None:
        """Run a read of the file in its worker thread, within the deadline; None when it cannot be read."""
        if self._store is None:
            return None
        store = self._store
        try:
            return await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(self._pool, query, store), self.deadline)
        except (asyncio.TimeoutError, *self._errors, ValueError):
            return None

    async def reload(self) -> bool:
        """Read the ledger afresh from the store, in place (a replica taking over from a leader that wrote what it
        decided); False when the store cannot be read now (the ledger is left as it was)."""
        loaded = await self.read(lambda store: store.load())
        if loaded is None:
            return False
        self.ledger.become(loaded)
        return True

    def _prune_due(self) -> bool:
        return self.retention is not None and time.time() - self._pruned >= PRUNE_EVERY_S

    def _apply(self, changes: list, points: list[tuple[str, Point]], tallies: list[tuple[str, Tally]],
               prune: bool, formats: list[tuple[str, Learned]]) -> None:
        """In the worker thread: one transaction for the decisions and the points; the hourly retention after."""
        self._store.apply(changes, points, tallies, formats)  # type: ignore[union-attr]
        if prune and self.retention is not None:
            self._pruned = time.time()
            self._store.prune(self._pruned, *self.retention)  # type: ignore[union-attr]

    def _recovered(self) -> None:
        if self.fault is not None:
            log.warning("%s is written again (the fault was: %s)", self.label, self.fault)
            self.on_note(f"runbot's {self.label} is written again; alerts are durable again")
        elif self._lost:
            self.on_note(f"runbot's state file {self.path} was deleted or replaced while runbot was running; "
                         f"what runbot remembers ({len(self.ledger.states)} runs, their incidents and threads) "
                         "is written to a new one")
        self.fault, self._rewrite, self._lost = None, False, False

    def _write_all(self, snapshot: Ledger) -> None:
        """In the worker thread: (re)open the file if it is gone, replaced, damaged or was not writable, then write
        it whole."""
        if self.path is None:  # a server (opened at start, never without its store): its pool replaces a dropped connection
            self._store.dump(snapshot)  # type: ignore[union-attr]
            return
        if self._corrupt and self._store is not None:
            self._store.close()
            self._store = None
        if self._corrupt and self.path.exists():
            _move_aside(self.path)
        if self._store is None or self._reopen or _identity(self.path) != self._identity:
            fresh = Store(self.path)  # raises while the file still cannot be written: a read-only handle stays for reads
            if self._store is not None:
                self._store.close()
            self._store, self._identity, self._corrupt, self._reopen = fresh, _identity(self.path), False, False
        self._store.dump(snapshot)

    def _fail(self, fault: str, *, corrupt: bool = False) -> None:
        self._rewrite = True  # whatever half-happened, the next successful write is a whole one
        self._corrupt = self._corrupt or corrupt
        if self.fault is None:
            log.error("state file failing: %s — alerts go on from memory; runbot retries every sweep", fault)
            self.on_note(f"runbot's {self.kind} is failing ({fault}); alerts go on from memory, but a restart now "
                         f"would forget open incidents. {RETRIES}")
        self.fault = fault

    def close(self) -> None:
        """Close the file (waiting a moment for a write still in the worker thread)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._store is not None and (self._busy is None or self._busy.done()):
            self._store.close()


def unreadable_words(counts: Counter[str]) -> str:
    """ "3 rows (points 2, outbox 1)": rows skipped, by table."""
    return f"{_plural(sum(counts.values()), 'row')} ({', '.join(f'{table} {k}' for table, k in sorted(counts.items()))})"


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _corrupt(exc: BaseException) -> bool:
    """Is the file to be moved aside and written afresh (damaged, not a database, refusing runbot's rows), rather
    than retried as it is (it cannot be opened or written now: read-only, full, locked)?"""
    if isinstance(exc, sqlite3.OperationalError):
        return "corrupt" in str(exc) or "malformed" in str(exc)
    return isinstance(exc, sqlite3.DatabaseError)


def _move_aside(path: Path) -> Path:
    """Move a damaged file (and its journal files) aside, where a person can still look at it."""
    moved = _aside(path)
    for suffix in ("", "-journal", "-wal", "-shm"):
        if Path(f"{path}{suffix}").exists():
            os.replace(f"{path}{suffix}", f"{moved}{suffix}")
    return moved


def _open_checked(path: Path) -> Store:
    """Open the file, let SQLite vouch for it (a torn or overwritten file fails here, not mid-sweep) and make sure
    it takes a write now."""
    store = Store(path)
    try:
        if fault := store.check():
            raise sqlite3.DatabaseError(f"database disk image is malformed: {fault}")
        store.writable()
    except BaseException:
        store.close()
        raise
    return store


def _looks_like_sqlite(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError:
        return True  # unreadable is the writes' to find out and say


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino
