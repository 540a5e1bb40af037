"""/run history: a run's phases, restarts and incidents over a window (pure spans, the rendering, and the command
and its Chart buttons through the real Bolt app against the local Slack stand-in)."""

from __future__ import annotations

import time

import pytest

from bot.core.alerts import RunState, Status
from bot.core.history import Point
from bot.core.ledger import Incident, Ledger, Outgoing
from bot.core.timeline import incidents_between, spans
from bot.core.verdict import Concern, Phase, Worry
from bot.render.history import ACTION_PLOT, CHART_ACTIONS, history_message
from handlers.commands import NOT_ALLOWED
from tests.test_plot import a_readable_png, bot_with_memory, stub  # noqa: F401 - stub: the module's Slack stand-in
from tests.test_slack_app import Bot

H = 3600.0
NOW = 1_800_000_000.0


def pt(t: float, phase: Phase = Phase.TRAINING, step: int | None = None, segment: int = 0, rate: float | None = None) -> Point:
    return Point(t, phase, 0, step, rate=rate, unit="tok/s" if rate else None, segment=segment)


def night() -> list[Point]:
    """Loading, training, a save, training, then a restart that loads and trains again (a point a minute)."""
    out = [pt(NOW - 10 * H + m * 60, Phase.LOADING) for m in range(10)]
    out += [pt(NOW - 10 * H + m * 60, step=m * 10, rate=14_000.0 + m) for m in range(10, 300)]
    out += [pt(NOW - 5 * H + m * 60, Phase.SAVING, step=2990) for m in range(5)]
    out += [pt(NOW - 5 * H + m * 60, step=3000 + m, rate=13_900.0) for m in range(5, 120)]
    out += [pt(NOW - 3 * H + m * 60, Phase.LOADING, segment=1) for m in range(3)]
    out += [pt(NOW - 3 * H + m * 60, step=m, segment=1, rate=14_100.0) for m in range(3, 181)]
    return out


def test_points_fold_into_spans_of_one_phase_and_a_restart_starts_one():
    got = [(s.phase, s.first_step, s.last_step, s.restarted) for s in spans(night())]
    assert got == [(Phase.LOADING, None, None, False), (Phase.TRAINING, 100, 2990, False),
                   (Phase.SAVING, 2990, 2990, False), (Phase.TRAINING, 3005, 3119, False),
                   (Phase.LOADING, None, None, True), (Phase.TRAINING, 3, 180, False)]
    training = spans(night())[1]
    assert training.rate == 14_000.0 + 155 and training.unit == "tok/s"  # the median, not a spike
    assert spans([]) == []


def test_an_incident_never_told_closed_ended_when_the_next_began():
    old = Incident("a", 1, "C", "1.0", NOW - 30 * H, Concern(Worry.SILENT), NOW - 29 * H)
    quiet_end = Incident("a", 2, "C", "2.0", NOW - 8 * H, Concern(Worry.SILENT), None)
    crash = Incident("a", 3, "C", "3.0", NOW - 2 * H, Concern(Worry.CRASHED), None)
    other = Incident("b", 1, "C", "4.0", NOW - H, Concern(Worry.SILENT), None)
    got = incidents_between([crash, other, quiet_end, old], "a", NOW - 24 * H)
    assert [(i.seq, i.closed_at) for i in got] == [(2, NOW - 2 * H), (3, None)]  # 1 ended before the window
    # One that began before the window and ran into it is part of it.
    into = Incident("a", 1, "C", "1.0", NOW - 30 * H, Concern(Worry.SILENT), None)
    assert [i.seq for i in incidents_between([into, quiet_end, crash], "a", NOW - 24 * H)] == [1, 2, 3]


def test_the_ledger_keeps_each_incidents_worst_concern_and_its_end():
    ledger = Ledger()
    open_ = RunState(status=Status.OPEN, concern=Concern(Worry.SILENT), seq=1, announced=True, opened_at=NOW)
    ledger.commit("a", open_, [Outgoing("post", {"text": "x"}, "C")], NOW)
    worse = RunState(status=Status.OPEN, concern=Concern(Worry.CRASHED), seq=1, announced=True, opened_at=NOW)
    ledger.commit("a", worse, [Outgoing("reply", {"text": "y"})], NOW + 60)
    assert ledger.incidents[("a", 1)].concern == Concern(Worry.CRASHED)
    milder = RunState(status=Status.OPEN, concern=Concern(Worry.SILENT), seq=1, announced=True, opened_at=NOW)
    ledger.commit("a", milder, [], NOW + 120)
    assert ledger.incidents[("a", 1)].concern == Concern(Worry.CRASHED)  # the worst it was, not the latest
    done = RunState(status=Status.RESOLVED, concern=Concern(Worry.SILENT), seq=1, announced=True, closed_at=NOW + 900)
    ledger.commit("a", done, [Outgoing("reply", {"text": "z"})], NOW + 900)
    assert ledger.incidents[("a", 1)].closed_at == NOW + 900
    finished = RunState(status=Status.FINISHED, seq=2, announced=True, closed_at=NOW + 999)
    ledger.commit("a", finished, [Outgoing("post", {"text": "done"}, "C")], NOW + 999)
    assert ledger.incidents[("a", 2)].concern is None  # a finished run's note is no problem


def test_the_answer_reads_newest_first_for_a_phone():
    incidents = [Incident("dflash", 1, "C", "1.0", NOW - 6 * H, Concern(Worry.SILENT), NOW - 6 * H + 840),
                 Incident("dflash", 2, "C", "2.0", NOW - 3 * H - 60, Concern(Worry.CRASHED), NOW - 3 * H + 120)]
    message = history_message("dflash", spans(night()), incidents, NOW, 12 * H)
    text = "\n".join(b["text"]["text"] for b in message["blocks"] if b["type"] == "section")
    phases = text.split("*phases*\n")[1].split("\n*incidents*")[0].splitlines()
    assert phases[0].endswith("–now training · step 3 → 180 · 14.1K tok/s (2 h 57 min)"), phases[0]
    assert ":arrows_counterclockwise: restarted · loading" in phases[1]
    assert "saving · step 2990" in phases[3] and len(phases) == 6
    lines = text.split("*incidents*\n")[1].splitlines()
    assert lines[0].endswith(":white_check_mark: crashed — over after 3 min") and "silent — over after 14 min" in lines[1]
    assert message["text"] == "dflash: training since 2 h 57 min ago · 2 incidents in 12 h"
    [actions] = [b for b in message["blocks"] if b["type"] == "actions"]
    assert [(e["action_id"], e["value"]) for e in actions["elements"]] == [
        ("runbot.plot.loss", "dflash loss 43200"), ("runbot.plot.rate", "dflash rate 43200"), ("runbot.plot.gpus", "dflash gpus 43200")]
    assert message["blocks"][0]["text"]["text"] == ":scroll: *dflash*: training since 2 h 57 min ago · 2 incidents in 12 h"


def test_nothing_remembered_says_so_in_one_line():
    message = history_message("dflash", [], [], NOW, 24 * H)
    assert message["text"].startswith("dflash: nothing remembered of the last 1 d yet") and len(message["blocks"]) == 1
    assert message["blocks"][0]["text"]["text"].startswith(":scroll: *dflash*: nothing remembered")


# -- through the app ----------------------------------------------------------------------------


@pytest.fixture
def make_bot(tmp_path, stub):
    stub.reset()

    def make(**kw) -> Bot:
        now = time.time()
        shifted = [Point(p.t - NOW + now, p.phase, p.level, p.step, p.total, 2.0, p.rate, p.unit, p.segment)
                   for p in night()]
        crash = Incident("dflash", 1, "C0ALERTS", "1.000100", now - 2 * H, Concern(Worry.CRASHED), None)
        return bot_with_memory(tmp_path, stub, {"dflash": shifted}, [crash], **kw)

    return make


async def test_run_history_answers_from_memory_with_chart_buttons(make_bot):
    async with make_bot() as bot:
        answer = await bot.ask("history dfl")
    assert answer["response_type"] == "ephemeral"
    assert answer["text"] == "dflash: training since 2 h 57 min ago · 1 incident in 1 d"
    body = "\n".join(b["text"]["text"] for b in answer["blocks"] if b["type"] == "section")
    assert ":red_circle: crashed — open 2 h" in body and "restarted · loading" in body
    assert bot.probes == 0  # memory, not a probe
    (run, since, _), = bot.history.asked
    assert run == "dflash" and abs(time.time() - 24 * H - since) < 60


async def test_run_history_takes_a_window_and_refuses_a_bad_one(make_bot):
    async with make_bot() as bot:
        answer = await bot.ask("history dflash 2h here")
        bad = await bot.ask("history dflash 6")
    assert answer["response_type"] == "in_channel" and "in 2 h" in answer["text"]
    assert "/run history RUN [DURATION]" in bad["text"] and "a duration needs its unit: 6h, 6m" in bad["text"]


async def test_a_chart_button_posts_the_chart_here_and_tells_the_clicker(make_bot, stub):
    async with make_bot() as bot:
        name, status = await bot.click(CHART_ACTIONS[1], "dflash rate 7200")
        assert status == 200
        answer = await bot.answer(name, timeout=30)
    (shared,) = stub.files
    assert shared["title"] == "dflash · rate · last 2 h"
    a_readable_png(shared["content"])
    assert answer["response_type"] == "ephemeral" and answer["replace_original"] is False
    assert "posted dflash's rate chart (last 2 h" in answer["text"]


@pytest.mark.parametrize("value", ["secret-run loss 3600", "dflash lr 3600", "dflash", ""])
async def test_a_chart_button_for_a_run_not_seen_here_uploads_nothing(make_bot, stub, value):
    async with make_bot() as bot:
        name, status = await bot.click(ACTION_PLOT, value)
        answer = await bot.answer(name)
    assert status == 200 and not stub.files
    assert "is not known here" in answer["text"]


async def test_a_chart_button_outside_access_is_an_unknown_run(make_bot, stub):
    async with make_bot(access='[access]\nusers = ["U0BOB"]', dflash_extra='users = ["U0BOB", "U0ALICE"]') as bot:
        hidden, _ = await bot.click(ACTION_PLOT, "llama-7b loss 3600", user="U0ALICE")
        answer = await bot.answer(hidden)
        # Someone allowed nowhere hears what /run tells them, whichever run the button names (issue 19.10).
        nowhere = [(await bot.click(ACTION_PLOT, f"{run} loss 3600", user="U0EVE"))[0] for run in ("dflash", "gpt5")]
        refusals = [(await bot.answer(name))["text"] for name in nowhere]
    assert not stub.files and answer["text"] == "run “llama-7b” is not known here"
    assert refusals == [NOT_ALLOWED] * 2


async def test_history_is_in_the_help(make_bot):
    async with make_bot() as bot:
        help_ = await bot.ask("help")
    assert "/run history RUN [DURATION] — what the run did lately: phases, restarts, incidents" in help_["text"]
