"""Pure: the /run history answer — what a run did over a window (its phases, restarts and incidents), newest first."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import tzinfo

from bot.core import humanize as hz
from bot.core.ledger import Incident
from bot.core.timeline import MAX_SPANS, Span
from bot.render.alerts import EMOJI, concern_words
from bot.render.slack import Message, _button, lead, safe, section
from bot.render.times import slack_time

ACTION_PLOT = "runbot.plot"  # the chart buttons: value "RUN METRIC WINDOW_S"
# Slack refuses a block whose buttons share an action_id (invalid_blocks): one per metric, all answered alike.
CHART_METRICS = ("loss", "rate", "gpus")
CHART_ACTIONS = tuple(f"{ACTION_PLOT}.{metric}" for metric in CHART_METRICS)
MAX_INCIDENTS = 6


def _when(start: float, end: float, now: float, tz: tzinfo | None) -> str:
    # A span still going on ends "now": the reader's question is what the run is doing since when.
    until = "now" if now - end < 300 else slack_time(end, tz)
    return f"{slack_time(start, tz)}–{until}"


def span_words(s: Span, clean: Callable[[str], str]) -> list[str]:
    """A span's phase, steps and rate in words, its log-borne text made safe by `clean` (Slack's or the terminal's)."""
    words = [clean(s.phase.value)]
    if s.first_step is not None and s.last_step is not None and s.last_step != s.first_step:
        words.append(f"step {s.first_step} → {s.last_step}")
    elif s.last_step is not None:
        words.append(f"step {s.last_step}")
    if s.rate is not None:
        words.append(f"{hz.count(s.rate)} {clean(s.unit or 'it/s')}")
    return words


def gist(spans: Sequence[Span], incidents: Sequence[Incident], now: float, window: float) -> str:
    """"training since 2 h ago · 1 incident in 1 d": the answer's first line, plain words (phases are runbot's own)."""
    first = spans[-1] if spans else None
    problems = sum(1 for i in incidents if i.concern is not None)
    said = f"{first.phase.value} since {hz.duration(now - first.start)} ago" if first else "history"
    return f"{said} · {problems or 'no'} incident{'s' if problems != 1 else ''} in {hz.duration(window)}"


def nothing_yet(window: float) -> str:
    return f"nothing remembered of the last {hz.duration(window)} yet (runbot keeps what its probes see, from the first sweep on)"


def _span_line(s: Span, now: float, tz: tzinfo | None) -> str:
    lead = ":arrows_counterclockwise: restarted · " if s.restarted else ""
    return f"• {_when(s.start, s.end, now, tz)} {lead}{' · '.join(span_words(s, safe))} ({hz.duration(s.end - s.start)})"


def _incident_line(i: Incident, now: float, tz: tzinfo | None) -> str:
    if i.concern is None:
        return f"• {slack_time(i.opened_at, tz)} {EMOJI['finished']} finished"
    what = safe(concern_words(i.concern))
    if i.closed_at is None:
        return f"• {slack_time(i.opened_at, tz)} {EMOJI['crit']} {what} — open {hz.duration(now - i.opened_at)}"
    return f"• {slack_time(i.opened_at, tz)} {EMOJI['recovered']} {what} — over after {hz.duration(i.closed_at - i.opened_at)}"


def history_message(run: str, spans: Sequence[Span], incidents: Sequence[Incident], now: float, window: float,
                    tz: tzinfo | None = None) -> Message:
    """The run's phases and incidents over the last `window` seconds, newest first, with chart buttons."""
    if not spans and not incidents:
        words = nothing_yet(window)
        return {"text": lead(run, words), "blocks": [section(lead(run, words, ":scroll:"))]}
    shown = list(reversed(spans))[:MAX_SPANS]
    lines = [_span_line(s, now, tz) for s in shown]
    if len(spans) > len(shown):
        lines.append(f"…and {len(spans) - len(shown)} earlier")
    told = list(reversed(incidents))[:MAX_INCIDENTS]
    said = safe(gist(spans, incidents, now, window))
    blocks = [section(lead(run, said, ":scroll:")),
              section("*phases*\n" + "\n".join(lines) if lines else "*phases*\nno probes in this window")]
    if told:
        blocks.append(section("*incidents*\n" + "\n".join(_incident_line(i, now, tz) for i in told)))
    window_s = int(window)
    blocks.append({"type": "actions", "elements": [
        _button(f"Chart {metric}", action, f"{run} {metric} {window_s}") for metric, action in zip(CHART_METRICS, CHART_ACTIONS)]})
    return {"text": lead(run, said), "blocks": blocks}
