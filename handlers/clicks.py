"""A button click read once, as typed fields, and the run it names checked the way /run checks one.

Slack sends each field with one type; a payload that does not (a list where the run name goes) is
no click of ours: it is logged in one line and acknowledged, never a traceback (issue 19.10).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from config.registry import Registry, Run
from handlers.commands import NOT_ALLOWED, log, may_use


@dataclass(frozen=True)
class Click:
    """What a listener needs of one button press."""

    action_id: str
    value: str  # what the button carries: a run's name, or "RUN METRIC SECONDS" on a chart button
    user: str
    channel: str
    response_url: str = ""  # "" when the click came without one
    message_ts: str = ""
    ephemeral: bool = False  # the clicked message exists only on the clicker's screen
    message: dict = field(default_factory=dict)  # the clicked message as Slack sent it ({} for an ephemeral one)


@dataclass(frozen=True)
class Refused:
    """Why a click does nothing: said to the clicker alone."""

    text: str
    outcome: str  # for the log: "refused" or "unknown_run"


class _Malformed(Exception):
    pass


def read(body: Any, action: Any) -> Click | None:
    """The click, or None (and one log line) when a field is not of the type Slack sends."""
    try:
        container = _get(body, "container", dict, {}, "payload")
        channel = _get(_get(body, "channel", dict, {}, "payload"), "id", str, "", "channel") \
            or _get(container, "channel_id", str, "", "container")
        return Click(
            action_id=_get(action, "action_id", str, "", "action"),
            value=_get(action, "value", str, "", "action"),
            user=_get(_get(body, "user", dict, {}, "payload"), "id", str, "", "user"),
            channel=channel,
            response_url=_get(body, "response_url", str, "", "payload"),
            message_ts=_get(container, "message_ts", str, "", "container"),
            ephemeral=_get(container, "is_ephemeral", bool, False, "container"),
            message=_get(body, "message", dict, {}, "payload"),
        )
    except _Malformed as exc:
        action_id = action.get("action_id") if isinstance(action, dict) else None
        log.warning("button %.64s: malformed payload (%s); ignored", action_id if isinstance(action_id, str) else "?", exc)
        return None


def _get(where: Any, key: str, kind: type, default: Any, what: str) -> Any:
    if not isinstance(where, dict):
        raise _Malformed(f"{what} is {type(where).__name__}")
    value = where.get(key)
    if value is None:  # absent, or JSON null: Slack leaves out what a surface does not have
        return default
    if not isinstance(value, kind):
        raise _Malformed(f"{what}.{key} is {type(value).__name__}")
    return value


def not_known(name: str) -> str:
    """A run gone from the configuration and one the clicker may not see: the same words, so that a
    button cannot be used to learn which runs exist (as /run answers a hidden run like a missing one)."""
    return f"run “{name[:64]}” is not known here"


def clicked_run(registry: Registry, user: str, channel: str, name: str) -> Run | Refused:
    """The run `name` if this clicker may see it in this channel. Someone who may use nothing here is
    refused as a slash command refuses them."""
    if not may_use(registry, user, channel):
        return Refused(NOT_ALLOWED, "refused")
    run = registry.runs.get(name)
    if run is None or not registry.access.allows(user, channel, run):
        return Refused(not_known(name), "unknown_run")
    return run
