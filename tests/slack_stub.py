"""A local stand-in for Slack (Web API, response_url, Socket Mode) and signed-request helpers, for sync and async tests.

The stand-in itself lives in the package (bot.demo.lab.slack) so that `runbot demo --cluster` can start it from a
wheel; the signed-request helpers are the tests' own.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

from slack_sdk.signature import SignatureVerifier

from bot.demo.lab.slack import APP_TOKEN, BOT_ID, BOT_TOKEN, BOT_USER, SECRET, TEAM_ID, SlackStub  # noqa: F401

# -- signed requests, as Slack sends them ----------------------------------------------------


def sign(body: str, secret: str = SECRET, timestamp: int | None = None) -> dict[str, str]:
    """The headers Slack adds: X-Slack-Request-Timestamp and X-Slack-Signature (v0 HMAC)."""
    ts = str(int(time.time()) if timestamp is None else timestamp)
    return {
        "Content-Type": "application/x-www-form-urlencoded",
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": SignatureVerifier(secret).generate_signature(timestamp=ts, body=body),
    }


def slash_fields(text: str, *, response_url: str, user_id: str = "U0ALICE", channel_id: str = "C0TEAM",
                 command: str = "/run") -> dict[str, str]:
    return {
        "token": "deprecated-verification-token", "team_id": TEAM_ID, "team_domain": "runbot-test",
        "channel_id": channel_id, "channel_name": "ml-team", "user_id": user_id, "user_name": "alice",
        "command": command, "text": text, "api_app_id": "A0TEST", "is_enterprise_install": "false",
        "response_url": response_url, "trigger_id": f"{uuid.uuid4().int % 10**12}.{TEAM_ID}",
    }


def slash_body(text: str, **kw) -> str:
    """The form body of a /run slash command (see slash_fields for the keywords)."""
    return urllib.parse.urlencode(slash_fields(text, **kw))


def action_payload(action_id: str, value: str, *, response_url: str, user_id: str = "U0ALICE",
                   channel_id: str = "C0TEAM", message_ts: str = "1796000001.000100", ephemeral: bool = False) -> dict:
    payload = {
        "type": "block_actions", "api_app_id": "A0TEST", "token": "deprecated-verification-token",
        "user": {"id": user_id, "username": "alice", "team_id": TEAM_ID},
        "team": {"id": TEAM_ID, "domain": "runbot-test"},
        "container": {"type": "message", "message_ts": message_ts, "channel_id": channel_id, "is_ephemeral": ephemeral},
        "channel": {"id": channel_id, "name": "ml-team"},
        "trigger_id": f"{uuid.uuid4().int % 10**12}.{TEAM_ID}",
        "response_url": response_url,
        "actions": [{"type": "button", "action_id": action_id, "block_id": "b1", "value": value,
                     "text": {"type": "plain_text", "text": action_id}, "action_ts": f"{time.time():.6f}"}],
    }
    if not ephemeral:
        payload["message"] = {"type": "message", "ts": message_ts, "bot_id": BOT_ID, "text": "…", "blocks": []}
    return payload


def action_body(action_id: str, value: str, **kw) -> str:
    """The form body of a button click (block_actions; see action_payload for the keywords)."""
    return urllib.parse.urlencode({"payload": json.dumps(action_payload(action_id, value, **kw))})


def slash_envelope(text: str, **kw) -> dict:
    """A /run slash command as Socket Mode delivers it."""
    return {"envelope_id": str(uuid.uuid4()), "type": "slash_commands", "accepts_response_payload": True,
            "payload": slash_fields(text, **kw)}


def action_envelope(action_id: str, value: str, **kw) -> dict:
    """A button click as Socket Mode delivers it."""
    return {"envelope_id": str(uuid.uuid4()), "type": "interactive", "accepts_response_payload": False,
            "payload": action_payload(action_id, value, **kw)}


def signed_request(body: str, secret: str = SECRET, timestamp: int | None = None) -> tuple[bytes, dict[str, str]]:
    return body.encode(), sign(body, secret, timestamp)


def post(url: str, body: str, headers: dict[str, str], timeout: float = 10.0) -> tuple[int, str]:
    """A blocking POST (for sync tests and subprocess tests): (status, body text)."""
    req = urllib.request.Request(url, data=body.encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
