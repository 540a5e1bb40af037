"""Pure: Evidence + a run's policy -> Verdict, as a short pipeline of stages. Time comes in through the
evidence (the remote clock) and the previous verdict, never from a clock of our own."""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Mapping, Protocol, Sequence

from bot.core.evidence import Evidence
from bot.core.facts import Step
from bot.core.history import Point
from bot.core.learned import learn
from bot.core.gpus import classify
from bot.core.stages.activity import activity
from bot.core.stages.freshness import freshness
from bot.core.stages.headline import judge, no_log, unreadable
from bot.core.stages.liveness import liveness
from bot.core.stages.trends import RunNumbers, loss_spike, slow, trend
from bot.core.verdict import Concern, Level, Phase, Verdict, Worry

# silence_after = "auto": several times the median gap between progress lines, within bounds.
AUTO_FACTOR, AUTO_FLOOR_S, AUTO_CAP_S, AUTO_DEFAULT_S = 8.0, 120.0, 1800.0, 600.0


class RunPolicy(Protocol):
    """What the diagnosis needs from a run's configuration (config.registry.Run satisfies it)."""

    name: str
    log: str
    silence_after: float | None  # None: "auto"
    loading_grace: float
    slow_below: float  # the rate under this share of its baseline for slow_for is a finding
    slow_for: float
    loss_spike: bool

    @property
    def roles(self) -> Mapping[str, Sequence[int]]: ...


def unreachable(run: RunPolicy, failure: str, kind: str | None = None) -> Verdict:
    """The verdict for a probe that never ran: the failure says what and where."""
    return Verdict(run=run.name, phase=Phase.UNREACHABLE, level=Level.CRIT, headline=failure,
                   concerns=(Concern(Worry.UNREACHABLE),), failure_kind=kind)


def learned_threshold(steps: Sequence[Step]) -> float | None:
    """Silence allowed for a loop, learned from the gaps between its progress lines: their `elapsed`
    values, their own timestamps, or the time per step they print."""
    gaps: list[float] = []
    for attr in ("elapsed", "stamp"):
        times = [getattr(s, attr) for s in steps if getattr(s, attr) is not None]
        gaps = [b - a for a, b in zip(times, times[1:]) if b > a]
        if len(gaps) >= 2:
            break
    if len(gaps) < 2:
        per_step = [s.step_time for s in steps if s.step_time]
        gaps = per_step if len(per_step) >= 2 else []
    if len(gaps) < 2:
        return None
    return min(AUTO_CAP_S, max(AUTO_FLOOR_S, AUTO_FACTOR * statistics.median(gaps)))


def diagnose(ev: Evidence, run: RunPolicy, *, previous: Verdict | None = None,
             history: Sequence[Point] = ()) -> Verdict:
    """recognise (the evidence) -> activity -> liveness -> freshness -> trends -> findings and headline, and
    what this look adds to the run's learned format (`Verdict.learned`, for its next look).
    `history`: the run's remembered points, oldest first (bot.core.history), for trends and their alerts."""
    verdict = _diagnose(ev, run, previous=previous, history=history)
    taught = learn(ev.learned, inode=ev.log.inode, size=ev.log.size, now=ev.now, sightings=ev.sightings,
                   counter=ev.counter, news=ev.news)
    return replace(verdict, learned=taught) if taught is not None else verdict


def _diagnose(ev: Evidence, run: RunPolicy, *, previous: Verdict | None, history: Sequence[Point]) -> Verdict:
    gpu = classify(ev.gpus, run.roles)
    if not ev.log.exists:
        return no_log(ev, run, gpu)
    if not ev.log.readable or (ev.problems and not ev.lines and ev.log.size):
        return unreadable(ev, run, gpu)
    doing = activity(ev)
    life = liveness(ev)
    steps = ev.moved.steps if ev.moved is not None and ev.moved.steps and not ev.steps else ev.steps
    fresh = freshness(ev, steps[-1] if steps else None, previous)
    training_threshold = run.silence_after if run.silence_after is not None else (
        learned_threshold(steps) or AUTO_DEFAULT_S)
    step = steps[-1] if steps else None
    numbers = RunNumbers(run.slow_below, run.slow_for, run.loss_spike)
    trends = trend(history, step)
    told = tuple(f for f in (slow(history, step, doing.phase, numbers), loss_spike(history, step, numbers)) if f)
    return judge(ev, run, gpu, doing, life, fresh, steps, training_threshold, previous, trends, told)
