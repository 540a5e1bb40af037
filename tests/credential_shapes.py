"""Made-up credentials and the check that none of one is shown (tests of redaction, on every surface)."""

from __future__ import annotations

import random
from typing import NamedTuple

ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
HEX = "0123456789abcdef"
B64 = ALNUM + "+/"


def rnd(alphabet: str, n: int, seed: str) -> str:
    """A made-up credential body: random, so no 8 characters of it occur in anything else shown."""
    rng = random.Random(seed)
    return "".join(rng.choice(alphabet) for _ in range(n))


class Shape(NamedTuple):
    name: str
    line: str  # a log line holding the credential
    secret: str  # the part that must never be shown (a kept prefix such as `hf_` is not part of it)
    whole_line: bool = False  # only a line of its own says it is one (a .netrc's lone `password` line)


def leaks(shape: Shape, *texts: str) -> list[str]:
    """The pieces of the secret (8 characters, or all of a shorter one) that some text shows."""
    n = min(8, len(shape.secret))
    pieces = {shape.secret[i:i + n] for i in range(len(shape.secret) - n + 1)}
    return sorted(p for p in pieces for t in texts if p in t)


def strings(message) -> list[str]:
    """Every string in a Slack payload."""
    if isinstance(message, str):
        return [message]
    if isinstance(message, dict):
        return [s for v in message.values() for s in strings(v)]
    if isinstance(message, list):
        return [s for v in message for s in strings(v)]
    return []
