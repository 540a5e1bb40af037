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
from tests.builders import KEY_BODY, KEY_LOGS, evidence, gpu_section, gpu_window

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


def test_status_message_leads_with_the_run_then_the_verdict():
    v = verdict_of("step=1200 loss=2.31 tok/s=14200\n")
    msg = rs.status_message(v, "dflash", "pve1 CT 200 · /workspace/train.log")
    assert msg["text"].splitlines()[0] == f"dflash: {v.headline}"  # what a lock screen shows: which run, then what
    first = msg["blocks"][0]["text"]["text"]
    assert first == f"{rs.LEVEL_EMOJI[v.level]} *dflash*: {v.headline}"
    # The headline is the progress: no "progress" row says it again (each fact once)
    assert v.headline.startswith("step 1200 · 14.2K tok/s · loss 2.31")
    assert not any("*progress*" in t for t in texts(msg)) and "progress:" not in msg["text"]
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
        assert msg["text"].splitlines()[0] == "dflash: cannot reach pve1 (10.1.2.6:22): connection refused"
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
    assert msg["text"].splitlines()[0] == "x: crashed — ValueError: &lt;!channel&gt; &amp; &lt;@U1&gt;"
    assert_safe(msg)


# -- narrow and within limits ---------------------------------------------------------------


def test_tail_lines_are_whole_rows_for_slack_to_wrap_and_very_long_ones_are_cut():
    step = "step=2 loss=1.9 tok/s=110 grad_norm=0.25 lr=3e-4 epoch=1 elapsed=00:10:05 mem=31.2GiB"  # > 45 columns
    lines = ["short", step, "y" * 500, "日本語のログ行" * 20, "a\tb\tc", "word " * 60]
    v = verdict_of("\n".join(lines) + "\n")
    rows = code_rows(rs.tail_message(v, 10))
    assert rows == [
        "short", step,  # not hard-wrapped at a phone's 45 columns: one row, copied whole
        "y" * (rs.LINE_COLS - 1) + "…",  # cut with an ellipsis, never wrapped onto continuation rows
        ("日本語のログ行" * 20)[: (rs.LINE_COLS - 1) // 2] + "…",  # wide characters count two columns
        "a   b   c",
        ("word " * 60)[: rs.LINE_COLS - 1].rstrip() + "…",
    ]
    assert all(width(r) <= rs.LINE_COLS for r in rows)


def test_clip_keeps_a_line_that_fits_and_cuts_one_that_does_not():
    assert rs.clip("x" * 10, 10) == "x" * 10
    assert rs.clip("x" * 11, 10) == "x" * 9 + "…"


def test_gpu_rows_have_a_sparkline_and_fit():
    v = verdict_of("step=1 loss=2\n")
    msg = rs.gpus_message(v, "dflash")
    rows = code_rows(msg)
    assert rows[0] == "target:"
    assert rows[1] == " 0 busy        30/140 GiB █████"  # five readings, all busy
    assert any("drafter" in r for r in rows) and any("idle" in r and "▁▁▁▁▁" in r for r in rows)
    assert all(width(r) <= rs.CODE_WIDTH for r in rows)
    assert "target 0–1 busy" in msg["text"]


def test_gpu_rows_from_the_drivers_window_show_avg_and_range_and_say_where_they_come_from():
    gpus = gpu_section([[(0, 31000, 75), (1, 30000, 100), (2, 18000, 0)]], bus_ids=True)
    window = gpu_window([(0, 99, 0, 49), (1, 99, 98, 98), (2, 0, 0, 0)])
    msg = rs.gpus_message(diagnose(evidence("step=1 loss=2\n", gpus=gpus, window=window), RUN), "dflash")
    assert code_rows(msg) == ["target:", " 0 oscillating 30/140 GiB avg 49 · 0–99", " 1 busy        29/140 GiB avg 98 · 98–99",
                              "drafter:", " 2 idle        18/140 GiB avg 0 · 0–0"]
    assert all(width(r) <= rs.CODE_WIDTH for r in code_rows(msg))
    assert "util from driver window 14 s, 71 samples" in msg["text"]
    assert "util from 5 readings over 1 s" in rs.gpus_message(verdict_of("step=1 loss=2\n"))["text"]


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
    assert all(width(r) <= rs.LINE_COLS for r in code_rows(msg))
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
    assert msg["blocks"][0]["text"]["text"].splitlines()[0].startswith(f"{rs.LEVEL_EMOJI[Level.CRIT]} *dflash*: ")
    assert "2 runs" in msg["blocks"][-1]["elements"][0]["text"]
    assert rs.runs_message([])["text"] == "no runs configured"


def test_runs_message_and_runbot_runs_share_one_order():
    from bot.render import text as render_text

    ok, bad = verdict_of("step=5 loss=1\n"), unreachable(RUN, "cannot reach pve1", "unreachable")
    rows = [("llama", ok), ("eagle", bad), ("alpaca", ok), ("dflash", bad)]
    slack_order = [line.split(":")[0] for line in rs.runs_message(rows)["text"].splitlines()]
    text_order = [line.split()[0] for line in render_text.runs(rows).splitlines()]
    assert slack_order == text_order == ["dflash", "eagle", "alpaca", "llama"]


def test_many_runs_fit_and_say_how_many_were_not_shown():
    v = verdict_of("step=5 loss=1\n")
    msg = rs.runs_message([(f"run-{i:03d}", replace(v, headline="x" * 300)) for i in range(300)])
    assert_within_limits(msg)
    note = next(t for t in texts(msg) if "not shown" in t)
    shown = sum(t.count("*run-") for t in texts(msg)[1:])
    assert note.startswith(f"… {300 - shown} more not shown") and shown >= rs.MAX_RUN_BUTTONS
    assert msg["blocks"][-1]["elements"][0]["text"].startswith("300 runs · ")  # the tally is never what is cut


def test_each_run_in_the_list_has_its_status_button():
    ok, bad = verdict_of("step=5 loss=1\n"), unreachable(RUN, "cannot reach pve1", "unreachable")
    msg = rs.runs_message([("llama", ok), ("dflash", bad)])
    rows = [b for b in msg["blocks"] if b["type"] == "section"]
    assert [(b["accessory"]["action_id"], b["accessory"]["value"]) for b in rows] == [
        (rs.ACTION_STATUS, "dflash"), (rs.ACTION_STATUS, "llama")]
    assert rows[0]["text"]["text"] == f"{rs.LEVEL_EMOJI[Level.CRIT]} *dflash*: cannot reach pve1"


def test_past_the_button_rows_runs_are_plain_lines():
    v = verdict_of("step=5 loss=1\n")
    msg = rs.runs_message([(f"r{i:02d}", v) for i in range(rs.MAX_RUN_BUTTONS + 5)])
    assert_within_limits(msg)
    assert sum("accessory" in b for b in msg["blocks"]) == rs.MAX_RUN_BUTTONS
    assert "*r44*" in "\n".join(texts(msg)) and not any("not shown" in t for t in texts(msg))


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


# -- on a phone: each fact once, a short writer line, the run named first (issue 15) -------------

THREAD_DEATH = (
    "step=10 loss=2.5 tok/s=14000\n"
    "Exception in thread drafter-1:\n"
    "Traceback (most recent call last):\n"
    '  File "/workspace/train.py", line 40, in run\n'
    '    raise RuntimeError("drafter lost its queue")\n'
    "RuntimeError: drafter lost its queue\n"
    "step=12 loss=2.4 tok/s=14100\n"
)


def rows_of(msg: dict) -> dict[str, str]:
    """The evidence section's rows, label -> text."""
    block = msg["blocks"][1]["text"]["text"]
    return {line.split("*")[1]: line.split("*  ", 1)[1] for line in block.splitlines()}


def test_a_thread_death_says_its_error_and_progress_once():
    v = verdict_of(THREAD_DEATH)
    msg = rs.status_message(v, "dflash")
    assert v.headline.startswith("training, but thread drafter-1 died: RuntimeError: drafter lost its queue — step 12")
    said = "\n".join(texts(msg))
    assert said.count("drafter lost its queue") == 2  # the text's first line and the first block's, nothing more
    assert "thread" not in rows_of(msg) and "progress" not in rows_of(msg)


def test_a_crash_shows_its_error_row_only_when_it_says_more_than_the_headline():
    short = verdict_of("step=3 loss=2\nTraceback (most recent call last):\nKeyError: 'labels'\n", writers=())
    assert short.headline.startswith("crashed — KeyError: 'labels' at step 3")
    assert "error" not in rows_of(rs.status_message(short, "dflash"))
    assert rows_of(rs.status_message(short, "dflash"))["progress"] == "loss 2"  # "at step 3" is the headline's
    long_message = "CUDA out of memory. Tried to allocate 372.53 GiB. GPU 0 has a total capacity of 139.8 GiB of which 1.2 GiB is free."
    long = verdict_of(f"step=3 loss=2\nTraceback (most recent call last):\ntorch.OutOfMemoryError: {long_message}\n", writers=())
    error = rows_of(rs.status_message(long, "dflash"))["error"]
    assert "1.2 GiB is free" in error and "1.2 GiB is free" not in long.headline


def test_a_silent_run_names_its_gpus_once():
    idle = gpu_section([[(0, 31000, 0), (1, 30000, 0), (2, 18000, 0)]] * 5)
    v = diagnose(evidence("step=12 loss=2.4 tok/s=14100\n", age=1800, gpus=idle), RUN)
    assert v.phase is Phase.SILENT and v.headline.endswith("; target 0–1 idle (memory held) · drafter 2 idle (memory held)")
    assert "GPUs" not in rows_of(rs.status_message(v, "dflash"))


def test_the_writer_line_is_the_script_and_its_arguments():
    command = "/opt/conda/envs/train/bin/python3.11 -u /home/alice/projects/dflash/job.py --config /home/alice/projects/dflash/run.yaml"
    v = verdict_of("step=1 loss=2\n", writers=((29728, 130, command),))
    assert rows_of(rs.status_message(v, "dflash"))["writer"] == "pid 29728 · up 2 min · job.py --config run.yaml"


@pytest.mark.parametrize("make", [
    lambda v: rs.status_message(v, "dflash"), lambda v: rs.gpus_message(v, "dflash"), lambda v: rs.tail_message(v, 20, "dflash"),
])
def test_every_answers_notification_text_leads_with_the_run(make):
    v = verdict_of("step=2220 loss=2.31 tok/s=14100\n")
    msg = make(v)
    assert msg["text"].startswith("dflash: step 2220 · 14.1K tok/s · ")
    assert msg["blocks"][0]["text"]["text"].startswith(f"{rs.LEVEL_EMOJI[v.level]} *dflash*: step 2220 · ")
    about = next(b for b in msg["blocks"] if b["type"] == "context")
    assert "dflash" not in about["elements"][0]["text"]  # the run is named once, first
