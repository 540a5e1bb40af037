"""Pure: a run's recent past for /run history — its phases as spans (a restart starts a new one) and its incidents."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from bot.core.history import Point
from bot.core.verdict import Phase

if TYPE_CHECKING:  # a type only: the ledger (and the alerts behind it) is not loaded for HISTORY_WINDOW_S
    from bot.core.ledger import Incident

MAX_SPANS = 8  # the newest spans a phone shows; older ones are counted, not listed
HISTORY_WINDOW_S = 86400.0  # how far back /run history and `runbot history` look unless told: "what happened overnight"


@dataclass(frozen=True)
class Span:
    """Consecutive points of one phase in one segment of the log."""

    start: float
    end: float
    phase: Phase
    segment: int
    first_step: int | None
    last_step: int | None
    rate: float | None  # the median rate of its points (training only)
    unit: str | None
    restarted: bool  # it begins a new segment: the log started over


def spans(points: Sequence[Point]) -> list[Span]:
    """The points (oldest first) folded into spans of one phase each, oldest first."""
    out: list[Span] = []
    group: list[Point] = []
    for p in points:
        if group and (p.phase is not group[0].phase or p.segment != group[0].segment):
            out.append(_span(group, restarted=bool(out) and group[0].segment != out[-1].segment))
            group = []
        group.append(p)
    if group:
        out.append(_span(group, restarted=bool(out) and group[0].segment != out[-1].segment))
    return out


def _span(group: list[Point], restarted: bool) -> Span:
    steps = [p.step for p in group if p.step is not None]
    rates = sorted(p.rate for p in group if p.rate is not None and p.phase is Phase.TRAINING)
    unit = next((p.unit for p in reversed(group) if p.unit is not None), None)
    return Span(group[0].t, group[-1].t, group[0].phase, group[0].segment, steps[0] if steps else None,
                steps[-1] if steps else None, rates[len(rates) // 2] if rates else None, unit, restarted)


def incidents_between(incidents: Iterable[Incident], run: str, since: float) -> list[Incident]:
    """The run's incidents open at any time since `since` (one that opened before and closed after counts), oldest first."""
    mine = sorted((i for i in incidents if i.run == run), key=lambda i: i.opened_at)
    # One never told closed (it ended quietly, or the bot was away) ended when the next one began.
    ends = [i.closed_at if i.closed_at is not None else (mine[k + 1].opened_at if k + 1 < len(mine) else None)
            for k, i in enumerate(mine)]
    return [i if i.closed_at is not None or end is None else replace(i, closed_at=end)
            for i, end in zip(mine, ends) if i.opened_at >= since or end is None or end >= since]
