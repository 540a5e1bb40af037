"""How runbot's calls to Slack are retried: never a repeat that could double a message, never an unbounded wait (shell)."""

from __future__ import annotations

import asyncio
import email.utils
import math
import random
import time
from typing import Optional

from aiohttp import ClientConnectorError, ClientOSError, ServerConnectionError
from slack_sdk.http_retry.async_handler import AsyncRetryHandler
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.http_retry.state import RetryState

# Web API methods that create something: a repeat after a dropped connection can post twice.
# The watchdog's outbox retries these itself, looking first for the message an attempt may have
# left (bot/watchdog.py); the transport must not. Everything else runbot calls is idempotent.
CREATING_METHODS = frozenset({
    "chat.postMessage", "chat.postEphemeral", "chat.scheduleMessage", "chat.meMessage",
    "files.upload", "files.completeUploadExternal", "conversations.create",
})
RATE_LIMIT_WAIT_S = 2.0  # a 429 is waited out inside one call only this long; longer is its caller's to decide


def retry_after(value: str | None, now: float) -> float | None:
    """Seconds a Retry-After header asks for (RFC 9110 §10.2.3), or None when it says nothing usable.

    Its two forms are delay-seconds (`120`) and an HTTP-date; a fractional `1.5`, which the RFC does
    not allow but servers send, is read as the number it is rather than failing the call.
    """
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None or when.tzinfo is None:
            return None
        seconds = when.timestamp() - now
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _method(request: HttpRequest) -> str:
    return request.url.rstrip("/").rsplit("/", 1)[-1]


class SafeConnectionRetry(AsyncRetryHandler):
    """Retries a call whose connection failed, once — but a call that creates a message only when
    the connection was never made (nothing can have been sent). `creating=True` treats every call
    of the client as creating (a response_url client: each post is a message)."""

    def __init__(self, *, creating: bool = False, max_retry_count: int = 1) -> None:
        super().__init__(max_retry_count)
        self.creating = creating

    async def _can_retry_async(self, *, state: RetryState, request: HttpRequest,
                               response: Optional[HttpResponse] = None, error: Optional[Exception] = None) -> bool:
        if error is None:
            return False
        if isinstance(error, ClientConnectorError):  # refused, unreachable, DNS: the request never left
            return True
        if self.creating or _method(request) in CREATING_METHODS:
            return False  # it may have landed: a repeat could post it twice
        return isinstance(error, (ServerConnectionError, ClientOSError))


class BoundedRateLimitRetry(AsyncRetryHandler):
    """Waits out a 429 inside the call when Slack asks for at most `max_wait` seconds (in all);
    a longer Retry-After ends the call with the 429, for its caller to schedule (chat.ChatError)."""

    def __init__(self, *, max_wait: float = RATE_LIMIT_WAIT_S, max_retry_count: int = 2) -> None:
        super().__init__(max_retry_count)
        self.max_wait = max_wait

    async def _can_retry_async(self, *, state: RetryState, request: HttpRequest,
                               response: Optional[HttpResponse] = None, error: Optional[Exception] = None) -> bool:
        if response is None or response.status_code != 429:
            return False
        wait = asked_wait(response.headers)
        spent = (state.custom_values or {}).get("rate_limit_waited", 0.0)  # state lives as long as the call
        if wait is None or spent + wait > self.max_wait:
            return False
        state.custom_values = {**(state.custom_values or {}), "rate_limit_waited": spent + wait}
        return True

    async def prepare_for_next_attempt_async(self, *, state: RetryState, request: HttpRequest,
                                             response: Optional[HttpResponse] = None,
                                             error: Optional[Exception] = None) -> None:
        state.next_attempt_requested = True
        wait = asked_wait(response.headers) if response is not None else None
        await asyncio.sleep((wait or 0.0) + random.random() * 0.1)
        state.increment_current_attempt()


def asked_wait(headers) -> float | None:
    """The wait a 429's headers ask for (a dict of str or of lists of str, any key case)."""
    for key, values in (headers or {}).items():
        if key.lower() == "retry-after":
            value = values[0] if isinstance(values, (list, tuple)) and values else values
            return retry_after(str(value), time.time())
    return 1.0  # a 429 without the header: Slack always sends one, but a second is a fair guess


def web_api_retries() -> list[AsyncRetryHandler]:
    """For the Web API client (the watchdog's posts and edits, buttons' chat.update)."""
    return [SafeConnectionRetry(), BoundedRateLimitRetry()]


def response_url_retries() -> list[AsyncRetryHandler]:
    """For posts to a response_url: each one is a message, so only a connection never made is retried."""
    return [SafeConnectionRetry(creating=True), BoundedRateLimitRetry()]
