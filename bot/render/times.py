"""Pure: times as people read them — a labelled clock, and Slack's date token (each reader's own zone)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, tzinfo


def clock(ts: float, tz: tzinfo | None = None) -> str:
    """"14:30 UTC": `ts` in `tz` (None: UTC), always labelled. Never the machine's own zone: it is
    nobody's in particular, and reading it would make this module depend on where it runs."""
    when = datetime.fromtimestamp(ts, tz or UTC)
    return f"{when:%H:%M} {when.tzname() or 'UTC'}"


def slack_time(ts: float, tz: tzinfo | None = None) -> str:
    """A Slack date token: every reader sees `ts` in their own time zone; clients that cannot render
    it (and notifications) show the fallback, clock(ts, tz). Made only of a number and that fallback,
    so it goes into text *after* escaping (safe() would turn its < > into text) — never build one
    from log text."""
    fallback = re.sub(r"[<>|&]", "", clock(ts, tz))
    return f"<!date^{int(ts)}^{{time}}|{fallback}>"
