"""Pure: a channel's storm — when many of its runs change at once, their news folds into one digest message that is edited."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bot.core.alerts import CRASH_SEVERITY, Action, Post, Reply, RunState, Status
from bot.core.budget import BURST, RESERVED

# A storm: this many runs of one channel with news (a post or a reply) within STORM_WINDOW_S — about one
# sweep at the default check_every — or more news waiting for the channel than Slack's burst sends at once
# (its crash reserve kept). Slack takes about one message a second per channel, so 100 runs changing
# together would wait minutes in line; one digest edited as they change says it all at once.
STORM_RUNS = 5
STORM_WINDOW_S = 60.0
STORM_WAITING = int(BURST - RESERVED)
EDIT_EVERY_S = 3.0  # the digest is edited at most this often: a third of the channel's pace, the rest for others
SUMMARY = "summary"  # the note of an end-of-run summary: never folded (it is the end's account, not a change)
DIGEST_PRIORITY = CRASH_SEVERITY - 1  # a digest carries many first alerts: first out after crashes


def digest_key(channel: str) -> str:
    """The digest's name in the ledger, as a host's is: a space, so it cannot clash with a run's name."""
    return f"digest {channel}"


def is_digest_key(name: str) -> bool:
    return name.startswith("digest ")


@dataclass(frozen=True)
class Row:
    """An unsent outbox row of one channel, as the fold sees it."""

    id: int
    run: str
    seq: int
    op: str  # "post" | "reply" | "update"
    note: str  # what it says: "opened", "recovered", "summary"… ("" for an edit)
    priority: int
    in_doubt: bool  # an attempt may have reached Slack: it may be there already, so it is never folded
    digest: int | None  # the digest its incident is told in (None: its own thread, or its post not out yet)

    @property
    def urgent(self) -> bool:
        """A crash: never folded, and it takes the channel's reserve (it never waits behind a storm)."""
        return self.priority >= CRASH_SEVERITY


@dataclass(frozen=True)
class Fold:
    """What a storm changes in a channel's outbox."""

    drop: tuple[int, ...] = ()  # rows whose news the digest now tells (never sent on their own)
    attach: tuple[tuple[str, int], ...] = ()  # incidents (run, seq) whose post is dropped: told in the open digest
    edit: tuple[int, ...] = ()  # digests (seq) whose runs changed: edit them


def storming(rows: Sequence[Row], news: Mapping[str, float], now: float) -> bool:
    """Is the channel in a storm? `news`: when each of its runs last had news (a post or a reply)."""
    recent = sum(1 for t in news.values() if now - t < STORM_WINDOW_S)
    waiting = sum(1 for r in rows if r.op != "update" and not r.urgent)
    return recent >= STORM_RUNS or waiting > STORM_WAITING


def fold(rows: Sequence[Row], news: Mapping[str, float], now: float) -> Fold:
    """Fold a channel's unsent rows (oldest first) into its digest.

    In a storm every post of a new incident goes into the digest instead (its replies and edits with it),
    and so does every reply of an incident already told there. Never folded: a crash, an end-of-run
    summary, and a row that may already be in Slack. An incident with a thread of its own keeps it:
    its news is told there as before, recovery included. Out of a storm, an incident told in the digest
    has its replies in the digest's thread; its edits always become an edit of the digest."""
    storm = storming(rows, news, now)
    drop: list[int] = []
    attach: dict[tuple[str, int], None] = {}  # in order, and looked up for the rows behind each post
    edit: set[int] = set()
    for r in rows:
        keep = r.urgent or r.note == SUMMARY or r.in_doubt
        if r.digest is not None:  # told in a digest already: the digest's own edit says it
            edit.add(r.digest)
            if r.op == "update" or (storm and not keep):
                drop.append(r.id)
        elif (r.run, r.seq) in attach:  # behind a post folded just now: it has no thread of its own
            if not keep:
                drop.append(r.id)
        elif storm and r.op == "post" and not keep:
            attach[(r.run, r.seq)] = None
            drop.append(r.id)
    return Fold(tuple(drop), tuple(attach), tuple(sorted(edit)))


def alone(actions: Sequence[Action], in_digest: bool) -> list[Action]:
    """A crash of a run told in a digest is no reply there: the run leaves the digest with a parent message of
    its own, posted at once (with the run's buttons, where the channel sees it), and its thread is its own
    from then on. Anything else a step says is said as the state machine said it."""
    crash = any(isinstance(a, Reply) and a.concern is not None and a.concern.severity >= CRASH_SEVERITY for a in actions)
    return [Post("opened")] if in_digest and crash else list(actions)


def calm(state: RunState | None) -> bool:
    """Has a run in a digest nothing more to tell there? (None: it went on to a newer incident.)"""
    return state is None or (not state.flapping and state.status not in (Status.OPEN, Status.RECOVERING))


def rank(state: RunState) -> tuple[int, int]:
    """Worst first: a crash, then flapping, open (by severity), recovering, then calm again."""
    severity = state.concern.severity if state.concern is not None else 0
    if calm(state):
        return (4, 0)
    if severity >= CRASH_SEVERITY and not state.flapping:
        return (0, -severity)
    if state.flapping:
        return (1, -severity)
    return (2 if state.status is Status.OPEN else 3, -severity)
