"""Round 4's first lessons, on its real logs: the structure that was misread at first sight (FIRST_SIGHT.txt)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.core.crashes import find_crashes
from bot.core.diagnose import diagnose
from bot.core.verdict import Level, Phase
from bot.probe.replay import DefaultRun
from tests.builders import evidence

ROUND4 = Path(__file__).parent / "fixtures" / "round4"


def log(case: str) -> str:
    return (ROUND4 / case / "log").read_text(errors="replace")


def test_a_traceback_whose_header_fell_before_the_window_is_still_found_by_its_frames():
    # 1,238 lines of a TRL reward run; the window holds the traceback's last frames and `ValueError: …`, no
    # header and no crash word of its own.
    lines = log("llm-trl-reward-trainer-eval-valueerror-step500").split("\n")
    assert "Traceback (most recent call last)" not in "\n".join(lines[-40:])
    [crash] = find_crashes(lines[-40:])
    assert crash.exc_type == "ValueError"


@pytest.mark.parametrize("case,words", [
    # tqdm draws its bar once more as the process unwinds: `0/1000 [00:29<?]` below the CUDA OOM is no progress.
    ("llm-oumi-trl-sft-oom-at-step-0-of-1000", "OutOfMemoryError"),
    ("llm-trl-reward-trainer-eval-valueerror-step500", "ValueError"),
])
def test_an_error_after_the_counters_last_move_ended_the_run_whatever_is_redrawn_after_it(case, words):
    verdict = diagnose(evidence(log(case), age=120, writers=()), DefaultRun("r"))
    assert (verdict.phase, verdict.level) == (Phase.CRASHED, Level.CRIT), verdict.headline
    assert words in verdict.headline
