"""Replicas on PostgreSQL: how long a killed leader's lock outlives it, and a sweep's write on PostgreSQL vs SQLite.

Starts its own PostgreSQL server (tests/postgres.py: initdb into a temp dir, loopback only). Failover: a child
process takes the leader's advisory lock, is killed with SIGKILL, and a standby polling every 20 ms times how long
until it leads; the takeover in `runbot serve` is that plus at most one `check_every` (the standby asks at each
tick). Sweep cost: one sweep's write of N runs (a point and a tally each, a few run states) through the store.

    python bench/failover.py [--kills 20] [--runs 500] [--sweeps 20]

Prints a table and a last line `RESULT name=value ...`.
"""

from __future__ import annotations

import argparse
import logging
import asyncio
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bot.core.alerts import RunState  # noqa: E402
from bot.core.history import Point, Tally  # noqa: E402
from bot.core.ledger import PutState  # noqa: E402
from bot.core.verdict import Phase  # noqa: E402
from bot.service.leadership import AdvisoryLock, Role  # noqa: E402
from bot.service.store import Store  # noqa: E402
from bot.service.store_pg import PgStore  # noqa: E402
from tests.postgres import Server  # noqa: E402

logging.getLogger("runbot.leadership").setLevel(logging.ERROR)  # each takeover would say so


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def one_failover(url: str, n: int) -> float:
    child = textwrap.dedent(f"""
        import asyncio, sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
        from bot.service.leadership import AdvisoryLock, Role
        lock = AdvisoryLock({url!r}, name="leader:{n}")
        assert asyncio.run(lock.check()) is Role.LEADER
        print("leading", flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    standby = AdvisoryLock(url, name=f"standby:{n}")
    try:
        assert proc.stdout.readline().strip() == "leading"
        assert await standby.check() is Role.STANDBY
        proc.kill()
        killed = time.perf_counter()
        proc.wait()
        while await standby.check() is not Role.LEADER:
            await asyncio.sleep(0.02)
        return time.perf_counter() - killed
    finally:
        proc.kill()
        standby.close()


def sweep_writes(store: Store, runs: int, sweeps: int) -> list[float]:
    took = []
    for k in range(sweeps):
        t = 1_800_000_000 + 10 * k
        points = [(f"run-{i}", Point(t, Phase.TRAINING, 0, 100 + k, 1000, 2.0, 14_000.0, "tok/s")) for i in range(runs)]
        tallies = [(f"run-{i}", Tally(0, t - 600, t, 1, 100 + k, 2.0, 1.9, 14_000.0 * (k + 1), k + 1, "tok/s"))
                   for i in range(runs)]
        states = [PutState(f"run-{i}", RunState(changed_at=t)) for i in range(0, runs, 50)]
        started = time.perf_counter()
        store.apply(states, points, tallies)
        took.append(time.perf_counter() - started)
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--sweeps", type=int, default=20)
    args = ap.parse_args()
    server = Server()
    try:
        gaps = [asyncio.run(one_failover(server.database(), n)) for n in range(args.kills)]
        pg = PgStore(server.database())
        try:
            on_pg = sweep_writes(pg, args.runs, args.sweeps)
        finally:
            pg.close()
        with tempfile.TemporaryDirectory() as tmp:
            lite = Store(Path(tmp) / "state.sqlite3")
            try:
                on_sqlite = sweep_writes(lite, args.runs, args.sweeps)
            finally:
                lite.close()
    finally:
        server.close()
    print(f"{'measure':<44} {'p50':>9} {'p99':>9}")
    print(f"{'lock freed after SIGKILL (ms)':<44} {1000 * pct(gaps, .5):>9.1f} {1000 * pct(gaps, .99):>9.1f}")
    print(f"{f'sweep write, {args.runs} runs, PostgreSQL (ms)':<44} {1000 * pct(on_pg, .5):>9.1f} {1000 * pct(on_pg, .99):>9.1f}")
    print(f"{f'sweep write, {args.runs} runs, SQLite (ms)':<44} {1000 * pct(on_sqlite, .5):>9.1f} {1000 * pct(on_sqlite, .99):>9.1f}")
    print(f"RESULT kills={args.kills} failover_p50_ms={1000 * statistics.median(gaps):.1f} "
          f"failover_p99_ms={1000 * pct(gaps, .99):.1f} runs={args.runs} pg_sweep_p50_ms={1000 * pct(on_pg, .5):.1f} "
          f"sqlite_sweep_p50_ms={1000 * pct(on_sqlite, .5):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
