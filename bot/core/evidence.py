"""Pure: a probe's sections -> Evidence (the log's lines and their stamps, progress read by structure, bars
with their roles, crashes, announcements and ends, writers, GPU readings). No judgement yet."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from bot.core.bars import Bar, Role, frames, role_of
from bot.core.crashes import find_crashes
from bot.core.facts import Crash, FolderUse, GpuReadings, Process, Step
from bot.core.gpus import parse_gpu_section
from bot.core.grammar import LineStamps, eval_noun, fields, is_eval_key, is_loss_key, last_frame, message, split_rank_prefix
from bot.core.launches import newest_launch
from bot.core.learned import CounterRule, Learned, Sighting, learn_counter, news_line
from bot.core.markers import Mark, Marker, find_markers
from bot.core.progress import bar_step, clean, counter_word, read_progress, recognise, table_header, table_step
from bot.core.redact import printable, redact_secrets
from bot.core.sections import LINE_CAP, Sections

# A line above a loading bar that says where the weights go ("Target 1 on cuda:1...").
_DEVICE_HINT = re.compile(r"cuda:\d+|\bgpu\s*\d|\bdevice\b|\brank\s*\d", re.I)
_HIDDEN = re.compile(r"^# hidden (\d{1,9})$", re.M)
_MOVED = re.compile(r"^# moved (.+)$", re.M)
_NEAR = re.compile(r"^# near$", re.M)
_USE = re.compile(r"^# use (\d{1,9}) ppid=(\d{1,9}) r=(\d{1,6}) w=(\d{1,6}) g=(\d{1,6})$", re.M)
# `ps -o pid=,etimes=,stat=,args=`; probes saved before the state was asked for have no stat column.
_PROC_LINE = re.compile(r"\s*(\d+)\s+(\S+)\s+(?:([DIRSTtWXZ][<NLsl+]*)\s+)?(.*)")
_NESTED = re.compile(r"\x1b\[A")  # tqdm moves the cursor up after a bar drawn at position >= 1


@dataclass(frozen=True)
class LogFile:
    path: str
    exists: bool
    size: int | None = None
    mtime: float | None = None
    readable: bool = True
    dir_exists: bool = True
    inode: int | None = None


@dataclass(frozen=True)
class BarLine:
    """A line of the window whose last frame is a progress bar."""

    index: int
    bar: Bar
    after: str = ""  # words written after the frame on the same line (its \r lost): the line's later news


@dataclass(frozen=True)
class MovedWriter:
    """The log's writer holds another file of the log's folder: the log was rotated or replaced under it."""

    process: Process
    path: str
    size: int | None
    mtime: float | None
    steps: tuple[Step, ...] = ()  # progress read from that file's end

    @property
    def deleted(self) -> bool:
        """The log was deleted under its writer (rm, then a new file by its name): it writes the old inode."""
        return self.path.endswith(" (deleted)")

    @property
    def name(self) -> str:
        """The file's name as said: `train.log.1`, or `train.log` for the deleted one."""
        return self.path.removesuffix(" (deleted)").rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Evidence:
    """Everything one probe saw, parsed; no judgement yet."""

    log: LogFile
    now: float | None = None  # the remote clock when probed
    host: str = ""
    lines: tuple[str, ...] = ()  # the log's last lines: \r-frames collapsed, control codes removed
    stamps: Sequence[float | None] = ()  # each line's own timestamp (the log's clock), where it has one
    window_truncated: bool = False  # the window starts mid-file
    steps: tuple[Step, ...] = ()  # the loop's last progress lines, oldest first (step lines or the loop's bar)
    bars: tuple[BarLine, ...] = ()  # every line whose last frame is a bar, with the bar's role
    crashes: tuple[Crash, ...] = ()
    markers: tuple[Marker, ...] = ()  # announcements (saving, evaluating…) and normal ends
    writers: tuple[Process, ...] = ()  # processes holding the log open for writing
    hidden_processes: int = 0  # processes whose open files the probe was not allowed to see
    moved: MovedWriter | None = None  # nobody writes the log, but a process writes another file of its folder
    near: tuple[Process, ...] = ()  # nobody holds the log open, but these training processes work in its folder
    near_use: tuple[FolderUse, ...] = ()  # how each process in the folder holds its files (none: the probe could not tell)
    processes: tuple[Process, ...] = ()  # likely training processes on the target
    gpus: GpuReadings = field(default_factory=GpuReadings)
    problems: tuple[str, ...] = ()  # parts of the probe that failed, in words
    counter: CounterRule | None = None  # the loop's counter as earlier looks taught it (bot.core.learned)
    sightings: tuple[Sighting, ...] = ()  # the window's recent templates, for the next look (bot.core.learned)
    news: str = ""  # before the first step: the newest line that is not a repeat (heartbeats repeat)
    learned: Learned | None = None  # what earlier looks learned of this log, when it still holds for it

    @property
    def silent_for(self) -> float | None:
        """Seconds since the log last grew, by the remote clock (the bot's clock may differ)."""
        if self.now is None or self.log.mtime is None:
            return None
        return max(0.0, self.now - self.log.mtime)

    @property
    def last_step_index(self) -> int | None:
        return self.steps[-1].index if self.steps else None

    @property
    def bar(self) -> Bar | None:
        return self.bars[-1].bar if self.bars else None

    @property
    def bar_index(self) -> int | None:
        return self.bars[-1].index if self.bars else None

    def device_line(self, index: int) -> str | None:
        """The line above a bar when it names where the work goes ("Target 1 on cuda:1")."""
        for j in range(index - 1, max(-1, index - 4), -1):
            above = self.lines[j].strip()
            if above and not any(b.index == j for b in self.bars):
                return above.rstrip(". ") if _DEVICE_HINT.search(above) and len(above) < 160 else None
        return None


# syslog and CloudWatch (SageMaker's logs) write control characters as `#` and three octal digits.
_SYSLOG_ESCAPE = re.compile(r"#0(15|33)(?=\[|[A-Za-z ]|$)", re.M)


def _unescape_syslog(text: str) -> str:
    if "#015" not in text and "#033" not in text:
        return text
    return _SYSLOG_ESCAPE.sub(lambda m: "\r" if m[1] == "15" else "\x1b", text)


def _capped(line: str) -> str:
    """At most LINE_CAP characters; a longer line is redacted before it is cut, or a credential across
    the cut would be left with a head too short for its rule."""
    return line if len(line) <= LINE_CAP else redact_secrets(line)[:LINE_CAP]


def collapse_frames(text: str) -> list[str]:
    """Split text into lines, keeping only the last frame of each \\r-redrawn line (tqdm bars)."""
    text = _unescape_syslog(text)
    lines = [_capped(printable(last_frame(raw))) for raw in text.split("\n")]
    if lines and lines[-1] == "" and (text.endswith("\n") or not text):
        lines.pop()
    return _unquoted(lines)


_QUOTED = re.compile(r"^>(?: |$)")


def _unquoted(lines: list[str]) -> list[str]:
    """A log quoted whole (a mail's or an issue's `> ` before every line): the quote's marks are not the log's."""
    written = [x for x in lines if x.strip()]
    if len(written) < 2 or not all(_QUOTED.match(x) for x in written):
        return lines
    return [x[2:] if x.startswith("> ") else x[1:] for x in lines]


def _key_values(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep:
            out.setdefault(key, value)
    return out


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _log_file(path: str, meta: dict[str, str]) -> LogFile:
    if meta.get("exists") == "0":
        return LogFile(path, exists=False, dir_exists=meta.get("dir") != "0")
    size = _number(meta.get("size"))
    inode = _number(meta.get("inode"))
    return LogFile(path, exists=True, size=int(size) if size is not None else None, mtime=_number(meta.get("mtime")),
                   readable=meta.get("readable") != "0", inode=int(inode) if inode is not None else None)


def parse_processes(text: str) -> tuple[Process, ...]:
    found = []
    for line in text.splitlines():
        if line.startswith(("#", "size=")):
            continue
        m = _PROC_LINE.match(line)
        if m:
            elapsed = m.group(2)
            found.append(Process(int(m.group(1)), int(elapsed) if elapsed.isdigit() else None, printable(m.group(4)),
                                 state=m.group(3)))
    return tuple(found)


def _drawn_below(raw: str) -> bool:
    """Is the line's last frame drawn below another bar (tqdm's ESC[A after it)? Only that frame says: an earlier
    one of the same line may have been (Tianshou redraws its epoch bar in place after drawing it one row down)."""
    last = next((f for f in reversed(raw[-4000:].split("\r")) if f.strip()), "")
    return bool(_NESTED.search(last[-400:]))


def _bars(raw_lines: Sequence[str], lines: Sequence[str]) -> tuple[BarLine, ...]:
    out = []
    for i, shown in enumerate(lines):
        if "|" not in shown and "[" not in shown and "━" not in shown:
            continue
        own = split_rank_prefix(shown)[1]
        found = frames(own, nested=_drawn_below(raw_lines[i]))
        if found:
            after = own[found[-1].end:].strip()
            out.append(BarLine(i, found[-1], after if _GLUED.search(after) and not _ASIDE.fullmatch(after) else ""))
    return tuple(_table_rows(out, lines))


# Text after a bar that is a message of its own, not the bar's padding, a stray character or the rest of a frame
# cut at the terminal's width (`, train_lo`): words with a number, or a sentence's capital (`Saving checkpoint...`).
_GLUED = re.compile(r"^(?![,\]])(?:.*[A-Za-z]{3,}.*\d|.*\d.*[A-Za-z]{3,}|[^a-z]*[A-Z][a-z]{2,})")
_ASIDE = re.compile(r"\[[^\]]*\]|\([^)]*\)")  # an annotation, not a message: Ray's `[repeated 15x across cluster]`


def _reading_lines(lines: Sequence[str], bars: Sequence[BarLine]) -> list[str]:
    """The lines as the progress and announcement readers see them: a bar with a message glued after it
    (its \r lost in a copy) stands for that message."""
    out = list(lines)
    for b in bars:
        if b.after:
            out[b.index] = b.after
    return out


def _table_rows(bars: list[BarLine], lines: Sequence[str]) -> list[BarLine]:
    """Bars whose description is a row of the window's epoch table are the loop's (YOLO's epoch bars); the
    bar under the same table that names metrics (`Class Images … mAP50-95`) is its validation."""
    header = next((h for x in reversed(lines) if (h := table_header(x))), None)
    if header is None:
        return bars
    out = []
    for b in bars:
        if table_step(b.bar, header, b.index) is not None:
            b = replace(b, bar=replace(b.bar, role=Role.TRAINING))
        elif re.search(r"\bmAP|\bClass[ \t]+Images\b", b.bar.desc):
            b = replace(b, bar=replace(b.bar, role=Role.EVALUATING))
        out.append(b)
    return out


def _place(bars: list[BarLine]) -> list[BarLine]:
    """Roles that need the neighbours: a nested bar with no description inside a loop is its evaluation
    (HF Trainer), a loop bar's nested saves keep their own roles; with no nesting marks (a log whose
    ESC codes were stripped), a bar with no description and another total after a loop bar is the same."""
    loop_totals = [b.bar.total for b in bars if b.bar.role is Role.TRAINING and not b.bar.desc and not b.bar.nested]
    # The loop's total: the commonest, and between equals the first (a final evaluation comes after the loop).
    loop_total = max(dict.fromkeys(loop_totals), key=loop_totals.count) if loop_totals else None
    placed = []
    for b in bars:
        bar = b.bar
        if bar.nested and not bar.desc:
            bar = replace(bar, role=Role.EVALUATING)
        elif (bar.role is Role.TRAINING and not bar.desc and loop_total is not None and bar.total != loop_total
              and loop_totals.count(bar.total) <= loop_totals.count(loop_total)):
            bar = replace(bar, role=Role.EVALUATING)
        placed.append(replace(b, bar=bar))
    return placed


def _against_counter(bars: Sequence[BarLine], steps: Sequence[Step], lines: Sequence[str]) -> list[BarLine]:
    """A bar with no description counts the loop's steps only when its total is the loop's: beside step lines
    that print their total (`step: 1050 (total: 1060)`), a bar of n/392507 is some other work's — what the
    line above it announces (PaddleNLP downloads its weights through such a bar), or work we cannot place."""
    total = steps[-1].total if steps else None
    if total is None:
        # A bar with no description (a counting bar `42it [00:00, 222144.73it/s]`, or ai-toolkit's `40/40` under
        # `- quantizing 40 transformer blocks`) counts what the line above it announced when that is a phase of
        # its own (AllenNLP: `Creating a vocabulary …`). It has no words of its own: the announcement's, cut, say what.
        return [replace(b, bar=replace(b.bar, role=said[0], desc=said[1].rstrip(".… ")[:60])) if (
            b.bar.role is Role.TRAINING and not b.bar.desc
            and (said := _announcement(lines, b.index, bars))[0] is not Role.OTHER) else b for b in bars]
    out = []
    for b in bars:
        bar = b.bar
        if bar.role is Role.TRAINING and not bar.desc and not bar.nested and bar.total is not None and bar.total != total:
            b = replace(b, bar=replace(bar, role=_announcement(lines, b.index, bars)[0]))
        out.append(b)
    return out


def _inner(bars: Sequence[BarLine]) -> list[BarLine]:
    """A bar that ran between two of the loop's frames — the loop advanced across it — is work inside the loop's
    step (a GRPO rollout's `Processed prompts 32/32` inside step 56/2290, a weight sync's shards): neither the
    loop's counter nor a phase of its own, but the loop's, nested in it. Its description says so wherever it
    shows again, also after the loop's last frame. Evaluations and saves keep their own phase."""
    loop = [b for b in bars if b.bar.role is Role.TRAINING and not b.bar.nested]
    if len(loop) < 2:
        return list(bars)
    outer = max(b.bar.total or 0 for b in loop)
    inside = {b.bar.desc for a, c in zip(loop, loop[1:]) if a.bar.n != c.bar.n
              for b in bars if a.index < b.index < c.index and b.bar.desc and b.bar.role is not Role.TRAINING}
    return [replace(b, bar=replace(b.bar, role=Role.TRAINING, nested=True))
            if b.bar.desc in inside and b.bar.role not in (Role.EVALUATING, Role.SAVING) and (b.bar.total or 0) < outer
            else b for b in bars]


# The phases an announcement above a bar hands it, in the markers' own words (one table: bot.core.markers).
_ANNOUNCED_ROLE = {Mark.LOADING: Role.LOADING, Mark.PREPARING: Role.PREPARING}


def _announcement(lines: Sequence[str], index: int, bars: Sequence[BarLine]) -> tuple[Role, str]:
    """The role the lines just above a bar give it, and the line that says so ("Downloading … .pdparams" before
    the bar: loading; AllenNLP's `Creating a vocabulary …` then `Fitting token dictionary from dataset.` before its
    counting bar: preparing)."""
    at_bars = {b.index for b in bars}
    said = 0
    for j in range(index - 1, max(-1, index - 4), -1):
        if j not in at_bars and (above := message(lines[j])):
            role = role_of(above)
            if role is Role.OTHER and (marked := find_markers([above])):
                role = _ANNOUNCED_ROLE.get(marked[0].kind, Role.OTHER)
            if role not in (Role.TRAINING, Role.OTHER):
                return role, above
            said += 1
            if said == 2:
                break
    return Role.OTHER, ""


def _with_evaluation(bars: Sequence[BarLine], evaluation: Step | None) -> tuple[BarLine, ...]:
    """An evaluation's own progress lines (`Epoch(val)  [4][1/8]`) are its bar: the pass and how far it got."""
    if evaluation is None or evaluation.step is None or not evaluation.total:
        return tuple(bars)
    pct = round(100 * evaluation.step / evaluation.total)
    bar = Bar(eval_noun(evaluation.line), pct, evaluation.step, evaluation.total, role=Role.EVALUATING,
              frame=evaluation.line, end=len(evaluation.line))
    return tuple(sorted([*bars, BarLine(evaluation.index, bar)], key=lambda b: b.index))


def _progress(steps: tuple[Step, ...], lines: Sequence[str], bars: Sequence[BarLine]) -> tuple[Step, ...]:
    """The loop's progress: its step lines, or its own bar's frames, whichever comes later in the log.

    A loop that prints step lines and draws a bar (HF Trainer: loss dicts and the bar) has both; the
    bar's n/total is the global step, the lines carry the loss."""
    loop = [b for b in bars if b.bar.role is Role.TRAINING and not b.bar.nested]
    if not loop:
        return steps
    header = next((h for x in reversed(lines) if (h := table_header(x))), None)
    frames_ = _within_epochs(loop[-1], bars) or tuple(
        (header and table_step(b.bar, header, b.index)) or _with_epoch_header(bar_step(b.bar, b.index), lines) for b in loop[-8:])
    if not steps:
        return frames_
    # Both: the later one leads, the other fills in what it lacks (HF: the bar counts, the dicts carry
    # the loss; kohya: the bar carries avr_loss, the epoch lines the epoch).
    lead, other = (frames_, steps) if frames_[-1].index > steps[-1].index else (steps, frames_)
    last, aside = lead[-1], other[-1]
    if aside.total and (aside.step or 0) >= aside.total and _moved_since(lead, aside.index) >= 3:
        # The other series ended at its total and the lead's counter moved on three times since: an earlier phase
        # (a warm-up's `Epoch 10/10` bar before fifty federated rounds), not this loop's other half.
        return lead
    filled = replace(
        last,
        step=last.step if last.step is not None else aside.step,
        total=last.total if last.step is not None else aside.total,
        counter=last.counter if last.step is not None else aside.counter,
        loss=last.loss if last.loss is not None else aside.loss,
        loss_key=last.loss_key if last.loss is not None else aside.loss_key,
        non_finite=last.non_finite or (aside.non_finite if last.loss is None else ()),
        epoch=last.epoch if last.epoch is not None else aside.epoch,
        rate=last.rate if last.rate is not None else aside.rate,
        rate_unit=last.rate_unit if last.rate is not None else aside.rate_unit,
    )
    return (*lead[:-1], filled)


_EPOCHS_DESC = re.compile(r"(?i)^\W*epochs?\W*$")  # a bar over the epochs themselves: `epochs:  33%|███▎ | 1/3`


def _within_epochs(outer: BarLine, bars: Sequence[BarLine]) -> tuple[Step, ...]:
    """A bar over the epochs with a bar over each epoch's batches below it (tqdm's nested bars): the batches are the
    loop's steps, the outer bar says which epoch (`epoch 1/3 · batch 29/60`)."""
    if not _EPOCHS_DESC.match(outer.bar.desc or ""):
        return ()
    inside = [b for b in bars if b.bar.role is Role.TRAINING and b.bar.nested and b.index > outer.index]
    return tuple(replace(bar_step(b.bar, b.index), epoch=float(outer.bar.n), epoch_total=outer.bar.total, counter="batch")
                 for b in inside[-8:])


def _moved_since(series: Sequence[Step], index: int) -> int:
    """How many times the series' counter advanced after line `index`."""
    after = [s.step for s in series if s.index > index and s.step is not None]
    return sum(1 for a, b in zip(after, after[1:]) if b > a)


def _with_epoch_loss(steps: tuple[Step, ...], lines: Sequence[str]) -> tuple[Step, ...]:
    """A loop counted by `Epoch N` lines prints its loss on a line of its own (nnU-Net v1: `epoch:  3` then
    `train loss : 1.1718`; v2: `train_loss nan` at the epoch's end, then `Epoch 1`): the epoch's loss is
    that line's — the one after the epoch's line, or for the epoch just begun, its predecessor's."""
    if not steps or steps[-1].counter != "epoch" or any(s.loss is not None for s in steps):
        return steps
    out = list(steps)
    for k, s in enumerate(steps):
        upto = steps[k + 1].index if k + 1 < len(steps) else len(lines)
        since = steps[k - 1].index + 1 if k > 0 else 0
        found = _loss_line(lines, s.index + 1, upto) or (_loss_line(lines, since, s.index) if k == len(steps) - 1 else None)
        if found is not None:
            out[k] = replace(s, loss=found.value, loss_key=found.key, non_finite=() if found.finite else (found.key,))
    return tuple(out)


# A loop announcing its next epoch: CNTK's `Starting Epoch 18: learning rate per sample = …`, st-gcn's `Training
# epoch: 1`, fairseq's `begin training epoch 104`.
_EPOCH_START = re.compile(r"(?i)^(?:(?:start(?:ing)?|begin(?:ning)?)[ \t]+(?:training[ \t]+)?|training[ \t]+)epoch[ \t]*[:#]?[ \t]*(\d+)\b")


def _with_next_epoch(steps: tuple[Step, ...], lines: Sequence[str]) -> tuple[Step, ...]:
    """The loop stands at the epoch it announced after its last progress line: the next one has begun (its batch
    count, when the counter restarts each epoch, is not known yet)."""
    if not steps:
        return _first_epoch(lines)
    last = steps[-1]
    for k in range(len(lines) - 1, last.index, -1):
        if (m := _EPOCH_START.match(message(lines[k]))) is None:
            continue
        epoch = int(m[1])
        if (last.epoch is not None and epoch <= last.epoch) or (last.epoch_total is not None and epoch > last.epoch_total):
            return steps
        per_epoch = last.counter == "batch" or last.epoch is None
        begun = replace(last, line=lines[k].strip(), index=k, epoch=float(epoch), counter="epoch" if per_epoch else last.counter,
                        step=None if per_epoch else last.step, total=None if per_epoch else last.total, rate=None, loss=None,
                        stamp=None, fmt="announced")
        return (*steps, begun)
    return steps


_BARE_EPOCH = re.compile(r"(?i)^[\W_]*epoch[ \t]*[:#]?[ \t]*(\d+)[\W_]*$")  # nnU-Net v2's `Epoch 0` on a line of its own
FIRST_EPOCH_LINES = 40  # the loop's first epoch, announced near the end of a window with no progress yet


def _first_epoch(lines: Sequence[str]) -> tuple[Step, ...]:
    """A loop with no progress line yet stands at the epoch it announced last, alone on its line, once: it has
    begun (nnU-Net v2 prints `Epoch 0` and its learning rate, then nothing until the epoch ends)."""
    for k in range(len(lines) - 1, max(-1, len(lines) - FIRST_EPOCH_LINES), -1):
        if m := _BARE_EPOCH.match(message(lines[k])):
            return (Step(line=lines[k].strip(), epoch=float(m[1]), counter="epoch", index=k, fmt="announced"),)
    return ()


# A counter's header: its word and n/total alone on a line, between decorations (`Round 48/50`,
# `--- Iteration 71/75 ---`, `=== Epoch 3 of 10 ===`). The loop prints it as each pass begins.
_HEADER = re.compile(r"(?i)^[\W_]*(epoch|round|iteration|iter|episode|generation|trial|fold|stage|cycle)[ \t]*[:#]?[ \t]*"
                     r"(\d+)[ \t]*(?:/|of)[ \t]*(\d+)[\W_]*$")


def _with_header(steps: tuple[Step, ...], lines: Sequence[str]) -> tuple[Step, ...]:
    """What the loop's headers say of its last step: the total of the pass it counts (`Round 50/50` above
    `Round 50, Global Loss: 0.0275`), or that the next pass has begun (`--- Iteration 71/75 ---` after the
    lines of iteration 69's candidates): its number and total, nothing measured yet."""
    if not steps or steps[-1].fmt == "announced" or steps[-1].step is None or steps[-1].counter is None:
        return steps
    last = steps[-1]
    word = counter_word(last.counter)
    for k in range(len(lines) - 1, max(-1, last.index - 6), -1):
        if (m := _HEADER.match(message(lines[k]))) is None:
            continue
        said = m[1].lower()
        if not (said.startswith(word) or word.startswith(said)):
            continue  # another counter's header (`iter` and `iteration` are one counter)
        n, total = int(m[2]), int(m[3])
        if not 0 < n <= total:
            return steps
        if k < last.index and n == last.step and last.total is None:
            return (*steps[:-1], replace(last, total=total))
        if k > last.index and n > last.step:
            begun = replace(last, line=lines[k].strip(), index=k, step=n, total=total, rate=None, loss=None, stamp=None,
                            fmt="announced")
            return (*steps, begun)
        return steps
    return steps


def _loss_line(lines: Sequence[str], start: int, stop: int):
    """The first line in [start, stop) that is a training loss alone: one number, named a loss."""
    for x in lines[max(0, start):stop]:
        fs = fields(message(x))
        if len(fs) == 1 and is_loss_key(fs[0].key) and not is_eval_key(fs[0].key):
            return fs[0]
    return None


def _with_epoch_header(step: Step, lines: Sequence[str]) -> Step:
    """Keras prints `Epoch 7/10` on a line of its own above the epoch's bar."""
    if step.epoch is not None or step.index < 0:
        return step
    for j in range(step.index - 1, max(-1, step.index - 4), -1):
        if (m := _HEADER.match(lines[j])) and m[1].lower() == "epoch":
            return replace(step, epoch=float(m[2]), epoch_total=int(m[3]), counter="batch")
    return step


def _moved(sections: Sections) -> MovedWriter | None:
    text = sections.text("writers", 1 << 16)
    if not (m := _MOVED.search(text)):
        return None
    after = text[m.end():]
    meta = _key_values(after.split("\n", 2)[1] if "\n" in after else "")
    procs = parse_processes(after)
    if not procs:
        return None
    lines = collapse_frames(sections.text("moved.window"))[1:]  # its first line is cut
    size = _number(meta.get("size"))
    return MovedWriter(procs[0], m[1].strip(), int(size) if size is not None else None, _number(meta.get("mtime")),
                       recognise(lines, LineStamps(lines)))


def _problems(sections: Sections, log: LogFile) -> list[str]:
    problems = []
    if "meta" not in sections.parts:
        return ["the probe printed nothing it could read"]
    if not sections.complete:
        problems.append("the probe's output was cut short")
    for part, what in (("window", "reading the log"), ("steps", "searching for step lines"), ("writers", "listing processes")):
        rc = sections.rc(part)
        if rc not in (None, 0):
            err = sections.text(f"{part}.err", 400).strip().splitlines()
            problems.append(f"{what} failed (exit {rc}{': ' + printable(err[-1]) if err else ''})")
    if log.exists and not log.readable:
        problems.append(f"log not readable: {log.path} (permission denied)")
    return problems


@dataclass(frozen=True)
class LogText:
    """The part of a look's parse that depends only on the log's bytes (the window, the step lines), its size and
    inode, the run's step pattern and what earlier looks learned: an unchanged log's is kept (bot.probe.looks)."""

    lines: tuple[str, ...]
    stamps: Sequence[float | None]
    truncated: bool
    steps: tuple[Step, ...]
    bars: tuple[BarLine, ...]
    crashes: tuple[Crash, ...]
    markers: tuple[Marker, ...]
    counter: CounterRule | None
    sightings: tuple[Sighting, ...]
    news: str


def text_key(sections: Sections, log: LogFile, learned: Learned | None) -> tuple:
    """Everything read_log_text reads (with the run's step pattern, which its caller keys on): equal keys, equal
    parses. Of what was learned, only the counter and the templates (its news and their age are the diagnosis')."""
    taught = (learned.counter, learned.sightings) if learned is not None else None
    return sections.get("window"), sections.get("steps"), log.size, taught


def read_evidence(sections: Sections, log_path: str, custom=None, learned: Learned | None = None, *,
                  text: Callable[[Sections, LogFile, Any, Learned | None], LogText] | None = None) -> Evidence:
    """Parse a probe's sections. Never raises: what cannot be read becomes a problem. `learned`: what earlier
    looks at the run learned of its format (used only while it holds for the log as it is now). `text`: reads
    the log's text in place of read_log_text (one that keeps an unchanged log's parse)."""
    meta = _key_values(sections.text("meta", 4096))
    log = _log_file(log_path, meta)
    learned = learned if learned is not None and learned.holds_for(log.inode, log.size) else None
    t = (text or read_log_text)(sections, log, custom, learned)
    writers_text = sections.text("writers", 1 << 16)
    near_text = writers_text[m.end():] if (m := _NEAR.search(writers_text)) else ""
    for mark in (_MOVED, _NEAR):
        writers_text = writers_text[: m.start()] if (m := mark.search(writers_text)) else writers_text
    return Evidence(
        log=log,
        now=_number(meta.get("now")),
        host=meta.get("host", ""),
        lines=t.lines,
        stamps=t.stamps,
        window_truncated=t.truncated,
        steps=t.steps,
        bars=t.bars,
        crashes=t.crashes,
        markers=t.markers,
        writers=parse_processes(writers_text),
        hidden_processes=int(hidden[1]) if (hidden := _HIDDEN.search(writers_text)) else 0,
        moved=_moved(sections),
        near=parse_processes(near_text),
        near_use=tuple(FolderUse(*map(int, m.groups())) for m in _USE.finditer(near_text)),
        processes=parse_processes(sections.text("procs", 1 << 16)),
        gpus=parse_gpu_section(sections.text("gpus", 1 << 18),
                               sections.text("gpu.window", 1 << 18) if "gpu.window" in sections.parts else None,
                               sections.rc("gpu.window")),
        problems=tuple(_problems(sections, log)),
        counter=t.counter,
        sightings=t.sightings,
        news=t.news,
        learned=learned,
    )


def read_log_text(sections: Sections, log: LogFile, custom=None, learned: Learned | None = None) -> LogText:
    """The window and step lines read: lines, stamps, progress, bars, crashes, announcements (see LogText).
    `learned`: what earlier looks learned, already known to hold for this log."""
    window = _unescape_syslog(sections.text("window"))
    truncated = bool(log.size and log.size > len(sections.get("window") or b""))
    if truncated:
        # The window starts somewhere in a line: drop that part. In a bar that never ends its line (50 MB
        # of \r-frames), or one line of them that fills the window and ends it, only the first frame is cut.
        cut = window.find("\n")
        cut = cut if cut >= 0 and window[cut + 1:].strip() else window.find("\r")
        window = window[cut + 1:] if cut >= 0 else ""
    earlier = [x for x in collapse_frames(sections.text("steps", 1 << 18)) if not x.startswith("cap=")]
    return _read_window(window, truncated, earlier, custom, learned)


def _read_window(window: str, truncated: bool, earlier: list[str], custom, learned: Learned | None) -> LogText:
    raw_lines = window.split("\n")
    lines = collapse_frames(window)
    raw_lines = raw_lines[: len(lines)]
    stamps = LineStamps(lines)
    bars = _bars(raw_lines, lines)
    reading = _reading_lines(lines, bars)
    progress, counter = _read_progress_learning(reading, stamps, earlier, learned)
    bars = tuple(_place(_inner(_against_counter(bars, progress.steps, lines))))
    steps = _with_header(_with_next_epoch(_with_epoch_loss(_progress(progress.steps, lines, bars), lines), lines), lines)
    bars = _with_evaluation(bars, progress.evaluation)
    if custom is not None and not steps:
        steps = _custom(lines, custom)
    if (start := newest_launch(lines, stamps, steps)) is not None:
        # The log's last progress is an earlier launch's: the run is the newest one, read alone.
        return _read_window("\n".join(raw_lines[start:]), True, [], custom, None)
    return LogText(
        lines=tuple(lines),
        stamps=stamps,
        truncated=truncated,
        steps=steps,
        bars=bars,
        crashes=tuple(find_crashes(reading)),  # a crash glued after a bar's frame starts its own line there
        markers=_with_after(find_markers(lines) + _glued_markers(raw_lines, len(lines)), bars),
        counter=counter,
        sightings=progress.sightings,
        news=news_line(lines, clean) if not steps else "",
    )


def _read_progress_learning(reading, stamps, earlier, learned: Learned | None):
    """The window's progress, read by the counter earlier looks taught — and when the numbers that moved since
    the last look say the window's own reading took the wrong one (or found none), read again by that one."""
    rule = learned.counter if learned is not None else None
    progress = read_progress(reading, stamps, earlier, rule)
    if learned is None:
        return progress, None
    counter = learn_counter(learned, progress.sightings, progress.loop)
    if counter is not None and counter != progress.loop and counter != rule:
        progress = read_progress(reading, stamps, earlier, counter)
    return progress, counter


def _with_after(markers: tuple[Marker, ...], bars: Sequence[BarLine]) -> tuple[Marker, ...]:
    """The announcements glued after a bar's frame (`…14.80it/s]Saving checkpoint…`, `…=0.1Saving checkpoint`),
    read in the glued text alone (the line as a whole may hide them, or show the bar's own words first): at the
    bar's line, their text the glued text's, so that the stages can tell them from the frame's."""
    glued = [replace(m, index=b.index) for b in bars if b.after for m in find_markers([b.after])]
    return tuple(sorted((*markers, *glued), key=lambda m: m.index)) if glued else markers


def _glued_markers(raw_lines: Sequence[str], count: int) -> tuple[Marker, ...]:
    """Ends glued into an earlier \\r-frame of the last lines (Lightning prints `Trainer.fit stopped`
    onto its bar, then redraws the bar over it)."""
    out = []
    for i in range(max(0, count - 5), count):
        raw = raw_lines[i]
        if "\r" in raw:
            for frame in raw.split("\r")[:-1]:
                for m in find_markers([printable(frame)]):
                    if m.kind is Mark.ENDED:
                        out.append(replace(m, index=i))
    return tuple(out)


def _custom(lines: Sequence[str], custom) -> tuple[Step, ...]:
    from bot.core.formats import parse_step

    found = [replace(s, index=i) for i, line in enumerate(lines) if (s := parse_step(line, custom))]
    return tuple(found[-8:])
