"""/run and its buttons, end to end over real HTTP: signed requests in, a local Slack stand-in out."""

from __future__ import annotations

import contextlib
import asyncio
import json
import logging
import time
import types
import urllib.parse
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from bot.render import slack as rs
from bot.service import app as app_module
from bot.probe.scheduler import FRESH_S
from bot.service.app import build_app, make_services
from bot.service.serve import JsonLines, http_runner
from config.registry import load_registry
from config.settings import Settings
from handlers import commands
from tests.slack_stub import (
    BOT_TOKEN,
    SECRET,
    SlackStub,
    action_body,
    action_payload,
    sign,
    slash_body,
)
from tests.standins import fake_nvidia_smi, path_with, writer_holding

SMI = "0, 31395, 143771, 97\n1, 30000, 143771, 99\n2, 18211, 143771, 88\n"
HOSTILE_LOG = (
    "step=1 loss=2.5 tok/s=900\n"
    "step=2 loss=2.4 tok/s=910 <!channel> please look <@U0BOSS> @here\n"
    "export SLACK_BOT_TOKEN=xoxb-123456789012-abcdefghijkl HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz123456\n"
    "\x1b[32mgreen\x1b[0m done & dusted\n"
)


@pytest.fixture(scope="module")
def stub():
    with SlackStub() as s:
        yield s


class Bot:
    """runbot's app on a local port, with two local runs on tmp logs and a stand-in nvidia-smi."""

    def __init__(self, tmp: Path, stub: SlackStub, *, access: str = "", dflash_extra: str = "", bot_extra: str = "",
                 smi_delay: float = 0.0, log: str = HOSTILE_LOG, timeouts: dict | None = None) -> None:
        self.tmp, self.stub = tmp, stub
        self.timeouts = timeouts or {}
        (tmp / "dflash.log").write_text(log)
        (tmp / "llama.log").write_text("step=10 loss=1.5 it/s=3.2\n")
        bin_dir = tmp / "bin"
        fake_nvidia_smi(bin_dir, [SMI])
        if smi_delay:
            (bin_dir / "nvidia-smi").rename(bin_dir / "nvidia-smi.real")
            (bin_dir / "nvidia-smi").write_text(f'#!/usr/bin/env bash\nsleep {smi_delay}\nexec "$(dirname "$0")/nvidia-smi.real" "$@"\n')
            (bin_dir / "nvidia-smi").chmod(0o755)
        self.smi_counter = bin_dir / "smi-rounds" / "counter"
        (tmp / "runs.toml").write_text(
            f"[bot]\n{bot_extra}\n{access}\n"
            f'[runs.dflash]\nhost = "local"\nlog = "{tmp / "dflash.log"}"\ngpu_samples = 1\nsilence_after = "1h"\n{dflash_extra}\n'
            f"[runs.dflash.gpus]\ntarget = [0, 1]\ndrafter = [2]\n"
            f'[runs.llama-7b]\nhost = "local"\nlog = "{tmp / "llama.log"}"\ngpu_samples = 1\nsilence_after = "1h"\n'
        )
        self.registry = load_registry(tmp / "runs.toml")
        self.settings = Settings(_env_file=None, slack_bot_token=BOT_TOKEN, slack_signing_secret=SECRET,
                                 slack_app_token=None, slack_api_base_url=stub.api_url)
        self.services = make_services(self.registry, self.settings, local_env=path_with(bin_dir))
        self.app = build_app(self.registry, self.settings, self.services)
        self.names = iter(f"r{i}" for i in range(10_000))

    @property
    def probes(self) -> int:
        """--query-gpu calls so far: one per probe (the driver's window, or gpu_samples = 1)."""
        return int(self.smi_counter.read_text())

    async def __aenter__(self) -> Bot:
        # Each run's training process holds its log open, as a real one does.
        self.writers = contextlib.ExitStack()
        for name in ("dflash.log", "llama.log"):
            self.writers.enter_context(writer_holding(self.tmp / name))
        self.runner = http_runner(self.app, self.settings, **self.timeouts)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        self.session = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.session.close()
        await self.runner.cleanup()
        await self.services.drain(5)
        await self.services.targets.close()
        self.writers.close()

    async def post(self, body: str, headers: dict) -> tuple[int, str, float]:
        started = time.monotonic()
        async with self.session.post(f"{self.url}/slack/events", data=body, headers=headers) as resp:
            return resp.status, await resp.text(), time.monotonic() - started

    async def command(self, text: str, *, user: str = "U0ALICE", channel: str = "C0TEAM") -> tuple[str, int, float]:
        """Send `/run text`; returns (response name, HTTP status, seconds to the ack)."""
        name = next(self.names)
        body = slash_body(text, response_url=self.stub.response_url(name), user_id=user, channel_id=channel)
        status, _, took = await self.post(body, sign(body))
        return name, status, took

    async def answer(self, name: str, timeout: float = 15) -> dict:
        return (await self.stub.until(lambda: self.stub.responses_to(name), timeout))[0]

    async def ask(self, text: str, **kw) -> dict:
        name, status, _ = await self.command(text, **kw)
        assert status == 200
        return await self.answer(name)

    async def click(self, action_id: str, value: str = "dflash", *, user: str = "U0ALICE", ephemeral: bool = False,
                    ts: str = "1796000042.000100") -> tuple[str, int]:
        name = next(self.names)
        body = action_body(action_id, value, response_url=self.stub.response_url(name), user_id=user,
                           ephemeral=ephemeral, message_ts=ts)
        status, _, _ = await self.post(body, sign(body))
        return name, status


@pytest.fixture
def make_bot(tmp_path, stub):
    stub.reset()
    return lambda **kw: Bot(tmp_path, stub, **kw)


def lines(payload: dict) -> list[str]:
    return payload["text"].splitlines()


def all_text(payload: dict) -> str:
    return json.dumps(payload, ensure_ascii=False)


# -- acknowledged at once, answered through response_url -------------------------------------


async def test_the_ack_comes_at_once_whatever_the_probe_takes(make_bot):
    async with make_bot(smi_delay=1.5) as bot:
        await bot.ask("help")  # the first request pays for auth.test
        name, status, ack = await bot.command("status dflash")
        assert status == 200 and ack < 0.5
        started = time.monotonic()
        answer = await bot.answer(name)
        assert time.monotonic() - started > 1.0  # the answer came later, through response_url
        assert lines(answer)[0].startswith("dflash: step 2 · 910 tok/s")


async def test_status_answers_with_the_verdict_first(make_bot, stub):
    async with make_bot() as bot:
        answer = await bot.ask("status dflash")
    assert answer["response_type"] == "ephemeral"
    assert lines(answer)[0].startswith("dflash: step 2 · 910 tok/s · loss 2.4 · ")
    assert answer["blocks"][0]["text"]["text"].startswith(":large_green_circle: *dflash*: step 2")
    assert "\ntraining · local · " in answer["text"]  # the phase and where, the run named once (first)
    assert [e["action_id"] for e in answer["blocks"][-1]["elements"]] == ["runbot.refresh", "runbot.tail", "runbot.gpus"]
    assert stub.posts("auth.test")  # Bolt checked the token against the stand-in, nowhere else


async def test_a_prefix_names_the_run_and_here_posts_in_the_channel(make_bot):
    async with make_bot() as bot:
        answer = await bot.ask("status ll here")
    assert answer["response_type"] == "in_channel"
    assert answer["text"].startswith("llama-7b: ") and "\ntraining · local · " in answer["text"]


async def test_gpus_answer(make_bot):
    async with make_bot() as bot:
        answer = await bot.ask("gpus dflash")
    assert lines(answer)[1:] == ["target 0–1 busy", "drafter 2 busy", "util from driver window 14 s, 71 samples"]
    code = next(b["text"]["text"] for b in answer["blocks"] if b["type"] == "section" and b["text"]["text"].startswith("```"))
    assert "target:" in code and "drafter:" in code


async def test_tail_answer_with_and_without_n(make_bot):
    async with make_bot() as bot:
        two = await bot.ask("tail dflash 2")
        default = await bot.ask("TAIL dflash")
    code = [b["text"]["text"] for b in two["blocks"] if b["type"] == "section" and b["text"]["text"].startswith("```")]
    assert len(code) == 1 and "green done" in code[0] and "step=1 " not in code[0]
    assert "step=1 loss=2.5" in all_text(default)


@pytest.mark.parametrize("text", ["tail dflash -n 2", "tail dflash -n2", "tail dflash --lines=2", "tail -n 2 dflash"])
async def test_tail_takes_n_as_an_option_too_as_the_cli_does(make_bot, text):
    async with make_bot() as bot:
        by_word = await bot.ask("tail dflash 2")
        by_option = await bot.ask(text)
    assert by_option["blocks"][1:] == by_word["blocks"][1:] and "```" in all_text(by_option)


async def test_the_status_button_in_the_runs_list_answers_beside_the_list(make_bot, stub):
    async with make_bot() as bot:
        listing = await bot.ask("runs")
        button = next(b["accessory"] for b in listing["blocks"] if b.get("accessory", {}).get("value") == "dflash")
        name, status = await bot.click(button["action_id"], button["value"])
        answer = await bot.answer(name)
    assert status == 200 and answer["replace_original"] is False and answer["response_type"] == "ephemeral"
    assert lines(answer)[0].startswith("dflash: step 2") and "*writer*" in all_text(answer)
    assert stub.posts("chat.update") == []  # the list stays, for the next run's button


@pytest.mark.parametrize("text", ["", "runs", "here"])
async def test_runs_lists_every_run(make_bot, text):
    async with make_bot() as bot:
        answer = await bot.ask(text)
    assert {line.split(":")[0] for line in lines(answer)} == {"dflash", "llama-7b"}
    assert answer["response_type"] == ("in_channel" if text == "here" else "ephemeral")


async def test_help_and_unknown_subcommands(make_bot):
    async with make_bot() as bot:
        help_ = await bot.ask("help")
        unknown = await bot.ask("frobnicate <!channel>")
        nearly = await bot.ask("dflash")
    for name in ("status RUN", "gpus RUN", "tail RUN [N]", "runs", "help"):
        assert f"/run {name}" in help_["text"]
    assert lines(unknown)[0] == "unknown command “frobnicate”"
    assert "/run status RUN" in unknown["text"]
    assert "did you mean /run status dflash?" in lines(nearly)[0]


@pytest.mark.parametrize("text, usage", [
    ("tail dflash 20 extra", "usage: /run tail RUN [N]"),
    ("tail dflash lots", "usage: /run tail RUN [N]"),
    ("tail dflash 0", "usage: /run tail RUN [N]"),
    ("tail dflash -n", "usage: /run tail RUN [N]"),
    ("tail dflash -n 0", "usage: /run tail RUN [N]"),
    ("tail dflash 5 -n 5", "usage: /run tail RUN [N]"),
    ("status", "usage: /run status RUN"),
    ("status dflash now", "usage: /run status RUN"),
    ("runs all", "usage: /run runs"),
])
async def test_words_a_command_does_not_take_show_its_usage_and_run_nothing(make_bot, text, usage):
    async with make_bot() as bot:
        answer = await bot.ask(text)
        assert bot.probes == 0
    assert lines(answer)[0].startswith(usage)
    assert answer["response_type"] == "ephemeral"


async def test_unknown_and_ambiguous_runs_list_the_known_ones(make_bot):
    async with make_bot() as bot:
        unknown = await bot.ask("status gpt5 here")
        assert bot.probes == 0
    assert lines(unknown)[0] == 'unknown run "gpt5" (known: dflash, llama-7b)'
    assert unknown["response_type"] == "ephemeral"  # mistakes are not posted in the channel


# -- access control ---------------------------------------------------------------------------


async def test_a_user_outside_access_is_refused_and_nothing_runs(make_bot, caplog):
    caplog.set_level(logging.INFO, "runbot.commands")
    async with make_bot(access='[access]\nusers = ["U0ALICE"]\nchannels = ["C0TEAM"]') as bot:
        for text in ("status dflash", "runs", "help", "bogus"):
            refused = await bot.ask(text, user="U0MALLORY")
            assert lines(refused)[0].startswith("not allowed") and refused["response_type"] == "ephemeral"
        wrong_channel = await bot.ask("status dflash", channel="C0OTHER")
        assert lines(wrong_channel)[0].startswith("not allowed")
        assert bot.probes == 0
        assert lines(await bot.ask("status dflash"))[0].startswith("dflash: step 2")
    outcomes = [r.runbot["outcome"] for r in caplog.records if getattr(r, "runbot", {}).get("event") == "command"]
    assert outcomes == ["refused"] * 5 + ["ok"]


async def test_a_runs_own_lists_replace_the_global_ones(make_bot):
    access = '[access]\nusers = ["U0ALICE"]'
    async with make_bot(access=access, dflash_extra='users = ["U0BOB"]') as bot:
        assert lines(await bot.ask("status dflash", user="U0BOB"))[0].startswith("dflash: step 2")
        # A run the user may not see is answered exactly as one that does not exist (issue 9.5).
        assert lines(await bot.ask("status llama", user="U0BOB"))[0] == 'unknown run "llama" (known: dflash)'
        assert lines(await bot.ask("status dflash"))[0] == 'unknown run "dflash" (known: llama-7b)'  # Alice
        runs = await bot.ask("runs", user="U0BOB")
        assert [line.split(":")[0] for line in lines(runs)] == ["dflash"]
        unknown = await bot.ask("status nope", user="U0BOB")
        assert lines(unknown)[0] == 'unknown run "nope" (known: dflash)'


async def test_hidden_runs_leak_through_no_answer(make_bot):
    # Bob may see dflash only. Every answer he can provoke must read as if llama-7b did not exist:
    # each command about it is answered exactly as the same command about a name nobody has.
    asks = [("status {}", "llama-7b", "qwen-7b"), ("status {}", "l", "q"), ("gpus {}", "lla", "qwe"),
            ("tail {} 5", "llama-7b", "qwen-7b"), ("{}", "llama-7b", "qwen-7b"), ("status {}", "LLAMA", "QWEN")]
    async with make_bot(access='[access]\nusers = ["U0ALICE"]', dflash_extra='users = ["U0BOB"]') as bot:
        for template, hidden, absent in asks:
            seen = json.dumps(await bot.ask(template.format(hidden), user="U0BOB"))
            other = json.dumps(await bot.ask(template.format(absent), user="U0BOB"))
            assert seen == other.replace(absent, hidden), template.format(hidden)
        assert bot.probes == 0
        # Over all runs "status " + "d" or "l" would differ; over Bob's runs "d" is dflash itself.
        assert lines(await bot.ask("status d", user="U0BOB"))[0].startswith("dflash: step 2")


# -- requests that are not from Slack ------------------------------------------------------------


async def test_bad_signature_and_stale_or_missing_timestamps_are_rejected(make_bot, stub):
    async with make_bot() as bot:
        body = slash_body("status dflash", response_url=stub.response_url("evil"))
        forged = sign(body, secret="not-the-secret")
        stale = sign(body, timestamp=int(time.time()) - 6 * 60)  # correctly signed, 6 minutes old
        fresh_enough = sign(body, timestamp=int(time.time()) - 4 * 60)
        garbled = {**sign(body), "X-Slack-Request-Timestamp": "soon"}
        missing = {"Content-Type": "application/x-www-form-urlencoded"}
        for headers in (forged, stale, garbled, missing):
            status, _, _ = await bot.post(body, headers)
            assert status == 401
        tampered_body = body.replace("status", "tail")
        assert (await bot.post(tampered_body, sign(body)))[0] == 401
        await asyncio.sleep(0.3)
        assert stub.responses == [] and bot.probes == 0
        assert (await bot.post(body, fresh_enough))[0] == 200
        await bot.answer("evil")


async def test_healthz(make_bot):
    async with make_bot() as bot, bot.session.get(f"{bot.url}/healthz") as resp:
        assert resp.status == 200 and await resp.json() == {"ok": True}


# -- safe to post -------------------------------------------------------------------------------


async def test_mentions_in_logs_are_escaped_and_tokens_redacted(make_bot):
    async with make_bot() as bot:
        answers = [await bot.ask(t) for t in ("tail dflash", "status dflash here", "runs")]
        answers += [await bot.ask("status <!channel>"), await bot.ask("<@U0BOSS> hello")]
    for answer in answers:
        text = all_text(answer)
        assert "<!" not in text and "<@" not in text
        assert "123456789012-abcdefghijkl" not in text and "abcdefghijklmnopqrstuvwxyz123456" not in text
        assert "\\u001b" not in text
        assert "@here" not in text
    tail = all_text(answers[0])
    assert "&lt;!channel&gt;" in tail and "xoxb-[redacted]" in tail and "hf_[redacted]" in tail


# -- failures are answers ---------------------------------------------------------------------------


async def test_a_probe_that_times_out_answers_with_what_failed(make_bot):
    async with make_bot(bot_extra='probe_timeout = "1s"', smi_delay=5) as bot:
        answer = await bot.ask("status dflash")
    assert lines(answer)[0] == "dflash: probe timed out after 1 s on this machine"
    assert answer["blocks"][0]["text"]["text"].startswith(":red_circle:")


async def test_a_probe_that_raises_answers_with_the_error_not_a_trace(make_bot, monkeypatch):
    async with make_bot() as bot:
        def broken(run):
            raise RuntimeError("ssh pool exploded <!channel>")

        monkeypatch.setattr(bot.services.targets, "runner_for", broken)
        answer = await bot.ask("status dflash")
    assert lines(answer)[0] == "dflash: the probe failed: RuntimeError: ssh pool exploded &lt;!channel&gt;"
    assert "Traceback" not in all_text(answer)


async def test_a_rate_limited_response_url_is_retried(make_bot, stub):
    async with make_bot() as bot:
        await bot.ask("help")
        stub.rate_limit(times=1, retry_after=0, method="response_url")
        answer = await bot.ask("status dflash")
    assert lines(answer)[0].startswith("dflash: step 2")


# -- buttons ----------------------------------------------------------------------------------------


async def test_refresh_on_a_channel_message_updates_it_with_chat_update(make_bot, stub):
    async with make_bot() as bot:
        for action_id, marker in (("runbot.refresh", "*writer*"), ("runbot.tail", "```"), ("runbot.gpus", "target:")):
            before = len(stub.posts("chat.update"))  # counted before the click: a cached verdict answers at once
            _, status = await bot.click(action_id)
            assert status == 200
            update = (await stub.until(lambda b=before: len(stub.posts("chat.update")) > b and stub.posts("chat.update")))[-1]
            assert update["channel"] == "C0TEAM" and update["ts"] == "1796000042.000100"
            assert update["text"].splitlines()[0].startswith("dflash: step 2")
            assert marker in json.dumps(update["blocks"], ensure_ascii=False)
        assert stub.responses == []


async def test_a_button_on_an_ephemeral_message_replaces_it_through_response_url(make_bot, stub):
    async with make_bot() as bot:
        name, _ = await bot.click("runbot.tail", ephemeral=True)
        answer = await bot.answer(name)
    assert answer["replace_original"] is True
    assert "green done" in all_text(answer)
    assert stub.posts("chat.update") == []


async def test_chat_update_failure_falls_back_to_response_url(make_bot, stub):
    async with make_bot() as bot:
        await bot.ask("help")
        stub.fail(status=500, times=1, method="chat.update")
        name, _ = await bot.click("runbot.refresh")
        answer = await bot.answer(name)
    assert answer["replace_original"] is True and lines(answer)[0].startswith("dflash: step 2")


async def test_a_rate_limited_chat_update_is_retried(make_bot, stub):
    async with make_bot() as bot:
        await bot.ask("help")
        stub.rate_limit(times=1, retry_after=0, method="chat.update")
        await bot.click("runbot.refresh")
        await stub.until(lambda: stub.posts("chat.update"))
    assert [status for method, _, status in stub.attempts if method == "chat.update"] == [429, 200]


async def test_a_refused_click_changes_nothing(make_bot, stub):
    async with make_bot(access='[access]\nusers = ["U0ALICE"]') as bot:
        name, _ = await bot.click("runbot.refresh", user="U0MALLORY")
        answer = await bot.answer(name)
        gone, _ = await bot.click("runbot.tail", value="deleted-run")
        gone_answer = await bot.answer(gone)
        assert bot.probes == 0
    assert lines(answer)[0].startswith("not allowed") and answer["replace_original"] is False
    assert gone_answer["text"] == "run “deleted-run” is not known here"  # as a run hidden from the clicker
    assert stub.posts("chat.update") == []


async def test_a_button_on_an_alert_answers_privately_and_leaves_the_alert_alone(make_bot, stub):
    from bot.core.alerts import RunState, Status
    from bot.core.verdict import Concern, Worry
    from bot.render.alerts import parent
    from tests.slack_stub import action_payload

    alert = parent("dflash", RunState(Status.OPEN, Concern(Worry.SILENT), seq=1, announced=True, opened_at=time.time(),
                                      headline="silent 12 min"), None, time.time())
    async with make_bot() as bot:
        for action_id, marker in (("runbot.refresh", "*writer*"), ("runbot.tail", "```"), ("runbot.gpus", "target:")):
            name = next(bot.names)
            payload = action_payload(action_id, "dflash", response_url=stub.response_url(name), channel_id="C0ALERTS",
                                     message_ts="1796000042.000100")
            payload["message"]["blocks"] = alert["blocks"]  # the alert's parent: it has the Mute button
            body = urllib.parse.urlencode({"payload": json.dumps(payload)})
            status, _, _ = await bot.post(body, sign(body))
            assert status == 200
            answer = await bot.answer(name)
            assert answer["response_type"] == "ephemeral" and answer["replace_original"] is False
            assert lines(answer)[0].startswith("dflash: step 2") and marker in all_text(answer)
    assert stub.posts("chat.update") == []  # the incident and its Mute button stay for everyone


# -- the log, and the seam for other subcommands -------------------------------------------------


async def test_every_command_is_one_structured_log_line(make_bot, caplog):
    caplog.set_level(logging.INFO, "runbot.commands")
    async with make_bot() as bot:
        await bot.ask("tail dfl 3 here")
        await bot.click("runbot.gpus", ephemeral=True)
        await bot.stub.until(lambda: len(bot.stub.responses) == 2)
        await asyncio.sleep(0.05)
    records = [r for r in caplog.records if hasattr(r, "runbot")]
    command, button = (r.runbot for r in records)
    assert command == {"event": "command", "user": "U0ALICE", "channel": "C0TEAM", "command": "tail", "args": ["dfl", "3"],
                       "run": "dflash", "here": True, "outcome": "ok", "delivered": True, "ms": command["ms"]}
    assert button["event"] == "button" and button["command"] == "gpus" and button["via"] == "response_url"
    line = JsonLines().format(records[0])
    assert "\n" not in line and json.loads(line)["outcome"] == "ok"


@pytest.fixture
def follow_module(monkeypatch):
    """A stand-in for another developer's listener module: decorates a subcommand, registers a listener."""
    monkeypatch.setattr(commands, "SUBCOMMANDS", dict(commands.SUBCOMMANDS))  # restored afterwards
    registered = []
    module = types.ModuleType("tests_fake_follow")

    @commands.subcommand("follow", "follow RUN", "follow a restart until the first step")
    async def follow(req: commands.CommandRequest) -> commands.Reply:
        run = req.run(req.args[0])
        return req.reply(rs.error_message(f"following {run.name}"))

    module.register = registered.append
    monkeypatch.setattr(app_module, "LISTENERS", (*app_module.LISTENERS, module))
    return registered


async def test_other_modules_add_subcommands_and_listeners(make_bot, follow_module):
    async with make_bot() as bot:
        assert follow_module == [bot.app]
        help_ = await bot.ask("help")
        followed = await bot.ask("follow dfl")
        usage = await bot.ask("follow")
    assert "/run follow RUN — follow a restart" in help_["text"]
    assert help_["text"].splitlines()[-1].startswith("/run help")
    assert lines(followed)[0] == "following dflash"
    assert lines(usage)[0].startswith("usage: /run follow RUN")


# -- the stand-in itself (the watchdog's tests lean on it too) --------------------------------------


def test_the_stub_behaves_like_slacks_web_api(stub):
    from slack_sdk import WebClient
    from slack_sdk.errors import SlackApiError

    stub.reset()
    client = WebClient(token=BOT_TOKEN, base_url=stub.api_url)
    meta = {"event_type": "runbot_alert", "event_payload": {"key": "k1"}}
    parent = client.chat_postMessage(channel="C0ALERTS", text="silent", metadata=meta)["ts"]
    reply = client.chat_postMessage(channel="C0ALERTS", text="still silent", thread_ts=parent)["ts"]
    assert float(reply) > float(parent)
    client.chat_update(channel="C0ALERTS", ts=parent, text="recovered", blocks=[])
    history = client.conversations_history(channel="C0ALERTS", include_all_metadata=True)["messages"]
    assert [(m["ts"], m["text"]) for m in history] == [(parent, "recovered")]
    assert history[0]["metadata"]["event_payload"] == {"key": "k1"}
    assert [m["text"] for m in client.conversations_replies(channel="C0ALERTS", ts=parent)["messages"]] == ["recovered", "still silent"]
    stub.fail(status=500, times=1, method="chat.postMessage")
    with pytest.raises(SlackApiError):
        client.chat_postMessage(channel="C0ALERTS", text="x")
    stub.rate_limit(times=1, retry_after=7)
    with pytest.raises(SlackApiError) as limited:
        client.auth_test()
    assert limited.value.response.status_code == 429 and limited.value.response.headers["Retry-After"] == "7"
    assert [status for _, _, status in stub.attempts][-2:] == [500, 429]
    assert len(stub.posts("chat.postMessage")) == 2  # .calls holds only what Slack did


# Malformed requests: each answered with a 4xx and no traceback, whatever the body (issue 9.11).
MALFORMED_BODIES = [
    "payload=notjson", "payload=%5B%5D", "payload=null", "payload=%7B%7D", "payload=42", "payload=%22x%22",
    'payload={"type":"block_actions"}', 'payload={"type":"block_actions","actions":[]}',
    'payload={"type":"block_actions","actions":null}', 'payload={"type":"block_actions","actions":[null]}',
    'payload={"type":"block_actions","actions":[{}]}', 'payload={"type":"block_actions","actions":"x"}',
    'payload={"type":"block_actions","user":"x","actions":[{"action_id":"runbot_refresh"}]}',
    "", "=", "&&&", "command=%2Frun", "command=/run&text=status%20dflash", "%ff%fe=%00",
    '{"type":"url_verification"}', "[]", "null",
]


@pytest.mark.parametrize("body", MALFORMED_BODIES)
async def test_malformed_but_signed_bodies_get_a_4xx_and_no_traceback(make_bot, body, caplog):
    async with make_bot() as bot:
        status, _, _ = await bot.post(body, sign(body))
        assert status < 500, body
        assert bot.probes == 0
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records if r.exc_info]


@pytest.mark.parametrize("timestamp", ["²", "١٢٣", "12 ", " 12", "+12", "-12", "1e9", "0x10", "9" * 40, ""])
async def test_odd_timestamps_are_401_not_500(make_bot, timestamp, caplog):
    async with make_bot() as bot:
        body = "command=/run&text=status"
        status, _, _ = await bot.post(body, {**sign(body), "X-Slack-Request-Timestamp": timestamp})
        assert status == 401
    assert not [r for r in caplog.records if r.exc_info]


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> tuple[bool, bytes]:
    """Whether the server closed the connection within `seconds`, and what it said first."""
    try:
        said = await asyncio.wait_for(reader.read(), seconds)
        return True, said
    except asyncio.TimeoutError:
        return False, b""


async def test_slow_or_idle_connections_are_closed(make_bot):
    # 0 of 2,500 slow connections were closed before the server had timeouts (issue 9.12).
    async with make_bot(timeouts={"header_timeout": 0.5, "body_timeout": 0.5}) as bot:
        port = int(bot.url.rsplit(":", 1)[1])
        idle = await asyncio.open_connection("127.0.0.1", port)  # says nothing at all
        slow_headers = await asyncio.open_connection("127.0.0.1", port)
        slow_headers[1].write(b"POST /slack/events HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        body = "command=/run&text=status&response_url=x&user_id=U&channel_id=C"
        slow_body = await asyncio.open_connection("127.0.0.1", port)
        head = "".join(f"{k}: {v}\r\n" for k, v in sign(body).items())
        slow_body[1].write(f"POST /slack/events HTTP/1.1\r\nHost: x\r\n{head}Content-Length: {len(body)}\r\n\r\n"
                           f"{body[:10]}".encode())  # a tenth of the body, then silence
        for _, writer in (idle, slow_headers, slow_body):
            await writer.drain()
        results = [await _closed_within(reader, 3.0) for reader, _ in (idle, slow_headers, slow_body)]
        for _, writer in (idle, slow_headers, slow_body):
            writer.close()
        assert [closed for closed, _ in results] == [True, True, True]
        assert results[2][1].startswith(b"HTTP/1.1 408")
        assert (await bot.post("payload=x", sign("payload=x")))[0] == 400  # the server still serves


async def test_asks_close_together_share_one_probe(make_bot):
    # 200 `/run runs` in 10 s took p99 12.8 s when each started probes of its own (issue 9.14).
    async with make_bot() as bot:
        await bot.ask("status dflash")
        first = bot.probes
        for text in ("status dflash", "runs", "gpus dflash", "tail dflash"):
            await bot.ask(text)
        assert bot.probes - first == 1  # llama-7b, which `runs` asked about first; dflash's answer was fresh
        await asyncio.sleep(FRESH_S + 0.1)
        await bot.ask("status dflash")
        assert bot.probes - first == 2  # too old to share: probed again


async def test_doctor_is_for_admins_only_and_answers_only_to_them(make_bot, stub):
    access = '[access]\nusers = ["U0ALICE", "U0BOB"]\nadmins = ["U0ALICE"]'
    def asked() -> int:  # Bolt calls auth.test for itself too: count doctor's calls as a difference
        return sum(1 for m, _, _ in stub.attempts if m == "auth.test")

    async with make_bot(access=access) as bot:
        await bot.ask("help")
        before = asked()
        refused = await bot.ask("doctor", user="U0BOB")
        assert asked() == before  # nothing was checked
        report = await bot.ask("doctor", user="U0ALICE")
        assert asked() == before + 1
    assert lines(refused)[0].startswith("only runbot's admins may run /run doctor")
    assert refused["response_type"] == report["response_type"] == "ephemeral"
    said = lines(report)
    assert f"✓ this machine: log {bot.tmp / 'dflash.log'} readable" in said
    assert "✓ SLACK_BOT_TOKEN accepted (auth.test): @runbot in Test" in said
    assert said[-1].startswith(f"{len(said) - 1} checks: ")
    assert BOT_TOKEN not in all_text(report)


# -- replays, stalls and odd clicks (issue 19.10) ---------------------------------------------------


async def test_a_replayed_request_is_answered_once(make_bot, stub, caplog):
    # A signed request replayed within Slack's 5 minutes was answered each time.
    async with make_bot() as bot:
        body = slash_body("status dflash", response_url=stub.response_url("once"))
        headers = sign(body)
        assert (await bot.post(body, headers))[0] == 200
        await bot.answer("once")
        for _ in range(3):
            status, text, _ = await bot.post(body, headers)
            assert (status, text) == (401, "replayed request")
        click = action_body("runbot.tail", "dflash", response_url=stub.response_url("click"), ephemeral=True)
        click_headers = sign(click)
        assert (await bot.post(click, click_headers))[0] == 200
        assert (await bot.post(click, click_headers))[0] == 401
        # The same body signed anew (as Slack's own retries are) is a new request.
        again = sign(body, timestamp=int(headers["X-Slack-Request-Timestamp"]) - 10)
        assert (await bot.post(body, again))[0] == 200
        await asyncio.sleep(0.5)
    assert len(stub.responses_to("once")) == 2 and len(stub.responses_to("click")) == 1
    assert not [r for r in caplog.records if r.exc_info]


async def _raw_post(bot, headers: dict[str, str], length: int, sent_body: str, wait: float) -> tuple[bool, bytes, float]:
    """A POST written by hand (declaring `length`, sending only `sent_body`): whether the server closed the
    connection within `wait`, what it said, and how long after the last byte."""
    port = int(bot.url.rsplit(":", 1)[1])
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"POST /slack/events HTTP/1.1\r\nHost: x\r\n{head}Content-Length: {length}\r\n\r\n{sent_body}".encode())
    await writer.drain()
    sent = time.monotonic()
    closed, said = await _closed_within(reader, wait)
    took = time.monotonic() - sent
    writer.close()
    return closed, said, took


async def test_a_stalled_body_is_closed_within_the_body_timeout(make_bot):
    # Headers and part of a body, then nothing: the connection must close at the timeout, not later.
    async with make_bot(timeouts={"header_timeout": 5.0, "body_timeout": 1.5}) as bot:
        body = slash_body("status dflash", response_url=bot.stub.response_url("stalled"))
        closed, said, took = await _raw_post(bot, sign(body), len(body), body[:len(body) // 2], 5.0)
        assert closed and said.startswith(b"HTTP/1.1 408"), said
        assert 1.4 < took < 2.2, f"closed {took:.2f} s after the last byte (body timeout 1.5 s)"
        assert (await bot.post("payload=x", sign("payload=x")))[0] == 400  # the server still serves


async def test_a_body_declared_too_large_is_refused_before_it_is_read(make_bot):
    async with make_bot(timeouts={"header_timeout": 5.0, "body_timeout": 3.0}) as bot:
        closed, said, took = await _raw_post(bot, sign("x"), 50 << 20, "xx", 6.0)
        assert closed and said.startswith(b"HTTP/1.1 413"), said
        assert took < 1.0, f"refused after {took:.2f} s"


# Every button, and the value it carries for a run called {}.
BUTTONS = [("runbot.refresh", "{}"), ("runbot.tail", "{}"), ("runbot.gpus", "{}"), ("runbot.status", "{}"),
           ("runbot.mute", "{}"), ("runbot.plot.loss", "{} loss 21600"), ("runbot.plot", "{} rate 3600")]


async def test_a_button_for_a_hidden_run_answers_as_one_for_a_run_that_is_gone(make_bot, stub, caplog):
    # Buttons said "not allowed" for a hidden run and "no longer configured" for a missing one (issue 19.10).
    caplog.set_level(logging.INFO, "runbot.commands")
    async with make_bot(access='[access]\nusers = ["U0ALICE"]', dflash_extra='users = ["U0BOB"]') as bot:
        for action_id, value in BUTTONS:
            said = []
            for run in ("llama-7b", "qwen-7b"):  # hidden from Bob, and configured nowhere
                name, status = await bot.click(action_id, value.format(run), user="U0BOB")
                assert status == 200
                said.append(json.dumps(await bot.answer(name), ensure_ascii=False).replace(run, "RUN"))
            hidden, gone = said
            assert hidden == gone, action_id
            assert json.loads(hidden)["text"] == "run “RUN” is not known here"
        assert bot.probes == 0
    outcomes = {r.runbot["outcome"] for r in caplog.records if getattr(r, "runbot", {}).get("event") == "button"}
    assert outcomes == {"unknown_run"}
    assert stub.posts("chat.update") == [] and not stub.files


def _click_payload(stub, name: str, action_id: str, **changes) -> str:
    payload = action_payload(action_id, "dflash", response_url=stub.response_url(name))
    for path, value in changes.items():  # "actions.0.value" -> payload["actions"][0]["value"]
        *parents, last = path.split(".")
        where = payload
        for key in parents:
            where = where[int(key)] if key.isdigit() else where[key]
        where[int(last) if last.isdigit() else last] = value
    return urllib.parse.urlencode({"payload": json.dumps(payload)})


MALFORMED_CLICKS = [
    {"actions.0.value": ["dflash"]}, {"actions.0.value": {"run": "dflash"}}, {"actions.0.value": 42},
    {"actions.0.value": True}, {"user.id": ["U0ALICE"]}, {"channel": "C0TEAM"}, {"channel.id": 7},
    {"container": []}, {"container.message_ts": 1796000001.0001}, {"container.is_ephemeral": "yes"},
    {"message": "hello"}, {"response_url": ["https://hooks.slack.com/x"]}, {"response_url": 42},
]
# Odd blocks in the clicked message only mean it is no alert: the click is answered as on any message.
ODD_BLOCKS = [{"message.blocks": "x"}, {"message.blocks": [1, {"type": "actions", "elements": "x"}]}]


@pytest.mark.parametrize("action_id", [a for a, _ in BUTTONS])
async def test_a_malformed_click_is_a_log_line_not_a_traceback(make_bot, stub, caplog, action_id):
    # A list-typed button value logged a traceback (issue 19.10).
    caplog.set_level(logging.INFO)
    value = "dflash loss 21600" if action_id.startswith("runbot.plot") else "dflash"
    async with make_bot() as bot:
        for k, changes in enumerate(MALFORMED_CLICKS + ODD_BLOCKS):
            body = _click_payload(stub, f"odd{k}", action_id, **{"actions.0.value": value, **changes})
            status, _, _ = await bot.post(body, sign(body))
            assert status == 200, changes
        ignored = lambda: [r for r in caplog.records if "malformed payload" in r.getMessage()]  # noqa: E731
        await stub.until(lambda: len(ignored()) == len(MALFORMED_CLICKS))
        await asyncio.sleep(0.5)  # time for any listener still running to fail
        assert (await bot.ask("help"))["text"]  # the bot still answers
    tracebacks = [r.getMessage() for r in caplog.records if r.exc_info]
    assert not tracebacks, tracebacks
    assert all("\n" not in r.getMessage() for r in ignored())
    assert not [n for n, _ in stub.responses if n in {f"odd{k}" for k in range(len(MALFORMED_CLICKS))}]  # silent acks
    for _, payload in stub.responses:
        assert "Traceback" not in json.dumps(payload) and "Error" not in payload["text"]
