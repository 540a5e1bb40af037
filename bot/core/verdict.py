"""Pure: the Verdict a diagnosis produces, its phases and ordered levels (nagiosplugin-style `worst`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable

from bot.core.facts import Crash, Process, Step
from bot.core.gpus import GpuReport


class Level(enum.IntEnum):
    """How much a human should care, ordered so that `worst()` is `max()`."""

    OK = 0  # steady training, a clean finish
    NOTE = 1  # normal but not steady: starting, loading, saving, evaluating
    WARN = 2  # degraded: a thread died, a GPU role idle
    CRIT = 3  # silent, crashed, stopped, unreachable, no log


def worst(levels: Iterable[Level]) -> Level:
    return max(levels, default=Level.OK)


class Phase(str, enum.Enum):
    UNREACHABLE = "unreachable"
    NO_LOG = "no log"
    STARTING = "starting"
    LOADING = "loading"
    COMPILING = "compiling"
    SAVING = "saving"
    EVALUATING = "evaluating"
    BUSY = "in progress"  # some other progress bar after the steps
    TRAINING = "training"
    THREAD_DIED = "thread died"
    SILENT = "silent"
    CRASHED = "crashed"
    STOPPED = "stopped"
    FINISHED = "finished"


# Tail lengths users may ask for (CLI `tail -n`, Slack `/run tail RUN N`); a verdict keeps TAIL_MAX lines.
TAIL_DEFAULT, TAIL_MAX = 20, 200

# Phases that may be silent for `loading_grace` rather than `silence_after`.
GRACE_PHASES = frozenset({Phase.STARTING, Phase.LOADING, Phase.COMPILING, Phase.SAVING, Phase.EVALUATING, Phase.BUSY})


@dataclass(frozen=True)
class Verdict:
    """What a run is doing, in one line plus a few short facts."""

    run: str
    phase: Phase
    level: Level
    headline: str  # the one line: what a lock-screen notification shows
    facts: tuple[tuple[str, str], ...] = ()  # (label, short text), most useful first
    step: Step | None = None
    silent_for: float | None = None  # seconds since the log last grew (remote clock)
    threshold: float | None = None  # the silence allowed in this phase
    writer: Process | None = None
    crash: Crash | None = None
    thread_crash: Crash | None = None
    gpu: GpuReport | None = None
    tail: tuple[str, ...] = ()  # last lines of the log, bars collapsed, cleaned (not yet redacted)
    concerns: tuple[str, ...] = ()  # machine-readable reasons for alerts: "silent", "crashed", "gpu_idle:drafter"…
    problems: tuple[str, ...] = ()  # probe parts that failed
    observed_at: float | None = None  # remote clock of the probe
    failure_kind: str | None = None  # set when the target could not be reached

    @property
    def reached(self) -> bool:
        return self.phase is not Phase.UNREACHABLE
