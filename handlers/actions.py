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
from handlers.commands import (
    NOT_ALLOWED,
    log,
    log_event,
    send_response,
)

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
    view, render = VIEWS[action["action_id"]]
    user = (body.get("user") or {}).get("id", "")
    container = body.get("container") or {}
    channel = (body.get("channel") or {}).get("id") or container.get("channel_id", "")
    response_url = body.get("response_url")
    name = action.get("value", "")
    # A Status button on a list of runs opens that run's status beside the list, which stays as it was.
    aside = is_alert(body.get("message")) or action["action_id"] == ACTION_STATUS
    with services.tracking():
        outcome, how = await _click(services, user, channel, name, render, container, response_url, aside)
    log_event("button", user=user, channel=channel, command=view, run=name[:64], outcome=outcome, via=how,
              ms=round((time.monotonic() - started) * 1000))


def is_alert(message: dict | None) -> bool:
    """Whether the clicked message is a watchdog alert (its buttons include Mute)."""
    for block in (message or {}).get("blocks") or ():
        if block.get("type") == "actions" and any(e.get("action_id") == ACTION_MUTE for e in block.get("elements") or ()):
            return True
    return False


async def _click(services: Services, user: str, channel: str, name: str, render, container: dict,
                 response_url: str | None, aside: bool = False) -> tuple[str, str]:
    """Re-probe and show the view: in place of the clicked message, or `aside` (a new private answer)."""
    run = services.registry.runs.get(name)
    if run is None or not services.registry.access.allows(user, channel, run):
        # A side note to the clicker only; the message stays as it was.
        why = NOT_ALLOWED if run is not None else f"run “{name}” is no longer configured"
        if response_url:
            await send_response(response_url, {**render_slack.error_message(why), "response_type": "ephemeral",
                                               "replace_original": False})
        return ("refused" if run is not None else "unknown_run"), "response_url"
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
        if response_url and await send_response(response_url, {**message, "response_type": "ephemeral",
                                                                "replace_original": False}):
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
