"""Pure: a probe's sections -> Evidence (log facts, steps, last bar, crashes, writers, GPU readings)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from bot.core.facts import Activity, Bar, Crash, GpuReadings, Process, Step
from bot.core.crashes import find_activity, find_crashes
from bot.core.formats import parse_bar, parse_step
from bot.core.gpus import parse_gpu_section
from bot.core.logtext import last_frame
from bot.probe.script import LINE_CAP, Sections
from bot.core.redact import printable

# A line above a loading bar that says where the weights go ("Target 1 on cuda:1...").
_DEVICE_HINT = re.compile(r"cuda:\d+|\bgpu\s*\d|\bdevice\b|\brank\s*\d", re.I)
KEPT_STEPS = 8  # enough for the rate, the loss and a learned step interval
_HIDDEN = re.compile(r"^# hidden (\d{1,9})$", re.M)
_PROC_LINE = re.compile(r"\s*(\d+)\s+(\S+)\s+(.*)")


@dataclass(frozen=True)
class LogFile:
    path: str
    exists: bool
    size: int | None = None
    mtime: float | None = None
    readable: bool = True
    dir_exists: bool = True


@dataclass(frozen=True)
class Evidence:
    """Everything one probe saw, parsed; no judgement yet."""

    log: LogFile
    now: float | None = None  # the remote clock when probed
    host: str = ""
    lines: tuple[str, ...] = ()  # the log's last lines: \r-frames collapsed, control codes removed
    window_truncated: bool = False  # the window starts mid-file
    steps: tuple[Step, ...] = ()  # the last step lines, oldest first
    last_step_index: int | None = None  # index in `lines`; -1 when the step lies before the window
    bar: Bar | None = None  # the last progress bar in the window
    bar_index: int | None = None
    device_line: str | None = None  # the line above the bar when it names a device
    crashes: tuple[Crash, ...] = ()
    activity: Activity | None = None
    writers: tuple[Process, ...] = ()  # processes holding the log open for writing
    hidden_processes: int = 0  # processes whose open files the probe was not allowed to see
    processes: tuple[Process, ...] = ()  # likely training processes on the target
    gpus: GpuReadings = field(default_factory=GpuReadings)
    problems: tuple[str, ...] = ()  # parts of the probe that failed, in words

    @property
    def silent_for(self) -> float | None:
        """Seconds since the log last grew, by the remote clock (the bot's clock may differ)."""
        if self.now is None or self.log.mtime is None:
            return None
        return max(0.0, self.now - self.log.mtime)


def collapse_frames(text: str) -> list[str]:
    """Split text into lines, keeping only the last frame of each \r-redrawn line (tqdm bars)."""
    lines = []
    for raw in text.split("\n"):
        lines.append(printable(last_frame(raw))[:LINE_CAP])
    if lines and lines[-1] == "" and (text.endswith("\n") or not text):
        lines.pop()
    return lines


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
    return LogFile(
        path,
        exists=True,
        size=int(size) if size is not None else None,
        mtime=_number(meta.get("mtime")),
        readable=meta.get("readable") != "0",
    )


def parse_processes(text: str) -> tuple[Process, ...]:
    found = []
    for line in text.splitlines():
        m = _PROC_LINE.match(line)
        if m:
            elapsed = m.group(2)
            found.append(Process(int(m.group(1)), int(elapsed) if elapsed.isdigit() else None, printable(m.group(3))))
    return tuple(found)


def _steps(lines: list[str], searched: str, custom: re.Pattern[str] | None) -> tuple[tuple[Step, ...], int | None]:
    """The last step lines: from the window when it has any, else from the wider search."""
    # From the end: only the last few matter, and parsing all of a 64 KiB window of step lines
    # was most of the Python time of a probe (measured by the Slack bench).
    in_window: list[tuple[int, Step]] = []
    for i in range(len(lines) - 1, -1, -1):
        if step := parse_step(lines[i], custom):
            in_window.append((i, step))
            if len(in_window) == KEPT_STEPS:
                break
    if in_window:
        return tuple(s for _, s in reversed(in_window)), in_window[0][0]
    found = [s for line in collapse_frames(searched) if not line.startswith("cap=") and (s := parse_step(line, custom))]
    return (tuple(found[-KEPT_STEPS:]), -1) if found else ((), None)


def _last_bar(lines: list[str]) -> tuple[Bar | None, int | None, str | None]:
    for i in range(len(lines) - 1, -1, -1):
        # Every tqdm frame has "|" (the bar) or "[" (its timing); most log lines have neither.
        if ("|" not in lines[i] and "[" not in lines[i]) or (bar := parse_bar(lines[i])) is None:
            continue
        device = None
        for j in range(i - 1, max(-1, i - 4), -1):
            above = lines[j].strip()
            if above and parse_bar(above) is None:
                device = above.rstrip(". ") if _DEVICE_HINT.search(above) and len(above) < 160 else None
                break
        return bar, i, device
    return None, None, None


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


def read_evidence(sections: Sections, log_path: str, custom: re.Pattern[str] | None = None) -> Evidence:
    """Parse a probe's sections. Never raises: what cannot be read becomes a problem."""
    meta = _key_values(sections.text("meta", 4096))
    log = _log_file(log_path, meta)
    window = sections.text("window")
    lines = collapse_frames(window)
    truncated = bool(log.size and log.size > len(sections.get("window") or b""))
    if truncated and lines:
        lines = lines[1:]  # the first line is cut somewhere in the middle
    steps, last_step = _steps(lines, sections.text("steps", 1 << 18), custom)
    writers_text = sections.text("writers", 1 << 16)
    bar, bar_index, device = _last_bar(lines)
    return Evidence(
        log=log,
        now=_number(meta.get("now")),
        host=meta.get("host", ""),
        lines=tuple(lines),
        window_truncated=truncated,
        steps=steps,
        last_step_index=last_step,
        bar=bar,
        bar_index=bar_index,
        device_line=device,
        crashes=tuple(find_crashes(lines)),
        activity=find_activity(lines),
        writers=parse_processes(writers_text),
        hidden_processes=int(hidden[1]) if (hidden := _HIDDEN.search(writers_text)) else 0,
        processes=parse_processes(sections.text("procs", 1 << 16)),
        gpus=parse_gpu_section(sections.text("gpus", 1 << 18)),
        problems=tuple(_problems(sections, log)),
    )
