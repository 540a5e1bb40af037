"""Each run's memory at the edge: its recent points in memory for answers and alerts, each probe's new points
queued to the state file (written with the sweep's decisions), older ones read back from it for charts (shell)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from bot.core.history import RECENT_S, Point, Tally, keep_recent, observe, tally
from bot.core.learned import Learned
from bot.core.verdict import Verdict
from bot.service.state_file import StateFile


class History:
    """One per bot. With no state file (a CLI call) it remembers nothing beyond the process."""

    def __init__(self, state_file: StateFile | None = None, *, clock: Callable[[], float] = time.time,
                 runs: Iterable[str] | None = None) -> None:
        self.state_file = state_file
        self.clock = clock
        self._recent: dict[str, tuple[Point, ...]] = {}
        self._tallies: dict[str, Tally] = {}  # each run's current segment, for its end-of-run summary
        self._learned: dict[str, Learned] = {}  # each run's format as its log taught it (bot.core.learned)
        if state_file is not None:
            memory = state_file.memory(clock() - RECENT_S, runs)
            self._tallies, self._learned = memory.tallies, memory.formats
            self._recent = {run: keep_recent(points, clock()) for run, points in memory.points.items()}

    def recent(self, run: str) -> tuple[Point, ...]:
        return self._recent.get(run, ())

    def tally(self, run: str) -> Tally | None:
        return self._tallies.get(run)

    def learned(self, run: str) -> Learned | None:
        return self._learned.get(run)

    def record(self, run: str, verdict: Verdict) -> tuple[Point, ...]:
        """What this verdict adds to the run's memory (each new step once), kept and queued for the disk."""
        now = self.clock()
        if (taught := verdict.learned) is not None:
            before = self._learned.get(run)
            self._learned[run] = taught
            if self.state_file is not None and (before is None or before.lasting != taught.lasting):
                self.state_file.record(run, (), learned=taught)  # a few hundred bytes, only when it changes
        old = self._recent.get(run, ())
        new = observe(verdict, now, old[-1] if old else None)
        if new:
            self._recent[run] = keep_recent((*old, *new), now)
            self._tallies[run] = tally(self._tallies.get(run), new)  # type: ignore[assignment]
            if self.state_file is not None:
                # On disk, one point per probe (its newest step, phase and GPU load): every step of a 2 s/step
                # run for 500 runs would be 5.8M rows a day; memory keeps them all for the trends.
                self.state_file.record(run, new[-1:], self._tallies[run])
        return new

    async def points(self, run: str, since: float, until: float | None = None) -> Sequence[Point]:
        """The run's points over a window, from the state file (every point of the last day, then sparser), or
        from memory when there is no file or it cannot be read now."""
        if self.state_file is not None:
            found = await self.state_file.read(lambda store: store.points(run, since, until))
            if found is not None:
                return found
        return [p for p in self.recent(run) if p.t >= since and (until is None or p.t <= until)]
