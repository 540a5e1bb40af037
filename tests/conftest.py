"""Test-wide: no test, nor any runbot it starts, writes the caches of the user running the tests."""

import os
import tempfile

# runbot keeps its validated settings under $XDG_CACHE_HOME/runbot (config/environment.py): the CLI tests start
# runbot as users do, and would otherwise leave that file in the real home.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="runbot-test-cache-")


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def pg_server():
    """One real PostgreSQL server for the session (tests/postgres.py), started on first use."""
    from tests.postgres import Server  # noqa: PLC0415

    server = Server()
    yield server
    server.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def state_db(request, tmp_path):
    """Where a store test keeps its state, on each engine: an SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "state.sqlite3")
    return request.getfixturevalue("pg_server").database()
