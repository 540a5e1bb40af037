"""Pure: the Verdict a diagnosis produces — its phase, ordered level (nagiosplugin-style `worst`), typed
concerns for the alert machine, typed findings and facts for the renderers."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable

from bot.core.facts import Crash, Process, Step
from bot.core.gpus import GpuReport
from bot.core.learned import Learned


class Level(enum.IntEnum):
    """How much a human should care, ordered so that `worst()` is `max()`."""

    OK = 0  # steady training, a clean finish
    NOTE = 1  # normal but not steady: starting, loading, saving, evaluating
    WARN = 2  # degraded: a thread died, a GPU role idle, loss NaN
    CRIT = 3  # silent, crashed, stopped, unreachable, no log

    @property
    def word(self) -> str:
        """"ok", "note", "warn", "crit": a level's one spelling wherever it is written out."""
        return self.name.lower()


def worst(levels: Iterable[Level]) -> Level:
    return max(levels, default=Level.OK)


def worst_first(rows: Iterable[tuple[str, Verdict]]) -> list[tuple[str, Verdict]]:
    """(run name, verdict) pairs in the one order every list of runs uses: the worst level first
    (a notification then names it), then by name, so that a list reads the same each time."""
    return sorted(rows, key=lambda row: (-row[1].level, row[0].casefold(), row[0]))


class Phase(str, enum.Enum):
    UNREACHABLE = "unreachable"
    NO_LOG = "no log"
    STARTING = "starting"
    LOADING = "loading"
    PREPARING = "preparing"  # dataset map / tokenize / index building
    COMPILING = "compiling"
    SAVING = "saving"
    EVALUATING = "evaluating"
    BUSY = "in progress"  # some other progress bar, of a kind we cannot place
    TRAINING = "training"
    THREAD_DIED = "thread died"
    SILENT = "silent"
    CRASHED = "crashed"
    STOPPED = "stopped"
    FINISHED = "finished"


# Tail lengths users may ask for (CLI `tail -n`, Slack `/run tail RUN N`); a verdict keeps TAIL_MAX lines.
TAIL_DEFAULT, TAIL_MAX = 20, 200


def tail_lines(typed: str) -> int:
    """A tail length as a user typed it ("50"), checked the one way the CLI and Slack share; ValueError says why not."""
    if not (typed.isascii() and typed.isdigit() and len(typed) <= 4 and 1 <= int(typed) <= TAIL_MAX):
        raise ValueError(f"N is a number of lines from 1 to {TAIL_MAX}, not {typed[:20]!r}")
    return int(typed)

# Phases that may be silent for `loading_grace` rather than `silence_after`.
GRACE_PHASES = frozenset({Phase.STARTING, Phase.LOADING, Phase.PREPARING, Phase.COMPILING, Phase.SAVING,
                          Phase.EVALUATING, Phase.BUSY})


class Worry(str, enum.Enum):
    """What the alert machine may open an incident for, most severe last."""

    GPU_IDLE = "gpu_idle"  # a GPU role idle beside one that works (subject: the role)
    LOG_REPLACED = "log_replaced"  # the writer writes another file (subject: that file)
    NAN_LOSS = "nan_loss"
    SLOW = "slow"  # the rate well below the run's own recent baseline for a while
    LOSS_SPIKE = "loss_spike"
    THREAD_DIED = "thread_died"  # subject: the thread
    HUNG_ON_EXIT = "hung_on_exit"
    RESTARTING = "restarting"  # a launcher restarts the workers after a failure
    LOSS_SCALE = "loss_scale"  # fp16 overflow on every step: the loss scale at its floor, nothing learns
    SILENT = "silent"
    UNREACHABLE = "unreachable"
    UNREADABLE = "unreadable"
    NO_LOG = "no_log"
    STOPPED = "stopped"
    CRASHED = "crashed"
    HELD = "held"  # not a problem of the run's own: its host's outage is told as one incident


SEVERITY = {Worry.GPU_IDLE: 1, Worry.LOG_REPLACED: 1, Worry.SLOW: 1, Worry.LOSS_SPIKE: 2, Worry.NAN_LOSS: 2, Worry.THREAD_DIED: 2, Worry.HUNG_ON_EXIT: 2,
            Worry.RESTARTING: 2, Worry.LOSS_SCALE: 2,
            Worry.SILENT: 3, Worry.UNREACHABLE: 3, Worry.UNREADABLE: 4, Worry.NO_LOG: 4, Worry.STOPPED: 4,
            Worry.CRASHED: 5, Worry.HELD: 0}


@dataclass(frozen=True)
class Concern:
    """One reason to alert: what (kind) and about what (the thread, the role), never a "kind:arg" string."""

    kind: Worry
    subject: str | None = None

    @property
    def severity(self) -> int:
        return SEVERITY[self.kind]

    @property
    def key(self) -> str:
        """Its spelling in the state file (and nowhere else): "thread_died:drafter-1"."""
        return f"{self.kind.value}:{self.subject}" if self.subject is not None else self.kind.value

    @classmethod
    def from_key(cls, key: str) -> Concern:
        kind, sep, subject = key.partition(":")
        try:
            return cls(Worry(kind), subject if sep else None)
        except ValueError:  # a concern a newer runbot wrote: the closest this one knows
            return cls(Worry.SILENT, None)


class Finding(str, enum.Enum):
    """Something worth a line beside the headline."""

    NAN_LOSS = "nan_loss"
    THREAD_DIED = "thread_died"
    IDLE_ROLE = "idle_role"
    LOG_REPLACED = "log_replaced"
    STUCK_COLLECTIVE = "stuck_collective"
    HUNG_ON_EXIT = "hung_on_exit"
    NO_FILE_PROGRESS = "no_file_progress"  # Lightning's rich bar: nothing reaches a file while it trains
    SLOW = "slow"  # throughput well below the run's own baseline
    LOSS_SPIKE = "loss_spike"
    LOSS_SCALE = "loss_scale"  # fp16: every step overflows at the loss scale's floor, so no step is taken


class Said(str, enum.Enum):
    """A fact a headline already states, so the rows under it leave it out: each fact once on a phone."""

    PROGRESS = "progress"  # the step, its rate and loss
    COUNTER = "counter"  # only where the loop got to ("at step 1200", "last epoch 3")
    LOSS = "loss"
    ETA = "eta"
    GPUS = "gpus"  # the GPUs' one-line summary
    CRASH = "crash"  # what failed (the error row still shows when its longer form says more)
    THREAD_CRASH = "thread_crash"


@dataclass(frozen=True)
class Found:
    """A finding and what it is about."""

    what: Finding
    detail: str = ""  # the role, the thread, the file — short and in words
    step: int | None = None  # where it began (NaN since step 45)
    before: float | None = None  # the last good value (0.0031 at step 40)
    before_step: int | None = None
    unit: str = "step"  # what `step` and `before_step` count: "step", "iteration", "batch"
    value: float | None = None  # the value now (a slow rate, a spiking loss)
    lasted: float | None = None  # seconds it has been so


@dataclass(frozen=True)
class Trend:
    """What the run's memory says about now (bot.core.stages.trends)."""

    eta: float | None = None  # seconds to the total at the last half hour's pace
    vs_median: float | None = None  # the rate now against the last hour's median: -0.12 is 12 % slower
    rate_spark: str = ""  # the last hour's rate, one cell per 5 min of the clock (bot.core.stages.trends)
    loss_spark: str = ""
    unit: str | None = None


@dataclass(frozen=True)
class Verdict:
    """What a run is doing: one line, and the typed facts each renderer formats its own way."""

    run: str
    phase: Phase
    level: Level
    headline: str  # the one line: what a lock-screen notification shows
    step: Step | None = None  # the loop's latest progress
    recent: tuple[Step, ...] = ()  # the loop's last progress lines, oldest first (what the run's memory records)
    progress_age: float | None = None  # seconds since the counter last moved (line stamps, the last probe, mtime)
    progress_since: float | None = None  # remote clock when the counter reached its current value
    silent_for: float | None = None  # seconds since the log last grew (remote clock)
    log_size: int | None = None
    threshold: float | None = None  # the silence allowed in this phase
    writer: Process | None = None
    hidden_processes: int = 0  # the probe could not see these processes' files (not root)
    process: Process | None = None  # a likely training process, when there is no log
    crash: Crash | None = None
    thread_crash: Crash | None = None
    findings: tuple[Found, ...] = ()
    trend: Trend | None = None  # what the run's memory says: ETA, rate against its median, sparklines
    gpu: GpuReport | None = None
    tail: tuple[str, ...] = ()  # last lines of the log, bars collapsed, cleaned (not yet redacted)
    concerns: tuple[Concern, ...] = ()  # reasons for alerts, most important first
    problems: tuple[str, ...] = ()  # probe parts that failed
    said: frozenset[Said | Finding] = frozenset()  # what the headline states (findings it names included)
    observed_at: float | None = None  # remote clock of the probe
    failure_kind: str | None = None  # set when the target could not be reached
    learned: Learned | None = None  # the run's format as its log has shown it so far (the next look starts from it)

    @property
    def reached(self) -> bool:
        return self.phase is not Phase.UNREACHABLE
