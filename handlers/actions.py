"""Buttons Refresh / Tail / GPUs / Status: re-probe the run and replace the message in place (on an alert, and
from a list of runs: answer privately beside it)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from slack_sdk.errors import SlackApiError

from bot.render import slack as render_slack
from bot.service.host_view import ownership
from bot.render.slack import ACTION_GPUS, ACTION_MUTE, ACTION_REFRESH, ACTION_STATUS, ACTION_TAIL
from bot.core.verdict import TAIL_DEFAULT
from handlers import clicks
from handlers.commands import log, log_event, say_privately, send_response

if TYPE_CHECKING:
    from bot.service.app import Services

def _status(v, run, held):
    return render_slack.status_message(v, run.name, run.where)


# Each view from the verdict, the run, and what the host says of its GPUs (asked for the gpus view only).
VIEWS = {
    ACTION_REFRESH: ("status", _status),
    ACTION_STATUS: ("status", _status),  # from /run runs: the same view, answered beside the list
    ACTION_TAIL: ("tail", lambda v, run, held: render_slack.tail_message(v, TAIL_DEFAULT, run.name)),
    ACTION_GPUS: ("gpus", lambda v, run, held: render_slack.gpus_message(v, run.name, run.where, host_lines=held)),
}


async def on_button(ack, body: dict, action: dict, context) -> None:
    await ack()
    services: Services = context["services"]
    started = time.monotonic()
    click = clicks.read(body, action)
    if click is None or click.action_id not in VIEWS:
        return
    view, render = VIEWS[click.action_id]
    # A Status button on a list of runs opens that run's status beside the list, which stays as it was.
    aside = is_alert(click.message) or click.action_id == ACTION_STATUS
    container = {"message_ts": click.message_ts, "is_ephemeral": click.ephemeral}
    with services.tracking():
        outcome, how = await _click(services, click.user, click.channel, click.value, render, container,
                                    click.response_url or None, aside)
    log_event("button", user=click.user, channel=click.channel, command=view, run=click.value[:64], outcome=outcome,
              via=how, ms=round((time.monotonic() - started) * 1000))


def is_alert(message: dict | None) -> bool:
    """Whether the clicked message is a watchdog alert (its buttons include Mute); blocks of another shape are not."""
    for block in _dicts((message or {}).get("blocks")):
        if block.get("type") == "actions" and any(e.get("action_id") == ACTION_MUTE for e in _dicts(block.get("elements"))):
            return True
    return False


def _dicts(items) -> list[dict]:
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


async def _click(services: Services, user: str, channel: str, name: str, render, container: dict,
                 response_url: str | None, aside: bool = False) -> tuple[str, str]:
    """Re-probe and show the view: in place of the clicked message, or `aside` (a new private answer)."""
    run = clicks.clicked_run(services.registry, user, channel, name)
    if isinstance(run, clicks.Refused):
        # A side note to the clicker only; the message stays as it was.
        if response_url:
            await say_privately(response_url, render_slack.error_message(run.text))
        return run.outcome, "response_url"
    if render is VIEWS[ACTION_GPUS][1]:  # the same answer as /run gpus: the host's word on who holds them
        seen = [r for r in services.registry.runs.values() if services.registry.access.allows(user, channel, r)]
        verdict, held = await asyncio.gather(services.check(run),
                                             ownership(services.registry, run, seen, services.scheduler))
    else:
        verdict, held = await services.check(run), []
    message = render(verdict, run, held)
    outcome = "unreachable" if not verdict.reached else "ok"
    if aside:
        # An alert is the channel's record of an incident (and carries its Mute button), a list of runs
        # the way to the others: replacing either would lose it for everyone. The clicker alone gets the view.
        if response_url and await say_privately(response_url, message):
            return outcome, "response_url"
        return "undelivered", "none"
    ts = container.get("message_ts")
    # Ephemeral messages exist only on the clicker's screen: only their response_url can edit them.
    # A channel message is edited with chat.update, which also works long after response_url expires.
    if ts and channel and not container.get("is_ephemeral"):
        try:
            await services.chat.chat_update(channel=channel, ts=ts, text=message["text"], blocks=message["blocks"])
            return outcome, "chat.update"
        except SlackApiError as exc:  # e.g. cant_update_message: a message not posted by this bot
            log.warning("chat.update failed (%s); trying response_url", exc.response.get("error"))
        except Exception as exc:  # Slack unreachable even after the retries
            log.warning("chat.update failed (%s: %s); trying response_url", type(exc).__name__, exc)
    if response_url and await send_response(response_url, {**message, "replace_original": True}):
        return outcome, "response_url"
    return "undelivered", "none"


def register(app) -> None:
    for action_id in VIEWS:
        app.action(action_id)(on_button)
