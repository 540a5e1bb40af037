"""Pure: a log that several launches were appended to, and where the newest began when it has not stepped yet."""

from __future__ import annotations

from collections.abc import Sequence

from bot.core.facts import Step
from bot.core.grammar import message, template

RELAUNCH_GAP = 600.0  # seconds of the lines' own stamps with nothing written: no loop's pause between two lines
_WORDS = 12  # a start-up line worth matching has this many characters of words, not a bare `)` or a rule


def newest_launch(lines: Sequence[str], stamps: Sequence[float | None], steps: Sequence[Step]) -> int | None:
    """Where the newest launch begins, if the log's last progress belongs to an earlier one: after the last step
    the stamps jump by RELAUNCH_GAP or more, and what follows prints again a line of the start-up before the first
    step (`Build dataset: train images = 34`, then `Creating model:swin/simmim_pretrain`, an hour after `EPOCH 4`).
    The gap alone is a long evaluation or a pause; the start-up alone is a report block that repeats itself."""
    if not steps or steps[-1].index < 0:
        return None
    last = steps[-1].index
    previous = next((stamps[i] for i in range(last, max(last - 5, -1), -1) if stamps[i] is not None), None)
    if previous is None:
        return None
    start = None
    for i in range(last + 1, len(lines)):
        when = stamps[i]
        if when is None:
            continue
        if when - previous >= RELAUNCH_GAP:
            start = i
            break
        previous = when
    if start is None:
        return None
    first = next((s.index for s in steps if s.index >= 0), last)
    startup = {_shape(x) for x in lines[:first]} - {None}  # read only once the stamps jumped: rare
    return start if any(_shape(x) in startup for x in lines[start:]) else None


def _shape(line: str) -> str | None:
    text = template(message(line))
    return text if sum(c.isalpha() for c in text) >= _WORDS else None
