"""Alerts delivered through the real slack_sdk client to the local Slack stand-in: retries that cannot
double a message, Retry-After obeyed within bounds, lookups on Slack's own clock, commands never held."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from bot.service.app import make_client
from bot.service.chat import ChatError, SlackChat
from bot.service.slack_http import retry_after
from bot.service.state_file import StateFile
from bot.probe.targets import Targets
from bot.service.watchdog import RETRY_AFTER_CAP_S, Watchdog
from config.registry import parse_registry
from config.settings import Settings
from handlers.commands import send_response
from tests.slack_stub import BOT_TOKEN, SlackStub
from tests.standins import set_age, writer_holding

CONFIG = """
[bot]
check_every = "1s"
alert_channel = "C0ALERTS"
probe_timeout = "5s"

[defaults]
gpu_samples = 1
silence_after = "5s"

[runs.alpha]
host = "local"
log = "alpha.log"
"""
STEPS = "".join(f"step={i} loss=2.{i} tok/s=14200\n" for i in range(1, 6))


@pytest.fixture(scope="module")
def stub():
    with SlackStub() as s:
        yield s


@pytest.fixture
def lab(tmp_path, stub):
    stub.reset()
    (tmp_path / "runs.toml").write_text(CONFIG)
    (tmp_path / "alpha.log").write_text(STEPS)
    registry = parse_registry(CONFIG, tmp_path / "runs.toml")
    settings = Settings(_env_file=None, slack_bot_token=BOT_TOKEN, slack_signing_secret="x", slack_app_token=None,
                        slack_api_base_url=stub.api_url)

    def make(clock=time.time) -> Watchdog:
        chat = SlackChat(make_client(settings))
        return Watchdog(registry, Targets(registry), StateFile.open(tmp_path / "state.sqlite3"), chat, clock=clock)

    return make


def parents(stub: SlackStub) -> list[dict]:
    return [p for p in stub.posts("chat.postMessage") if not p.get("thread_ts")]


# -- Retry-After, read as RFC 9110 says --------------------------------------------------------

@pytest.mark.parametrize("value, seconds", [
    ("120", 120.0), ("0", 0.0), ("1.5", 1.5), (" 3 ", 3.0), ("-4", 0.0), (None, None), ("soon", None), ("", None),
    ("inf", None), ("nan", None),
    ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # a date in the past: no wait
])
def test_retry_after_values(value, seconds):
    assert retry_after(value, now=time.time()) == seconds


def test_retry_after_as_a_date():
    now = 1_445_412_480.0  # Wed, 21 Oct 2015 07:28:00 GMT
    assert retry_after("Wed, 21 Oct 2015 07:30:00 GMT", now) == 120.0


# -- the transport never doubles a message -------------------------------------------------------

async def test_a_dropped_post_is_not_sent_twice_and_the_outbox_adopts_it(lab, stub, tmp_path):
    # slack_sdk's connection retry used to re-send chat.postMessage under the outbox: two parents.
    wd = lab()
    stub.drop_after_doing(times=1, method="chat.postMessage")
    with writer_holding(tmp_path / "alpha.log"):
        set_age(tmp_path / "alpha.log", 60)
        await wd.sweep()  # the parent lands, its answer is lost: in doubt
        assert len(parents(stub)) == 1 and [r.op for r in wd.ledger.pending()] == ["post"]
        await wd.sweep()  # looked for by its key on Slack, found, adopted: not posted again
    assert len(parents(stub)) == 1 and wd.ledger.pending() == []
    assert wd.ledger.thread("alpha", 1)[1] == stub.channel_messages("C0ALERTS")[0]["ts"]  # its thread is the real parent
    await wd.stop()


@pytest.mark.parametrize("offset", [-3600.0, 600.0])
async def test_the_lookup_does_not_trust_the_bots_clock(lab, stub, tmp_path, offset):
    # Slack's clock an hour behind or ten minutes ahead of the bot's: the copy is still found.
    stub.clock_offset = offset
    wd = lab()
    stub.drop_after_doing(times=1, method="chat.postMessage")
    with writer_holding(tmp_path / "alpha.log"):
        set_age(tmp_path / "alpha.log", 60)
        await wd.sweep()
        await wd.sweep()
        stub.drop_after_doing(times=1, method="chat.postMessage")  # now a reply in the thread
        (tmp_path / "alpha.log").write_text(STEPS + "Traceback (most recent call last):\nRuntimeError: boom\n")
        await wd.sweep()
        await wd.sweep()
    posts = stub.posts("chat.postMessage")
    # The parent, the crash, its end-of-run summary: each once, whatever the bot's clock says.
    assert len(parents(stub)) == 1 and len(posts) == 3, [p["text"][:40] for p in posts]
    assert "now crashed" in posts[1]["text"] and "alpha: summary — crashed" in posts[2]["text"]
    await wd.stop()


async def test_edits_are_retried_after_a_dropped_connection(lab, stub):
    # chat.update is idempotent: the transport may repeat it.
    chat = SlackChat(make_client(Settings(_env_file=None, slack_bot_token=BOT_TOKEN, slack_api_base_url=stub.api_url)))
    ts = await chat.post("C0ALERTS", "parent", None)
    stub.drop_after_doing(times=1, method="chat.update")
    await chat.update("C0ALERTS", ts, "edited", None)
    assert [m for m, _, _ in stub.attempts].count("chat.update") == 2


async def test_a_dropped_response_url_post_is_not_repeated(stub):
    stub.reset()
    stub.drop_after_doing(times=1, method="response_url")
    assert await send_response(stub.response_url("once"), {"text": "hi"}) is False
    assert len(stub.responses_to("once")) == 1  # it landed; a repeat would have shown it twice


# -- Retry-After: obeyed, bounded, fractional -----------------------------------------------------

async def test_a_fractional_retry_after_is_waited_out(lab, stub):
    # "1.5" raised inside slack_sdk's own handler (int("1.5")).
    chat = SlackChat(make_client(Settings(_env_file=None, slack_bot_token=BOT_TOKEN, slack_api_base_url=stub.api_url)))
    stub.rate_limit(times=1, retry_after="1.5", method="chat.postMessage")
    started = time.monotonic()
    assert await chat.post("C0ALERTS", "hi", None)
    assert 1.4 < time.monotonic() - started < 5


async def test_a_long_retry_after_ends_the_call_and_quiets_delivery_for_a_bounded_time(lab, stub, tmp_path):
    now = [time.time()]
    wd = lab(clock=lambda: now[0])
    stub.rate_limit(times=None, retry_after="120", method="chat.postMessage")
    with writer_holding(tmp_path / "alpha.log"):
        set_age(tmp_path / "alpha.log", 60)
        started = time.monotonic()
        await wd.sweep()
        assert time.monotonic() - started < 5  # not 120 s inside one call
        attempts = len(stub.attempts)
        now[0] += 10
        await wd.sweep()  # inside the quiet time: Slack is not asked again
        assert len(stub.attempts) == attempts
        stub.clear_failures()
        now[0] += RETRY_AFTER_CAP_S  # 40 s on: past the cap, though Slack asked for 120
        await wd.sweep()
    assert len(parents(stub)) == 1
    await wd.stop()


async def test_a_command_is_answered_while_slack_rate_limits_the_alerts(lab, stub, tmp_path):
    # /run mute answered after 118 s when it waited for the parent's edit behind a 120 s Retry-After.
    wd = lab()
    with writer_holding(tmp_path / "alpha.log"):
        set_age(tmp_path / "alpha.log", 60)
        await wd.sweep()
        assert len(parents(stub)) == 1
        stub.rate_limit(times=None, retry_after="120", method="chat.update")
        started = time.monotonic()
        state = await wd.mute(wd.registry.runs["alpha"], time.time() + 600, by="U1")
        assert time.monotonic() - started < 0.5 and state.muted(time.time())
        await wd.settled(timeout=5)
    assert [r.op for r in wd.ledger.pending("alpha")] == ["update"]  # the edit waits for Slack, the mute holds
    stub.clear_failures()
    await wd.stop()


async def test_a_slack_that_never_answers_costs_a_sweep_one_call_timeout(lab, stub, tmp_path):
    wd = lab()
    wd.chat.call_timeout = 0.5

    async def hang(**kw):
        await asyncio.sleep(3600)

    wd.chat.client.chat_postMessage = hang
    with writer_holding(tmp_path / "alpha.log"):
        set_age(tmp_path / "alpha.log", 60)
        started = time.monotonic()
        await wd.sweep()
        assert time.monotonic() - started < 3
    [row] = wd.ledger.pending("alpha")
    assert row.tried_at is not None  # in doubt: the next attempt looks before it posts
    with pytest.raises(ChatError):
        await wd.chat.post("C0ALERTS", "x", None)
    await wd.stop()
