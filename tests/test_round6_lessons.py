"""Round 6's lessons, on its real logs (tests/fixtures/round6/FIRST_SIGHT.txt has what was misread at first
sight): configuration dumps are no progress and no announcement, a thread's death with its traceback cut."""

from __future__ import annotations

from pathlib import Path

from bot.core.crashes import find_crashes
from bot.core.diagnose import diagnose
from bot.core.markers import find_markers
from bot.core.progress import drop_mappings, read_progress
from bot.core.verdict import Level, Phase
from bot.probe.replay import DefaultRun
from tests.builders import evidence

ROUND6 = Path(__file__).parent / "fixtures" / "round6"


def log(case: str) -> str:
    return (ROUND6 / case / "log").read_text(errors="replace")


CONFIG_DUMP = "cv-reid-strong-baseline-config-dump-no-training-yet"


def test_a_yaml_config_dump_is_no_progress_and_its_test_section_no_evaluation():
    lines = log(CONFIG_DUMP).split("\n")
    assert read_progress(lines).steps == ()  # `RANGE_LOSS_WEIGHT: 1` is a setting, not a loss
    assert find_markers(lines) == ()  # `TEST:` over its nested keys is a section, not `Test:` announcing a pass
    silent = diagnose(evidence(log(CONFIG_DUMP), age=25 * 60), DefaultRun("r"))
    assert (silent.phase, silent.level) == (Phase.SILENT, Level.CRIT), silent.headline


def test_a_mapping_of_numbers_only_or_a_loss_line_stays():
    # Three indented numeric rows with no word among their values may be a report's lines (rsl_rl's block).
    rows = ["  Surrogate loss: -0.0096", "  Mean reward: 4006.23", "  Mean episode length: 42.41"]
    assert drop_mappings(rows) == rows
    yaml = ["SOLVER:", "  OPTIMIZER_NAME: 'Adam'", "", "  BASE_LR: 0.00035", "  # a comment", "  CENTER_LOSS_WEIGHT: 0.0005"]
    assert [x for x in drop_mappings(yaml) if x] == ["SOLVER:", "  # a comment"]


def test_exception_in_thread_as_the_logs_last_words_is_a_dead_thread():
    # open_clip: the thread's header, then nothing (the paste ends): the main loop's last step stands.
    lines = log("cv-open-clip-exception-in-thread-after-eval-epoch-10").split("\n")
    [crash] = find_crashes(lines)
    assert crash.thread == "Thread-5"
    v = diagnose(evidence(log("cv-open-clip-exception-in-thread-after-eval-epoch-10"), age=30), DefaultRun("r"))
    assert v.level is Level.WARN and "thread" in v.headline, v.headline


def test_exception_in_thread_followed_by_its_traceback_is_read_as_before():
    lines = ["Exception in thread loader:", "Traceback (most recent call last):", '  File "x.py", line 1, in f',
             "ValueError: bad"]
    [crash] = find_crashes(lines)
    assert (crash.thread, crash.exc_type) == ("loader", "ValueError")
