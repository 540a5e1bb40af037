"""Where alerts go: the Chat seam, its adapter over slack_sdk's AsyncWebClient, and a printing stand-in (shell)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any, Protocol

import aiohttp

from bot.service.slack_http import asked_wait

METADATA_TYPE = "runbot_alert"  # message metadata event type: carries the outbox key, so a retry can look first
_TRANSIENT_ERRORS = {"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"}
CALL_TIMEOUT_S = 10.0  # one Slack call, retries inside the client included: a sweep must not wait longer


class ChatError(Exception):
    """A post or edit that did not go through.

    transient: Slack is down, slow or rate-limiting; stop sending this sweep and try again next.
    in_doubt: the message may have been posted anyway (a timeout, a dropped connection).
    retry_after: Slack asked for this many seconds of quiet (a 429 longer than the client waits out).
    """

    def __init__(self, message: str, *, transient: bool = True, in_doubt: bool = False,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.transient, self.in_doubt, self.retry_after = transient, in_doubt, retry_after


class Chat(Protocol):
    """What the watchdog needs from Slack. `key` (optional to honour) tags a message so `find` can see it.

    Optional extras a Chat may have: `async find(channel, key, *, thread_ts=None, after_ts=None) -> ts | None`
    and `channel_id(channel) -> str` (the id behind a "#name" it has posted to).
    """

    async def post(self, channel: str, text: str, blocks: list | None, thread_ts: str | None = None, *,
                   key: str | None = None) -> str: ...

    async def update(self, channel: str, ts: str, text: str, blocks: list | None) -> None: ...


class SlackChat:
    """The Chat over an AsyncWebClient. Errors become ChatError; each call ends within `call_timeout`.

    Retries live in the client's handlers (bot/slack_http.py): short 429s are waited out there,
    and a post is never repeated after a dropped connection — the watchdog's outbox does that,
    looking first (`find`) for the copy an interrupted attempt may have left."""

    def __init__(self, client: Any, *, call_timeout: float = CALL_TIMEOUT_S) -> None:
        self.client, self.call_timeout = client, call_timeout
        self._ids: dict[str, str] = {}  # "#name" -> channel id, learnt from chat.postMessage answers

    def channel_id(self, channel: str) -> str:
        return self._ids.get(channel, channel)

    async def post(self, channel: str, text: str, blocks: list | None, thread_ts: str | None = None, *,
                   key: str | None = None) -> str:
        extra = {"metadata": {"event_type": METADATA_TYPE, "event_payload": {"key": key}}} if key else {}
        answer = await self._call("chat_postMessage", channel=channel, text=text, blocks=blocks, thread_ts=thread_ts,
                                  unfurl_links=False, unfurl_media=False, **extra)
        if answer.get("channel"):
            self._ids[channel] = answer["channel"]
        return answer["ts"]

    async def update(self, channel: str, ts: str, text: str, blocks: list | None) -> None:
        await self._call("chat_update", channel=self.channel_id(channel), ts=ts, text=text, blocks=blocks)

    async def find(self, channel: str, key: str, *, thread_ts: str | None = None,
                   after_ts: str | None = None) -> str | None:
        """The ts of a message this bot posted with `key`, if Slack has it (needs the *:history scopes).

        Keys are unique, so no time window is needed to tell ours from others: a channel is read
        newest first (200 messages), a thread from `after_ts` — a ts of Slack's own, the last message
        known to be in it — so neither the bot's clock nor a long thread can hide the copy."""
        args: dict[str, Any] = {"channel": self.channel_id(channel), "include_all_metadata": True, "limit": 200}
        if thread_ts:
            method, args["ts"] = "conversations_replies", thread_ts
            if after_ts:
                args["oldest"] = after_ts
        else:
            method = "conversations_history"
        answer = await self._call(method, **args)
        for message in answer.get("messages") or ():
            meta = message.get("metadata") or {}
            if meta.get("event_type") == METADATA_TYPE and (meta.get("event_payload") or {}).get("key") == key:
                return message.get("ts")
        return None

    async def _call(self, method: str, **args: Any) -> dict:
        from slack_sdk.errors import SlackApiError

        try:
            call = getattr(self.client, method)(**{k: v for k, v in args.items() if v is not None})
            answer = await asyncio.wait_for(call, self.call_timeout)
            return answer.data if hasattr(answer, "data") else dict(answer)
        except SlackApiError as exc:
            status = getattr(exc.response, "status_code", 200)
            error = _error_code(exc.response)
            if status == 429:  # not acted on: never in doubt; the caller waits as long as Slack asked
                wait = asked_wait(getattr(exc.response, "headers", None))
                raise ChatError(f"{method}: rate limited (Retry-After {wait:g} s)" if wait is not None
                                else f"{method}: rate limited", retry_after=wait) from None
            transient = status >= 500 or error in _TRANSIENT_ERRORS
            raise ChatError(f"{method}: {error or 'HTTP ' + str(status)}", transient=transient,
                            in_doubt=status >= 500) from None
        except (TimeoutError, asyncio.TimeoutError, aiohttp.ClientError, OSError) as exc:  # it may or may not have landed
            raise ChatError(f"{method}: {type(exc).__name__}: {exc}" if str(exc) else f"{method}: {type(exc).__name__}",
                            in_doubt=True) from None


def _error_code(response: Any) -> str:
    try:
        return str(response.get("error") or "")
    except (AttributeError, TypeError, ValueError):  # a 5xx page that was not JSON
        return ""


# How the printing chat shows Slack's emoji codes and escapes in a terminal.
_TERMINAL = {":red_circle:": "🔴", ":large_orange_circle:": "🟠", ":large_yellow_circle:": "🟡",
             ":white_check_mark:": "✅", ":checkered_flag:": "🏁", ":x:": "❌", ":stopwatch:": "⏱", ":no_bell:": "🔕",
             ":bell:": "🔔", "&lt;": "<", "&gt;": ">", "&amp;": "&"}


_DATE = re.compile(r"<!date\^[0-9]+\^[^|>]*\|([^>]*)>")  # a Slack date token: a terminal shows its fallback


def terminal(text: str) -> str:
    first = _DATE.sub(r"\1", text.splitlines()[0] if text else "")
    for code, shown in _TERMINAL.items():
        first = first.replace(code, shown)
    return first


class PrintingChat:
    """A chat that prints what it would post, thread replies indented (the demo; alerts without a workspace)."""

    def __init__(self, say: Callable[[str], None] = print) -> None:
        self.say, self._next = say, 0
        self.calls: list[tuple[str, dict]] = []

    async def post(self, channel: str, text: str, blocks: list | None, thread_ts: str | None = None, *,
                   key: str | None = None) -> str:
        self._next += 1
        ts = f"{self._next}.000100"
        self.calls.append(("post", {"channel": channel, "text": text, "thread_ts": thread_ts, "ts": ts}))
        self.say(f"   ↳ in the thread: {terminal(text)}" if thread_ts else f"{channel}: {terminal(text)}")
        return ts

    async def update(self, channel: str, ts: str, text: str, blocks: list | None) -> None:
        self.calls.append(("update", {"channel": channel, "ts": ts, "text": text}))
        self.say(f"   ✎ the parent now reads: {terminal(text)}")
