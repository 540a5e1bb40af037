"""Pure: a Verdict as a phone-first Slack message (Block Kit plus a plain-text fallback), safe to post."""

from __future__ import annotations

import json
import re
import unicodedata
import urllib.parse
from typing import Any, Iterable, Sequence

from bot.core import humanize as hz
from bot.core.gpus import GpuState, util_words
from bot.core.redact import printable, redact_lines, redact_secrets, slack_escape
from bot.core.verdict import TAIL_DEFAULT, Level, Verdict, worst_first
from bot.render.facts import rows as fact_rows
from bot.render.facts import tail_note
from bot.render.times import clock, slack_time

LEVEL_EMOJI = {Level.OK: ":large_green_circle:", Level.NOTE: ":large_blue_circle:",
               Level.WARN: ":large_yellow_circle:", Level.CRIT: ":red_circle:"}

# Slack's limits (docs.slack.dev, Block Kit reference): 50 blocks a message, 3000 characters a
# section text, 150 a header. The sum of block texts has an undocumented ceiling: chat.postMessage
# answers msg_blocks_too_long somewhere past 13,000 characters (slackapi/bolt-js#2509), so we
# keep well under it. Slack truncates `text` at 40,000; a notification shows far less.
MAX_BLOCKS = 50
MAX_SECTION = 3000
MAX_HEADER = 150
MAX_TOTAL = 11_000
MAX_TEXT = 3000
# Slack cuts a message past 40,000 characters; stay well under it once JSON-encoded.
MAX_ENCODED = 36_000
CODE_WIDTH = 45  # a phone shows about this many monospace columns: GPU rows, a table, are made to fit it
# A log line is shown whole, as one row Slack wraps to the screen (so it copies whole); past this many
# columns (about four rows on a phone) it is cut with "…": nobody reads a 2,000-character line there.
LINE_COLS = 180
MAX_FACTS = 6
FACT_CHARS = 200

ACTION_REFRESH, ACTION_TAIL, ACTION_GPUS = "runbot.refresh", "runbot.tail", "runbot.gpus"
ACTION_STATUS = "runbot.status"  # a run's Status button in /run runs: its status as a new answer, the list stays
MAX_RUN_BUTTONS = 40  # /run runs: rows with a button (each its own block; Slack allows 50 a message)
RUN_LINE_CHARS = 200
ACTION_MUTE = "runbot.mute"  # reserved for the watchdog's alerts (value = run name)

Message = dict[str, Any]  # {"text": str, "blocks": [...]}

# Bare @channel / @here / @everyone: Slack may parse them in text that is not verbatim. A word
# joiner after the @ keeps the look and defuses the mention.
_BARE_MENTION = re.compile(r"@(?=(?:channel|here|everyone)\b)", re.I)


def safe(text: str) -> str:
    """Log or process text made safe to post: controls and ANSI gone, secrets redacted, & < > escaped."""
    return _escaped(redact_secrets(printable(text)))


def _escaped(redacted: str) -> str:
    return _BARE_MENTION.sub("@\u2060", slack_escape(redacted))


def _cleaned(lines: Iterable[str]) -> list[str]:
    """Log lines shown together, cleaned, then redacted as one text: a private key spans lines."""
    return redact_lines(printable(line) for line in lines)


def cut(escaped: str, limit: int) -> str:
    """Shorten already-escaped text to `limit` characters with "…", never splitting an &entity;."""
    if len(escaped) <= limit:
        return escaped
    head = escaped[: max(0, limit - 1)]
    amp = head.rfind("&", max(0, len(head) - 5))
    if amp != -1 and ";" not in head[amp:]:
        head = head[:amp]
    return head + "…"


def mrkdwn(text: str) -> dict:
    # verbatim: Slack keeps formatting but auto-links and parses nothing in the text itself.
    return {"type": "mrkdwn", "text": text, "verbatim": True}


def section(text: str) -> dict:
    return {"type": "section", "text": mrkdwn(cut(text, MAX_SECTION))}


def context(*texts: str) -> dict:
    return {"type": "context", "elements": [mrkdwn(cut(t, MAX_SECTION)) for t in texts[:10]]}


def header(text: str) -> dict:
    return {"type": "header", "text": {"type": "plain_text", "text": cut(text, MAX_HEADER), "emoji": True}}


# -- code blocks no wider than a phone -----------------------------------------------------


def _cols(ch: str) -> int:
    if unicodedata.category(ch) in ("Cf", "Mn"):  # zero-width: the joiners safe() adds, combining marks
        return 0
    return 2 if unicodedata.east_asian_width(ch) in "WF" else 1


def _fit_cols(text: str, width: int) -> str:
    """The longest prefix of `text` that fits `width` display columns."""
    used = 0
    for i, ch in enumerate(text):
        used += _cols(ch)
        if used > width:
            return text[:i]
    return text


def clip(line: str, cols: int) -> str:
    """One cleaned line as one row of at most `cols` display columns, cut with "…" when longer."""
    row = line.expandtabs(4).rstrip()
    return row if len(_fit_cols(row, cols)) == len(row) else _fit_cols(row, cols - 1).rstrip() + "…"


def _code_lines(cleaned: Iterable[str], cols: int) -> list[str]:
    """Each _cleaned line (redacted whole, before cutting) clipped to `cols`, then escaped."""
    # A ``` inside the text would close the fence: break it with a zero-width space.
    return [_escaped(clip(line, cols)).replace("```", "``\u200b`") for line in cleaned]


def code_sections(rows: Sequence[str], budget: int) -> tuple[list[dict], int]:
    """Rows in ``` sections of at most MAX_SECTION characters, keeping the *last* rows that fit
    `budget` characters in all. Returns the sections and how many leading rows were left out."""
    fence = len("```\n\n```")
    chunks: list[list[str]] = []  # built from the end backwards
    size = total = 0
    kept = 0
    for row in reversed(rows):
        cost = len(row) + 1
        new_chunk = not chunks or size + cost > MAX_SECTION - fence
        if total + cost + (fence if new_chunk else 0) > budget or cost > MAX_SECTION - fence:
            break
        if new_chunk:
            chunks.append([])
            size, total = 0, total + fence
        chunks[-1].insert(0, row)
        size, total, kept = size + cost, total + cost, kept + 1
    blocks = [section("```\n" + "\n".join(chunk) + "\n```") for chunk in reversed(chunks)]
    return blocks, len(rows) - kept


# -- the building blocks the watchdog reuses ------------------------------------------------


def verdict_line(v: Verdict) -> str:
    """The verdict, safe, on one line."""
    return cut(safe(" ".join(v.headline.split())) or v.phase.value, 1000)


def lead(run_name: str, said: str, emoji: str = "") -> str:
    """The first line of every message about a run: the run, then what is said of it (`said` already safe).
    Without an emoji it is a notification's text ("dflash: step 2220 · 14K tok/s · …", what a lock screen
    shows); with one, a message's first block line, the run in bold."""
    name = safe(run_name)
    return f"{emoji} *{name}*: {said}" if emoji else f"{name}: {said}"


def verdict_blocks(v: Verdict, run_name: str, *, facts: bool = True, muted_until: float | None = None) -> list[dict]:
    """The run and its verdict with its status emoji, then a few short evidence lines and any probe problems."""
    blocks = [section(lead(run_name, verdict_line(v), LEVEL_EMOJI[v.level]))]
    shown = fact_rows(v, muted_until=muted_until)[:MAX_FACTS] if facts else []
    if shown:
        # A row's time goes in after escaping: a Slack date token, each reader's own zone.
        lines = [f"*{safe(r.label)}*  {cut(safe(' '.join(r.text.split())), FACT_CHARS)}"
                 + (f" {slack_time(r.at)}" if r.at is not None else "") for r in shown]
        blocks.append(section("\n".join(lines)))
    if v.problems:
        blocks.append(context(*(f":warning: {cut(safe(p), 300)}" for p in v.problems[:5])))
    return blocks


def buttons(run_name: str, *, extra: Iterable[dict | tuple[str, str]] = ()) -> dict:
    """Refresh / Tail / GPUs for one run (value = run name), then any extra buttons:
    element dicts, or (label, action_id) pairs that also carry the run name."""
    elements = [_button(label, action, run_name)
                for label, action in (("Refresh", ACTION_REFRESH), ("Tail", ACTION_TAIL), ("GPUs", ACTION_GPUS))]
    for item in extra:
        elements.append(item if isinstance(item, dict) else _button(item[0], item[1], run_name))
    return {"type": "actions", "elements": elements[:25]}


def _button(label: str, action_id: str, value: str) -> dict:
    return {"type": "button", "text": {"type": "plain_text", "text": label[:75], "emoji": True},
            "action_id": action_id, "value": value[:2000]}


def _about(v: Verdict, where: str) -> dict:
    """The phase and where the run lives (its name leads the message already)."""
    return context(" · ".join([safe(v.phase.value)] + ([safe(where)] if where else [])))


def _message(text_lines: Iterable[str], blocks: list[dict]) -> Message:
    return fit({"text": cut("\n".join(text_lines), MAX_TEXT), "blocks": blocks})


def fit(message: Message) -> Message:
    """Backstop for Slack's limits: at most MAX_BLOCKS blocks and MAX_TOTAL characters of block
    text, keeping a trailing actions block and saying what was left out."""
    blocks = list(message.get("blocks", ()))
    actions = blocks.pop() if blocks and blocks[-1].get("type") == "actions" else None
    room = MAX_BLOCKS - (actions is not None) - 1  # one left for the note
    dropped = 0
    while blocks and (len(blocks) > room or sum(map(block_chars, blocks)) > MAX_TOTAL - 100
                      or _encoded_size(message, blocks) > MAX_ENCODED):
        blocks.pop()
        dropped += 1
    if dropped:
        blocks.append(context(f"… {dropped} more block{'s' if dropped > 1 else ''} left out (Slack's size limit)"))
    if actions is not None:
        blocks.append(actions)
    return {**message, "blocks": blocks}


def _encoded_size(message: Message, blocks: list) -> int:
    """The request as Slack receives it: quotes and backslashes in log text double when encoded."""
    return len(json.dumps({"text": message.get("text", ""), "blocks": blocks}, ensure_ascii=False))


def block_chars(block: dict) -> int:
    """Characters of text in one block (what Slack's size limits count)."""
    if block.get("type") == "section":
        return len(block["text"]["text"])
    if block.get("type") == "context":
        return sum(len(e.get("text", "")) for e in block["elements"])
    if block.get("type") == "header":
        return len(block["text"]["text"])
    return 0


# -- the messages ---------------------------------------------------------------------------


def status_message(v: Verdict, run_name: str, where: str = "", *, muted_until: float | None = None) -> Message:
    """The /run status answer: run and verdict, evidence, where, buttons."""
    text = [f"{v.phase.value}" + (f" · {where}" if where else "")]
    text += [f"{r.label}: {' '.join(r.text.split())}" + (f" {clock(r.at)}" if r.at is not None else "")
             for r in fact_rows(v, muted_until=muted_until)[:MAX_FACTS]]
    text += [f"problem: {p}" for p in v.problems[:5]]
    return _message([lead(run_name, verdict_line(v)), *(safe(t) for t in text)],
                    [*verdict_blocks(v, run_name, muted_until=muted_until), _about(v, where), buttons(run_name)])


def gpus_message(v: Verdict, run_name: str | None = None, where: str = "", *,
                 host_lines: Sequence[str] = ()) -> Message:
    """The /run gpus answer: the role summary, then one short row per GPU with a sparkline of its samples, then
    what the host says of who holds them (bot.render.host.ownership) when there is something to say."""
    name = run_name or v.run
    blocks = verdict_blocks(v, name, facts=False)
    text = [lead(name, verdict_line(v))]
    report = v.gpu
    if report is None or not v.reached:
        note = "no GPU readings (the run could not be probed)"
        blocks.append(section(note))
        text.append(note)
    elif report.error and not report.gpus:
        blocks.append(section(f":warning: {safe(report.error)}"))
        text.append(safe(report.error))
    else:
        summary = [safe(line) for line in report.lines()] + [f"util from {report.basis.phrase()}"]
        blocks.append(section("\n".join(summary)))
        text += summary
        rows = []
        placed = set()
        for role, indices in [*report.roles, (None, tuple(g.index for g in report.gpus))]:
            members = [g for g in report.gpus if g.index in indices and g.index not in placed]
            if not members:
                continue
            if report.roles:
                rows.append(f"{role or 'other'}:")
            rows += [_gpu_row(g) for g in members]
            placed.update(g.index for g in members)
        code, _ = code_sections(_code_lines(_cleaned(rows), CODE_WIDTH), MAX_TOTAL // 2)
        blocks += code
    if host_lines:
        said = [safe(line) for line in host_lines]
        blocks.append(section("\n".join(said)))
        text += said
    blocks += [_about(v, where), buttons(name)]
    return _message(text, blocks)


_SPARK = "▁▂▃▄▅▆▇█"


def _gpu_row(g: GpuState) -> str:
    """' 0 busy        31/141 GiB ▇█▇██' (a sparkline of the readings, up to ~20 fit CODE_WIDTH), or
    ' 0 oscillating 0.9/140 GiB avg 49 · 0–99' from the driver's window."""
    if g.mem_used_mib is None:
        mem = "mem ?"
    else:
        mem = hz.gib(g.mem_used_mib, g.mem_total_mib) if g.mem_total_mib else hz.gib(g.mem_used_mib)
    if g.window is not None:
        util = util_words(g, now=False)
    else:
        util = "".join("?" if u is None else _SPARK[min(7, int(u * 8 / 100.01))] for u in g.utils)
    row = f"{g.index:>2} {g.cls:<11} {mem:<10}"
    return row + " " + util[: max(0, CODE_WIDTH - len(row) - 1)]


def tail_message(v: Verdict, n: int = TAIL_DEFAULT, run_name: str | None = None) -> Message:
    """The /run tail answer: the verdict, then the last n lines, trimmed from the top to fit."""
    name = run_name or v.run
    blocks = verdict_blocks(v, name, facts=False)
    text = [lead(name, verdict_line(v))]
    # Redact all the verdict keeps, then take n: the BEGIN line of a key may lie above the n.
    lines = _cleaned(v.tail)[-n:] if n > 0 and v.reached else []
    if (note := tail_note(v, len(lines))) is not None:
        blocks.append(section(f"_({note})_"))
        text.append(f"({note})")
    elif lines:
        budget = MAX_TOTAL - sum(map(block_chars, blocks)) - 600  # room for the note, context, buttons
        code, dropped = code_sections(_code_lines(lines, LINE_COLS), budget)
        if dropped:
            blocks.append(context(f":scissors: {dropped} earlier line{'s' if dropped > 1 else ''} not shown "
                                  f"(Slack's size limit); newest at the bottom"))
        blocks += code
        text += [cut(_escaped(line), 300) for line in lines[-5:]]
    blocks += [_about(v, ""), buttons(name)]
    return _message(text, blocks)


def runs_message(rows: Iterable[tuple[str, Verdict]]) -> Message:
    """Every run with its one-line verdict, the worst first (so a notification names it), each of the first
    MAX_RUN_BUTTONS with a Status button; the rest as plain lines, as many as Slack's limits allow."""
    rows = worst_first(rows)
    if not rows:
        return _message(["no runs configured"], [section("no runs configured (`runbot init` writes a commented example configuration)")])
    counts: dict[Level, int] = {}
    for _, v in rows:
        counts[v.level] = counts.get(v.level, 0) + 1
    tally = " · ".join(f"{LEVEL_EMOJI[lvl]} {counts[lvl]}" for lvl in sorted(counts, reverse=True))
    footer = f"{len(rows)} run{'s' if len(rows) > 1 else ''} · {tally}"
    budget = MAX_TOTAL - len(footer) - 200  # room for the footer and a note of what was left out
    blocks: list[dict] = []
    chunk: list[str] = []
    shown = 0
    for name, v in rows:
        line = lead(name, cut(safe(" ".join(v.headline.split())), RUN_LINE_CHARS), LEVEL_EMOJI[v.level])
        if sum(map(block_chars, blocks)) + len("\n".join([*chunk, line])) > budget:
            break
        if shown < MAX_RUN_BUTTONS:
            # A section per run, its button beside it: one tap from the list to that run's status.
            blocks.append({**section(line), "accessory": _button("Status", ACTION_STATUS, name)})
        elif chunk and len("\n".join([*chunk, line])) > MAX_SECTION:
            blocks.append(section("\n".join(chunk)))
            chunk = [line]
        else:
            chunk.append(line)
        shown += 1
    if chunk:
        blocks.append(section("\n".join(chunk)))
    if shown < len(rows):
        blocks.append(context(f"… {len(rows) - shown} more not shown (Slack's size limit); `runbot runs` lists them all"))
    blocks.append(context(footer))
    text = [lead(name, verdict_line(v)) for name, v in rows]
    return _message(text, blocks)


def help_message(subcommands: Iterable[Any], note: str | None = None) -> Message:
    """What /run takes: one line per registered subcommand (anything with .usage and .help)."""
    subcommands = list(subcommands)
    lines = [f"`/run {safe(c.usage)}` — {safe(c.help)}" for c in subcommands]
    blocks = [section(f":warning: {safe(note)}")] if note else []
    blocks.append(section("*/run* commands\n" + "\n".join(lines)))
    blocks.append(context("RUN: any unique prefix of a run name · add `here` at the end to post in the "
                          "channel (otherwise only you see the answer) · `/run` alone = `/run runs`"))
    text = ([safe(note)] if note else []) + ["/run commands:"] + [f"/run {safe(c.usage)} — {safe(c.help)}" for c in subcommands]
    return _message(text, blocks)


def host_message(title: str, lines: Sequence[str]) -> Message:
    """/run host and /run discover: a title, then the lines as code (discover's blocks paste from there whole)."""
    code, left_out = code_sections(_code_lines(_cleaned(lines), LINE_COLS), MAX_TOTAL - 500)
    blocks = [section(f"*{safe(title)}*"), *code]
    if left_out:
        blocks.append(context(f"… the first {left_out} lines left out (Slack's size limit): `runbot` prints them all"))
    return _message([safe(title), *(safe(line) for line in lines)], blocks)


def discover_message(title: str, lines: Sequence[str], *, asked_here: bool = False) -> Message:
    """/run discover: the `[runs.NAME]` blocks as code to paste, whole blocks only and no line cut (a cut log line
    is an unterminated TOML string; bot.render.host bounds every line). Cleaned as every answer is: a live
    `log = "…"` line is one redaction leaves alone (bot.render.host comments out a block whose path it changes)."""
    rows = [_escaped(line).replace("```", "``\u200b`") for line in _cleaned(lines)]
    paragraphs: list[list[str]] = [[]]
    for row in rows:
        if not row and paragraphs[-1]:
            paragraphs.append([])
        paragraphs[-1].append(row)
    budget, kept, used, left_out = MAX_TOTAL - 1500, [], 0, 0
    for para in paragraphs:
        cost = sum(len(r) + 1 for r in para)
        if left_out or used + cost > budget or any(len(r) > MAX_SECTION - 20 for r in para):
            left_out += 1  # in order: after one left out, the rest are too (`runbot discover` prints them all)
            continue
        kept += para
        used += cost
    code, _ = code_sections(kept, MAX_TOTAL - 500)
    blocks = [section(f"*{safe(title)}*"), *code]
    if left_out:
        blocks.append(context(f"… {left_out} more part{'s' * (left_out > 1)} left out, whole (Slack's size limit): "
                              "`runbot discover` prints them all"))
    if asked_here:
        blocks.append(context("answered only to you: discovery shows every CT's command lines"))
    return _message([safe(title), *(safe(line) for line in lines)], blocks)


def error_message(text: str) -> Message:
    """Something went wrong or was refused: one line, escaped (it may quote what the user typed)."""
    line = safe(" ".join(text.split())) or "something went wrong"
    return _message([line], [section(f":warning: {line}")])


def builder_url(message: Message) -> str:
    """A Block Kit Builder link that shows the message's blocks (for eyeballing a layout)."""
    return "https://app.slack.com/block-kit-builder/#" + urllib.parse.quote(
        json.dumps({"blocks": message["blocks"]}, ensure_ascii=False, separators=(",", ":")), safe="")
