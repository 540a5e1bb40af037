"""The watchdog against real local probes and a fake chat: alerts, threads, retries, doubt, restarts, mutes, watch."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path

import pytest

from bot.core.alerts import Status
from bot.service.chat import ChatError, SlackChat
from bot.probe.runners import RunResult
from bot.service.state_file import StateFile
from bot.probe.targets import Targets
from bot.service.watchdog import Watchdog
from config.registry import parse_registry
from tests.standins import set_age, writer_holding

CONFIG = """
[bot]
check_every = "1s"
alert_channel = "C0ALERTS"
probe_timeout = "{timeout}"
remind_every = "1h"

[defaults]
gpu_samples = 1
silence_after = "5s"

[runs.alpha]
host = "local"
log = "alpha.log"

[runs.beta]
host = "local"
log = "beta.log"
"""
STEPS = "".join(f"step={i} loss=2.{i} tok/s=14200\n" for i in range(1, 6))
OOM = STEPS + "Traceback (most recent call last):\n  File \"train.py\", line 9\ntorch.OutOfMemoryError: CUDA out of memory.\n"


class FakeChat:
    """Records what was posted; can fail (Slack down) or lose the answer of a post that did land (doubt)."""

    def __init__(self) -> None:
        self.posts: list[dict] = []
        self.updates: list[dict] = []
        self.fail_next = 0
        self.lose_answer_next = 0
        self.has_find = True
        self.refuse: str | None = None  # a definite refusal, e.g. "channel_not_found"
        self.raise_next: list[BaseException] = []  # errors that are not ChatError (a slack_sdk surprise)
        self.attempts = 0

    async def post(self, channel, text, blocks, thread_ts=None, *, key=None):
        self.attempts += 1
        if self.raise_next:
            raise self.raise_next.pop(0)
        if self.refuse:
            raise ChatError(f"chat.postMessage: {self.refuse}", transient=False)
        if self.fail_next:
            self.fail_next -= 1
            raise ChatError("chat.postMessage: HTTP 500", in_doubt=False)
        ts = f"{1000 + len(self.posts)}.0001"
        self.posts.append({"channel": channel, "text": text, "thread_ts": thread_ts, "key": key, "ts": ts})
        if self.lose_answer_next:
            self.lose_answer_next -= 1
            raise ChatError("chat.postMessage: timed out", in_doubt=True)
        return ts

    async def update(self, channel, ts, text, blocks):
        if self.fail_next:
            self.fail_next -= 1
            raise ChatError("chat.update: HTTP 500")
        self.updates.append({"channel": channel, "ts": ts, "text": text})

    async def find(self, channel, key, *, thread_ts=None, after_ts=None):
        if not self.has_find:
            raise ChatError("missing_scope", transient=False)
        return next((p["ts"] for p in self.posts if p["key"] == key), None)

    def parents(self):
        return [p for p in self.posts if p["thread_ts"] is None]

    def thread(self, ts):
        return [p["text"] for p in self.posts if p["thread_ts"] == ts]


@pytest.fixture
def lab(tmp_path):
    def make(timeout="5s", clock=time.time, chat=None, store=None, alpha=""):
        config = tmp_path / "runs.toml"
        config.write_text(CONFIG.format(timeout=timeout).replace('log = "alpha.log"\n', f'log = "alpha.log"\n{alpha}\n'))
        registry = parse_registry(config.read_text(), config)
        store = store or StateFile.open(tmp_path / "state.sqlite3")
        return Watchdog(registry, Targets(registry), store, chat or FakeChat(), clock=clock)
    for name in ("alpha", "beta"):
        (tmp_path / f"{name}.log").write_text(STEPS)
    # beta trains quietly beside alpha throughout: its process holds its log, as a real one does.
    with writer_holding(tmp_path / "beta.log"):
        yield make


@contextlib.contextmanager
def stepping(log: Path, every: float = 1.0):
    """A step line appended to `log` every `every` seconds while the block runs: a run that trains, and so
    never goes silent however slow a loaded machine makes the sweeps (silence_after is 5 s)."""
    done = threading.Event()

    def loop() -> None:
        step = 6
        while not done.wait(every):
            with log.open("a") as f:
                f.write(f"step={step} loss=2.0 tok/s=14200\n")
            step += 1

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def silent(log: Path) -> None:
    set_age(log, 60)


def steps_again(log: Path, first: int = 6) -> None:
    with log.open("a") as f:
        f.write("".join(f"step={i} loss=1.9 tok/s=14100\n" for i in range(first, first + 3)))


async def test_silent_then_recovered_is_one_thread(lab, tmp_path):
    wd = lab()
    log = tmp_path / "alpha.log"
    with writer_holding(log), writer_holding(tmp_path / "beta.log"):
        await wd.sweep()
        assert wd.chat.posts == []
        silent(log)
        await wd.sweep()
        [parent] = wd.chat.parents()
        assert parent["channel"] == "C0ALERTS" and parent["text"].startswith("alpha: silent")
        await wd.sweep()
        assert len(wd.chat.posts) == 1  # still silent: nothing new
        steps_again(log)
        await wd.sweep()
        assert len(wd.chat.posts) == 1  # healthy once: not yet told (no flapping)
        steps_again(log, 9)
        await wd.sweep()
    assert wd.chat.thread(parent["ts"]) == [wd.chat.posts[-1]["text"]]
    assert "recovered after" in wd.chat.posts[-1]["text"]
    assert wd.chat.updates[-1]["ts"] == parent["ts"] and "recovered" in wd.chat.updates[-1]["text"]
    assert wd.states["alpha"].status is Status.RESOLVED


async def test_a_crash_goes_in_the_same_thread(lab, tmp_path):
    wd = lab()
    log = tmp_path / "alpha.log"
    with writer_holding(log):
        silent(log)
        await wd.sweep()
    log.write_text(OOM)  # the writer is gone and a traceback ends the log
    await wd.sweep()
    [parent] = wd.chat.parents()
    reply, summary = wd.chat.thread(parent["ts"])
    assert "now crashed" in reply and "OutOfMemoryError" in reply
    assert "crashed" in wd.chat.updates[-1]["text"]
    # The end-of-run summary follows the crash in its thread, once: the silence was this same incident.
    assert summary.startswith("alpha: summary — crashed · seen over 1 min")  # its steps were a minute old
    # No mean rate: runbot never saw it training, only silent.
    assert "steps 1 → 5 · loss 2.5 (best 2.1) · no incidents before it" in summary, summary
    await wd.sweep()
    assert len(wd.chat.thread(parent["ts"])) == 2


async def test_a_clean_end_is_told_once_with_its_summary(lab, tmp_path):
    wd = lab()
    log = tmp_path / "alpha.log"
    with writer_holding(log):
        await wd.sweep()
        steps_again(log)
        await wd.sweep()
    with log.open("a") as f:
        f.write("Training complete.\n")
    await wd.sweep()
    await wd.sweep()
    [parent] = wd.chat.parents()
    assert "finished" in parent["text"]
    [summary] = wd.chat.thread(parent["ts"])
    assert summary.startswith("alpha: summary — finished · seen over ")
    assert "steps 1 → 8 · loss 1.9 (best 1.9) ·" not in summary  # the best is said only when it was better
    assert "steps 1 → 8 · loss 1.9 · 14.2K tok/s mean · no incidents" in summary, summary


async def test_summary_false_posts_the_end_without_its_summary(lab, tmp_path):
    wd = lab(alpha="summary = false")
    assert wd.registry.runs["alpha"].summary is False
    log = tmp_path / "alpha.log"
    with writer_holding(log):
        await wd.sweep()
    log.write_text(OOM)
    await wd.sweep()
    [parent] = wd.chat.parents()
    assert "OutOfMemoryError" in parent["text"] and wd.chat.thread(parent["ts"]) == []


async def test_a_restarted_bot_still_knows_the_run_for_its_summary(lab, tmp_path):
    wd = lab()
    log = tmp_path / "alpha.log"
    with writer_holding(log):
        await wd.sweep()
    await wd.stop()
    wd.state_file.close()
    again = lab()  # a new bot on the same state file: the tally comes back from the points
    log.write_text(OOM)
    await again.sweep()
    [parent] = again.chat.parents()
    [summary] = again.chat.thread(parent["ts"])
    assert "steps 1 → 5 · loss 2.5 (best 2.1) · 14.2K tok/s mean" in summary, summary


async def test_slack_down_keeps_messages_and_sends_each_once_in_order(lab, tmp_path):
    wd = lab()
    log = tmp_path / "alpha.log"
    with writer_holding(log):
        silent(log)
        wd.chat.fail_next = 3
        for _ in range(3):
            await wd.sweep()
        assert wd.chat.posts == [] and len(wd.ledger.pending("alpha")) == 1
    log.write_text(OOM)
    await wd.sweep()  # Slack is back: the parent, then the crash in its thread
    [parent] = wd.chat.parents()
    assert "silent" in parent["text"] and wd.chat.thread(parent["ts"]) and wd.ledger.pending() == []
    await wd.sweep()
    # The parent, the crash and the end-of-run summary: each once, in that order.
    assert [p["text"][:23] for p in wd.chat.posts] == ["alpha: silent 1 min — l", "alpha: now crashed — to", "alpha: summary — crashe"]


async def test_a_post_in_doubt_is_looked_for_not_doubled(lab, tmp_path):
    wd = lab()
    log = tmp_path / "alpha.log"
    with writer_holding(log):
        silent(log)
        wd.chat.lose_answer_next = 1  # it landed, but the bot never heard back
        await wd.sweep()
        assert len(wd.chat.posts) == 1 and wd.ledger.pending("alpha")[0].tried_at is not None
        await wd.sweep()
    assert len(wd.chat.posts) == 1 and wd.ledger.pending() == []
    assert wd.ledger.thread("alpha", 1)[1] == wd.chat.posts[0]["ts"]


async def test_without_a_way_to_look_a_post_in_doubt_is_sent_again(lab, tmp_path):
    wd = lab()
    wd.chat.has_find = False
    log = tmp_path / "alpha.log"
    with writer_holding(log):
        silent(log)
        wd.chat.lose_answer_next = 1
        await wd.sweep()
        await wd.sweep()
    assert len(wd.chat.posts) == 2  # at least once: a rare duplicate beats a lost alert
    assert wd.ledger.pending() == []


async def test_a_restart_posts_no_duplicate_and_keeps_the_thread(lab, tmp_path):
    chat = FakeChat()
    wd = lab(chat=chat)
    log = tmp_path / "alpha.log"
    with writer_holding(log):
        silent(log)
        await wd.sweep()
        wd.state_file.close()  # the bot dies; a new one starts on the same file
        wd = lab(chat=chat)
        await wd.sweep()
        assert len(chat.parents()) == 1
    log.write_text(OOM)
    await wd.sweep()
    [parent] = chat.parents()
    crash, summary = chat.thread(parent["ts"])
    assert "now crashed" in crash and "alpha: summary — crashed" in summary


async def test_unreachable_three_sweeps_in_a_row(lab, tmp_path):
    wd = lab()

    class Down:
        async def run(self, script, *, timeout, limit=None):
            return RunResult(failure="host pve9 did not answer (connection refused)", failure_kind="unreachable")

    wd.targets = type("T", (), {"runner_for": lambda self, run: Down()})()
    for expected in (0, 0, 1, 1):
        await wd.sweep()
        assert len(wd.chat.parents()) == expected * 2  # both runs are on the dead host
    assert "did not answer" in wd.chat.parents()[0]["text"]


async def test_a_stuck_probe_holds_up_only_its_own_runs_and_not_the_sweep(lab, tmp_path):
    # alpha and beta live on this machine: one probe reads both (tests/test_scheduler.py shows other
    # containers going on without them). A probe that never answers costs the sweep its `wait`, no more.
    wd = lab(timeout="30s")

    class Stuck:
        async def run(self, script, *, timeout, limit=None):
            await asyncio.sleep(3600)

    wd.targets = type("T", (), {"runner_for": lambda self, run: Stuck()})()
    started = time.monotonic()
    report = await wd.sweep(wait=1.0)
    assert time.monotonic() - started < 3 and report.probed == 2 and wd.chat.posts == []
    report = await wd.sweep(wait=1.0)
    assert report.still_running == ("alpha", "beta") and report.probed == 0
    await wd.stop()


async def test_mute_silences_posts_edits_the_parent_and_expires(lab, tmp_path):
    now = [time.time()]
    wd = lab(clock=lambda: now[0])
    alpha, beta = wd.registry.runs["alpha"], wd.registry.runs["beta"]
    with writer_holding(tmp_path / "alpha.log"), writer_holding(tmp_path / "beta.log"):
        silent(tmp_path / "alpha.log")
        await wd.sweep()
        await wd.mute(alpha, now[0] + 3600, by="U1")
        await wd.settled()  # the parent's edit goes out in the background
        assert "muted until" in str(wd.chat.updates[-1]) and wd.muted_until("alpha") == now[0] + 3600
        await wd.mute(beta, now[0] + 3600)
        silent(tmp_path / "beta.log")
        await wd.sweep()
        assert len(wd.chat.parents()) == 1  # beta fell silent while muted: tracked, not posted
        assert wd.states["beta"].status is Status.OPEN
        now[0] += 3601  # the mutes end by themselves
        await wd.sweep()
    assert len(wd.chat.parents()) == 2 and "beta" in wd.chat.parents()[1]["text"]
    assert "muted" not in wd.chat.updates[-1]["text"] and wd.muted_until("alpha") is None


async def test_watch_follows_a_restart_to_its_first_step(lab, tmp_path):
    wd = lab()
    run = wd.registry.runs["alpha"]
    log = tmp_path / "alpha.log"
    log.write_text("")
    with writer_holding(log):
        watch, started = await wd.watch(run, "C0HERE", "U1")
        again, second = await wd.watch(run, "C0HERE", "U2")
        assert started and not second and again.ts == watch.ts  # at most one watch per run
        assert await wd.watch_tick("alpha") is None
        log.write_text("  Target 0 on cuda:0...\nLoading weights:  15%|█▌        | 131/851 [00:00<00:03, 199.62it/s]")
        assert await wd.watch_tick("alpha") is None
        with log.open("a") as f:
            f.write("\rLoading weights:  60%|██████    | 511/851 [00:02<00:01, 199.62it/s]")
        assert await wd.watch_tick("alpha") is None
        with log.open("a") as f:
            f.write("\rLoading weights: 100%|██████████| 851/851 [00:04<00:00, 199.62it/s]\nstep=1 loss=9.1 tok/s=14213\n")
        assert await wd.watch_tick("alpha") == "trained"
    last = wd.chat.updates[-1]["text"]
    assert last == "alpha: starting… → loading weights 15% (131/851) → 60% (511/851) → first step 1 · 14.2K tok/s :white_check_mark:"
    assert wd.ledger.watches() == []
    _, started = await wd.watch(run, "C0HERE")
    assert started  # the old watch ended, a new one may begin


async def test_watch_stops_at_a_crash(lab, tmp_path):
    wd = lab()
    (tmp_path / "alpha.log").write_text(OOM)
    await wd.watch(wd.registry.runs["alpha"], "C0HERE")
    assert await wd.watch_tick("alpha") == "crashed"
    assert ":x:" in wd.chat.updates[-1]["text"]


async def test_the_scheduler_sweeps_on_the_running_loop(lab, tmp_path):
    wd = lab()
    silent(tmp_path / "alpha.log")
    wd.start()
    try:
        for _ in range(50):
            await asyncio.sleep(0.1)
            if wd.chat.posts:
                break
        assert wd.chat.parents() and wd.scheduler.get_job("sweep").max_instances == 1
    finally:
        await wd.stop()


class _Answer:
    def __init__(self, data, status=200):
        self.data, self.status_code, self.headers = data, status, {"Retry-After": "0"}

    def get(self, key, default=None):
        return self.data.get(key, default)


async def test_slack_adapter_maps_errors_and_reads_metadata():
    from slack_sdk.errors import SlackApiError

    calls = []

    class Client:
        async def chat_postMessage(self, **kw):
            calls.append(kw)
            if len(calls) == 1:
                raise SlackApiError("rate limited", _Answer({"ok": False, "error": "ratelimited"}, 429))
            return _Answer({"ok": True, "ts": "5.5", "channel": "C9"})

        async def chat_update(self, **kw):
            raise SlackApiError("bad", _Answer({"ok": False, "error": "channel_not_found"}))

        async def conversations_history(self, **kw):
            return _Answer({"ok": True, "messages": [
                {"ts": "1.1"}, {"ts": "2.2", "metadata": {"event_type": "runbot_alert", "event_payload": {"key": "k1"}}}]})

        async def conversations_replies(self, **kw):
            raise SlackApiError("down", _Answer({}, 503))

    chat = SlackChat(Client())
    with pytest.raises(ChatError) as limited:  # the client's handlers wait out short 429s; a longer one is the caller's
        await chat.post("#alerts", "hi", None, key="k1")
    assert limited.value.transient and not limited.value.in_doubt and limited.value.retry_after == 0
    assert await chat.post("#alerts", "hi", None, key="k1") == "5.5"
    assert calls[-1]["metadata"]["event_payload"] == {"key": "k1"} and chat.channel_id("#alerts") == "C9"
    with pytest.raises(ChatError) as refused:
        await chat.update("#alerts", "5.5", "x", None)
    assert not refused.value.transient
    assert await chat.find("C9", "k1") == "2.2" and await chat.find("C9", "k2") is None
    with pytest.raises(ChatError) as down:
        await chat.find("C9", "k1", thread_ts="5.5")
    assert down.value.transient and down.value.in_doubt


def _services(wd):
    from bot.service.app import Services

    return Services(targets=wd.targets, registry=wd.registry, chat=None, store=wd.state_file, watchdog=wd, clock=wd.clock)


async def test_run_mute_unmute_and_watch_commands(lab):
    import handlers.watch  # noqa: F401 - registers watch, mute and unmute
    from handlers.commands import dispatch

    wd = lab()
    services = _services(wd)
    reply, _, _ = await dispatch(services, "U1", "C0TEAM", "mute alp 2h")
    assert "alpha muted until" in reply.text and abs(wd.muted_until("alpha") - (time.time() + 7200)) < 60
    reply, _, _ = await dispatch(services, "U1", "C0TEAM", "status alpha")
    assert "muted: alerts muted until" in reply.text  # still probed, and says so
    reply, _, _ = await dispatch(services, "U1", "C0TEAM", "mute alpha soon")
    assert reply.outcome == "usage" and "bad duration" in reply.text
    until = wd.muted_until("alpha")
    for too_long in ("365d", "8d", "7d1s"):  # capped by [bot] max_mute, 7 days by default
        reply, _, _ = await dispatch(services, "U1", "C0TEAM", f"mute alpha {too_long}")
        assert reply.outcome == "usage" and "at most 7d" in reply.text, too_long
    assert wd.muted_until("alpha") == until  # a refused mute changes nothing
    reply, _, _ = await dispatch(services, "U1", "C0TEAM", "mute alpha 7d")
    assert reply.outcome == "ok"
    reply, _, _ = await dispatch(services, "U1", "C0TEAM", "unmute alpha")
    assert "alpha unmuted" in reply.text and wd.muted_until("alpha") is None
    reply, _, _ = await dispatch(services, "U1", "C0TEAM", "watch alpha here")
    assert "watching alpha" in reply.text and reply.in_channel
    assert wd.chat.posts[-1]["channel"] == "C0TEAM"
    reply, _, _ = await dispatch(services, "U2", "C0TEAM", "watch alpha")
    assert reply.outcome == "busy" and "already being watched" in reply.text
    services.watchdog = None
    reply, _, _ = await dispatch(services, "U1", "C0TEAM", "mute alpha")
    assert "not running" in reply.text


async def test_the_mute_button_mutes_for_an_hour(lab):
    from handlers.watch import on_mute_button

    wd = lab()
    acks = []

    async def ack():
        acks.append(True)

    body = {"user": {"id": "U1"}, "channel": {"id": "C0ALERTS"}}
    await on_mute_button(ack, body, {"value": "beta"}, {"services": _services(wd)})
    assert acks and abs(wd.muted_until("beta") - (time.time() + 3600)) < 60
    assert wd.states["beta"].muted_by == "U1"


# --- delivery: one pass, one try, contained -----------------------------------------------------


async def test_a_late_parent_takes_its_thread_with_it_in_one_pass(lab, tmp_path):
    chat = FakeChat()
    wd = lab(chat=chat)
    log = tmp_path / "alpha.log"
    with writer_holding(log):
        silent(log)
        chat.fail_next = 1
        await wd.sweep()  # the parent fails
    log.write_text(OOM)
    chat.fail_next = 1
    await wd.sweep()  # the crash reply, its summary and the edit queue behind it
    assert [r.op for r in wd.ledger.pending("alpha")] == ["post", "reply", "reply", "update"]
    wd.state_file.close()
    wd = lab(chat=chat)  # a restart once Slack is back: one delivery of alpha's queue
    await wd.deliver("alpha")
    [parent] = chat.parents()
    assert "now crashed" in chat.thread(parent["ts"])[0] and chat.updates[-1]["ts"] == parent["ts"]
    assert wd.ledger.pending() == []


async def test_a_definite_refusal_is_tried_once_a_sweep_then_less_and_less(lab, tmp_path):
    chat = FakeChat()
    chat.refuse = "channel_not_found"
    wd = lab(chat=chat)
    log = tmp_path / "alpha.log"
    tries = []
    with writer_holding(log), writer_holding(tmp_path / "beta.log"), stepping(tmp_path / "beta.log"):
        silent(log)
        for _ in range(9):
            before = chat.attempts
            await wd.sweep()
            tries.append(chat.attempts - before)
        assert tries[0] == 1  # once, not again by the sweep's backlog pass
        assert tries == [1, 1, 0, 1, 0, 0, 0, 1, 0]  # the gaps double (at most remind_every)
        chat.refuse = None  # the bot was invited: the next try delivers, and every sweep tries again
        for _ in range(8):
            await wd.sweep()
    assert len(chat.parents()) == 1 and wd.ledger.pending() == []


async def test_a_refused_queue_is_tried_at_least_every_remind_every(lab, tmp_path):
    from dataclasses import replace

    chat = FakeChat()
    chat.refuse = "not_in_channel"
    wd = lab(chat=chat)
    wd.policy = replace(wd.policy, remind_every=3.0)  # check_every is 1 s: at most 2 sweeps sat out
    tries = []
    with writer_holding(tmp_path / "alpha.log"), writer_holding(tmp_path / "beta.log"), stepping(tmp_path / "beta.log"):
        silent(tmp_path / "alpha.log")
        for _ in range(10):
            before = chat.attempts
            await wd.sweep()
            tries.append(chat.attempts - before)
    assert tries == [1, 1, 0, 1, 0, 0, 1, 0, 0, 1]


async def test_an_unexpected_delivery_error_stays_with_its_run(lab, tmp_path, monkeypatch):
    import sqlite3

    chat = FakeChat()
    wd = lab(chat=chat)
    with writer_holding(tmp_path / "alpha.log"), writer_holding(tmp_path / "beta.log"):
        silent(tmp_path / "alpha.log")
        silent(tmp_path / "beta.log")
        chat.fail_next = 1
        await wd.sweep()  # one parent fails, and Slack counts as down for the rest of the sweep
        assert len(wd.ledger.pending()) == 2

        def broken(run, verdict):  # a bug in judging: the runs' own tasks deliver nothing
            raise ValueError("a bug")

        async def probe(run):  # at once: the scheduled sweep waits only 90 % of check_every for probes
            return None

        monkeypatch.setattr(wd, "probe", probe)
        monkeypatch.setattr(wd, "judge", broken)
        pruned = []
        monkeypatch.setattr(wd.ledger, "prune", lambda before: pruned.append(before) or 0)
        chat.raise_next = [sqlite3.OperationalError("database is locked")]  # not a ChatError
        await wd._scheduled_sweep()  # the backlog pass: the first run's error must not stop the second
        assert len(chat.parents()) == 1 and len(wd.ledger.pending()) == 1 and pruned
        monkeypatch.undo()
        await wd.sweep()  # the row left in doubt is looked for, not found, and sent
    assert len(chat.parents()) == 2 and wd.ledger.pending() == []


async def test_a_mute_whose_edit_fails_unexpectedly_still_mutes(lab, tmp_path):
    chat = FakeChat()
    wd = lab(chat=chat)
    alpha = wd.registry.runs["alpha"]
    with writer_holding(tmp_path / "alpha.log"), writer_holding(tmp_path / "beta.log"):
        silent(tmp_path / "alpha.log")
        await wd.sweep()

        async def update(*args):
            raise RuntimeError("slack_sdk surprise")

        chat.update = update
        state = await wd.mute(alpha, time.time() + 600, by="U1")
        await wd.settled()
    assert state.muted(time.time()) and wd.muted_until("alpha") is not None
    assert [r.op for r in wd.ledger.pending("alpha")] == ["update"]  # the edit waits for the next sweep


async def test_the_mute_button_answers_privately_when_muting_fails(lab, monkeypatch):
    import sqlite3

    import handlers.watch as watch_handlers

    wd = lab()
    sent = []

    async def send_response(url, payload):
        sent.append((url, payload))
        return True

    async def mute(*args, **kw):
        raise sqlite3.OperationalError("database is locked")

    async def ack():
        pass

    monkeypatch.setattr(watch_handlers, "send_response", send_response)
    monkeypatch.setattr(wd, "mute", mute)
    body = {"user": {"id": "U1"}, "channel": {"id": "C0ALERTS"}, "response_url": "https://hooks.example/r1"}
    await watch_handlers.on_mute_button(ack, body, {"value": "beta"}, {"services": _services(wd)})
    [(url, payload)] = sent
    assert payload["response_type"] == "ephemeral" and payload["replace_original"] is False
    assert "could not mute beta" in payload["text"] and "database is locked" in payload["text"]


async def test_times_in_answers_are_slack_dates_in_each_readers_zone(lab, monkeypatch):
    import json

    import handlers.watch as watch_handlers
    from bot.render.alerts import clock
    from handlers.commands import dispatch

    wd = lab()
    services = _services(wd)

    def token(ts):
        return f"<!date^{int(ts)}^{{time}}|{clock(ts)}>"

    reply, _, _ = await dispatch(services, "U1", "C0TEAM", "mute alpha 2h")
    until = wd.muted_until("alpha")
    assert f"alpha muted until {token(until)} — still probed" in reply.text
    assert token(until) in reply.blocks[0]["text"]["text"]
    reply, _, _ = await dispatch(services, "U1", "C0TEAM", "status alpha")
    blocks = json.dumps(reply.blocks, ensure_ascii=False)
    assert f"*muted*  alerts muted until {token(until)}" in blocks and "&lt;!date" not in blocks
    assert f"muted: alerts muted until {clock(until)}" in reply.text and clock(until).endswith(" UTC")
    reply, _, _ = await dispatch(services, "U1", "C0TEAM", "watch alpha")
    reply, _, _ = await dispatch(services, "U2", "C0TEAM", "watch alpha")
    started = wd.ledger.watches()[0].started_at
    assert f"already being watched (since {token(started)})" in reply.text

    sent = []

    async def send_response(url, payload):
        sent.append(payload)
        return True

    async def ack():
        pass

    monkeypatch.setattr(watch_handlers, "send_response", send_response)
    body = {"user": {"id": "U1"}, "channel": {"id": "C0ALERTS"}, "response_url": "https://hooks.example/r1"}
    await watch_handlers.on_mute_button(ack, body, {"value": "beta"}, {"services": services})
    assert sent[0]["text"] == f":no_bell: beta muted until {token(wd.muted_until('beta'))} (by you)"


def test_the_printing_chat_shows_a_slack_dates_fallback():
    from bot.service.chat import terminal

    assert terminal("muted until <!date^1800003600^{time}|09:00 UTC> by <@U1> &amp; co\nmore") == \
        "muted until 09:00 UTC by <@U1> & co"


async def test_a_quiet_sweep_writes_every_runs_points_in_one_transaction(lab, tmp_path, monkeypatch):
    from bot.service.store import Store

    wd = lab()
    writes = []
    real = Store.apply
    monkeypatch.setattr(Store, "apply", lambda self, changes, points=(), tallies=(), formats=(): (
        writes.append((len(list(changes)), sorted(r for r, _ in points))), real(self, changes, points, tallies, formats))[1])
    with writer_holding(tmp_path / "alpha.log"):
        await wd.sweep()  # the first sweep: both runs' first states are decisions, written as they come
        writes.clear()
        for log in ("alpha", "beta"):
            steps_again(tmp_path / f"{log}.log")
        await wd.sweep()  # nothing to decide: the two runs' points, one write
    assert writes == [(0, ["alpha", "beta"])]
    assert [p.step for p in wd.state_file._store.points("alpha", 0)][-1] == 8
