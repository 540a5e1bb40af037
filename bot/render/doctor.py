"""`runbot doctor`'s answer: one line per check, ✓ or ✗ with its fix, and what it adds up to (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Sequence

from bot.core.redact import clean_line


class Outcome(Enum):
    PASS = "✓"
    FAIL = "✗"
    SKIP = "–"  # not checked, and the line says why (no Slack token, the host could not be reached…)


@dataclass(frozen=True)
class Check:
    """One thing a working install needs, and whether this one has it."""

    name: str  # what was checked: "pve1: host key known and matching"
    outcome: Outcome
    detail: str = ""  # what was found
    fix: str = ""  # what to do about a ✗ (empty when the detail already says it)

    @property
    def ok(self) -> bool:
        return self.outcome is not Outcome.FAIL


def passed(checks: Sequence[Check]) -> bool:
    """All good: nothing failed (a skipped check says why, and does not fail the install)."""
    return all(c.ok for c in checks)


def line(check: Check) -> str:
    """One check, printable and redacted: a detail may quote a host's or a container's output."""
    said = f"{check.outcome.value} {check.name}"
    if check.detail:
        said += f": {check.detail}"
    if check.fix:
        said += f" — fix: {check.fix}"
    return clean_line(said)


def report(checks: Sequence[Check]) -> str:
    """Every check's line, then the sum: all passed, or how many failed."""
    failed = sum(1 for c in checks if not c.ok)
    skipped = sum(1 for c in checks if c.outcome is Outcome.SKIP)
    total = f"{len(checks)} check{'s' if len(checks) != 1 else ''}"
    tail = f"{total}: all passed" if not failed else f"{total}: {failed} failed"
    if skipped:
        tail += f", {skipped} skipped"
    return "\n".join([*map(line, checks), tail])


def slack_message(checks: Sequence[Check]) -> dict:
    """The same lines for /run doctor, made safe to post (secrets redacted, & < > escaped), in sections Slack takes."""
    from bot.render.slack import MAX_TEXT, cut, fit, safe, section  # noqa: PLC0415 - the CLI never needs Slack's shape

    lines = [safe(text) for text in report(checks).splitlines()]
    blocks, chunk = [], []
    for text in lines:
        if chunk and sum(len(t) + 1 for t in chunk) + len(text) > 2900:  # a section holds 3000 characters
            blocks.append(section("\n".join(chunk)))
            chunk = []
        chunk.append(text[:2900])
    blocks.append(section("\n".join(chunk)))
    return fit({"text": cut("\n".join(lines), MAX_TEXT), "blocks": blocks})
