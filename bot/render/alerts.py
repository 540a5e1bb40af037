"""Pure: alert messages (parent, thread replies) and the `/run watch` message as Slack payloads."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import tzinfo

from bot.core import humanize as hz
from bot.render.times import clock, slack_time
from bot.core.alerts import Post, Reply, RunState, Status
from bot.core.digest import calm, rank
from bot.render.slack import (
    ACTION_MUTE,
    buttons,
    context,
    cut,
    fit,
    lead,
    safe,
    section,
    verdict_blocks,
)
from bot.core.history import Tally
from bot.core.outages import is_host_key
from bot.core.verdict import Concern, Phase, Verdict, Worry

MUTE_FOR_S = 3600.0  # the alert's Mute button
EMOJI = {"crit": ":red_circle:", "warn": ":large_orange_circle:", "recovering": ":large_yellow_circle:",
         "recovered": ":white_check_mark:", "finished": ":checkered_flag:"}


def concern_words(concern: Concern | None) -> str:
    if concern is None:
        return "a problem"
    who = concern.subject or ""
    match concern.kind:
        case Worry.SILENT:
            return "silent"
        case Worry.CRASHED:
            return "crashed"
        case Worry.STOPPED:
            return "stopped"
        case Worry.NO_LOG:
            return "log missing"
        case Worry.UNREADABLE:
            return "log unreadable"
        case Worry.UNREACHABLE:
            return "unreachable"
        case Worry.HUNG_ON_EXIT:
            return "hung on exit"
        case Worry.NAN_LOSS:
            return "loss NaN"
        case Worry.THREAD_DIED:
            return f"thread {who} died"
        case Worry.GPU_IDLE:
            return f"{who} GPUs idle"
        case Worry.LOG_REPLACED:
            return f"log replaced by {concern.subject}" if concern.subject else "log replaced"
        case Worry.HELD:
            return "host down"
    return concern.kind.value.replace("_", " ")


def _emoji(state: RunState) -> str:
    if state.flapping:
        return EMOJI["crit"] if state.concern is None or state.concern.severity >= 3 else EMOJI["warn"]
    if state.status is Status.RESOLVED:
        return EMOJI["recovered"]
    if state.status is Status.FINISHED:
        return EMOJI["finished"]
    if state.status is Status.RECOVERING:
        return EMOJI["recovering"]
    return EMOJI["crit"] if state.concern is None or state.concern.severity >= 3 else EMOJI["warn"]


def mute_note(state: RunState, now: float, tz: tzinfo | None = None) -> str:
    """"muted until <14:30 as a Slack date>" while a mute holds, else "" (mrkdwn, safe to post)."""
    if not state.muted(now):
        return ""
    by = f" by <@{safe(state.muted_by)}>" if state.muted_by else ""
    return f"muted until {slack_time(state.muted_until, tz)}{by}"  # type: ignore[arg-type]


def _parent_words(state: RunState, now: float) -> str:
    """What the incident is now, in words (not yet escaped): what follows the run's name on the parent's first line."""
    head = " ".join(state.headline.split())
    if state.flapping:  # whatever the machine underneath says this sweep
        return f"flapping — {_flap_words(state)}; now {head}"
    if state.status is Status.RESOLVED:
        took = hz.duration((state.closed_at or now) - (state.opened_at or now))
        return f"recovered after {took} ({concern_words(state.concern)}) — {head}"
    if state.status is Status.FINISHED:
        return head if head.startswith("finished") else f"finished — {head}"
    return head


def _flap_words(state: RunState) -> str:
    return f"{concern_words(state.concern)} and back {len(state.flips)} times lately"


def parent(run: str, state: RunState, verdict: Verdict | None, now: float, tz: tzinfo | None = None) -> dict:
    """The incident's parent message as it should read now: {"text", "blocks"}. Its text leads as every answer's
    does, the run then the verdict (what a lock screen shows); the emoji is the block's."""
    words = cut(safe(_parent_words(state, now)), 1000)
    blocks = [section(lead(run, words, _emoji(state)))]
    if verdict is not None and (state.status in (Status.OPEN, Status.RECOVERING) or state.flapping):
        blocks += verdict_blocks(verdict, run)[1:]  # the evidence; the line above already says the verdict
    notes = []
    if state.opened_at is not None and state.status is not Status.FINISHED:
        notes.append(f"{safe(concern_words(state.concern))} since {slack_time(state.opened_at, tz)}")
    if state.changed_at is not None and state.changed_at != state.opened_at:
        notes.append(f"updated {slack_time(state.changed_at, tz)}")
    muted = mute_note(state, now, tz)
    if muted:
        notes.append(muted)
    if notes:
        blocks.append(context(" · ".join(notes)))
    if state.status is not Status.FINISHED and not is_host_key(run):
        # A host's incident has no run to refresh, tail or mute: its buttons would answer "no longer configured".
        blocks.append(buttons(run, extra=(("Mute 1h", ACTION_MUTE),)))
    return fit({"text": lead(run, words) + (f"\n{muted}" if muted else ""), "blocks": blocks})


def reply(run: str, action: Reply, state: RunState, now: float) -> dict:
    """A message in the incident's thread (no buttons: the parent has them). The headline already names the
    problem ("crashed — …"), so the reply adds only what is new: still, now, again, recovered."""
    head = cut(safe(" ".join(state.headline.split())), 1000)
    since = hz.duration(now - state.opened_at) if state.opened_at is not None else "?"
    words, emoji = {
        "still": (f"still, after {since}: {head}", _emoji(state)),
        "changed": (f"now {head}", _emoji(state)),
        "reopened": (f"reopened, {head}", _emoji(state)),
        "recovered": (f"recovered after {since}: {head}", EMOJI["recovered"]),
        "finished": (head, EMOJI["finished"]),
        "flapping": (f"flapping — {safe(_flap_words(state))}: only how it settles (or a crash) will be said here; "
                     f"now {head}", _emoji(state)),
        "settled": ((f"stopped flapping, healthy again: {head}", EMOJI["recovered"]) if action.concern is None
                    else (f"stopped flapping, now {head}", _emoji(state))),
    }.get(action.note, (head, _emoji(state)))
    return {"text": lead(run, words), "blocks": [section(lead(run, words, emoji))]}


def message(run: str, action: Post | Reply, state: RunState, verdict: Verdict | None, now: float,
            tz: tzinfo | None = None) -> dict:
    """The payload of a Post or a Reply."""
    if isinstance(action, Post):
        return parent(run, state, verdict, now, tz)
    return reply(run, action, state, now)


# --- a channel's storm digest ---------------------------------------------------------------

GROUP_CHARS = 600  # names listed per line of the digest before "+N more": a few lines on a phone


def digest(members: Sequence[tuple[str, RunState | None]], opened_at: float, now: float, tz: tzinfo | None = None) -> dict:
    """The one message a storm is told in: how many runs changed and how they stand, then one line per kind of
    trouble, worst first, naming its runs. `members`: each run told in it with its state (None: it went on to a
    newer incident, told elsewhere)."""
    groups: dict[tuple, tuple[str, str, list[str]]] = {}  # (rank, what) -> (emoji, what, names)
    for run, state in members:
        if state is None or calm(state):
            key, emoji, what = (4, 0, ""), EMOJI["recovered"], "calm again"
        else:
            key = (*rank(state), concern_words(state.concern))
            what = "flapping" if state.flapping else "recovering" if state.status is Status.RECOVERING else key[2]
            emoji = _emoji(state)
        name = run + (" (muted)" if state is not None and state.muted(now) else "")
        groups.setdefault(key, (emoji, what, []))[2].append(name)
    shown = [(key, *groups[key]) for key in sorted(groups)]
    count = lambda n, what: f"{n} {what}"  # noqa: E731
    said = ", ".join(count(len(names), what) for _, _, what, names in shown) if shown else "nothing yet"
    head = f"{len(members)} run{'s' if len(members) != 1 else ''} changed at once: " + (
        "all calm again" if [k[0] for k, *_ in shown] == [4] else said)
    emoji = shown[0][1] if shown else EMOJI["recovered"]
    lines = [f"{e} *{safe(what)}* ({len(names)}): {_names(sorted(names, key=_natural), GROUP_CHARS)}"
             for _, e, what, names in shown]
    notes = ["one message for this channel while many runs change at once, edited as they do; a crash still gets its own",
             f"since {slack_time(opened_at, tz)}", f"updated {slack_time(now, tz)}"]
    blocks = [section(f"{emoji} *{safe(head)}*"), section(cut("\n".join(lines), 2900)), context(" · ".join(notes))]
    return fit({"text": safe(head), "blocks": blocks})


def _names(names: Sequence[str], room: int) -> str:
    """Names, escaped and comma-separated, as many as fit in `room` characters, then "+N more"."""
    out, used = [], 0
    for i, name in enumerate(names):
        shown = safe(name)
        if out and used + len(shown) + 2 > room:
            return ", ".join(out) + f" +{len(names) - i} more"
        out.append(shown)
        used += len(shown) + 2
    return ", ".join(out)


def _natural(name: str) -> list:
    """flap2 before flap10."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name)]


# --- /run watch -----------------------------------------------------------------------------

WATCH_DONE = {"trained": ":white_check_mark:", "crashed": ":x:", "finished": ":checkered_flag:", "timeout": ":stopwatch:"}


def watch_stage(verdict: Verdict) -> str:
    """One stage of a restart in a few words: "starting…", "loading weights 15% (131/851)", "step 10 · 14.2K tok/s"."""
    if verdict.phase is Phase.STARTING:
        return "starting…"
    if verdict.phase is Phase.TRAINING and verdict.step is not None:
        step = verdict.step
        bits = [f"step {step.step}" if step.step is not None else "first step"]
        if step.rate is not None:
            bits.append(f"{hz.count(step.rate)} {step.rate_unit or 'it/s'}")
        return " · ".join(bits)
    if verdict.phase in (Phase.CRASHED, Phase.STOPPED, Phase.UNREACHABLE, Phase.NO_LOG, Phase.SILENT):
        return verdict.headline
    # "no steps yet — loading weights 15% (131/851) — Target 1 on cuda:1" -> "loading weights 15% (131/851)"
    return verdict.headline.removeprefix("no steps yet — ").split(" — ")[0]


_LEAD = re.compile(r"^[^0-9]*")


def advance(trail: tuple[str, ...], stage: str, limit: int = 8) -> tuple[str, ...]:
    """Add a stage; a run of the same stage (a bar moving) keeps only its first and latest frames."""
    if trail and trail[-1] == stage:
        return trail
    lead = _LEAD.match(stage)[0]  # type: ignore[index]
    same = lambda other: _LEAD.match(other)[0] == lead and lead != other
    if len(trail) >= 2 and same(trail[-1]) and same(trail[-2]):
        trail = trail[:-1]
    return (trail + (stage,))[-limit:]


def _trail_text(trail: tuple[str, ...]) -> str:
    shown = []
    for i, stage in enumerate(trail):
        lead = _LEAD.match(stage)[0]  # type: ignore[index]
        if i and lead != stage and trail[i - 1].startswith(lead):
            stage = stage[len(lead):]  # "loading weights 15% → 60%"
        shown.append(stage)
    return " → ".join(shown)


def watch_message(run: str, trail: tuple[str, ...], done: str | None, started: float, now: float) -> dict:
    """The message `/run watch` keeps editing: the trail of stages, then how it ended."""
    if done == "trained" and len(trail) > 1:  # it was restarting: this is the first step seen
        trail = (*trail[:-1], "first " + trail[-1])
    text = _trail_text(trail) or "probing…"
    mark = f" {WATCH_DONE[done]}" if done else ""
    status = {
        None: f"watching {run} · {hz.duration(now - started)}",
        "trained": f"{run} is training — stopped watching",
        "crashed": f"{run} stopped — stopped watching",
        "finished": f"{run} finished — stopped watching",
        "timeout": f"no first step after {hz.duration(now - started)} — stopped watching",
    }[done]
    line = f"{cut(safe(text), 2500)}{mark}"
    return {"text": lead(run, line), "blocks": [section(lead(run, line, ":eyes:")), context(safe(status))]}


def watch_outcome(verdict: Verdict, started: float, now: float, limit: float) -> str | None:
    """Why a watch stops now, or None to keep going."""
    if verdict.phase in (Phase.TRAINING, Phase.THREAD_DIED) and verdict.step is not None:
        return "trained"
    if verdict.phase in (Phase.CRASHED, Phase.STOPPED):
        return "crashed"
    if verdict.phase is Phase.FINISHED:
        return "finished"
    return "timeout" if now - started >= limit else None


# --- the end-of-run summary -------------------------------------------------------------------


def summary(run: str, tally: Tally | None, verdict: Verdict | None, incidents: int) -> dict:
    """One message when a run ends: the time between the first and last steps runbot saw, how far it got, its loss (final and best), its
    mean rate, the incidents it had before. `incidents` does not count the one telling the end."""
    crashed = verdict is not None and verdict.phase is Phase.CRASHED
    parts = ["crashed" if crashed else "finished"]
    if tally is not None:
        parts.append(f"seen over {hz.duration(tally.last_t - tally.started)}")
        if tally.first_step is not None and tally.last_step is not None and tally.last_step > tally.first_step:
            parts.append(f"steps {tally.first_step} → {tally.last_step}")
        elif tally.last_step is not None:
            parts.append(f"step {tally.last_step}")
        if tally.final_loss is not None:
            best = tally.best_loss
            parts.append(f"loss {hz.number(tally.final_loss)}"
                         + (f" (best {hz.number(best)})" if best is not None and best < tally.final_loss else ""))
        if tally.mean_rate is not None:
            parts.append(f"{hz.count(tally.mean_rate)} {tally.unit or 'it/s'} mean")
    else:
        parts.append("no steps seen")
    parts.append({0: "no incidents"}.get(incidents, f"{incidents} incident{'s' if incidents != 1 else ''}")
                 + (" before it" if crashed else ""))
    words = "summary — " + " · ".join(safe(p) for p in parts)
    return {"text": lead(run, words), "blocks": [section(lead(run, words, EMOJI["crit" if crashed else "finished"]))]}
