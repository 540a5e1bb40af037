"""Pure: a Verdict as plain text for the terminal (status, gpus, tail, runs, history). Printable, secrets redacted."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Sequence

from bot.core import humanize as hz
from bot.core.gpus import format_indices, util_words
from bot.core.redact import clean_line, redact_lines
from bot.core.timeline import MAX_SPANS
from bot.core.verdict import Verdict, worst_first
from bot.render.times import clock
from bot.render.facts import rows as fact_rows
from bot.render.facts import tail_note

if TYPE_CHECKING:
    from bot.core.ledger import Incident
    from bot.core.timeline import Span


def _safe(text: str) -> str:
    # A headline may quote what the probe did not write (a replayed capture's `failure`, a host's text):
    # no escape sequence reaches the terminal.
    return clean_line(text)


def status(v: Verdict, *, where: str = "", muted_until: float | None = None) -> str:
    """First line: the verdict. Then aligned facts, then any probe problems."""
    lines = [_safe(v.headline)]
    rows = [("run", f"{v.run}{f' ({where})' if where else ''} · {v.phase.value}")]
    rows += [(r.label, r.text if r.at is None else f"{r.text} {clock(r.at)}") for r in fact_rows(v, muted_until=muted_until)]
    rows += [("problem", p) for p in v.problems]
    width = max(len(label) for label, _ in rows)
    lines += [f"  {label:<{width}}  {_safe(text)}" for label, text in rows]
    return "\n".join(lines)


def gpus(v: Verdict) -> str:
    """Per-GPU classification over the driver's window or the samples, grouped by role, and which it was."""
    head = _safe(v.headline)
    report = v.gpu
    if report is None or not v.reached:
        return f"{head}\n  no GPU readings (the run could not be probed)"
    if report.error and not report.gpus:
        return f"{head}\n  {_safe(report.error)}"
    lines = [head, f"  {report.summary()}", f"  util from {report.basis.phrase()}"]
    roles = [(role, list(idx)) for role, idx in report.roles]
    placed = {i for _, idx in roles for i in idx}
    others = [g.index for g in report.gpus if g.index not in placed]
    if others:
        roles.append(("other" if roles else "GPUs", others))
    for role, indices in roles:
        lines.append(f"  {role} ({format_indices(indices)})")
        for i in indices:
            g = report.by_index(i)
            if g is None:
                lines.append(f"    GPU {i}: not reported")
                continue
            mem = _mem(g.mem_used_mib, g.mem_total_mib)
            lines.append(f"    GPU {g.index}: {g.cls:<11} {mem:<16} util % {util_words(g)}")
    lines += [f"  ! {_safe(f)}" for f in report.findings]
    if report.error:
        lines.append(f"  ! {_safe(report.error)}")
    return "\n".join(lines)


def _mem(used: float | None, total: float | None) -> str:
    if used is None:
        return "mem ?"
    return hz.gib(used, total) if total else hz.gib(used)


def tail(v: Verdict, n: int = 20) -> str:
    """The verdict line, then the last n log lines (bars collapsed, colours stripped, secrets redacted)."""
    # All the verdict keeps, redacted as one text, then the last n: a private key spans lines,
    # and its BEGIN line may lie above the n.
    body = redact_lines(v.tail)[-n:] if n > 0 and v.reached else []
    if (note := tail_note(v, len(body))) is not None:
        return f"{_safe(v.headline)}\n  ({note})"
    return "\n".join([_safe(v.headline), *body])


def runs(rows: Iterable[tuple[str, Verdict]]) -> str:
    """One line per run, the worst first: name, level, verdict."""
    rows = worst_first(rows)
    if not rows:
        return "no runs configured"
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {v.level.word:<4}  {_safe(v.headline)}" for name, v in rows)


def history(run: str, spans: Sequence[Span], incidents: Sequence[Incident], now: float, window: float) -> str:
    """`runbot history RUN`: what /run history says, newest first, times as labelled clocks (UTC)."""
    # Only the history's: their modules load the alerts' and Slack's renderers, which `runbot status` never needs.
    from bot.render.alerts import concern_words  # noqa: PLC0415
    from bot.render.history import MAX_INCIDENTS, gist, nothing_yet, span_words  # noqa: PLC0415

    if not spans and not incidents:
        return f"{run}: {nothing_yet(window)}"
    lines = [f"{run}: {gist(spans, incidents, now, window)}", "  phases"]
    shown = list(reversed(spans))[:MAX_SPANS]
    for s in shown:
        until = "now" if now - s.end < 300 else clock(s.end)
        lead = "restarted · " if s.restarted else ""
        lines.append(f"    {clock(s.start)}–{until}  {lead}{' · '.join(span_words(s, clean_line))} ({hz.duration(s.end - s.start)})")
    if len(spans) > len(shown):
        lines.append(f"    …and {len(spans) - len(shown)} earlier")
    if told := list(reversed(incidents))[:MAX_INCIDENTS]:
        lines.append("  incidents")
    for i in told:
        what = "finished" if i.concern is None else clean_line(concern_words(i.concern))
        if i.concern is None:
            how = ""
        elif i.closed_at is None:
            how = f" — open {hz.duration(now - i.opened_at)}"
        else:
            how = f" — over after {hz.duration(i.closed_at - i.opened_at)}"
        lines.append(f"    {clock(i.opened_at)}  {what}{how}")
    return "\n".join(lines)
