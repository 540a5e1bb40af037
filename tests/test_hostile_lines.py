"""The built-in grammar's (and redaction's) cost on hostile text: a window of lines built to make regexes backtrack (runs of
digits, brackets, separators, half-formats) is read in bounded time. Lines are capped at 2000 characters
and the window at 64 KiB, so a pattern that is quadratic in a line shows here (runs of digits took 1.07 s
before `\\d+it` was anchored); a linear one costs a few tens of ms."""

from __future__ import annotations

import random
import time

import pytest

from bot.core.diagnose import diagnose
from bot.core.redact import redact_lines
from bot.core.sections import LINE_CAP
from tests.builders import evidence
from tests.test_diagnose import Run

WINDOW = 64 * 1024
BOUND_S = 0.5  # CPU seconds for a whole window; ~0.12 s is the worst seen on a 2-core CI machine's peer

_rng = random.Random(1)
HOSTILE = {
    "digits": "1" * LINE_CAP,
    "digits and spaces": "1 " * (LINE_CAP // 2),
    "digits and tabs": "1\t" * (LINE_CAP // 2),
    "thousands": "1," * (LINE_CAP // 2),
    "signs": "-1" * (LINE_CAP // 2),
    "percents": "1%" * (LINE_CAP // 2),
    "fractions": "1/" * (LINE_CAP // 2),
    "decimals": "1." * (LINE_CAP // 2),
    "exponents": "1e" * (LINE_CAP // 2),
    "brackets": "[" * LINE_CAP,
    "pipes": "|" * LINE_CAP,
    "bar pieces": "|█" * (LINE_CAP // 2),
    "key=": "a=" * (LINE_CAP // 2),
    "key: ": "a: " * (LINE_CAP // 3),
    "ranks": "[rank0]:" * (LINE_CAP // 8),
    "hosts": "a1: " * (LINE_CAP // 4),
    "escapes": "\x1b[" * (LINE_CAP // 2),
    "stamps": "2024-01-01 00:00:00 " * (LINE_CAP // 20),
    "clocks": "1:00:00 " * (LINE_CAP // 8),
    "half bars": "9%|" * (LINE_CAP // 3),
    "half tracebacks": "Traceback (most recent call last): " * (LINE_CAP // 35),
    "half dicts": "{'loss': " * (LINE_CAP // 9),
    "step words": "step 1/ loss: nan " * (LINE_CAP // 18),
    "many fields": " ".join(f"k{i}={i}" for i in range(300))[:LINE_CAP],
    "noise": "".join(_rng.choice("0123456789 :=/|[]()%.,-_abcdefkMGs") for _ in range(LINE_CAP)),
}


@pytest.mark.parametrize("line", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_window_of_hostile_lines_is_read_in_bounded_time(line):
    text = "\n".join([line] * (WINDOW // (len(line) + 1))) + "\n"
    started = time.process_time()
    diagnose(evidence(text), Run())
    assert time.process_time() - started < BOUND_S


def test_a_window_of_step_lines_costs_little():
    lines = [f"step={i} loss={2 + 8 / i:.4f} tok/s={14200 + i % 97} elapsed={i * 0.8:.1f}s" for i in range(1, 3000)]
    text = "\n".join(lines)[-WINDOW:]
    diagnose(evidence(text), Run())  # warm the regex cache
    started = time.process_time()
    for _ in range(5):
        diagnose(evidence(text), Run())
    assert (time.process_time() - started) / 5 < 0.1  # ~11 ms here: only each template's last lines are read closely


# Redaction's cost on the same kind of text: lines built to make its rules backtrack or repeat (a
# chain of `key=`, URLs without an `@`, a command line of flags after `mysql`). Each must stay linear
# in the line: a chain of 500 `key=` took 1.8 s, and 500 `a://` 0.5 s, while the rules were written.
REDACT_HOSTILE = {
    "key=": "key=" * (LINE_CAP // 4),
    "key: ": "key: " * (LINE_CAP // 5),
    "glued keywords": "password" * (LINE_CAP // 8),
    "quotes": "token='" * (LINE_CAP // 7),
    "escapes": 'password="' + "\\a" * (LINE_CAP // 2 - 10),
    "flags after mysql": "mysql " + "-x " * (LINE_CAP // 3),
    "flags after sshpass": "sshpass " + "-x " * (LINE_CAP // 3),
    "schemes": "a://" * (LINE_CAP // 4),
    "users": "http://a:" * (LINE_CAP // 9),
    "netrc words": "machine a " * (LINE_CAP // 10),
    "semicolons": "password=" + "a;b=" * (LINE_CAP // 4 - 3),
    "password words": "password: " + "a " * (LINE_CAP // 2 - 6),
    "long names": "a_" * (LINE_CAP // 2 - 10) + "token=abc",
    "azure shapes": "aaa1Q~" * (LINE_CAP // 6),
}


@pytest.mark.parametrize("line", REDACT_HOSTILE.values(), ids=REDACT_HOSTILE.keys())
def test_a_window_of_hostile_lines_is_redacted_in_bounded_time(line):
    lines = [line[:LINE_CAP]] * (WINDOW // (LINE_CAP + 1))
    started = time.process_time()
    redact_lines(lines)
    assert time.process_time() - started < BOUND_S
