"""Pure: how long since the run's counter last moved — from the lines' own timestamps, from the last probe,
and only last from the file's mtime (heartbeats and warnings keep that fresh while a run stands still)."""

from __future__ import annotations

from dataclasses import dataclass

from bot.core.evidence import Evidence
from bot.core.facts import Step
from bot.core.verdict import Verdict

# The newest stamped line must be near the end to stand for the file's mtime.
_NEAR_END = 50


@dataclass(frozen=True)
class Freshness:
    age: float | None  # seconds since the counter last moved (None: no clock to tell)
    since: float | None  # remote clock when it reached its current value
    how: str  # "stamps", "previous probe", "mtime"


def _same_progress(step: Step, before: Step | None) -> bool:
    return before is not None and before.step == step.step and before.line == step.line


def freshness(ev: Evidence, step: Step | None, previous: Verdict | None = None) -> Freshness:
    mtime_age = ev.silent_for
    if step is None or ev.now is None:
        return Freshness(mtime_age, None, "mtime")
    age, how = mtime_age, "mtime"
    if step.stamp is not None and step.index >= 0:
        tail = ev.stamps[max(0, len(ev.stamps) - _NEAR_END):]
        newest = max((s for s in tail if s is not None), default=None)
        if newest is not None and newest > step.stamp and mtime_age is not None:
            # The last stamped line was written about when the file last changed; the step came
            # (newest - step.stamp) before it.
            age, how = mtime_age + (newest - step.stamp), "stamps"
    if previous is not None and _same_progress(step, previous.step) and previous.progress_since is not None:
        earlier = ev.now - previous.progress_since
        if age is None or earlier > age:
            age, how = earlier, "previous probe"
    since = ev.now - age if age is not None else None
    return Freshness(age, since, how)
