"""Pure: one line or one frame at a time — is it a progress line, a progress bar? — over the shared grammar,
and the remote grep pre-filter (that grammar's words, plus a run's own step_pattern)."""

from __future__ import annotations

import functools
import re
from typing import Protocol

from bot.core.bars import Bar, Role, last_bar
from bot.core.facts import Step
from bot.core.grammar import prefilter_ere, split_rank_prefix, strip_host_prefix, strip_stamp
from bot.core.progress import bar_step, read_line
from bot.core.redact import strip_ansi


class Pattern(Protocol):
    def search(self, text: str) -> object | None: ...


def parse_step(line: str, custom: Pattern | None = None) -> Step | None:
    """A line that reads as a loop's progress on its own (a step key or n/total beside a loss, a rate or a
    time), or one the run's `custom` pattern matches; None otherwise. Series of lines, where a template
    that recurs with an advancing number needs no key at all, are bot.core.progress's job."""
    frames = [f for f in strip_ansi(line).split("\r") if f.strip()]
    for shown in reversed(frames[-2:]):  # a \r-joined line: its last frames are what was seen last
        text = strip_stamp(strip_host_prefix(split_rank_prefix(shown)[1])).strip()
        bar = last_bar(text)
        if bar is not None and bar.role is Role.TRAINING and (bar.epoch is not None or (s := bar_step(bar)).loss is not None):
            return Step(**{**bar_step(bar).__dict__, "line": shown.strip()})
        if bar is None and (step := read_line(text)) is not None:
            return Step(**{**step.__dict__, "line": shown.strip()})
        if custom is not None and (custom.search(shown) or custom.search(text)):
            found = read_line(text, alone=False)
            return Step(**{**(found.__dict__ if found else {}), "line": shown.strip(), "fmt": "custom"})
    return None


def parse_bar(frame: str) -> Bar | None:
    """The last progress-bar frame in a text, or None."""
    return last_bar(split_rank_prefix(strip_ansi(frame).strip())[1])


def last_bar_frame(chunk: str) -> str | None:
    """The last tqdm frame in text whose frames are separated by \\r (and lines by \\n)."""
    for frame in reversed(re.split(r"[\r\n]", chunk)):
        if (bar := parse_bar(frame)) is not None:
            return bar.frame
    return None


# Python class escapes as POSIX brackets (busybox grep knows none of them). The negated ones
# have no form inside [...]; the config refuses a backslash there anyway.
_PY_CLASS = {"d": ("[0-9]", "0-9"), "s": ("[ \t]", " \t"), "w": ("[A-Za-z0-9_]", "A-Za-z0-9_"),
             "D": ("[^0-9]", None), "S": ("[^ \t]", None), "W": ("[^A-Za-z0-9_]", None)}


def _to_ere(pattern: str) -> str:
    """Translate Python's \\d \\s \\w (also inside [...]) and \\D \\S \\W for grep; everything else is kept."""
    out, in_class, i = [], False, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            out.append(_PY_CLASS[nxt][in_class] or c + nxt if nxt in _PY_CLASS else c + nxt)
            i += 2
            continue
        in_class = (in_class and c != "]") or (not in_class and c == "[")
        out.append(c)
        i += 1
    return "".join(out)


@functools.lru_cache(maxsize=256)  # one per run's configured format at most: the same string each sweep
def step_grep_ere(custom: str | None = None) -> str:
    """One POSIX ERE matching every line parse_step may accept (a pre-filter for `grep -aE`).

    Run it with LC_ALL=C: in a UTF-8 locale GNU grep's `.` does not match invalid bytes.
    """
    ere = prefilter_ere()
    return f"({ere})|({_to_ere(custom)})" if custom else ere
