"""Pure: a run's memory — the points each probe adds (every step it saw, once), segments where the log
restarts, and the bounded window of recent points the trends are read from."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from bot.core.facts import Step
from bot.core.gpus import GpuReport, GpuState
from bot.core.verdict import Phase, Verdict

RECENT_S = 3 * 3600.0  # what answers and alerts read; older points stay in the state file for charts
# A step or total beyond this is no counter (a 20-digit "step=" in a log): it would not fit the state file's
# integers, and a count added to it must still fit.
MAX_COUNT = 2**53
RECENT_MAX = 4000  # points of one run kept in memory (a 0.5 s/step run gives 21600 steps in 3 h: spaced out)


@dataclass(frozen=True)
class RoleLoad:
    """One GPU role at one probe: the share of the time its GPUs were busy (their mean), the memory it held."""

    role: str
    busy: float  # 0..1
    mem_gib: float | None


@dataclass(frozen=True)
class Point:
    """What runbot knew of a run at one moment (`t`: the bot's clock, seconds)."""

    t: float
    phase: Phase
    level: int
    step: int | None = None
    total: int | None = None
    loss: float | None = None
    rate: float | None = None
    unit: str | None = None
    segment: int = 0  # counts the log's restarts: a step that falls back is a new run, not a fall of 100 %
    gpus: tuple[RoleLoad, ...] = ()


def finite(x: float | None) -> float | None:
    """Only real numbers reach the memory: a NaN loss is a finding, never a point on a chart."""
    return x if x is not None and math.isfinite(x) and abs(x) < 1e30 else None


def count(x: int | None) -> int | None:
    """Only counts the state file can hold reach the memory."""
    return x if x is not None and 0 <= x <= MAX_COUNT else None


def role_load(role: str, states: Sequence[GpuState]) -> RoleLoad | None:
    """The role's load over its GPUs: each GPU's share of time busy (counted in its readings, or estimated over
    the driver's window), their mean, and the memory they hold together; None when nothing was read."""
    shares = [share for g in states if (share := g.busy_share) is not None]
    mems = [g.mem_used_mib for g in states if g.mem_used_mib is not None]
    if not shares and not mems:
        return None
    busy = sum(shares) / len(shares) if shares else 0.0
    return RoleLoad(role, round(busy, 3), round(sum(mems) / 1024, 2) if mems else None)


def role_loads(gpu: GpuReport | None) -> tuple[RoleLoad, ...]:
    """Each configured role's load ("GPUs": all of them, for a run with no roles): what the memory keeps,
    the metrics export and the JSON answers carry."""
    if gpu is None or not gpu.gpus:
        return ()
    roles = [(role, gpu.in_role(role)) for role, _ in gpu.roles] or [("GPUs", list(gpu.gpus))]
    return tuple(load for role, states in roles if (load := role_load(role, states)) is not None)


def _times(steps: Sequence[Step], t: float, age: float | None) -> list[float]:
    """When each step line was printed, on the bot's clock: the newest `age` seconds before `t`, the others
    by their own stamps or elapsed times relative to it; without either, all at the newest's time."""
    newest = t - (age or 0.0)
    last = steps[-1]
    out = []
    for s in steps:
        if s.stamp is not None and last.stamp is not None:
            out.append(newest - max(0.0, last.stamp - s.stamp))
        elif s.elapsed is not None and last.elapsed is not None:
            out.append(newest - max(0.0, last.elapsed - s.elapsed))
        else:
            out.append(newest)
    return out


def observe(verdict: Verdict, t: float, last: Point | None) -> tuple[Point, ...]:
    """The points one verdict adds after `last` (the run's newest remembered point): each step line it saw
    that is newer than `last`'s step, or one point of phase and GPUs when there is no new step."""
    if not verdict.reached:
        return ()
    segment = last.segment if last is not None else 0
    level, gpus = int(verdict.level), role_loads(verdict.gpu)
    steps = [s for s in verdict.recent if s.step is not None] or ([verdict.step] if verdict.step is not None else [])
    if steps and last is not None and last.step is not None and steps[-1].step is not None and steps[-1].step < last.step:
        segment += 1  # the counter fell back: the log restarted (a relaunch, a resume from an earlier checkpoint)
        last = None
    fresh = [s for s in steps if last is None or last.step is None or (s.step or 0) > last.step]
    if not fresh:
        return (Point(t, verdict.phase, level, last.step if last else None, last.total if last else None,
                      segment=segment, gpus=gpus),)
    times = _times(fresh, t, verdict.progress_age)
    out = [Point(at, verdict.phase, level, count(s.step), count(s.total), finite(s.loss), finite(s.rate), s.rate_unit, segment)
           for s, at in zip(fresh, times)]
    out[-1] = replace(out[-1], t=max(out[-1].t, last.t if last else out[-1].t), gpus=gpus)
    return tuple(out)


def keep_recent(points: Sequence[Point], now: float) -> tuple[Point, ...]:
    """The last RECENT_S of points, at most RECENT_MAX of them: spaced out evenly when there are more."""
    recent = [p for p in points if now - p.t <= RECENT_S]
    if len(recent) <= RECENT_MAX:
        return tuple(recent)
    stride = len(recent) / RECENT_MAX
    return tuple(recent[int(i * stride)] for i in range(RECENT_MAX - 1)) + (recent[-1],)


@dataclass(frozen=True)
class Tally:
    """A run's current segment in a few numbers, kept up to date point by point (for its end-of-run summary)."""

    segment: int
    started: float  # the bot's clock at its first point: how long runbot watched it, not how long it ran
    last_t: float
    first_step: int | None = None
    last_step: int | None = None
    final_loss: float | None = None
    best_loss: float | None = None
    rate_sum: float = 0.0
    rate_n: int = 0
    unit: str | None = None

    @property
    def mean_rate(self) -> float | None:
        return self.rate_sum / self.rate_n if self.rate_n else None


def tally(old: Tally | None, points: Sequence[Point]) -> Tally | None:
    """The tally with a probe's new points (oldest first); a new segment starts a new one. One Tally built per
    probe, not per point: this runs for every run of every sweep."""
    for i, p in enumerate(points):
        if old is None or p.segment != old.segment:
            return tally(Tally(p.segment, p.t, p.t), points[i:])
    if old is None or not points:
        return old
    steps = [p.step for p in points if p.step is not None]
    losses = [p.loss for p in points if p.loss is not None]
    unit = old.unit or next((p.unit for p in points if p.rate is not None and p.phase is Phase.TRAINING), None)
    rates = [p.rate for p in points if p.rate is not None and p.phase is Phase.TRAINING and p.unit == unit]
    best = min(losses, default=None)
    return Tally(
        old.segment, old.started, max(old.last_t, points[-1].t),
        old.first_step if old.first_step is not None else (steps[0] if steps else None),
        steps[-1] if steps else old.last_step,
        losses[-1] if losses else old.final_loss,
        best if old.best_loss is None or (best is not None and best < old.best_loss) else old.best_loss,
        old.rate_sum + sum(rates), old.rate_n + len(rates), unit)
