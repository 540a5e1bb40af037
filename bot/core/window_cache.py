"""Pure: what the last look saw of a run's log, and a probe that sent only what changed rebuilt into the very sections
a full probe would have sent (docs/probe.md, "Incremental looks")."""

from __future__ import annotations

import re
from dataclasses import dataclass

from bot.core.sections import LINE_CAP, Sections

# The last bytes of the log a look holds: enough for the tail, the last bar frames and a traceback, small enough
# that a sweep of hundreds of runs moves little data.
WINDOW_BYTES = 64 * 1024
# Bytes before the seen size sent again with a grown log's new bytes: the bot checks them against its copy, so a
# file rewritten in place (same inode, larger) is read in full again, never glued onto stale bytes.
OVERLAP_BYTES = 256
STEP_LINES = 32  # step lines the probe's search keeps (prose that mentions "step" must not push real ones out)
STEPS_BYTES = STEP_LINES * (LINE_CAP + 1) + 64  # the most a steps section holds: a seen one bigger is not kept
UNCHANGED = "unchanged"  # the section that says: same inode, size and mtime as seen, nothing read
FROM = "window.from"  # the byte offset of the log where a whole window starts
SINCE = "window.since"  # instead of FROM, for a grown log: the window holds only [SINCE, size), the seen end's overlap first
_STAT = re.compile(rb"^size=(\d{1,19}) mtime=(\d{1,19}) inode=(\d{1,19})$", re.M)


@dataclass(frozen=True)
class Stat:
    """The log as the probe's `stat` saw it."""

    inode: int
    size: int
    mtime: int


@dataclass(frozen=True)
class Seen:
    """One run's last full-equivalent look: its log's stat, the window's bytes (the log's [size - len, size)) and
    the step search's answer, which depends on the file's bytes alone. At most WINDOW_BYTES + STEPS_BYTES."""

    stat: Stat
    window: bytes
    steps: bytes


def stat_of(sections: Sections) -> Stat | None:
    """The log's stat line of a probe's meta section (None: missing, unreadable or unstated)."""
    meta = sections.get("meta") or b""
    if b"\nreadable=0" in b"\n" + meta or not (m := _STAT.search(meta)):
        return None
    return Stat(inode=int(m[3]), size=int(m[1]), mtime=int(m[2]))


def _clean(sections: Sections, part: str) -> bool:
    return sections.rc(part) == 0 and f"{part}.err" not in sections.parts


def remember(sections: Sections, window_bytes: int = WINDOW_BYTES) -> Seen | None:
    """What a full-equivalent look leaves for the next one; None when it cannot stand for the file (an older
    probe without offsets, a part that failed, a window that does not end where stat said the file did)."""
    stat, start = stat_of(sections), sections.get(FROM)
    window, steps = sections.get("window"), sections.get("steps")
    if stat is None or start is None or window is None or steps is None or not start.isdigit():
        return None
    if not (_clean(sections, "window") and _clean(sections, "steps")):
        return None
    if int(start) + len(window) != stat.size or len(window) > window_bytes or len(steps) > STEPS_BYTES:
        return None  # the file changed between stat and read: the next look reads it whole
    return Seen(stat, window, steps)


def rebuild(seen: Seen | None, sections: Sections, window_bytes: int = WINDOW_BYTES) -> Sections | None:
    """The sections a full probe would have sent, from what was seen and what this probe sent: the same for a full
    (or an older) probe; the seen window and step lines for an unchanged log; the seen window with the new bytes
    appended, cut to `window_bytes`, for a grown one. None: the bytes before the seen size are no longer the ones
    seen (rewritten in place), or the answer does not fit what was seen: probe this run again in full."""
    parts = sections.parts
    if UNCHANGED in parts:
        if seen is None or stat_of(sections) != seen.stat:
            return None
        rest = {k: v for k, v in parts.items() if k != UNCHANGED}
        return Sections({**rest, FROM: str(seen.stat.size - len(seen.window)).encode(), "window": seen.window,
                         "window.rc": b"0", "steps": seen.steps, "steps.rc": b"0"})
    start, window = parts.get(SINCE), parts.get("window") or b""
    if start is None:
        return sections  # a whole window (or an older probe's): what a full probe sends
    stat, offset = stat_of(sections), int(start) if start.isdigit() else -1
    if (seen is None or stat is None or not _clean(sections, "window") or stat.inode != seen.stat.inode
            or not 0 <= offset <= seen.stat.size <= offset + len(window)):
        return None
    overlap = seen.stat.size - offset
    if overlap > len(seen.window) or seen.window[len(seen.window) - overlap:] != window[:overlap]:
        return None
    whole = (seen.window + window[overlap:])[-window_bytes:]
    rest = {k: v for k, v in parts.items() if k != SINCE}
    return Sections({**rest, FROM: str(offset + len(window) - len(whole)).encode(), "window": whole})
