"""Pure: what the run's memory says about now — its ETA, its rate against its own recent median, sparklines
of rate and loss, and the findings only numbers over time can show: a throughput drop, a loss spike."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bot.core.facts import Step
from bot.core.history import Point
from bot.core.verdict import Finding, Found, Phase, Trend

SPARK = "▁▂▃▄▅▆▇█"
SPARK_WINDOW_S, SPARK_CELLS = 3600.0, 12  # one cell per 5 minutes of the clock
# The least height of a sparkline's axis, as a share of its level: a rate from zero (a ±1 % wobble is noise,
# a drop to half is half the bar); a loss falls slowly, so it gets a fifth of its level (a 2 % wobble still
# draws flat, its descent still shows).
RATE_MIN_SPAN, LOSS_MIN_SPAN = 1.0, 0.2
PACE_WINDOW_S = 1800.0  # the ETA's pace: the last half hour of steps
BASELINE_WINDOW_S = 3600.0  # a rate is slow against the median of the hour before its slow stretch
MIN_BASELINE_POINTS = 5
SPIKE_POINTS, SPIKE_MADS = 3, 6.0  # a loss spike: this many points in a row this many deviations above


@dataclass(frozen=True)
class RunNumbers:
    """What a run's policy says about its numbers (config.registry.Run has these fields)."""

    slow_below: float = 0.6
    slow_for: float = 600.0
    loss_spike: bool = False


def _segment(points: Sequence[Point]) -> list[Point]:
    """The points of the run's current segment (since its log last restarted)."""
    if not points:
        return []
    last = points[-1].segment
    return [p for p in points if p.segment == last]


def _training(points: Sequence[Point], unit: str | None) -> list[Point]:
    """Points where the loop itself was running (evaluations and saves slow nothing) with a rate in `unit`."""
    return [p for p in points if p.phase is Phase.TRAINING and p.rate is not None and p.unit == unit]


def spark(values: Sequence[float], *, min_span: float) -> str:
    """One cell per value, on an axis whose top is the highest value and whose height is at least `min_span`
    of the level (the largest magnitude): noise smaller than that draws flat at the top, a real fall draws a
    fall. `min_span=1.0` scales a non-negative series from zero, as a rate is read (half the rate, half the bar)."""
    finite = [v for v in values if math.isfinite(v)]
    if len(finite) < 2:
        return ""
    lo, hi = min(finite), max(finite)
    height = max(hi - lo, min_span * max(abs(lo), abs(hi)))
    if height == 0:  # all zero: nothing moves, and nothing is there
        return SPARK[0] * len(finite)
    bottom = hi - height
    return "".join(SPARK[min(len(SPARK) - 1, int((v - bottom) / height * len(SPARK)))] for v in finite)


def _cells(points: Sequence[Point], attr: str, now: float) -> list[float]:
    """The last SPARK_CELLS wall-clock buckets up to `now`, each the median of its points (empty ones skipped).

    Buckets are fixed to the clock (multiples of SPARK_WINDOW_S / SPARK_CELLS since the epoch), not counted
    back from `now`: two asks a minute apart draw the same cells, only the newest still filling."""
    width = SPARK_WINDOW_S / SPARK_CELLS
    newest = math.floor(now / width)
    buckets: dict[int, list[float]] = {}
    for p in points:
        value = getattr(p, attr)
        cell = math.floor(p.t / width)
        if value is not None and newest - SPARK_CELLS < cell <= newest:
            buckets.setdefault(cell, []).append(value)
    return [statistics.median(buckets[k]) for k in sorted(buckets)]


def _eta(points: Sequence[Point], step: Step, now: float) -> float | None:
    if step.total is None or step.step is None or step.step >= step.total:
        return None
    window = [p for p in points if p.step is not None and now - p.t <= PACE_WINDOW_S]
    if len(window) < 2 or window[-1].t - window[0].t < 60:
        return None
    pace = (window[-1].step - window[0].step) / (window[-1].t - window[0].t)  # type: ignore[operator]
    return (step.total - step.step) / pace if pace > 0 else None


def trend(points: Sequence[Point], step: Step | None) -> Trend:
    """The trends of the run's current segment; empty without a history."""
    seg = _segment(points)
    if not seg or step is None:
        return Trend()
    now = seg[-1].t
    unit = step.rate_unit
    rated = _training(seg, unit)
    hour = [p.rate for p in rated if now - p.t <= BASELINE_WINDOW_S]
    vs = (step.rate / statistics.median(hour) - 1) if step.rate and len(hour) >= MIN_BASELINE_POINTS and statistics.median(hour) else None
    return Trend(eta=_eta(seg, step, now), vs_median=vs, rate_spark=spark(_cells(rated, "rate", now), min_span=RATE_MIN_SPAN),
                 loss_spark=spark(_cells(seg, "loss", now), min_span=LOSS_MIN_SPAN), unit=unit)


def slow(points: Sequence[Point], step: Step | None, phase: Phase, policy: RunNumbers) -> Found | None:
    """The rate below `slow_below` of its baseline for at least `slow_for`, the newest reading included."""
    seg = _segment(points)
    if phase is not Phase.TRAINING or step is None or step.rate is None or not seg:
        return None
    now = seg[-1].t
    if now - seg[0].t < 2 * policy.slow_for:
        return None  # quiet while the segment is young (warm-up, compilation): a baseline first, then a stretch
    rated = _training(seg, step.rate_unit)
    recent = [p for p in rated if now - p.t <= policy.slow_for]
    before = [p.rate for p in rated if policy.slow_for < now - p.t <= policy.slow_for + BASELINE_WINDOW_S]
    if len(before) < MIN_BASELINE_POINTS or not recent:
        return None
    baseline = statistics.median(before)  # type: ignore[type-var]
    limit = policy.slow_below * baseline
    if step.rate >= limit or any(p.rate >= limit for p in recent):  # type: ignore[operator]
        return None
    # How long it has been slow: back from now over the run of slow points.
    slow_since = now
    for p in reversed(rated):
        if p.rate >= limit:  # type: ignore[operator]
            break
        slow_since = p.t
    if now - slow_since < policy.slow_for:
        return None
    return Found(Finding.SLOW, step.rate_unit or "it/s", before=baseline, value=step.rate, lasted=now - slow_since)


def loss_spike(points: Sequence[Point], step: Step | None, policy: RunNumbers) -> Found | None:
    """The last SPIKE_POINTS losses far above the segment's recent ones (median + SPIKE_MADS deviations)."""
    if not policy.loss_spike or step is None or step.loss is None or not math.isfinite(step.loss):
        return None
    losses = [p.loss for p in _segment(points) if p.loss is not None]
    if len(losses) < 20:
        return None
    window, last = losses[-60:-SPIKE_POINTS + 1], [*losses[-SPIKE_POINTS + 1:], step.loss]
    median = statistics.median(window)
    mad = statistics.median(abs(x - median) for x in window) or abs(median) * 0.01 or 1e-9
    if all(x > median + SPIKE_MADS * mad and x > 1.2 * median for x in last):
        return Found(Finding.LOSS_SPIKE, "loss", step=step.step, before=median, value=step.loss)
    return None
