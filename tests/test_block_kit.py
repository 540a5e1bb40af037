"""Every Block Kit message runbot posts, checked without a screenshot: Slack's size limits, the first line
(the run, then what is said of it), the buttons (each one a listener answers), and a phone's width."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pytest

from bot.core.alerts import Post, Reply, RunState, Status
from bot.core.diagnose import diagnose, unreachable
from bot.core.facts import Crash, Process
from bot.core.history import Tally
from bot.core.ledger import Incident
from bot.core.timeline import Span
from bot.core.verdict import Concern, Level, Phase, Verdict, Worry
from bot.render import alerts as ra
from bot.render import history as rh
from bot.render import slack as rs
from bot.service.app import LISTENERS
from config.registry import Run
from tests.builders import evidence, gpu_section
from tests.test_render_slack import code_rows, width

NOW = 1_800_000_000.0
RUN = Run(name="dflash", host="local", container=None, log="/workspace/train.log", gpus=(("target", (0, 1)), ("drafter", (2,))))
GPUS = gpu_section([[(0, 31000, 97), (1, 30000, 99), (2, 18000, 0)]] * 5)
HOSTILE = "<!channel> @here xoxb-123456789012-abcdefghijkl & ```x``` " + "y" * 400
THREAD = ("step=10 loss=2.5 tok/s=14000\nException in thread drafter-1:\nTraceback (most recent call last):\n"
          "RuntimeError: drafter lost its queue\nstep=12 loss=2.4 tok/s=14100\n")


def verdicts() -> dict[str, Verdict]:
    """One verdict of each kind a run's answer can carry."""
    def of(log, **kw):
        return diagnose(evidence(log, gpus=GPUS, **kw), RUN)

    return {
        "training": of("step=1200 loss=2.31 tok/s=14200\n"),
        "thread died": of(THREAD),
        "crashed": of("step=3 loss=2\nTraceback (most recent call last):\ntorch.OutOfMemoryError: CUDA out of memory.\n", writers=()),
        "silent": of("step=12 loss=2.4 tok/s=14100\n", age=1800),
        "no log": of(None),
        "unreachable": unreachable(RUN, "cannot reach pve1 (10.1.2.6:22): connection refused", "unreachable"),
        "hostile": Verdict(run="dflash", phase=Phase.CRASHED, level=Level.CRIT, headline=HOSTILE, tail=(HOSTILE,) * 300,
                           problems=(HOSTILE,), crash=Crash("traceback", "E", HOSTILE), writer=Process(1, 5, HOSTILE)),
    }


@dataclass(frozen=True)
class Case:
    builder: str  # the function that made it, as `module.name`
    what: str
    message: dict
    run: str | None  # the run it is about: its first line leads with it


OPEN = RunState(Status.OPEN, Concern(Worry.SILENT), seq=1, announced=True, opened_at=NOW - 3600, changed_at=NOW - 600,
                notified_at=NOW - 600, headline="silent 12 min — last step 1200; process alive")
STATES = {
    "open": OPEN,
    "muted": replace(OPEN, muted_until=NOW + 3600, muted_by="U0ALICE"),
    "recovering": replace(OPEN, status=Status.RECOVERING),
    "resolved": replace(OPEN, status=Status.RESOLVED, closed_at=NOW, headline="step 1300 · 14.2K tok/s"),
    "finished": replace(OPEN, status=Status.FINISHED, concern=None, headline="finished — last step 60 · loss 1.9"),
    "flapping": replace(OPEN, flapping=True, flips=(NOW - 300, NOW - 200, NOW - 100, NOW - 50, NOW - 20, NOW - 10)),
    "crashed": replace(OPEN, concern=Concern(Worry.CRASHED), headline="crashed — torch.OutOfMemoryError at step 10"),
}
REPLIES = [Reply("still", Concern(Worry.SILENT)), Reply("changed", Concern(Worry.CRASHED)), Reply("reopened", Concern(Worry.SILENT)),
           Reply("recovered", Concern(Worry.SILENT)), Reply("finished"), Reply("flapping", Concern(Worry.SILENT)),
           Reply("settled"), Reply("settled", Concern(Worry.SILENT))]
SPANS = [Span(NOW - 7200, NOW - 3600, Phase.LOADING, 0, None, None, None, None, False),
         Span(NOW - 3600, NOW - 10, Phase.TRAINING, 0, 3, 180, 14100.0, "tok/s", False)]


def every_message() -> Iterator[Case]:
    """Each message builder, with the inputs that stretch it."""
    for what, v in verdicts().items():
        yield Case("slack.status_message", what, rs.status_message(v, "dflash", "pve1 CT 200 · /workspace/train.log"), "dflash")
        yield Case("slack.gpus_message", what, rs.gpus_message(v, "dflash", "pve1 CT 200"), "dflash")
        yield Case("slack.tail_message", what, rs.tail_message(v, 200, "dflash"), "dflash")
    vs = list(verdicts().values())
    yield Case("slack.runs_message", "a few", rs.runs_message([(f"run-{i}", v) for i, v in enumerate(vs)]), None)
    yield Case("slack.runs_message", "300 runs", rs.runs_message([(f"run-{i:03d}", vs[i % len(vs)]) for i in range(300)]), None)
    yield Case("slack.runs_message", "none", rs.runs_message([]), None)
    subcommands = [type("S", (), {"usage": f"cmd{i} RUN", "help": "h" * 80}) for i in range(12)]
    yield Case("slack.help_message", "with a note", rs.help_message(subcommands, note=HOSTILE), None)
    yield Case("slack.error_message", "hostile", rs.error_message(HOSTILE), None)
    yield Case("slack.host_message", "hostile", rs.host_message(f"pve1 {HOSTILE}", HOSTILE.splitlines()), None)
    yield Case("slack.host_message", "2000 lines", rs.host_message("discovered on pve1",
                                                                   [f'log = "/w/{i}/{"x" * 150}.log"' for i in range(2000)]), None)
    yield Case("slack.discover_message", "hostile", rs.discover_message(f"pve1 {HOSTILE}", HOSTILE.splitlines(),
                                                                      asked_here=True), None)
    yield Case("slack.discover_message", "300 blocks", rs.discover_message(
        "discovered on pve1", [row for i in range(300) for row in ("", f"[runs.r{i}]", f'log = "/w/{i}/{"x" * 150}.log"')]),
        None)
    yield Case("slack.discover_message", "a line longer than a section", rs.discover_message(
        "discovered on pve1", ["# head", "", "[runs.a]", f'log = "/{"x" * 4000}"', "", "[runs.b]"]), None)
    yield Case("slack.gpus_message", "host lines", rs.gpus_message(vs[0], "dflash", "pve1 CT 200",
                                                                   host_lines=HOSTILE.splitlines()), "dflash")
    training = verdicts()["training"]
    for what, state in STATES.items():
        yield Case("alerts.parent", what, ra.parent("dflash", state, training, NOW), "dflash")
        yield Case("alerts.message", f"post {what}", ra.message("dflash", Post("opened"), state, training, NOW), "dflash")
    for reply in REPLIES:
        for what, state in (("open", OPEN), ("resolved", STATES["resolved"])):
            yield Case("alerts.reply", f"{reply.note} {what}", ra.reply("dflash", reply, state, NOW), "dflash")
    yield Case("alerts.parent", "a host", ra.parent("host pve1", OPEN, None, NOW), "host pve1")
    for done in (None, *ra.WATCH_DONE):
        yield Case("alerts.watch_message", f"watch {done}",
                   ra.watch_message("dflash", ("starting…", "loading weights 15%", "step 10"), done, NOW - 90, NOW), "dflash")
    tally = Tally(segment=0, started=NOW - 3600, last_t=NOW, first_step=1, last_step=500, final_loss=1.9, best_loss=1.8,
                  rate_sum=14100.0 * 10, rate_n=10, unit="tok/s")
    for what, v in (("finished", training), ("crashed", verdicts()["crashed"])):
        yield Case("alerts.summary", what, ra.summary("dflash", tally, v, 2), "dflash")
    yield Case("alerts.summary", "no tally", ra.summary("dflash", None, None, 0), "dflash")
    incidents = [Incident("dflash", 1, "C", "1.0", NOW - 6000, Concern(Worry.SILENT), NOW - 5000),
                 Incident("dflash", 2, "C", "2.0", NOW - 600, Concern(Worry.CRASHED))]
    yield Case("history.history_message", "a day", rh.history_message("dflash", SPANS, incidents, NOW, 86400), "dflash")
    yield Case("history.history_message", "empty", rh.history_message("dflash", [], [], NOW, 86400), "dflash")


CASES = list(every_message())
IDS = [f"{c.builder}:{c.what}" for c in CASES]


class Listening:
    """What the app's listeners register for (as Bolt's app.action / app.command would)."""

    def __init__(self) -> None:
        self.actions: set[str] = set()
        self.commands: set[str] = set()
        for listener in LISTENERS:
            listener.register(self)

    def action(self, action_id: str):
        self.actions.add(action_id)
        return lambda handler: handler

    def command(self, name: str):
        self.commands.add(name)
        return lambda handler: handler


LISTENED = Listening().actions


def text_objects(node) -> Iterator[dict]:
    if isinstance(node, dict):
        if node.get("type") in ("mrkdwn", "plain_text"):
            yield node
        for value in node.values():
            yield from text_objects(value)
    elif isinstance(node, list):
        for value in node:
            yield from text_objects(value)


def buttons(message: dict) -> Iterator[tuple[dict, dict]]:
    """(block, button) for every button: in actions blocks and as section accessories."""
    for block in message["blocks"]:
        if block["type"] == "actions":
            for element in block["elements"]:
                yield block, element
        if "accessory" in block:
            yield block, block["accessory"]


# -- size ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_within_slacks_limits(case):
    message = case.message
    blocks = message["blocks"]
    assert 1 <= len(blocks) <= rs.MAX_BLOCKS
    assert 1 <= len(message["text"]) <= rs.MAX_TEXT
    assert sum(map(rs.block_chars, blocks)) <= rs.MAX_TOTAL
    assert len(json.dumps(message, ensure_ascii=False)) < 40_000
    for block in blocks:
        assert block["type"] in ("section", "context", "actions", "header")
        if block["type"] == "section":
            assert 1 <= len(block["text"]["text"]) <= rs.MAX_SECTION
        if block["type"] == "context":
            assert 1 <= len(block["elements"]) <= 10
            assert all(1 <= len(e["text"]) <= rs.MAX_SECTION for e in block["elements"])
        if block["type"] == "actions":
            assert 1 <= len(block["elements"]) <= 25
    for node in text_objects(blocks):
        # verbatim: Slack links and parses nothing in text that may hold log lines
        assert node["type"] == "plain_text" or node.get("verbatim") is True, node


# -- the first line --------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_first_line_leads_with_the_run_then_what_is_said_of_it(case):
    first_text = case.message["text"].splitlines()[0]
    first_block = next(b for b in case.message["blocks"] if b["type"] == "section")["text"]["text"].splitlines()[0]
    assert not first_text.startswith(":"), first_text  # a lock screen shows words, not an emoji's code
    assert "*" not in first_text.split(":", 1)[0]  # nor mrkdwn
    if case.run is not None:
        assert first_text.startswith(f"{case.run}: ") and len(first_text) > len(case.run) + 2, first_text
        assert re.match(rf":[a-z_]+: \*{re.escape(case.run)}\*: \S", first_block), first_block
        assert first_text.split(": ", 1)[1][:20] in first_block  # the same words in both
    elif case.builder == "slack.runs_message" and case.what != "none":
        worst = first_text.split(":", 1)[0]
        assert re.match(rf":[a-z_]+: \*{re.escape(worst)}\*: ", first_block), first_block  # the worst run, first


def test_every_answer_about_a_run_is_in_the_catalogue():
    """A new message builder must come here to be checked: every *_message, and the alerts' payloads."""
    def built(module, prefix):
        return {f"{prefix}.{name}" for name, fn in inspect.getmembers(module, inspect.isfunction)
                if fn.__module__ == module.__name__ and not name.startswith("_")
                and (name.endswith("_message") or name in ("parent", "reply", "summary", "message"))}

    builders = built(rs, "slack") | built(ra, "alerts") | built(rh, "history")
    assert builders <= {c.builder for c in CASES}, builders - {c.builder for c in CASES}


# -- buttons ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_button_is_one_a_listener_answers(case):
    for block, button in buttons(case.message):
        assert button["type"] == "button"
        assert button["action_id"] in LISTENED, button["action_id"]
        assert 1 <= len(button["text"]["text"]) <= 75 and len(button["action_id"]) <= 255
        assert 1 <= len(button["value"]) <= 2000
        run = button["value"].split()[0]  # the plot buttons carry "RUN METRIC SECONDS"
        assert run == case.run or case.run is None and run.startswith("run-"), button
    for block in case.message["blocks"]:
        if block["type"] == "actions":
            ids = [e["action_id"] for e in block["elements"]]
            assert len(ids) == len(set(ids)), ids  # Slack refuses two of one action_id in a block


@pytest.mark.parametrize("builder, has", [("slack.status_message", True), ("slack.gpus_message", True),
                                          ("slack.tail_message", True), ("slack.runs_message", True),
                                          ("history.history_message", True), ("alerts.reply", False)])
def test_the_messages_that_lead_somewhere_have_their_buttons(builder, has):
    for case in CASES:
        if case.builder == builder and not (builder == "slack.runs_message" and case.what == "none") \
                and not (builder == "history.history_message" and case.what == "empty"):
            assert bool(list(buttons(case.message))) is has, case.what


def test_open_alerts_have_refresh_tail_gpus_and_mute_and_finished_ones_none():
    for case in CASES:
        if case.builder == "alerts.parent":
            ids = [b["action_id"] for _, b in buttons(case.message)]
            if case.what in ("finished", "a host"):  # a host has no run for the buttons to name
                assert ids == []
            else:
                assert ids == [rs.ACTION_REFRESH, rs.ACTION_TAIL, rs.ACTION_GPUS, rs.ACTION_MUTE], case.what


def test_each_listed_run_up_to_the_limit_has_its_status_button():
    [case] = [c for c in CASES if c.builder == "slack.runs_message" and c.what == "300 runs"]
    assert [b["action_id"] for _, b in buttons(case.message)] == [rs.ACTION_STATUS] * rs.MAX_RUN_BUTTONS


# -- a phone's width -------------------------------------------------------------------------------


@pytest.mark.parametrize("case", [c for c in CASES if c.builder in ("slack.gpus_message", "slack.tail_message")],
                         ids=[i for c, i in zip(CASES, IDS) if c.builder in ("slack.gpus_message", "slack.tail_message")])
def test_code_rows_fit_a_phone_or_are_cut(case):
    rows = code_rows(case.message)
    widest = rs.CODE_WIDTH if case.builder == "slack.gpus_message" else rs.LINE_COLS
    assert all(width(r) <= widest for r in rows), max(rows, key=width)
    if case.builder == "slack.tail_message" and case.what == "hostile":
        assert rows and all(r.endswith("…") for r in rows)  # a 470-column line is cut, not wrapped into rows


def test_the_facts_under_a_headline_fit_a_phone():
    """Evidence rows are short: a label and at most FACT_CHARS, so a status is a screen, not a scroll."""
    for case in CASES:
        if case.builder == "slack.status_message":
            sections = [b["text"]["text"] for b in case.message["blocks"] if b["type"] == "section"]
            for line in "\n".join(sections[1:]).splitlines():
                assert len(line) <= rs.FACT_CHARS + 30, line


def test_status_level_emoji_are_the_renderers_own():
    for case in CASES:
        if case.builder == "slack.status_message":
            first = case.message["blocks"][0]["text"]["text"]
            assert first.split(" ", 1)[0] in rs.LEVEL_EMOJI.values()
