"""Pure: the watchdog's memory — run states, incidents and their threads, the outbox, watches — and the row changes that persist it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation

from bot.core.alerts import RunState, Status
from bot.core.verdict import Concern

OPS = ("post", "reply", "update")


@dataclass(frozen=True)
class Outgoing:
    """A message to queue: op "post" opens incident `seq` in `channel`; "reply"/"update" go to its thread."""

    op: str
    payload: dict
    channel: str | None = None  # posts only
    priority: int = 0  # the concern's severity: the most important messages go first when Slack is busy


@dataclass(frozen=True)
class Incident:
    """One parent message: where its thread lives (parent_ts None until the parent has gone out)."""

    run: str
    seq: int
    channel: str
    parent_ts: str | None
    opened_at: float
    concern: Concern | None = None  # what it is about (the worst told); None: the calm note of a finished run
    closed_at: float | None = None  # told recovered or finished


@dataclass(frozen=True)
class Message:
    """One outbox row: every message is written here before it is sent, and keeps its key for life."""

    id: int
    key: str  # sent as message metadata, so an attempt whose outcome is unknown can be looked for
    run: str
    seq: int
    op: str
    payload: dict
    created_at: float
    attempts: int = 0
    tried_at: float | None = None  # set before each attempt, cleared by its known outcome: set = in doubt
    last_error: str | None = None
    sent_at: float | None = None
    ts: str | None = None
    priority: int = 0


@dataclass(frozen=True)
class Pending:
    """An outbox row not yet known to be sent, with the thread it belongs to."""

    id: int
    key: str
    run: str
    seq: int
    op: str
    payload: dict
    channel: str
    parent_ts: str | None
    attempts: int
    tried_at: float | None  # not None: an earlier attempt's outcome is unknown (look before re-posting)
    priority: int = 0


@dataclass(frozen=True)
class Watch:
    run: str
    channel: str
    ts: str
    started_at: float
    user: str | None = None


# What changed, row by row, for the persistence layer to write (bot/store.py).
@dataclass(frozen=True)
class PutState:
    run: str
    state: RunState


@dataclass(frozen=True)
class PutIncident:
    incident: Incident


@dataclass(frozen=True)
class PutMessage:
    message: Message


@dataclass(frozen=True)
class DropMessages:
    ids: tuple[int, ...]


@dataclass(frozen=True)
class PutWatch:
    watch: Watch


@dataclass(frozen=True)
class DropWatch:
    run: str


Change = PutState | PutIncident | PutMessage | DropMessages | PutWatch | DropWatch


@dataclass
class Ledger:
    """Everything the watchdog remembers, answered from memory; every mutation also records the
    row changes that make it durable, which the state file takes with `take_changes()`."""

    states: dict[str, RunState] = field(default_factory=dict)
    incidents: dict[tuple[str, int], Incident] = field(default_factory=dict)
    messages: dict[int, Message] = field(default_factory=dict)  # by id, which is the send order
    watch_rows: dict[str, Watch] = field(default_factory=dict)
    _changes: list[Change] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self._next_id = max(self.messages, default=0) + 1

    def snapshot(self) -> Ledger:
        """A copy to write from another thread (rows are frozen; only the tables are copied)."""
        return Ledger(dict(self.states), dict(self.incidents), dict(self.messages), dict(self.watch_rows))

    @property
    def changed(self) -> bool:
        """Are there row changes not yet taken (decisions the file does not hold)?"""
        return bool(self._changes)

    def take_changes(self) -> list[Change]:
        changes, self._changes = self._changes, []
        return changes

    # --- run states ---------------------------------------------------------------------------

    def state(self, run: str) -> RunState | None:
        return self.states.get(run)

    def commit(self, run: str, state: RunState, messages: list[Outgoing] = (), now: float = 0.0) -> list[int]:
        """Save a run's new state and queue its messages, all or nothing. Returns the outbox ids."""
        for m in messages:  # checked first: nothing is changed by a commit that cannot be made whole
            if m.op not in OPS or (m.op == "post" and not m.channel):
                raise ValueError(f"cannot queue {m.op!r} (channel {m.channel!r})")
        self.states[run] = state
        self._changes.append(PutState(run, state))
        ids = [self._queue(run, state.seq, m, now, state.concern) for m in messages]
        self._follow(run, state)
        return ids

    def _follow(self, run: str, state: RunState) -> None:
        """Keep the incident's own record current: its worst concern while open, when it closed (for /run history)."""
        incident = self.incidents.get((run, state.seq))
        if incident is None:
            return
        closed = state.closed_at if state.status in (Status.RESOLVED, Status.FINISHED) else None
        concern = incident.concern
        if state.status is Status.OPEN and state.concern is not None and (concern is None or state.concern.severity > concern.severity):
            concern = state.concern
        if (concern, closed) != (incident.concern, incident.closed_at):
            self._put_incident(replace(incident, concern=concern, closed_at=closed))

    def _queue(self, run: str, seq: int, m: Outgoing, now: float, concern: Concern | None = None) -> int:
        if m.op == "post":
            self._put_incident(Incident(run, seq, m.channel, None, now, concern))  # type: ignore[arg-type]
        elif m.op == "update":  # an edit shows the whole current state: an older unsent edit is moot
            moot = tuple(i for i, x in self.messages.items()
                         if x.run == run and x.seq == seq and x.op == "update" and x.sent_at is None)
            self._drop(moot)
        row_id, self._next_id = self._next_id, self._next_id + 1
        self._put(Message(row_id, f"{run}#{seq}:{row_id}", run, seq, m.op, m.payload, now, priority=m.priority))
        return row_id

    # --- the outbox ---------------------------------------------------------------------------

    def pending(self, run: str | None = None) -> list[Pending]:
        """Unsent messages, oldest first (per run, the order they must go out in)."""
        out = []
        for m in self.messages.values():
            if m.sent_at is not None or (run is not None and m.run != run):
                continue
            incident = self.incidents.get((m.run, m.seq))
            if incident is None:  # a message whose incident was never queued: nothing to send it to
                continue
            out.append(Pending(m.id, m.key, m.run, m.seq, m.op, m.payload, incident.channel, incident.parent_ts,
                               m.attempts, m.tried_at, m.priority))
        return out

    def trying(self, row_id: int, now: float) -> None:
        """Recorded before the call: if the bot dies now, the row is known to be in doubt."""
        if (m := self.messages.get(row_id)) is not None:
            self._put(replace(m, attempts=m.attempts + 1, tried_at=now))

    def sent(self, row: Pending, ts: str | None, now: float, channel: str | None = None) -> None:
        """Recorded after the call. A post's ts becomes its incident's thread (and its channel id)."""
        if (m := self.messages.get(row.id)) is not None:
            self._put(replace(m, sent_at=now, ts=ts, tried_at=None, last_error=None))
        if row.op == "post" and (incident := self.incidents.get((row.run, row.seq))) is not None:
            self._put_incident(replace(incident, parent_ts=ts, channel=channel or incident.channel))

    def failed(self, row_id: int, error: str, *, in_doubt: bool) -> None:
        """The call failed. `in_doubt`: it may have reached Slack anyway (a timeout, a dropped connection)."""
        if (m := self.messages.get(row_id)) is not None:
            self._put(replace(m, last_error=error[:500], tried_at=m.tried_at if in_doubt else None))

    def thread(self, run: str, seq: int) -> tuple[str, str | None] | None:
        """(channel, parent ts) of a run's incident, or None."""
        incident = self.incidents.get((run, seq))
        return (incident.channel, incident.parent_ts) if incident is not None else None

    def last_ts(self, run: str, seq: int) -> str | None:
        """Slack's ts of the newest message known to be in an incident's thread (the parent's when none)."""
        incident = self.incidents.get((run, seq))
        stamps = [m.ts for m in self.messages.values()
                  if m.run == run and m.seq == seq and m.op in ("post", "reply") and m.sent_at is not None]
        stamps.append(incident.parent_ts if incident is not None else None)
        # Decimal, never float: a 16-digit ts loses its last microsecond in a double, and "after the
        # parent" could then skip the very reply being looked for.
        valid = [s for s in stamps if _decimal(s) is not None]
        return max(valid, key=_decimal) if valid else None

    def prune(self, before: float) -> int:
        """Forget sent messages older than `before` (the outbox would otherwise grow forever)."""
        old = tuple(i for i, m in self.messages.items() if m.sent_at is not None and m.sent_at < before)
        self._drop(old)
        return len(old)

    # --- watches ------------------------------------------------------------------------------

    def watches(self) -> list[Watch]:
        return sorted(self.watch_rows.values(), key=lambda w: w.started_at)

    def start_watch(self, watch: Watch, stale_before: float) -> Watch | None:
        """Record a watch unless a live one exists for the run; returns the one in the way, else None."""
        old = self.watch_rows.get(watch.run)
        if old is not None and old.started_at >= stale_before:
            return old
        self.watch_rows[watch.run] = watch
        self._changes.append(PutWatch(watch))
        return None

    def end_watch(self, run: str) -> None:
        if self.watch_rows.pop(run, None) is not None:
            self._changes.append(DropWatch(run))

    # --- bookkeeping --------------------------------------------------------------------------

    def _put(self, m: Message) -> None:
        self.messages[m.id] = m
        self._changes.append(PutMessage(m))

    def _put_incident(self, incident: Incident) -> None:
        self.incidents[(incident.run, incident.seq)] = incident
        self._changes.append(PutIncident(incident))

    def _drop(self, ids: tuple[int, ...]) -> None:
        if ids:
            for i in ids:
                del self.messages[i]
            self._changes.append(DropMessages(ids))


def _decimal(ts: str | None) -> Decimal | None:
    try:
        value = Decimal(ts) if isinstance(ts, str) else None
    except InvalidOperation:
        return None
    return value if value is not None and value.is_finite() else None
