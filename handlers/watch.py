"""/run watch, /run mute, /run unmute and the alerts' Mute button: thin wiring onto the watchdog."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bot.render import slack as render_slack
from bot.service.chat import ChatError
from bot.service.leadership import StandingBy
from bot.render.alerts import MUTE_FOR_S
from bot.render.times import slack_time
from bot.render.slack import ACTION_MUTE
from config.registry import format_duration, parse_duration
from handlers import clicks
from handlers.commands import (
    CommandRequest,
    Reply,
    Usage,
    log,
    log_event,
    send_response,
    subcommand,
)

if TYPE_CHECKING:
    from bot.service.app import Services

NOT_RUNNING = "the watchdog is not running (`runbot serve` starts it)"


@dataclass(frozen=True)
class At:
    """A time in a note: a Slack date token (each reader's own zone), added after the text around it is escaped."""

    ts: float


def _line(*parts: str | At) -> str:
    """Text parts made safe to post, times as Slack date tokens."""
    return "".join(slack_time(p.ts) if isinstance(p, At) else render_slack.safe(p) for p in parts)


def _note(req: CommandRequest, *parts: str | At, outcome: str = "ok") -> Reply:
    line = _line(*parts)
    return req.reply({"text": line, "blocks": [render_slack.section(line)]}, outcome=outcome)


@subcommand("watch", "watch RUN", "follow a restart in one message, edited in place until the first step (30 min at most)")
async def watch(req: CommandRequest) -> Reply:
    run = req.run(req.args[0])
    watchdog = req.services.watchdog
    if watchdog is None:
        return _note(req, NOT_RUNNING, outcome="error")
    try:
        found, started = await watchdog.watch(run, req.channel_id, req.user_id)
    except StandingBy as exc:
        return _note(req, str(exc), outcome="standby")
    except ChatError as exc:  # e.g. not_in_channel: the bot needs inviting to post here
        return _note(req, f"cannot post the watch message here ({exc}); invite the bot to this channel", outcome="error")
    if not started:
        return _note(req, f"{run.name} is already being watched (since ", At(found.started_at), ") — one watch per run",
                     outcome="busy")
    return _note(req, f"watching {run.name}: the message in this channel follows it until its first step")


@subcommand("mute", "mute RUN [DURATION]", f"no alerts for RUN for a while (default {format_duration(MUTE_FOR_S)}); it is still probed")
async def mute(req: CommandRequest) -> Reply:
    run = req.run(req.args[0])
    seconds = MUTE_FOR_S
    if len(req.args) > 1:
        try:
            seconds = parse_duration(req.args[1], "DURATION")
        except ValueError as exc:
            raise Usage(str(exc)) from None
        longest = req.registry.bot.max_mute
        if seconds > longest:  # a forgotten year-long mute is an alert channel that lies
            raise Usage(f"at most {format_duration(longest)} (the [bot] max_mute setting)")
    watchdog = req.services.watchdog
    if watchdog is None:
        return _note(req, NOT_RUNNING, outcome="error")
    try:
        state = await watchdog.mute(run, req.services.clock() + seconds, req.user_id)
    except StandingBy as exc:
        return _note(req, str(exc), outcome="standby")
    return _note(req, f":no_bell: {run.name} muted until ", At(state.muted_until), " — still probed; "
                      f"`/run unmute {run.name}` to hear from it again")


@subcommand("unmute", "unmute RUN", "alerts for RUN again")
async def unmute(req: CommandRequest) -> Reply:
    run = req.run(req.args[0])
    watchdog = req.services.watchdog
    if watchdog is None:
        return _note(req, NOT_RUNNING, outcome="error")
    try:
        await watchdog.mute(run, None, req.user_id)
    except StandingBy as exc:
        return _note(req, str(exc), outcome="standby")
    return _note(req, f":bell: {run.name} unmuted")


async def on_mute_button(ack, body: dict, action: dict, context) -> None:
    """Mute 1h on an alert: the parent is edited by the watchdog; the clicker gets a private note."""
    await ack()
    services: Services = context["services"]
    started = time.monotonic()
    click = clicks.read(body, action)
    if click is None:
        return
    run = clicks.clicked_run(services.registry, click.user, click.channel, click.value)
    if isinstance(run, clicks.Refused):
        line, outcome = _line(run.text), run.outcome
    elif services.watchdog is None:
        line, outcome = _line(NOT_RUNNING), "error"
    else:
        try:
            with services.tracking():
                state = await services.watchdog.mute(run, services.clock() + MUTE_FOR_S, click.user)
        except StandingBy as exc:
            line, outcome = _line(str(exc)), "standby"
        except Exception as exc:  # noqa: BLE001 - the clicker hears why; the log gets the traceback
            log.exception("Mute button on %s failed", run.name)
            line, outcome = _line(f"could not mute {run.name}: {type(exc).__name__}: {exc}"[:300]), "error"
        else:
            line, outcome = _line(f":no_bell: {run.name} muted until ", At(state.muted_until), " (by you)"), "ok"
    if click.response_url:
        await send_response(click.response_url, {"text": line, "blocks": [render_slack.section(line)],
                                                 "response_type": "ephemeral", "replace_original": False})
    log_event("button", user=click.user, channel=click.channel, command="mute", run=click.value[:64], outcome=outcome,
              ms=round((time.monotonic() - started) * 1000))


def register(app) -> None:
    app.action(ACTION_MUTE)(on_mute_button)
