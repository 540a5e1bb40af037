"""The pure request checks of HTTP mode: timestamps and body shapes, table-driven."""

from __future__ import annotations

import json
import urllib.parse

import pytest

from bot.service.slack_requests import WINDOW_S, SeenSignatures, body_fault, timestamp_fault

FORM = "application/x-www-form-urlencoded"


def form(**fields) -> str:
    return urllib.parse.urlencode(fields)


def interaction(payload) -> str:
    return form(payload=json.dumps(payload))


GOOD_COMMAND = form(command="/run", text="status x", response_url="https://hooks.slack.com/x", user_id="U1", channel_id="C1")
GOOD_CLICK = interaction({"type": "block_actions", "user": {"id": "U1"}, "actions": [{"action_id": "runbot_refresh"}]})


@pytest.mark.parametrize("value, fault", [
    ("1700000000", None), ("0", None), (None, "missing"), ("", "missing"), ("²", "invalid"), ("١٢٣", "invalid"),
    ("12 ", "invalid"), ("+12", "invalid"), ("-1", "invalid"), ("1e9", "invalid"), ("9" * 13, "invalid"),
])
def test_timestamps(value, fault):
    said = timestamp_fault(value)
    assert (said is None) if fault is None else (fault in said)


@pytest.mark.parametrize("body, content_type, fault", [
    (GOOD_COMMAND, FORM, None),
    (GOOD_CLICK, FORM, None),
    (interaction({"type": "view_submission", "user": {"id": "U1"}}), FORM, None),  # not ours, but well formed: Bolt says 404
    ('{"type": "url_verification", "challenge": "x"}', "application/json", None),
    ("payload=notjson", FORM, "not JSON"),
    (interaction([]), FORM, "not a JSON object"),
    (interaction(None), FORM, "not a JSON object"),
    (interaction(42), FORM, "not a JSON object"),
    (interaction({}), FORM, "no type"),
    (interaction({"type": 3}), FORM, "no type"),
    (interaction({"type": "block_actions", "user": "U1", "actions": [{"action_id": "a"}]}), FORM, "user"),
    (interaction({"type": "block_actions"}), FORM, "without actions"),
    (interaction({"type": "block_actions", "actions": []}), FORM, "without actions"),
    (interaction({"type": "block_actions", "actions": "x"}), FORM, "without actions"),
    (interaction({"type": "block_actions", "actions": [None]}), FORM, "without action_id"),
    (interaction({"type": "block_actions", "actions": [{"action_id": 1}]}), FORM, "without action_id"),
    (form(command="/run", text="status"), FORM, "without response_url, user_id, channel_id"),
    (form(command="", response_url="x", user_id="U", channel_id="C"), FORM, "without command"),
    ("", FORM, "neither"), ("=", FORM, "neither"), ("&&&", FORM, "malformed"), ("%ff%fe=%00", FORM, "malformed"),
    ("a=1", FORM, "neither"),
    ("[]", "application/json", "not a JSON object"), ("null", "application/json", "not a JSON object"),
    ("{", "application/json", "not JSON"), ("[" * 100_000, "application/json", "not JSON"),
    (GOOD_COMMAND, "text/plain", "unsupported content type"),
    ("a=" + "x" * (1 << 20), FORM, "too large"),
])
def test_bodies(body, content_type, fault):
    said = body_fault(body, content_type)
    assert (said is None) if fault is None else (said is not None and fault in said), said


T = 1_800_000_000


@pytest.mark.parametrize("seen, then, first", [
    ([], ("v0=a", T, T), True),
    ([("v0=a", T, T)], ("v0=a", T, T + 1), False),  # replayed a second later
    ([("v0=a", T, T)], ("v0=a", T, T + WINDOW_S), False),  # at the window's edge the signature is still valid
    ([("v0=a", T, T)], ("v0=a", T, T + WINDOW_S + 2), True),  # past it the verifier refuses it anyway: forgotten
    ([("v0=a", T + WINDOW_S, T)], ("v0=a", T + WINDOW_S, T + 2 * WINDOW_S), False),  # a timestamp ahead lives longer
    ([("v0=a", T, T)], ("v0=b", T, T + 1), True),
])
def test_signatures_are_remembered_as_long_as_they_are_valid(seen, then, first):
    memory = SeenSignatures()
    for signature, ts, now in seen:
        assert memory.first_time(signature, ts, now) is True
    assert memory.first_time(*then) is first


def test_memory_is_bounded_and_a_full_memory_refuses_rather_than_forgets():
    memory = SeenSignatures(limit=100)
    for k in range(100):
        assert memory.first_time(f"v0={k}", T, T)
    assert memory.first_time("v0=new", T, T + 1) is None  # cannot tell: refused, nothing forgotten
    assert memory.first_time("v0=0", T, T + 1) is False
    assert len(memory) == 100
    assert memory.first_time("v0=new", T + 60, T + WINDOW_S + 2) is True  # the old ones have expired
    assert len(memory) == 1
