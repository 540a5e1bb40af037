"""Block Kit rendering: the verdict first, safe to post, narrow enough for a phone, inside Slack's limits."""

from __future__ import annotations

import json
import re
import urllib.parse
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.render import slack as rs
from bot.core.diagnose import diagnose, unreachable
from bot.core.redact import printable
from bot.core.facts import Crash, Process, Step
from bot.core.verdict import Level, Phase, Verdict
from config.registry import Run
from tests.builders import KEY_BODY, KEY_LOGS, evidence, gpu_section

RUN = Run(name="dflash", host="local", container=None, log="/workspace/train.log", gpus=(("target", (0, 1)), ("drafter", (2,))))
GPUS = gpu_section([[(0, 31000, 97), (1, 30000, 99), (2, 18000, 0)]] * 5)
HOSTILE = (
    "step=7 loss=2.5 tok/s=900 <!channel> <@U123ABC> <!here|here> @everyone "
    "\x1b[31mred\x1b[0m xoxb-123456789012-abcdefghijkl hf_abcdefghijklmnopqrstuvwxyz123456 "
    "password=hunter2 AKIAABCDEFGHIJKLMNOP & more ```fence``` *bold*"
)


def verdict_of(log: str, **kw) -> Verdict:
    return diagnose(evidence(log, gpus=GPUS, **kw), RUN)


def texts(message: dict) -> list[str]:
    """Every string Slack will render: the fallback and all text objects."""
    out = [message["text"]]

    def walk(node):
        if isinstance(node, dict):
            if node.get("type") in ("mrkdwn", "plain_text"):
                out.append(node["text"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(message["blocks"])
    return out


def assert_within_limits(message: dict) -> None:
    blocks = message["blocks"]
    assert 1 <= len(blocks) <= rs.MAX_BLOCKS
    assert len(message["text"]) <= rs.MAX_TEXT
    for block in blocks:
        if block["type"] == "section":
            assert 1 <= len(block["text"]["text"]) <= rs.MAX_SECTION
        if block["type"] == "header":
            assert len(block["text"]["text"]) <= rs.MAX_HEADER
    assert sum(map(rs.block_chars, blocks)) <= rs.MAX_TOTAL
    assert len(json.dumps(message, ensure_ascii=False)) < 40_000  # characters, as Slack counts them


def assert_safe(message: dict) -> None:
    """No mention, link or secret can come out of log text; no escape codes either."""
    for text in texts(message):
        assert "<" not in text and ">" not in text  # every < and > is escaped: no <!channel>, <@U…>, links
        assert not re.search(r"&(?!amp;|lt;|gt;)", text)  # every & is the start of an entity
        assert not re.search(r"@(channel|here|everyone)\b", text, re.I)
        for secret in ("123456789012-abcdefghijkl", "abcdefghijklmnopqrstuvwxyz123456", "hunter2", "AKIAABCDEFGHIJKLMNOP"):
            assert secret not in text
        assert printable(text) == text


def code_rows(message: dict) -> list[str]:
    rows = []
    for block in message["blocks"]:
        text = block.get("text", {}).get("text", "") if block["type"] == "section" else ""
        if text.startswith("```"):
            rows += text.removeprefix("```\n").removesuffix("\n```").split("\n")
    return rows


def width(row: str) -> int:
    unescaped = row.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&").replace("\u200b", "")
    return sum(rs._cols(c) for c in unescaped)


# -- the verdict comes first --------------------------------------------------------------


def test_status_message_leads_with_the_verdict():
    v = verdict_of("step=1200 loss=2.31 tok/s=14200\n")
    msg = rs.status_message(v, "dflash", "pve1 CT 200 · /workspace/train.log")
    assert msg["text"].splitlines()[0] == v.headline
    first = msg["blocks"][0]["text"]["text"]
    assert first == f"{rs.LEVEL_EMOJI[v.level]} {v.headline}"
    assert any("*progress*" in t and "step 1200" in t for t in texts(msg))
    assert any("pve1 CT 200" in t for t in texts(msg))
    actions = msg["blocks"][-1]
    assert actions["type"] == "actions"
    assert [(e["action_id"], e["value"]) for e in actions["elements"]] == [
        ("runbot.refresh", "dflash"), ("runbot.tail", "dflash"), ("runbot.gpus", "dflash")]
    assert_within_limits(msg)


@pytest.mark.parametrize("level", list(Level))
def test_every_level_has_an_emoji(level):
    v = Verdict(run="x", phase=Phase.TRAINING, level=level, headline="h")
    assert rs.status_message(v, "x")["blocks"][0]["text"]["text"].startswith(rs.LEVEL_EMOJI[level])


def test_an_unreachable_run_says_what_failed():
    v = unreachable(RUN, "cannot reach pve1 (10.1.2.6:22): connection refused", "unreachable")
    for msg in (rs.status_message(v, "dflash"), rs.gpus_message(v), rs.tail_message(v, 20)):
        assert msg["text"].splitlines()[0] == "cannot reach pve1 (10.1.2.6:22): connection refused"
        assert msg["blocks"][0]["text"]["text"].startswith(rs.LEVEL_EMOJI[Level.CRIT])
        assert_within_limits(msg)
    assert "no GPU readings" in rs.gpus_message(v)["text"]


def test_probe_problems_are_shown():
    v = replace(verdict_of("step=1 loss=2\n"), problems=("writers: permission denied",))
    msg = rs.status_message(v, "dflash")
    assert any("writers: permission denied" in t for t in texts(msg))


def test_buttons_take_extra_buttons_for_the_watchdog():
    block = rs.buttons("dflash", extra=[("Mute 1h", rs.ACTION_MUTE)])
    assert [e["action_id"] for e in block["elements"]] == ["runbot.refresh", "runbot.tail", "runbot.gpus", "runbot.mute"]
    assert all(e["value"] == "dflash" for e in block["elements"])


# -- safe to post -------------------------------------------------------------------------


def test_log_text_is_escaped_redacted_and_stripped_everywhere():
    log = HOSTILE + "\n" + "\n".join(HOSTILE.split(" ")) + "\n"  # one long line, then a word a line
    v = verdict_of(log, writers=((692, 40, "python train.py --hf_token=hf_abcdefghijklmnopqrstuvwxyz123456 <!channel>"),))
    assert "<!channel>" in v.tail[0]  # the raw verdict still has it: rendering defuses it
    for msg in (rs.status_message(v, "dflash", "local"), rs.tail_message(v, 5), rs.gpus_message(v),
                rs.runs_message([("dflash", v)]), rs.error_message(HOSTILE)):
        assert_safe(msg)
    tail = "\n".join(code_rows(rs.tail_message(v, 40)))
    assert "&lt;!channel&gt;" in tail and "&lt;@U123ABC&gt;" in tail
    assert "xoxb-[redacted]" in tail and "hf_[redacted]" in tail and "password=[redacted]" in tail
    assert "red" in tail and "\x1b" not in tail
    assert "``\u200b`fence" in tail  # a ``` in a log line cannot close the code block


def test_a_secret_split_across_wrapped_rows_is_still_redacted():
    token = "xoxp-" + "9" * 60
    v = verdict_of(f"{'x' * 30} {token}\n")
    tail = rs.tail_message(v, 1)
    assert "9" * 10 not in "".join(code_rows(tail))


@pytest.mark.parametrize("name", KEY_LOGS)
def test_a_private_key_block_in_the_tail_is_never_posted(name):
    v = verdict_of("\n".join(KEY_LOGS[name]) + "\n")
    msg = rs.tail_message(v, 20)
    for text in texts(msg):
        for line in KEY_BODY:
            assert line[:8] not in text and line[-8:] not in text, text
    assert "[redacted]" in "\n".join(code_rows(msg))


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_short_tail_that_starts_inside_a_key_block_shows_none_of_it(n):
    """`/run tail RUN 2` of a log that ends mid-key: the BEGIN line is in the verdict, above the n."""
    msg = rs.tail_message(verdict_of("\n".join(KEY_LOGS["cut off"]) + "\n"), n)
    for text in texts(msg):
        assert not any(line[:8] in text or line[-8:] in text for line in KEY_BODY), text


def test_headlines_and_facts_from_the_log_are_escaped():
    v = Verdict(run="x", phase=Phase.CRASHED, level=Level.CRIT, headline="crashed — ValueError: <!channel> & <@U1>",
                crash=Crash("traceback", "ValueError", "<!subteam^S1> token=abcdef123456"))
    msg = rs.status_message(v, "x")
    assert msg["text"].splitlines()[0] == "crashed — ValueError: &lt;!channel&gt; &amp; &lt;@U1&gt;"
    assert_safe(msg)


# -- narrow and within limits ---------------------------------------------------------------


def test_code_rows_fit_a_phone():
    lines = ["short", "y" * 500, "日本語のログ行" * 20, "a\tb\tc", "word " * 40]
    v = verdict_of("\n".join(lines) + "\n")
    msg = rs.tail_message(v, 10)
    rows = code_rows(msg)
    assert rows and all(width(r) <= rs.CODE_WIDTH for r in rows)
    assert sum(r.endswith("…") for r in rows) >= 2  # the long lines were cut after ROWS_PER_LINE rows


def test_wrap_breaks_at_spaces_and_marks_continuations():
    rows = rs.wrap("step=2 loss=1.9 tok/s=110 grad_norm=0.25 lr=3e-4 epoch=1")
    assert rows == ["step=2 loss=1.9 tok/s=110 grad_norm=0.25", "  lr=3e-4 epoch=1"]


def test_gpu_rows_have_a_sparkline_and_fit():
    v = verdict_of("step=1 loss=2\n")
    msg = rs.gpus_message(v, "dflash")
    rows = code_rows(msg)
    assert rows[0] == "target:"
    assert re.match(r" 0 busy +30 ?/140 GB +█████$", rows[1]) or "busy" in rows[1]
    assert any("drafter" in r for r in rows) and any("idle" in r and "▁▁▁▁▁" in r for r in rows)
    assert all(width(r) <= rs.CODE_WIDTH for r in rows)
    assert "target 0–1 busy" in msg["text"]


def test_a_huge_tail_is_trimmed_from_the_top_with_a_note():
    lines = [f"step={i} loss=1.0 " + "&<>" * 30 for i in range(200)]
    v = verdict_of("\n".join(lines) + "\n")
    msg = rs.tail_message(v, 200)
    assert_within_limits(msg)
    rows = code_rows(msg)
    assert "step=199" in rows[-2] or "step=199" in rows[-1] or any("step=199" in r for r in rows[-3:])
    note = next(t for t in texts(msg) if "not shown" in t)
    assert re.search(r"\d+ earlier lines not shown", note)
    assert "step=0 " not in "\n".join(rows)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=400), min_size=1, max_size=200),
       st.integers(min_value=1, max_value=200))
def test_any_tail_stays_within_slacks_limits(lines, n):
    tail = tuple(line.replace("\n", " ").replace("\r", " ") for line in lines)
    v = Verdict(run="r", phase=Phase.TRAINING, level=Level.OK, headline="step 1", tail=tail)
    msg = rs.tail_message(v, n)
    assert_within_limits(msg)
    assert all(width(r) <= rs.CODE_WIDTH for r in code_rows(msg))
    for text in texts(msg):
        assert "<" not in text and ">" not in text


@settings(max_examples=40, deadline=None)
@given(st.text(max_size=4000), st.lists(st.text(max_size=600), min_size=4, max_size=4))
def test_any_verdict_stays_within_limits_and_safe(headline, texts_):
    error, command, thread, step_line = texts_
    v = Verdict(run="r", phase=Phase.CRASHED, level=Level.CRIT, headline=headline, tail=(headline,) * 3,
                problems=(headline,), crash=Crash("traceback", error[:30], error), writer=Process(1, 5, command),
                thread_crash=Crash("traceback", "E", thread, thread=thread[:30]), step=Step(step_line))
    for msg in (rs.status_message(v, "r", headline), rs.tail_message(v, 200), rs.gpus_message(v),
                rs.runs_message([("r", v)] * 60), rs.error_message(headline)):
        assert_within_limits(msg)
        for text in texts(msg):
            assert "<" not in text and ">" not in text


@given(st.text(alphabet="a&<>b", max_size=300), st.integers(min_value=2, max_value=200))
def test_cut_never_splits_an_entity(raw, limit):
    out = rs.cut(rs.safe(raw), limit)
    assert len(out) <= limit
    assert not re.search(r"&(?!amp;|lt;|gt;)", out)


def test_runs_message_puts_the_worst_first():
    ok = verdict_of("step=5 loss=1\n")
    bad = unreachable(RUN, "cannot reach pve1", "unreachable")
    msg = rs.runs_message([("llama", ok), ("dflash", bad)])
    assert msg["text"].splitlines()[0] == "dflash: cannot reach pve1"
    assert msg["blocks"][0]["text"]["text"].splitlines()[0].startswith(f"{rs.LEVEL_EMOJI[Level.CRIT]} *dflash*")
    assert "2 runs" in msg["blocks"][-1]["elements"][0]["text"]
    assert rs.runs_message([])["text"] == "no runs configured"


def test_runs_message_and_runbot_runs_share_one_order():
    from bot.render import text as render_text

    ok, bad = verdict_of("step=5 loss=1\n"), unreachable(RUN, "cannot reach pve1", "unreachable")
    rows = [("llama", ok), ("eagle", bad), ("alpaca", ok), ("dflash", bad)]
    slack_order = [line.split(":")[0] for line in rs.runs_message(rows)["text"].splitlines()]
    text_order = [line.split()[0] for line in render_text.runs(rows).splitlines()]
    assert slack_order == text_order == ["dflash", "eagle", "alpaca", "llama"]


def test_many_runs_fit():
    v = verdict_of("step=5 loss=1\n")
    msg = rs.runs_message([(f"run-{i:03d}", replace(v, headline="x" * 300)) for i in range(300)])
    assert_within_limits(msg)
    assert any("left out" in t for t in texts(msg))


def test_help_lists_what_is_registered():
    class Sub:
        def __init__(self, usage, help):
            self.usage, self.help = usage, help

    msg = rs.help_message([Sub("status RUN", "the verdict"), Sub("watch RUN", "follow a restart")], note="unknown command “x<y”")
    assert "`/run watch RUN` — follow a restart" in msg["blocks"][1]["text"]["text"]
    assert msg["text"].splitlines()[0] == "unknown command “x&lt;y”"


def test_builder_url_round_trips_the_blocks():
    msg = rs.status_message(verdict_of("step=1 loss=2\n"), "dflash")
    url = rs.builder_url(msg)
    assert url.startswith("https://app.slack.com/block-kit-builder/#%7B%22blocks%22")
    assert json.loads(urllib.parse.unquote(url.split("#", 1)[1])) == {"blocks": msg["blocks"]}


def test_render_slack_is_pure():
    source = Path(rs.__file__).read_text()
    assert "slack_sdk" not in source and "slack_bolt" not in source and "import asyncio" not in source


def test_a_tail_says_whether_its_log_is_missing_unreadable_or_empty():
    from bot.core.verdict import Concern, Worry

    missing = Verdict(run="r", phase=Phase.NO_LOG, level=Level.CRIT, headline="log not found: /x.log",
                      concerns=(Concern(Worry.NO_LOG),))
    unreadable = replace(missing, headline="cannot read the log: permission denied", concerns=(Concern(Worry.UNREADABLE),))
    empty = Verdict(run="r", phase=Phase.STARTING, level=Level.NOTE, headline="no output yet (importing?)")
    from bot.render import text as render_text

    for v, note in ((missing, "(the log does not exist)"), (unreadable, "(the log cannot be read)"), (empty, "(the log is empty)")):
        assert note in rs.tail_message(v, 20)["text"].splitlines()
        assert render_text.tail(v, 20).splitlines()[1] == f"  {note}"
