"""A real PostgreSQL server for the tests: initdb into a temp dir as an unprivileged user, loopback only."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest


def _bin(name: str) -> str | None:
    """Debian keeps the server's programs out of PATH (/usr/lib/postgresql/<major>/bin)."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One postgres process; `database()` hands each test a database of its own, `stop()`/`start()` take the
    server away and bring it back on the same port (a database lost under the bot)."""

    def __init__(self) -> None:
        initdb, self.postgres = _bin("initdb"), _bin("postgres")
        if not initdb or not self.postgres:
            pytest.fail("PostgreSQL's initdb/postgres not found: .ci/run installs Debian's postgresql package")
        self.dir = Path(tempfile.mkdtemp(prefix="runbot-pg-"))
        self.user = None
        if os.geteuid() == 0:  # postgres refuses to run as root
            self.user = "postgres" if _has_user("postgres") else "nobody"
            os.chmod(self.dir, 0o700)
            shutil.chown(self.dir, self.user)
        self.data = self.dir / "data"
        self.port = _free_port()
        self._run([initdb, "-D", str(self.data), "-U", "runbot", "--auth=trust", "-E", "UTF8", "--no-instructions"],
                  check=True, stdout=subprocess.DEVNULL)
        self.proc: subprocess.Popen | None = None
        self.start()

    def _cmd(self, argv: list[str]) -> list[str]:
        return ["runuser", "-u", self.user, "--", *argv] if self.user else argv

    def _run(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self._cmd(argv), **kw)

    @property
    def url(self) -> str:
        return f"postgresql://runbot@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        self.proc = subprocess.Popen(self._cmd([
            self.postgres, "-D", str(self.data), "-p", str(self.port), "-k", str(self.dir),
            "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200", "-c", "fsync=on"]),
            stdout=subprocess.DEVNULL, stderr=open(self.dir / "server.log", "ab"))  # noqa: SIM115
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited: {(self.dir / 'server.log').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    pass
                if self._sql("SELECT 1").returncode == 0:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("postgres did not start within 30 s")

    def stop(self, *, fast: bool = True) -> None:
        if self.proc is None:
            return
        # The postmaster itself, not runuser before it (which does not pass signals on): SIGINT is a fast
        # shutdown, every session cut, as when a database server is stopped under the bot.
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
            os.kill(pid, signal.SIGINT if fast else signal.SIGTERM)
        except (OSError, ValueError, IndexError):
            self.proc.terminate()
        self.proc.wait(30)
        self.proc = None

    def _sql(self, sql: str, db: str = "postgres") -> subprocess.CompletedProcess:
        import psycopg  # noqa: PLC0415

        try:
            with psycopg.connect(f"postgresql://runbot@127.0.0.1:{self.port}/{db}", autocommit=True, connect_timeout=2) as c:
                c.execute(sql)
            return subprocess.CompletedProcess([], 0)
        except psycopg.Error:
            return subprocess.CompletedProcess([], 1)

    def database(self) -> str:
        """A fresh, empty database on this server, as a URL."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        if self._sql(f"CREATE DATABASE {name}").returncode:
            raise RuntimeError(f"cannot create database {name}")
        return f"postgresql://runbot@127.0.0.1:{self.port}/{name}"

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def open_store(where: str):
    """The store for a test's `state_db` (tests/conftest.py): an SQLite file or a PostgreSQL database."""
    from config.state_where import is_server  # noqa: PLC0415
    from bot.service.store import Store  # noqa: PLC0415

    if is_server(where):
        from bot.service.store_pg import PgStore  # noqa: PLC0415

        return PgStore(where)
    return Store(where)
