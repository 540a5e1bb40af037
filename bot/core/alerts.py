"""Pure: the incident state machine — (run state, what a sweep saw, now, policy) -> (new state, actions)."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, replace

from bot.core.verdict import SEVERITY, Concern, Phase, Verdict, Worry

# How bad each kind of concern is (verdict.SEVERITY, as Concern.severity): the worst confirmed concern names the incident.
# Consecutive sweeps a concern must be seen before it counts: one unanswered probe is a blip,
# one idle GPU reading between two busy ones is a data-loader pause. "held" never counts: the
# watchdog gives it to a run whose whole host is down, whose news the host's own incident tells.
CONFIRM_SWEEPS = {Worry.UNREACHABLE: 3, Worry.GPU_IDLE: 2, Worry.HELD: 1 << 30}
# A streak longer than the longest confirmation says nothing more: capping it keeps a steady
# problem's state the same from sweep to sweep, so the state file is not rewritten every sweep.
STREAK_CAP = max(n for w, n in CONFIRM_SWEEPS.items() if w is not Worry.HELD)
CRASH_SEVERITY = SEVERITY[Worry.CRASHED]  # what still gets through while a run flaps, and goes first


class Status(str, enum.Enum):
    QUIET = "quiet"  # no incident
    OPEN = "open"  # an incident: a problem is confirmed
    RECOVERING = "recovering"  # looked healthy once; recovery is told after one more healthy sweep
    RESOLVED = "resolved"  # told recovered; a new problem within `reopen_within` reopens the thread
    FINISHED = "finished"  # the run ended cleanly (told once)


@dataclass(frozen=True)
class Policy:
    remind_every: float = 3600.0
    reopen_within: float = 1800.0
    recovery_sweeps: int = 2  # healthy sweeps in a row before "recovered" is told (no flapping)
    # Flapping, as Nagios and Icinga count it: changes between problem and healthy over a window.
    # This many in `flap_window` fold into one "flapping" message; at most flap_changes // 3 there
    # again, and it has settled.
    flap_window: float = 600.0
    flap_changes: int = 6

    @property
    def flap_settled(self) -> int:
        return self.flap_changes // 3


@dataclass(frozen=True)
class Seen:
    """What one sweep saw of a run, reduced to what the state machine needs."""

    concerns: tuple[Concern, ...] = ()
    finished: bool = False  # ended cleanly, nothing to worry about
    headline: str = ""

    @classmethod
    def of(cls, verdict: Verdict) -> Seen:
        return cls(verdict.concerns, verdict.phase is Phase.FINISHED and not verdict.concerns, verdict.headline)


@dataclass(frozen=True)
class RunState:
    """Everything the watchdog remembers about one run between sweeps (times: the bot's clock)."""

    status: Status = Status.QUIET
    concern: Concern | None = None  # the incident's worst confirmed concern: Concern(Worry.THREAD_DIED, "drafter-1")
    seq: int = 0  # incident number: each new parent message is a new incident
    announced: bool = False  # the parent was posted (or is queued): replies have a thread to go to
    opened_at: float | None = None
    changed_at: float | None = None  # last change of status or concern
    notified_at: float | None = None  # last message that could ping someone (reminders count from it)
    closed_at: float | None = None  # recovered or finished
    healthy: int = 0  # healthy sweeps in a row while recovering
    headline: str = ""  # the latest verdict line, for the parent message
    muted_until: float | None = None
    muted_by: str | None = None
    streaks: tuple[tuple[Concern, int], ...] = ()  # consecutive sweeps each current concern was seen
    bad: bool | None = None  # what the last decisive sweep saw: a confirmed problem (True) or none
    flips: tuple[float, ...] = ()  # when `bad` changed, within the flap window
    flapping: bool = False  # the changes are folded into one incident until they settle

    @property
    def live(self) -> bool:
        """Is there a thread that later news belongs in?"""
        return self.announced and self.status in (Status.OPEN, Status.RECOVERING, Status.RESOLVED)

    def muted(self, now: float) -> bool:
        return self.muted_until is not None and now < self.muted_until


@dataclass(frozen=True)
class Post:
    """A new parent message: an incident, or the calm note that a run finished."""

    note: str  # "opened" | "finished" | "flapping"


@dataclass(frozen=True)
class Reply:
    """A message in the incident's thread."""

    note: str  # "still" | "changed" | "recovered" | "reopened" | "finished" | "flapping" | "settled"
    concern: Concern | None = None


@dataclass(frozen=True)
class Update:
    """Edit the parent so it shows the current state (silent: edits ping nobody)."""


Action = Post | Reply | Update


def worst(concerns: Iterable[Concern]) -> Concern | None:
    # Ties go to the first named, so the diagnosis's own order decides between equals.
    return max(concerns, key=lambda c: c.severity, default=None)


def decide(prev: RunState | None, seen: Seen, now: float, policy: Policy = Policy()) -> tuple[RunState, list[Action]]:
    """One sweep's step for one run. `prev` None: the watchdog has never seen this run."""
    state = prev or RunState()
    old = dict(state.streaks)
    streaks = tuple((c, min(old.get(c, 0) + 1, STREAK_CAP)) for c in dict.fromkeys(seen.concerns))
    confirmed = [c for c, n in streaks if n >= CONFIRM_SWEEPS.get(c.kind, 1)]
    problem = worst(confirmed)
    # An unconfirmed concern (a first unanswered probe) says nothing about the run: hold still.
    unsure = bool(seen.concerns) and problem is None
    state = replace(state, streaks=streaks, headline=seen.headline)
    if state.muted_until is not None and now >= state.muted_until:  # mutes end by themselves
        state = replace(state, muted_until=None, muted_by=None)
        expired = [Update()] if state.live else []
    else:
        expired = []
    new, actions = _step(state, prev is None, problem, unsure, seen.finished, now, policy)
    new, actions = _flaps(new, actions, None if unsure else problem is not None, problem, seen.finished, now, policy)
    if new.muted(now):  # still probed and tracked; only edits, which ping nobody, go out
        if any(isinstance(a, Post) for a in actions):  # a parent held back is not announced: it goes out unmuted
            new = replace(new, announced=False)
        actions = [a for a in actions if isinstance(a, Update) and new.announced]
        new = replace(new, notified_at=state.notified_at)
    elif expired and not any(isinstance(a, Update) for a in actions):
        actions = [*actions, *expired]
    return new, actions


def _step(s: RunState, first: bool, problem: Concern | None, unsure: bool, finished: bool, now: float,
          policy: Policy) -> tuple[RunState, list[Action]]:
    muted = s.muted(now)
    if s.status is Status.RESOLVED and (s.closed_at is None or now - s.closed_at > policy.reopen_within):
        s = replace(s, status=Status.QUIET)  # the old thread is history now

    if finished:
        if s.status is Status.FINISHED:
            return s, []
        done = replace(s, status=Status.FINISHED, concern=None, changed_at=now, closed_at=now, healthy=0)
        if s.live:
            return replace(done, notified_at=now), [Reply("finished"), Update()]
        # A run already over when the watchdog first met it is no news; nor is an incident never told.
        if first or s.status is not Status.QUIET:
            return replace(done, announced=False), []
        return replace(done, seq=s.seq + 1, announced=not muted, opened_at=now, notified_at=now), [Post("finished")]

    if problem is not None:
        if s.status in (Status.QUIET, Status.FINISHED):
            opened = replace(s, status=Status.OPEN, concern=problem, seq=s.seq + 1, announced=not muted,
                             opened_at=now, changed_at=now, notified_at=now, closed_at=None, healthy=0)
            return opened, [Post("opened")]
        if s.status is Status.RESOLVED:
            again = replace(s, status=Status.OPEN, concern=problem, changed_at=now, notified_at=now,
                            closed_at=None, healthy=0)
            # The same thread either way; "again" only when it is the same trouble as before.
            return again, [Reply("reopened" if problem == s.concern else "changed", problem), Update()]
        # OPEN or RECOVERING
        s = replace(s, status=Status.OPEN, healthy=0)
        if not s.announced:  # opened while muted: tell it now that nobody has silenced it
            if muted:
                return replace(s, concern=problem), []
            return replace(s, concern=problem, announced=True, notified_at=now), [Post("opened")]
        if problem != s.concern:
            return replace(s, concern=problem, changed_at=now, notified_at=now), [Reply("changed", problem), Update()]
        if not muted and s.notified_at is not None and now - s.notified_at >= policy.remind_every:
            return replace(s, notified_at=now), [Reply("still", problem), Update()]
        return s, []

    if unsure:
        return s, []

    # Healthy.
    if s.status is Status.FINISHED:
        return replace(s, status=Status.QUIET), []  # a new run is writing the log
    if s.status in (Status.OPEN, Status.RECOVERING):
        healthy = s.healthy + 1 if s.status is Status.RECOVERING else 1
        if healthy < policy.recovery_sweeps:
            return replace(s, status=Status.RECOVERING, healthy=healthy), []
        if not s.announced:  # nobody was told of it: nobody needs telling it is over
            return replace(s, status=Status.QUIET, concern=None, healthy=0, changed_at=now), []
        closed = replace(s, status=Status.RESOLVED, changed_at=now, closed_at=now, notified_at=now, healthy=0)
        return closed, [Reply("recovered", s.concern), Update()]
    return s, []


def _flaps(s: RunState, actions: list[Action], bad: bool | None, problem: Concern | None, finished: bool, now: float,
           policy: Policy) -> tuple[RunState, list[Action]]:
    """Fold a run that keeps changing between problem and healthy into one incident.

    Every change is counted over `flap_window`; at `flap_changes` the run is flapping: one message
    says so (in the thread, or as a new parent) and the machine underneath goes on silently, except
    for a crash. Once the changes in the window fall to `flap_settled`, one message says where the
    run settled. 100 runs flapping every 22 s made 321 posts and 306 edits per run per hour before."""
    if finished and s.flapping:
        return replace(s, flapping=False, flips=()), actions  # an end is news: the finish is told
    flips = tuple(t for t in s.flips if now - t < policy.flap_window)
    if bad is not None and s.bad is not None and bad != s.bad:
        flips += (now,)
    s = replace(s, flips=flips, bad=s.bad if bad is None else bad)
    if not s.flapping:
        if len(flips) < policy.flap_changes:
            return s, actions
        worst = problem or s.concern
        # A thread to reply in exists only once its parent has gone out: a parent _step is posting in this
        # very sweep (an incident opened while muted, told now) is not one yet, so the flapping one replaces it.
        if s.live and not any(isinstance(a, Post) for a in actions):
            return replace(s, flapping=True, concern=worst, notified_at=now, changed_at=now), [Reply("flapping", worst), Update()]
        opened = replace(s, flapping=True, status=Status.OPEN, concern=worst, seq=s.seq + 1, announced=True,
                         opened_at=now, changed_at=now, notified_at=now, closed_at=None, healthy=0)
        return opened, [Post("flapping")]
    if bad is not None and len(flips) <= policy.flap_settled:
        settled = replace(s, flapping=False, flips=(), changed_at=now, notified_at=now)
        if problem is None and settled.status in (Status.OPEN, Status.RECOVERING):
            settled = replace(settled, status=Status.RESOLVED, closed_at=now, healthy=0)
        elif problem is not None:
            settled = replace(settled, status=Status.OPEN, concern=problem, closed_at=None, healthy=0)
        if any(isinstance(a, Post) for a in actions):  # its parent goes out this sweep: that is the news
            return settled, actions
        return settled, ([Reply("settled", problem), Update()] if settled.announced else [])
    # Still flapping: only a crash is news enough to tell (and it does not count as settling).
    crash = [a for a in actions if isinstance(a, Reply) and a.concern is not None and a.concern.severity >= CRASH_SEVERITY]
    if any(isinstance(a, Post) for a in actions):  # the machine opened a thread nobody will see
        s = replace(s, announced=False)
    return s, ([*crash, Update()] if crash else [])


def told_end(actions: Iterable[Action], state: RunState) -> bool:
    """Does this step tell that the run ended — finished, or a crash confirmed? (The moment for its summary:
    the machine tells each once, so the summary goes out once, in the same thread.)"""
    for a in actions:
        if isinstance(a, Update):
            continue
        if a.note == "finished":
            return True
        concern = (a.concern if isinstance(a, Reply) else None) or state.concern
        if a.note in ("opened", "changed", "reopened", "flapping") and concern is not None and concern.kind is Worry.CRASHED:
            return True
    return False


def mute(prev: RunState | None, until: float | None, now: float, by: str | None = None) -> tuple[RunState, list[Action]]:
    """Mute a run until `until` (None: unmute). The parent is edited to say so."""
    state = prev or RunState()
    if until is not None and until <= now:
        until = None
    new = replace(state, muted_until=until, muted_by=by if until is not None else None)
    return new, ([Update()] if new.live and new.muted_until != state.muted_until else [])
