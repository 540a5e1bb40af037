"""Which replica sweeps and posts: the one holding a PostgreSQL advisory lock on its session; a lone bot always leads (shell)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from dataclasses import dataclass
from enum import Enum

log = logging.getLogger("runbot.leadership")

# The lock's key: one per database (a team's replicas share one). Under 2**31, so pg_locks shows it whole in objid.
LOCK_KEY = 0x72626F74  # "rbot"
CONNECT_TIMEOUT_S = 3


class StandingBy(RuntimeError):
    """A change asked of a replica that does not lead (a mute, a watch): said to the user as it is."""


class Role(Enum):
    LEADER = "leader"
    STANDBY = "standby"
    # A leader whose database went away: nobody can take over meanwhile (the lock lives in that database), so it
    # goes on judging from memory and holds its messages; once the database is back it leads again if it can.
    CUT_OFF = "cut off"


@dataclass(frozen=True)
class Replica:
    """A runbot connected to the shared database, as the server sees it."""

    name: str  # host:pid, as each replica names its lock session
    leads: bool


def replica_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Solo:
    """An SQLite bot: nobody else can sweep its file, so it leads."""

    role = Role.LEADER

    async def check(self) -> Role:
        return Role.LEADER

    def needs_reload(self) -> bool:
        return False

    async def still_leads(self) -> bool:
        return True

    async def replicas(self) -> list[Replica]:
        return [Replica(replica_name(), True)]

    def close(self) -> None:
        pass


class AdvisoryLock:
    """Leadership by `pg_try_advisory_lock` on a session of its own: the server releases the lock the moment that
    session ends (the leader's process killed, its host gone once TCP gives up, its connection cut), and a standby's
    next `check()` takes it. A leader checks its session is alive before each sweep: one that lost it stands by at
    once, before it posts anything (the new leader may have taken over)."""

    def __init__(self, url: str, *, key: int = LOCK_KEY, name: str | None = None) -> None:
        self.url, self.key, self.name = url, key, name or replica_name()
        self.role = Role.STANDBY
        self._conn = None
        self._holds = False  # this session holds the lock
        self.epoch: int | None = None  # the leadership's number when this replica last took it
        # Taken (first, or again after losing its session) since the watchdog last asked `needs_reload`, and whether
        # nobody led in between every such taking (then its memory is the latest there is).
        self.retaken = False
        self.continued = False

    async def check(self) -> Role:
        """This replica's role now (a blocking call in a thread: at most a connect timeout)."""
        was = self.role
        self.role = await asyncio.to_thread(self._check)
        if self.role is not was:
            log.warning("this replica (%s) now %s", self.name, "leads" if self.role is Role.LEADER else "stands by")
        return self.role

    def _check(self) -> Role:
        import psycopg  # noqa: PLC0415  (only with a PostgreSQL state)

        try:
            return self._ask()
        except psycopg.Error:
            self._drop()  # the session is gone (cut, or the server with it): is the database?
        try:
            return self._ask()
        except psycopg.Error as exc:
            was_leading = self.role in (Role.LEADER, Role.CUT_OFF)
            log.warning("leadership: the database cannot be asked (%s); %s", str(exc).strip(),
                        "leading from memory, messages held" if was_leading else "standing by")
            self._drop()
            return Role.CUT_OFF if was_leading else Role.STANDBY

    def _ask(self) -> Role:
        import psycopg  # noqa: PLC0415

        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                                         application_name=f"runbot {self.name}")
            self._holds = False
        if self._holds:
            self._conn.execute("SELECT 1")  # the session lives: the lock is still ours
            return Role.LEADER
        if not self._conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()[0]:
            return Role.STANDBY
        self._holds = True
        continued = self._count_epoch()
        self.continued = continued and (self.continued or not self.retaken)  # every taking since the last ask
        self.retaken = True
        return Role.LEADER

    def needs_reload(self) -> bool:
        """Did this replica take the lock since it was last asked, with another leading in between (or never having
        led)? Then the shared ledger is newer than its memory. Asking clears it."""
        stale, self.retaken, self.continued = self.retaken and not self.continued, False, False
        return stale

    def _count_epoch(self) -> bool:
        """Number each taking of the lock (runbot_meta's leader_epoch): a leader that was cut off and takes it back
        knows whether another led in between (then its memory is stale) or not (True: it is the latest there is)."""
        import psycopg  # noqa: PLC0415

        try:
            row = self._conn.execute(
                "INSERT INTO runbot_meta (key, value) VALUES ('leader_epoch', '1') ON CONFLICT (key) DO UPDATE "
                "SET value = (runbot_meta.value::bigint + 1)::text RETURNING value::bigint").fetchone()
        except psycopg.errors.UndefinedTable:  # a database no store has opened yet: nothing to be stale about
            self.epoch = None
            return False
        continued = self.role is not Role.STANDBY and self.epoch is not None and row[0] == self.epoch + 1
        self.epoch = row[0]
        return continued

    async def still_leads(self) -> bool:
        """Before each message: is the lock's session alive (one round trip)? A leader cut off since its tick must
        not post what the next leader will."""
        if self.role is not Role.LEADER:
            return False
        self.role = await asyncio.to_thread(self._check)
        # A lock taken again just now is news for the next tick first: it may have to read the ledger afresh.
        return self.role is Role.LEADER and not self.retaken

    async def replicas(self) -> list[Replica]:
        """Every runbot with a lock session on the database, and which one holds the lock."""
        return await asyncio.to_thread(self._replicas)

    def _replicas(self) -> list[Replica]:
        import psycopg  # noqa: PLC0415

        try:
            with psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
                found = conn.execute(
                    "SELECT a.application_name, bool_or(l.granted AND l.objid = %s AND l.locktype = 'advisory') "
                    "FROM pg_stat_activity a LEFT JOIN pg_locks l ON l.pid = a.pid "
                    "WHERE a.application_name LIKE 'runbot %%' GROUP BY a.pid, a.application_name ORDER BY 1",
                    (self.key,)).fetchall()
        except psycopg.Error as exc:
            log.warning("leadership: the replicas cannot be listed (%s)", str(exc).strip())
            return []
        return [Replica(name.removeprefix("runbot "), bool(leads)) for name, leads in found]

    def _drop(self) -> None:
        self._holds = False
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001 - a dead connection may fail to close; it is gone either way
                pass
        self._conn = None

    def close(self) -> None:
        """Give the lock back: a replica stopping lets a standby lead at its next tick. Said to the server before
        the session closes (the server ends a closed session's backend, and its locks, a moment later)."""
        if self._holds and self._conn is not None and not self._conn.closed:
            try:
                self._conn.execute("SELECT pg_advisory_unlock(%s)", (self.key,))
            except Exception:  # noqa: BLE001 - a dead session holds nothing
                pass
        self._drop()
        self.role = Role.STANDBY


def leadership_for(state_db: str) -> Solo | AdvisoryLock:
    from config.state_where import is_server  # noqa: PLC0415

    return AdvisoryLock(state_db) if is_server(state_db) else Solo()
