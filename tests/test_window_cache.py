"""bot.core.window_cache: what a probe that sent only what changed is rebuilt into must be, byte for byte, what a full
probe of the same file would have sent — or None, when the bytes seen are no longer the file's (probe it again)."""

from __future__ import annotations

import pytest

from bot.core.evidence import read_evidence
from bot.core.sections import Sections
from bot.core.window_cache import (FROM, OVERLAP_BYTES, SINCE, UNCHANGED, WINDOW_BYTES, Seen, Stat, rebuild,
                                   remember, stat_of)

STEPS = b"cap=1048576\nstep 7 loss 0.5\n"


def _meta(stat: Stat) -> bytes:
    return f"now=1000.5\nhost=t\nsize={stat.size} mtime={stat.mtime} inode={stat.inode}\n".encode()


def full(content: bytes, stat: Stat) -> Sections:
    """What the script sends on a full look: the last WINDOW_BYTES, from where they start."""
    start = max(0, len(content) - WINDOW_BYTES)
    return Sections({"meta": _meta(stat), "meta.rc": b"0", FROM: str(start).encode(), "window": content[start:],
                     "window.rc": b"0", "steps": STEPS, "steps.rc": b"0", "writers": b"# hidden 0\n",
                     "writers.rc": b"0", "end": b""})


def told(content: bytes, stat: Stat, seen: Seen | None) -> Sections:
    """What the script sends when told `seen` (its look(): unchanged, grown within the window, or read in full)."""
    parts = dict(full(content, stat).parts)
    if seen is None or seen.stat.inode != stat.inode:
        return Sections(parts)
    if (seen.stat.size, seen.stat.mtime) == (stat.size, stat.mtime):
        for name in (FROM, "window", "window.rc", "steps", "steps.rc"):
            del parts[name]
        return Sections({**parts, UNCHANGED: b""})
    since = max(0, seen.stat.size - OVERLAP_BYTES)
    if stat.size > seen.stat.size and since >= stat.size - WINDOW_BYTES:
        del parts[FROM]
        return Sections({**parts, SINCE: str(since).encode(), "window": content[since:]})
    return Sections(parts)


def lines(n: int, start: int = 0, tag: bytes = b"") -> bytes:
    return b"".join(b"step %d loss %.3f %s\n" % (i, 1 / (i + 1), tag) for i in range(start, start + n))


BAR = "Training:  45%|████▌     | 450/1000 [00:10<00:12, 44.1it/s]".encode()
# (case, content seen, content now, inode then/now, mtime then/now, rebuilt: "full" = equal to the full probe, None)
# PATHS: what the script sends for each (a grown log's new bytes, nothing, or a whole window)
CASES = [
    ("append", lines(200), lines(200) + lines(5, 200), (1, 1), (10, 11), "full"),
    ("append to a small log", lines(3), lines(3) + lines(2, 3), (1, 1), (10, 11), "full"),
    ("unchanged", lines(5000), lines(5000), (1, 1), (10, 10), "full"),
    ("unchanged small", lines(3), lines(3), (1, 1), (10, 10), "full"),
    ("rotation: a new inode", lines(5000), lines(40, tag=b"new"), (1, 2), (10, 11), "full"),
    ("truncation", lines(5000), lines(100), (1, 1), (10, 11), "full"),
    ("rewritten in place, larger: the overlap differs", lines(5000), lines(5000, tag=b"x") + lines(3), (1, 1),
     (10, 11), None),
    ("the seen window glued to new bytes crosses the window's size", lines(3000), lines(3000) + lines(600, 3000),
     (1, 1), (10, 11), "full"),
    ("more new bytes than a window: read in full", lines(3000), lines(3000) + lines(4000, 3000), (1, 1), (10, 11),
     "full"),
    ("a bar's \\r frames split across the seen end", lines(4000) + b"\r".join([BAR] * 30)[:-7],
     lines(4000) + b"\r".join([BAR] * 60), (1, 1), (10, 11), "full"),
    ("a UTF-8 character split at the seen end", lines(4000) + "é █".encode()[:-1],
     lines(4000) + "é █▌ done\n".encode(), (1, 1), (10, 11), "full"),
    ("same size, new mtime (rewritten): read in full", lines(300), lines(300).replace(b"step 1 ", b"step 9 "),
     (1, 1), (10, 12), "full"),
]


PATHS = {
    'append': 'since',
    'append to a small log': 'since',
    'unchanged': 'unchanged',
    'unchanged small': 'unchanged',
    'rotation: a new inode': 'full',
    'truncation': 'full',
    'rewritten in place, larger: the overlap differs': 'since',
    "the seen window glued to new bytes crosses the window's size": 'since',
    'more new bytes than a window: read in full': 'full',
    "a bar's \\r frames split across the seen end": 'since',
    'a UTF-8 character split at the seen end': 'since',
    'same size, new mtime (rewritten): read in full': 'full',
}


@pytest.mark.parametrize("case, then, now, inodes, mtimes, want", CASES, ids=[c[0] for c in CASES])
def test_rebuild_is_what_a_full_probe_sends(case, then, now, inodes, mtimes, want):
    seen = remember(full(then, Stat(inodes[0], len(then), mtimes[0])))
    assert seen is not None and seen.window == then[-WINDOW_BYTES:]
    stat = Stat(inodes[1], len(now), mtimes[1])
    answer = told(now, stat, seen)
    assert {"since": SINCE, "unchanged": UNCHANGED, "full": FROM}[PATHS[case]] in answer.parts
    got = rebuild(seen, answer)
    if want is None:
        assert got is None
        return
    whole = full(now, stat)
    assert got is not None and got.parts == whole.parts
    assert read_evidence(got, "/t.log") == read_evidence(whole, "/t.log")
    assert remember(got) == remember(whole)


def test_a_full_or_older_probe_is_read_as_it_is():
    probe = full(lines(10), Stat(1, len(lines(10)), 10))
    older = Sections({k: v for k, v in probe.parts.items() if k != FROM})
    assert rebuild(None, probe) is probe and rebuild(None, older) is older
    assert remember(older) is None  # no offset: the next look reads the log in full


@pytest.mark.parametrize("why, parts", [
    ("an unchanged answer with no seen", {UNCHANGED: b""}),
    ("a grown answer whose stat is another file", {SINCE: b"0", "meta": _meta(Stat(9, 5, 1)), "window": b"x" * 5}),
    ("a grown answer that starts past the seen end", {SINCE: b"50000", "window": b"x" * 10}),
    ("a grown answer whose window read failed", {SINCE: b"100", "window.rc": b"1"}),
])
def test_answers_that_do_not_fit_what_was_seen_ask_for_a_full_look(why, parts):
    then = lines(3000)
    seen = remember(full(then, Stat(1, len(then), 10)))
    base = {"meta": _meta(Stat(1, len(then) + 10, 11)), "window": then[-OVERLAP_BYTES:] + b"x" * 10, "window.rc": b"0"}
    assert rebuild(None if why.endswith("no seen") else seen, Sections({**base, **parts})) is None


@pytest.mark.parametrize("why, change", [
    ("the window read failed", {"window.rc": b"1"}),
    ("the step search said something on stderr", {"steps.err": b"grep: broken"}),
    ("the file grew between stat and read", {"window": lines(10) + b"more"}),
    ("the log is not readable", {"meta": _meta(Stat(1, 10, 10)) + b"readable=0\n"}),
])
def test_a_look_that_cannot_stand_for_the_file_is_not_remembered(why, change):
    probe = full(lines(10), Stat(1, len(lines(10)), 10))
    assert remember(probe) is not None
    assert remember(Sections({**probe.parts, **change})) is None


def test_stat_is_read_from_meta():
    assert stat_of(full(b"abc", Stat(7, 3, 99))) == Stat(7, 3, 99)
    assert stat_of(Sections({"meta": b"now=1\nexists=0\n"})) is None
