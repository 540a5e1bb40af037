"""A paused writer (state T: Ctrl-Z in tmux, SIGSTOP, a debugger) is said, not read as "process alive", and
alerted like silence once the log has been still past the threshold (issue 22 #4). Real stopped processes."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from bot.core.evidence import parse_processes
from bot.core.verdict import Level, Phase, Worry
from bot.probe.checkup import check
from bot.probe.replay import DefaultRun
from bot.probe.runners import LocalRunner
from tests.standins import set_age, writer_holding

STEPS = "".join(f"step={i} loss=2.{i} tok/s=14200\n" for i in range(1, 6))


def probe(log: Path):
    return asyncio.run(check(DefaultRun("paused", str(log)), LocalRunner()))


@pytest.mark.parametrize("age, phase, level, worries", [
    (5, Phase.TRAINING, Level.WARN, []),  # just paused: said at once, no incident yet
    (15 * 60, Phase.SILENT, Level.CRIT, [Worry.SILENT]),  # still past silence_after: alerted as silence is
])
def test_a_stopped_writer_reads_paused(tmp_path: Path, age: float, phase: Phase, level: Level, worries: list) -> None:
    log = tmp_path / "train.log"
    log.write_text(STEPS)
    with writer_holding(log) as writer:
        os.kill(writer.pid, signal.SIGSTOP)
        try:
            set_age(log, age)
            verdict = probe(log)
        finally:
            os.kill(writer.pid, signal.SIGCONT)
        resumed = probe(log)
    assert verdict.headline.startswith(f"paused — process {writer.pid} is stopped") and "last step 5" in verdict.headline
    assert (verdict.phase, verdict.level, [c.kind for c in verdict.concerns]) == (phase, level, worries)
    assert not resumed.headline.startswith("paused")


@pytest.mark.parametrize("line, state, paused", [
    ("  4242   310 Tl   python train.py", "Tl", True),
    ("  4242   310 t    python train.py", "t", True),
    ("  4242   310 Sl+  python train.py", "Sl+", False),
    ("  4242   310 python train.py", None, False),  # a probe saved before the state was asked for
])
def test_the_state_column_is_read_and_optional(line: str, state: str | None, paused: bool) -> None:
    [process] = parse_processes(line)
    assert (process.pid, process.elapsed_s, process.command, process.state, process.paused) == (4242, 310, "python train.py", state, paused)
