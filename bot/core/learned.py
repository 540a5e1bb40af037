"""Pure: what a run's own log taught runbot at its earlier looks — the number that advanced between two looks is
its loop's counter, the newest line that was news and since when — kept per run, dropped when the log restarts."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

# Templates remembered from one look to the next: the window's most recent ones. A loop's line recurs; what
# interleaves it (warnings, eval reports, saves) is rarely more than a dozen other shapes.
MAX_SIGHTINGS = 16
MAX_TEMPLATE = 300  # characters of a template kept (its numbers are out: a line's words, never its values)
MAX_NEWS = 200  # characters of the news line kept: enough to know it again


@dataclass(frozen=True)
class Sighting:
    """One template's newest line at one look: its numbers, and which of them could count a loop."""

    template: str
    values: tuple[float, ...]  # every number of the line, in order
    countable: tuple[int, ...]  # positions of whole, non-negative numbers that are not a loss, rate, time or clock
    measured: bool  # the line also reports a measurement (a fraction, a loss, a rate, a time): what a loop prints


@dataclass(frozen=True)
class CounterRule:
    """The loop's progress line and which of its numbers counts: learned, not guessed."""

    template: str
    field: int


@dataclass(frozen=True)
class Learned:
    """A run's format as its own log showed it, at the look that learned it."""

    inode: int | None  # the log it was learned on: a new file at the path is a new run
    size: int  # the log's size then: a smaller log later has been truncated or restarted
    counter: CounterRule | None = None
    sightings: tuple[Sighting, ...] = ()
    news: str = ""  # the newest line that does not merely repeat an earlier one (a heartbeat repeats)
    news_since: float | None = None  # the remote clock when that line was first seen to be the newest news

    @property
    def lasting(self) -> tuple:
        """What is worth keeping across a restart of the bot: the file, the counter, the news and its age — not
        the last look's numbers, which change at every look (a restart loses one look of learning, no more)."""
        return self.inode, self.counter, self.news, self.news_since

    def holds_for(self, inode: int | None, size: int | None) -> bool:
        """Whether this was learned on the log as it is now (same file, not shorter)."""
        if size is None:
            return False
        same_file = self.inode is None or inode is None or self.inode == inode
        return same_file and size >= self.size


def news_line(lines: Sequence[str], clean, *, within: int = 200) -> str:
    """The newest of the last `within` lines that is not a repeat of an earlier one once its clock is taken out:
    `[12:00:01] waiting for rank 3` printed every minute is a heartbeat, not news. When every line repeats (a
    retry loop's warnings), what they are — the same set of lines at the next look is no news either."""
    tail = [t for t in (clean(x) for x in lines[-within:]) if t]
    seen = Counter(tail)
    for text in reversed(tail):
        if seen[text] == 1:
            return text[:MAX_NEWS]
    if not tail:
        return ""
    return "repeats " + hashlib.sha256("\n".join(sorted(seen)).encode()).hexdigest()[:16]


def _advanced(before: Sighting, now: Sighting) -> list[tuple[float, int]]:
    """(how far, where) for each countable number of a template that grew from one look to the next."""
    if len(before.values) != len(now.values):
        return []
    return [(now.values[i] - before.values[i], i) for i in now.countable
            if i in before.countable and now.values[i] > before.values[i]]


def learn_counter(before: Learned | None, sightings: Sequence[Sighting],
                  loop: CounterRule | None) -> CounterRule | None:
    """The loop's counter by what moved between the two looks. The window's own reading stands when its counter
    is among what moved; otherwise the template whose number moved (most recent first), the number that moved
    furthest — an iteration count outruns the epoch beside it."""
    if before is None:
        return None
    earlier = {s.template: s for s in before.sightings}
    moved = {s.template: _advanced(earlier[s.template], s) for s in sightings if s.template in earlier}
    if loop is not None:
        if any(i == loop.field for _, i in moved.get(loop.template, ())):
            return loop
        if moved.get(loop.template):
            return CounterRule(loop.template, max(moved[loop.template])[1])
    for s in sightings:  # most recent first
        if s.measured and moved.get(s.template):
            return CounterRule(s.template, max(moved[s.template])[1])
    return before.counter


def learn(before: Learned | None, *, inode: int | None, size: int | None, now: float | None,
          sightings: Sequence[Sighting], counter: CounterRule | None, news: str) -> Learned | None:
    """What this look adds to what earlier looks learned (`before`, already checked to hold for this log);
    `counter`: the one this look read by (learn_counter's, before the window was read with it)."""
    if size is None:
        return None
    still = before is not None and news and news == before.news
    since = before.news_since if still and before is not None else now
    return Learned(inode=inode, size=size, counter=counter, sightings=tuple(sightings[:MAX_SIGHTINGS]),
                   news=news, news_since=since)


def stood_for(learned: Learned | None, news: str, now: float | None) -> float | None:
    """How long the log's newest news has stood, by earlier looks: None when unknown or it is new."""
    if learned is None or not news or news != learned.news or learned.news_since is None or now is None:
        return None
    return max(0.0, now - learned.news_since)


# --- kept in the state file -------------------------------------------------------------------------

def to_record(learned: Learned) -> dict:
    """A plain mapping for JSON (a few KiB at most: bounded templates, MAX_SIGHTINGS of them); read back, typed,
    by bot.core.state_rows.learned."""
    return {"inode": learned.inode, "size": learned.size,
            "counter": [learned.counter.template, learned.counter.field] if learned.counter else None,
            "sightings": [[s.template, list(s.values), list(s.countable), s.measured] for s in learned.sightings],
            "news": learned.news, "news_since": learned.news_since}
