"""Pure: the watchdog's memory — run states, incidents and their threads, the outbox, watches — and the row changes that persist it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation

from bot.core.alerts import RunState, Status
from bot.core.digest import Fold, digest_key
from bot.core.verdict import Concern

OPS = ("post", "reply", "update")


@dataclass(frozen=True)
class Outgoing:
    """A message to queue: op "post" opens incident `seq` in `channel`; "reply"/"update" go to its thread."""

    op: str
    payload: dict
    channel: str | None = None  # posts only
    priority: int = 0  # the concern's severity: the most important messages go first when Slack is busy
    note: str = ""  # what it says ("opened", "recovered", "summary"…; "" for an edit): a storm folds by it


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
    # Told in its channel's digest number `digest` (a storm folded its post): its thread is the digest's,
    # and `channel` names that digest. None: its own parent message.
    digest: int | None = None


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
    note: str = ""


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
    note: str = ""
    digest: int | None = None  # the digest its incident is told in (its thread is the digest's)


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
        # Digests whose runs changed since the watchdog last edited them: (channel, seq). Memory only:
        # the edit is queued in the same step that made it due, so it is on disk with the change.
        self._stale: set[tuple[str, int]] = set()

    def become(self, other: Ledger) -> None:
        """Hold what `other` holds, in place (the watchdog keeps references to these tables): a standby taking
        over reads what the leader wrote; its own unwritten changes are dropped with its stale view."""
        for mine, theirs in ((self.states, other.states), (self.incidents, other.incidents),
                             (self.messages, other.messages), (self.watch_rows, other.watch_rows)):
            mine.clear()
            mine.update(theirs)
        self._changes.clear()
        self._next_id = max(self.messages, default=0) + 1
        self._stale = set()

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
        ids = [row for m in messages if (row := self._queue(run, state.seq, m, now, state.concern)) is not None]
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

    def _queue(self, run: str, seq: int, m: Outgoing, now: float, concern: Concern | None = None) -> int | None:
        if m.op == "post":
            told = self.incidents.get((run, seq))
            if told is not None and told.digest is not None:  # leaves its digest (a crash): a parent of its own now
                self._stale.add((told.channel, told.digest))
                # What it still had to say in the digest's thread would wait for the new parent, out of order;
                # the parent tells the state as it is now.
                self._drop(tuple(i for i, x in self.messages.items() if x.run == run and x.seq == seq and x.sent_at is None))
                self._put_incident(replace(told, channel=m.channel, parent_ts=None, digest=None))  # type: ignore[arg-type]
            else:
                self._put_incident(Incident(run, seq, m.channel, None, now, concern))  # type: ignore[arg-type]
        elif m.op == "update":
            incident = self.incidents.get((run, seq))
            if incident is not None and incident.digest is not None:  # its parent is the digest: edit that instead
                self._stale.add((incident.channel, incident.digest))
                return None
            # An edit shows the whole current state: an older unsent edit is moot.
            moot = tuple(i for i, x in self.messages.items()
                         if x.run == run and x.seq == seq and x.op == "update" and x.sent_at is None)
            self._drop(moot)
        row_id, self._next_id = self._next_id, self._next_id + 1
        self._put(Message(row_id, f"{run}#{seq}:{row_id}", run, seq, m.op, m.payload, now, priority=m.priority,
                          note=m.note))
        return row_id

    # --- the outbox ---------------------------------------------------------------------------

    def pending(self, run: str | None = None) -> list[Pending]:
        """Unsent messages, oldest first (per run, the order they must go out in)."""
        return [p for m in self.messages.values()
                if m.sent_at is None and (run is None or m.run == run) and (p := self._pending(m)) is not None]

    def pending_row(self, row_id: int) -> Pending | None:
        """One row as it stands now (None: sent, or folded into a digest meanwhile)."""
        m = self.messages.get(row_id)
        return self._pending(m) if m is not None and m.sent_at is None else None

    def _pending(self, m: Message) -> Pending | None:
        incident = self.incidents.get((m.run, m.seq))
        if incident is None:  # a message whose incident was never queued: nothing to send it to
            return None
        channel, parent_ts = self._where(incident)
        return Pending(m.id, m.key, m.run, m.seq, m.op, m.payload, channel, parent_ts, m.attempts, m.tried_at,
                       m.priority, m.note, incident.digest)

    def _where(self, incident: Incident) -> tuple[str, str | None]:
        """(channel, parent ts) of an incident's thread: its own, or its digest's."""
        if incident.digest is None:
            return incident.channel, incident.parent_ts
        digest = self.incidents.get((digest_key(incident.channel), incident.digest))
        return (digest.channel, digest.parent_ts) if digest is not None else (incident.channel, None)

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
        return self._where(incident) if incident is not None else None

    def last_ts(self, run: str, seq: int) -> str | None:
        """Slack's ts of the newest message known to be in an incident's thread (the parent's when none)."""
        incident = self.incidents.get((run, seq))
        stamps = [m.ts for m in self.messages.values()
                  if m.run == run and m.seq == seq and m.op in ("post", "reply") and m.sent_at is not None]
        stamps.append(self._where(incident)[1] if incident is not None else None)
        # Decimal, never float: a 16-digit ts loses its last microsecond in a double, and "after the
        # parent" could then skip the very reply being looked for.
        valid = [s for s in stamps if _decimal(s) is not None]
        return max(valid, key=_decimal) if valid else None

    def prune(self, before: float) -> int:
        """Forget sent messages older than `before` (the outbox would otherwise grow forever)."""
        old = tuple(i for i, m in self.messages.items() if m.sent_at is not None and m.sent_at < before)
        self._drop(old)
        return len(old)

    # --- channel digests -----------------------------------------------------------------------

    def open_digest(self, channel: str) -> Incident | None:
        """The channel's digest still telling a storm (the newest not closed), if any."""
        key = digest_key(channel)
        return max((i for (run, _), i in self.incidents.items() if run == key and i.closed_at is None),
                   key=lambda i: i.seq, default=None)

    def fold(self, channel: str, plan: Fold, now: float) -> None:
        """Apply a storm's fold: drop the rows the digest now tells, and tell the attached incidents in the
        channel's open digest (a new one if none is open). The digests to edit become stale."""
        self._drop(tuple(i for i in plan.drop if i in self.messages and self.messages[i].sent_at is None))
        self._stale.update((channel, seq) for seq in plan.edit)
        attach = [i for key in plan.attach if (i := self.incidents.get(key)) is not None and i.parent_ts is None]
        if not attach:
            return
        digest = self.open_digest(channel)
        if digest is None:
            seq = 1 + max((s for (run, s) in self.incidents if run == digest_key(channel)), default=0)
            digest = Incident(digest_key(channel), seq, channel, None, now)
            self._put_incident(digest)
        for incident in attach:
            self._put_incident(replace(incident, channel=channel, digest=digest.seq))
        self._stale.add((channel, digest.seq))

    def take_stale(self) -> list[tuple[str, int]]:
        """The digests (channel, seq) to edit now, each once."""
        stale, self._stale = sorted(self._stale), set()
        return stale

    def members(self, channel: str, seq: int) -> list[tuple[str, int]]:
        """The runs told in a digest, each with its newest incident there, by name."""
        newest: dict[str, int] = {}
        for (run, s), i in self.incidents.items():
            if i.digest == seq and i.channel == channel:
                newest[run] = max(s, newest.get(run, s))
        return sorted(newest.items())

    def tell_digest(self, channel: str, seq: int, payload: dict, now: float, *, calm: bool,
                    priority: int = 0) -> int | None:
        """Queue the digest as it reads now: its post the first time (a post not yet tried just takes the new
        text), an edit after. `calm`: every run in it is calm again, and it closes (a later change reopens it)."""
        key = digest_key(channel)
        digest = self.incidents.get((key, seq))
        if digest is None:
            return None
        closed = (digest.closed_at or now) if calm else None
        if closed != digest.closed_at:
            self._put_incident(replace(digest, closed_at=closed))
        post = next((m for m in self.messages.values() if m.run == key and m.seq == seq and m.op == "post"), None)
        if digest.parent_ts is None and post is None:
            row_id, self._next_id = self._next_id, self._next_id + 1
            self._put(Message(row_id, f"{key}#{seq}:{row_id}", key, seq, "post", payload, now, priority=priority,
                              note="digest"))
            return row_id
        if post is not None and post.sent_at is None and post.tried_at is None:
            self._put(replace(post, payload=payload, priority=max(priority, post.priority)))
            return post.id
        return self._queue(key, seq, Outgoing("update", payload, priority=priority), now)

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
