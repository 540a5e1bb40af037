"""Pure: when the watchdog next looks at a run — every sweep while something may change, less often while nothing can yet."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from bot.core.verdict import Level, Phase, Verdict

# A healthy run is looked at every silence_after / STEADY_SHARE at most: a crash in it is told within a quarter of
# the silence its config already accepts for a hang (docs/configuration.md, "How late an alert can be").
STEADY_SHARE = 4


class Why(str, enum.Enum):
    """Why a run's next look is when it is (the sweep's log line and the tests read it)."""

    FIRST = "first look"  # no verdict yet (a new run, a restarted bot)
    INCIDENT = "incident"  # an incident is open or recovering, or a concern is being confirmed
    WATCHED = "watched"  # a `/run watch` of a restart is live
    ASKED = "asked"  # a person asked about it a moment ago
    HOST = "host trouble"  # a run of its host did not answer as a host that is up does
    NOT_OK = "not ok"  # anything but steady training or a finish with nothing left running
    UNSURE = "unsure"  # healthy, but when it could next go silent is not known
    STEADY = "steady"  # far from its silence_after: every max(check_every, silence_after / 4)
    EDGE = "edge"  # right when its last progress passes silence_after: a hang is told on time


ATTENTION = frozenset({Why.INCIDENT, Why.WATCHED, Why.ASKED, Why.HOST})  # reasons the watchdog knows, not the verdict


@dataclass(frozen=True)
class Look:
    """A run's next look: the first sweep that is due at `at` probes it (see `due`)."""

    at: float  # the bot's clock
    why: Why


def steady_every(silence_after: float, check_every: float) -> float:
    """The longest gap between two looks at a healthy run: whole sweeps, at most silence_after / 4, at least one."""
    return check_every * max(1, math.floor(silence_after / STEADY_SHARE / check_every))


def next_look(verdict: Verdict | None, now: float, silence_after: float | None, check_every: float, *,
              attention: Why | None = None, spread: float = 1.0) -> Look:
    """When to look at a run again, from its last verdict.

    `now`: when the look that gave `verdict` began (the sweep's start: a moment early errs towards looking early).
    `silence_after`: the run's setting (None: "auto"; the verdict's own threshold is used when it has one).
    `attention`: one of ATTENTION when the watchdog knows a reason to look every sweep.
    `spread` (0 to 1): this share of the steady gap (at least one sweep), for a run's first steady look, so that
    runs first seen together are not all due in the same sweeps ever after (the watchdog spreads them by name).
    A run that is not steady is looked at every sweep (at = now); a steady one after steady_every, but never
    later than the moment its last progress would pass its silence threshold, so a hang is told within
    silence_after + check_every however rarely the run is looked at."""
    if attention is not None:
        return Look(now, attention)
    if verdict is None:
        return Look(now, Why.FIRST)
    if verdict.level is not Level.OK or verdict.concerns:
        return Look(now, Why.NOT_OK)
    threshold = verdict.threshold if verdict.threshold is not None else silence_after
    if verdict.phase is Phase.FINISHED and verdict.writer is None and verdict.process is None:
        # Over, and nothing of it left running: only a restart can change it; no silence to race.
        every = steady_every(threshold if threshold is not None else check_every, check_every)
        return Look(now + every if every > check_every else now, Why.STEADY)
    if verdict.phase is not Phase.TRAINING or threshold is None or verdict.progress_age is None:
        return Look(now, Why.UNSURE)
    every = steady_every(threshold, check_every)
    if every <= check_every:
        return Look(now, Why.STEADY)
    every = check_every * max(1, math.ceil(every / check_every * min(1.0, max(0.0, spread))))
    edge = now + max(0.0, threshold - verdict.progress_age)
    return Look(edge, Why.EDGE) if edge < now + every else Look(now + every, Why.STEADY)


def due(look: Look | None, now: float, check_every: float) -> bool:
    """Does the sweep starting at `now` probe the run? A look within half a sweep from now is this sweep's: sweeps
    start a little early or late, and a look due a moment after this sweep would otherwise wait a whole one."""
    return look is None or look.at <= now + check_every / 2
