"""Pure: how long since the run's counter last moved — from the lines' own timestamps, from the last probe,
and only last from the file's mtime (heartbeats and warnings keep that fresh while a run stands still) —
and, before the first step, how long the work has stood and how long it may."""

from __future__ import annotations

from dataclasses import dataclass

from bot.core.bars import Bar
from bot.core.evidence import Evidence
from bot.core.facts import Step
from bot.core.grammar import fields
from bot.core.learned import stood_for
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


# Before the first step the loading grace is for work that moves. A bar whose own rate says its next item is
# far off (a checkpoint shard every 5 min) may stay silent this many items' time, up to the grace.
MOVES_FACTOR = 3.0


def _seconds(text: str | None) -> float | None:
    """tqdm's `01:02:03` or `05:45`, in seconds."""
    found = fields(text) if text else []
    return found[0].value if len(found) == 1 and found[0].unit == "clock" else None


def seconds_per_item(bar: Bar | None) -> float | None:
    """The time one of the bar's items takes by its own rate (`5.66s/it`, `199.62it/s`, `999 examples/s`);
    None where the rate is unknown (`?it/s`) or the bar is done."""
    if bar is None or bar.finished or not bar.rate:
        return None
    found = [f for f in fields(bar.rate) if f.unit.endswith("/s") or f.unit.startswith("s/")]
    if not found or found[0].value <= 0:
        return None
    return found[0].value if found[0].unit.startswith("s/") else 1.0 / found[0].value


def standing(ev: Evidence, bar: Bar | None) -> float | None:
    """How long the work before the first step has not moved: the log's silence; for a bar still at 0 its own
    elapsed time too (`0/77976 [01:02:03<?, ?it/s]` has stood an hour when it was drawn); and, by earlier
    looks, how long its newest news has stood while only heartbeats kept the file fresh."""
    silent = ev.silent_for
    stood = stood_for(ev.learned, ev.news, ev.now)
    if stood is not None and (silent is None or stood > silent):
        silent = stood
    if silent is None or bar is None or bar.n != 0 or bar.finished:
        return silent
    return silent + (_seconds(bar.elapsed) or 0.0)


def allowed_before_first_step(bar: Bar | None, silence_after: float, grace: float) -> float:
    """The silence a phase before the first step may keep: `silence_after` — a frozen log is a hang whatever
    it was doing — or, for a bar whose items each take long by its own rate, that many items' time, up to `grace`."""
    per_item = seconds_per_item(bar)
    if per_item is None:
        return silence_after
    return min(grace, max(silence_after, MOVES_FACTOR * per_item))
