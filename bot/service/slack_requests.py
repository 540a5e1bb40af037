"""Pure: is an HTTP body one of the Slack requests runbot serves? (say what is wrong, never raise)."""

from __future__ import annotations

import heapq
import json
import re
import urllib.parse
from typing import Any

_TIMESTAMP = re.compile(r"[0-9]{1,12}")  # ASCII digits only: str.isdigit() also takes "²" and "١"
MAX_BODY = 1 << 20  # Slack's payloads are a few KiB; a view can reach ~100 KiB
WINDOW_S = 5 * 60  # a signature is accepted while its timestamp is within this of now, either way (slack_sdk)
MAX_REMEMBERED = 50_000  # ~170 requests/s for 5 minutes, ~10 MB; Slack sends one app far fewer


def timestamp_fault(value: str | None) -> str | None:
    """Why an X-Slack-Request-Timestamp cannot be checked (None: it is a plain Unix time)."""
    if not value:
        return "missing X-Slack-Request-Timestamp"
    return None if _TIMESTAMP.fullmatch(value) else "invalid X-Slack-Request-Timestamp"


def body_fault(body: str, content_type: str) -> str | None:
    """Why a (validly signed) body is not a request runbot can handle, in a few words; None if it is.

    Slack sends slash commands as form fields, interactions as a form field `payload` holding a
    JSON object, and Events API callbacks as a JSON object. Anything else would only reach Bolt
    to fail inside it with a traceback.
    """
    if len(body) > MAX_BODY:
        return "body too large"
    if content_type.startswith("application/json"):
        return _object_fault(_json(body), "body")
    if not content_type.startswith("application/x-www-form-urlencoded"):
        return f"unsupported content type {content_type[:60]!r}"
    try:
        fields = dict(urllib.parse.parse_qsl(body, keep_blank_values=True, strict_parsing=True, errors="strict"))
    except (ValueError, UnicodeDecodeError):
        return "malformed form body"
    if "payload" in fields:
        return _interaction_fault(_json(fields["payload"]))
    if "command" in fields:
        missing = [k for k in ("command", "response_url", "user_id", "channel_id") if not fields.get(k)]
        return f"slash command without {', '.join(missing)}" if missing else None
    return "neither a slash command nor an interaction"


_NOT_JSON = object()


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _NOT_JSON


def _object_fault(value: Any, what: str) -> str | None:
    if value is _NOT_JSON:
        return f"{what} is not JSON"
    if not isinstance(value, dict):
        return f"{what} is not a JSON object"
    if not isinstance(value.get("type"), str):
        return f"{what} has no type"
    return None


def _interaction_fault(payload: Any) -> str | None:
    if fault := _object_fault(payload, "payload"):
        return fault
    if not isinstance(payload.get("user", {}), dict):
        return "payload.user is not an object"
    if payload["type"] == "block_actions":
        actions = payload.get("actions")
        if not isinstance(actions, list) or not actions:
            return "block_actions without actions"
        if not all(isinstance(a, dict) and isinstance(a.get("action_id"), str) for a in actions):
            return "an action without action_id"
    return None


class SeenSignatures:
    """The signatures of the requests accepted in the last few minutes, to refuse a request sent twice.

    A valid signature stays valid while its timestamp is within WINDOW_S of now, so each is kept until
    then and no longer: memory follows the rate of requests, and at most `limit` are kept. When that
    many are held, new requests are refused (`full`) rather than an old signature forgotten, which
    would let it be replayed. Slack never sends one twice: its retries are new requests, signed anew.
    """

    def __init__(self, limit: int = MAX_REMEMBERED, window: float = WINDOW_S) -> None:
        self.limit, self.window = limit, window
        self._until: dict[str, float] = {}  # signature -> when it stops being valid anyway
        self._expiring: list[tuple[float, str]] = []  # the same, as a heap, soonest first

    def __len__(self) -> int:
        return len(self._until)

    def first_time(self, signature: str, timestamp: int, now: float) -> bool | None:
        """Whether this (already verified) signature is new, and remember it; None: too many held to tell."""
        while self._expiring and self._expiring[0][0] < now:
            _, old = heapq.heappop(self._expiring)
            self._until.pop(old, None)
        if signature in self._until:
            return False
        if len(self._until) >= self.limit:
            return None
        until = timestamp + self.window + 1.0  # a second more: the verifier read its clock a moment earlier
        self._until[signature] = until
        heapq.heappush(self._expiring, (until, signature))
        return True
