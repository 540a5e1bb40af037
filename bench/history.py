"""The runs' memory at scale: one sweep's points for 500 runs written in one transaction, and the state file's
size for 500 runs after 30 days under the default retention.

Usage: .venv/bin/python bench/history.py [--runs 500] [--days 30] [--dir /tmp]
Prints a table and a last line `RESULT name=value ...`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.core.facts import Step  # noqa: E402
from bot.core.gpus import GpuReport, GpuState  # noqa: E402
from bot.core.history import Point, RoleLoad, Tally, observe, tally  # noqa: E402
from bot.core.verdict import Level, Phase, Verdict  # noqa: E402
from bot.service.store import Store  # noqa: E402
from config.registry import BotConfig  # noqa: E402

SWEEP_S = 60.0
STEP_S = 2.0  # a 2 s/step run: 30 steps a sweep, of which the probe keeps the last 8


# Eight GPUs, five sampled readings each, as the seed's pipeline shows them: a target on 0-4, drafters on 5-7.
GPUS = GpuReport(
    gpus=tuple(GpuState(i, "target" if i < 5 else "drafter", "busy", (99.0, 97.0, 100.0, 98.0, 99.0), 72_000.0, 143_771.0,
                        True) for i in range(8)),
    roles=(("target", (0, 1, 2, 3, 4)), ("drafter", (5, 6, 7))))


def verdict(step: int) -> Verdict:
    steps = tuple(Step(f"step={s}", step=s, total=100_000, loss=2.0 + 1 / s, rate=14_200.0, rate_unit="tok/s",
                       elapsed=s * STEP_S) for s in range(step - 7, step + 1))
    return Verdict(run="r", phase=Phase.TRAINING, level=Level.OK, headline="", step=steps[-1], recent=steps,
                   gpu=GPUS)


def points_of_a_sweep(verdicts: dict[str, Verdict], t: float, last: dict[str, Point],
                      tallies: dict[str, Tally]) -> list[tuple[str, Point]]:
    """What bot.service.history.History does per probe: observe, tally, and queue the probe's newest point."""
    out = []
    for name, v in verdicts.items():
        new = observe(v, t, last.get(name))
        tallies[name] = tally(tallies.get(name), new)
        last[name] = new[-1]
        out.append((name, new[-1]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--days", type=float, default=30)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    bot = BotConfig()
    with tempfile.TemporaryDirectory(prefix="runbot-history-", dir=args.dir) as tmp:
        path = Path(tmp) / "state.sqlite3"
        store = Store(path)
        last: dict[str, Point] = {}
        tallies: dict[str, Tally] = {}
        t0 = 1_800_000_000.0
        # The probes' verdicts exist before History sees them: built outside the timing.
        verdicts = {f"run-{i:03d}": verdict(int(t0 / STEP_S)) for i in range(args.runs)}
        points_of_a_sweep({k: verdict(int(t0 / STEP_S) - 30) for k in verdicts}, t0 - SWEEP_S, last, tallies)
        # One sweep, timed: what the event loop spends in History.record, then the worker thread's transaction.
        started = time.process_time()
        batch = points_of_a_sweep(verdicts, t0, last, tallies)
        observe_s = time.process_time() - started
        started = time.process_time()
        store.apply([], batch, list(tallies.items()))
        write_s = time.process_time() - started
        # 30 days: a day's sweeps at once per simulated day (the retention runs hourly in the bot; here daily,
        # after each day's points, which leaves at most a day of full points — the same as history_full).
        sweeps_per_day = int(86400 / SWEEP_S)
        t = t0
        gpus = (RoleLoad("target", 1.0, 70.5), RoleLoad("drafter", 0.9, 40.2))
        for day in range(int(args.days)):
            day_points = []
            for _ in range(sweeps_per_day):  # the same rows History writes, built directly: observe() is timed above
                t += SWEEP_S
                step = int((t - t0) / STEP_S)
                day_points += [(f"run-{i:03d}", Point(t, Phase.TRAINING, 0, step, 100_000, 2.0 + 1 / step, 14_200.0,
                                                      "tok/s", 0, gpus)) for i in range(args.runs)]
            store.apply([], day_points)
            store.prune(t, bot.history_full, bot.history_every, bot.history_keep)
        store._db.execute("VACUUM")
        rows = store._db.execute("SELECT count(*) FROM points").fetchone()[0]
        store.close()
        size = os.path.getsize(path)
    per_sweep = len(batch)
    print(f"{'what':<44} {'value':>12}")
    print(f"{'points in one sweep (' + str(args.runs) + ' runs)':<44} {per_sweep:>12}")
    print(f"{'History.record for the sweep (loop), CPU ms':<44} {observe_s * 1000:>12.1f}")
    print(f"{'store.apply() for the sweep (worker), CPU ms':<44} {write_s * 1000:>12.1f}")
    print(f"{'the sweep history, in all, CPU ms':<44} {(observe_s + write_s) * 1000:>12.1f}")
    print(f"{'rows after ' + str(args.days) + ' days':<44} {rows:>12}")
    print(f"{'state file after ' + str(args.days) + ' days, MB':<44} {size / 1e6:>12.1f}")
    total = observe_s + write_s
    print(f"RESULT runs={args.runs} sweep_points={per_sweep} sweep_record_ms={observe_s * 1000:.1f} "
          f"sweep_write_ms={write_s * 1000:.1f} sweep_history_ms={total * 1000:.1f} days={args.days:g} rows={rows} "
          f"file_mb={size / 1e6:.1f} history_ok={total < 0.02} size_ok={size < 200e6}")


if __name__ == "__main__":
    main()
