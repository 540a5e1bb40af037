"""Round 5's lessons, on its real logs: how a process's end is said when no Python traceback says it
(tests/fixtures/round5/FIRST_SIGHT.txt has what was misread at first sight)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.core.crashes import find_crashes
from bot.core.diagnose import diagnose
from bot.core.facts import Kind
from bot.core.verdict import Level, Phase
from bot.probe.replay import DefaultRun
from tests.builders import evidence

ROUND5 = Path(__file__).parent / "fixtures" / "round5"


def log(case: str) -> str:
    return (ROUND5 / case / "log").read_text(errors="replace")


def line(case: str, start: str) -> str:
    """The log's own line that starts so (the tests read real text, never a retyped copy)."""
    return next(x for x in log(case).split("\n") if x.lstrip().startswith(start))


@pytest.mark.parametrize("case,start,kind,words", [
    # abseil's failure-signal handler (Ray, TensorFlow, JAX)
    ("cv-custom-ray-lmapf-sigterm-after-7936512-steps", "*** SIGTERM received at time=", Kind.SIGNAL, "SIGTERM"),
    # libc++'s uncaught C++ exception (clang, macOS: MLX on Metal)
    ("llm-mlx-lm-lora-qwen-metal-abort-after-iter20", "libc++abi: terminating", Kind.TRACEBACK, "[METAL]"),
    # zsh's job report: `[1]    24608 abort      python -m mlx_lm.lora …`
    ("llm-mlx-lm-lora-qwen-metal-abort-after-iter20", "[1]", Kind.FATAL, "Aborted"),
    # a paste's bold `**Killed**`
    ("misc-custom-fastmaskrcnn-killed-after-iter-144", "**Killed**", Kind.KILLED, "Killed"),
    # darknet's out-of-memory, said as a line, not an exception
    ("misc-darknet-cuda-oom-after-resize-iter-10090", "CUDA Error: out of memory", Kind.OOM, "out of memory"),
])
def test_a_processs_end_in_the_words_of_whatever_printed_it(case, start, kind, words):
    [crash] = find_crashes([line(case, start)])[:1]
    assert crash.kind is kind and words in f"{crash.exc_type} {crash.message}"


def test_hydras_report_of_a_failed_job_names_the_error_on_its_next_line():
    lines = log("misc-hydra-lightning-template-error-locating-target").split("\n")
    [crash] = find_crashes(lines)
    assert crash.message.startswith("Error locating target 'src.models.xxx_module.XXXLitModule'")


def test_a_signal_reported_by_the_processs_own_handler_under_its_banner_is_its_end():
    # Open MPI's handler, indented under `*** Process received signal ***`, each line prefixed `[host:pid]`.
    crashes = find_crashes(log("misc-mindyolo-ascend-segfault-epoch2-step600").split("\n"))
    assert crashes and crashes[0].kind is Kind.SEGFAULT and "signal 11" in crashes[0].message


@pytest.mark.parametrize("case,phase,words", [
    # `CUDA Error: out of memory`, then `Assertion '0' failed`, then `Aborted (core dumped)`: the cause, not the abort.
    ("misc-darknet-cuda-oom-after-resize-iter-10090", Phase.CRASHED, "out of memory"),
    ("llm-mlx-lm-lora-qwen-metal-abort-after-iter20", Phase.CRASHED, "METAL"),
    ("cv-custom-ray-lmapf-sigterm-after-7936512-steps", Phase.CRASHED, "SIGTERM"),
    ("misc-mindyolo-ascend-segfault-epoch2-step600", Phase.CRASHED, "segmentation fault"),
    # Caffe's solver says its own end: `Optimization Done.` (read as killed at first sight: a false CRIT)
    ("misc-caffe-scnn-finetune-optimization-done", Phase.FINISHED, "optimization done"),
])
def test_how_the_run_ended_is_what_the_first_line_says(case, phase, words):
    verdict = diagnose(evidence(log(case), age=120, writers=()), DefaultRun("r"))
    assert verdict.phase is phase, verdict.headline
    assert verdict.level is (Level.CRIT if phase is Phase.CRASHED else Level.OK)
    assert words.casefold() in verdict.headline.casefold(), verdict.headline


def test_a_save_that_has_printed_fewer_lines_than_the_runs_last_save_is_still_saving():
    # accelerate's save_state printed six lines for checkpoint-768; for checkpoint-800 only the first so far.
    v = diagnose(evidence(log("cv-diffusers-dreambooth-lora-saving-checkpoint-800"), age=20), DefaultRun("r"))
    assert v.phase is Phase.SAVING and "800" in v.headline, v.headline


def test_a_save_as_long_as_the_runs_last_one_is_over():
    # Built from the real log: checkpoint-800's save printed as whole as checkpoint-768's was. The loop goes on.
    text = log("cv-diffusers-dreambooth-lora-saving-checkpoint-800")
    block = text[text.index("Model weights saved in"):text.index("Saved state to")]
    block = block[:block.rindex("\n") + 1] + text[text.index("Saved state to"):].split("\n")[0].split(" - ")[-1]
    whole = text[:text.rindex("Model weights saved in")] + block.replace("checkpoint-768", "checkpoint-800") + "\n"
    v = diagnose(evidence(whole, age=20), DefaultRun("r"))
    assert v.phase is Phase.TRAINING, v.headline


@pytest.mark.parametrize("age,phase,level", [(10, Phase.TRAINING, Level.OK), (15 * 60, Phase.SILENT, Level.CRIT)])
def test_an_evaluation_lines_epoch_count_is_no_pass_in_progress(age, phase, level):
    # Catalyst: `2/4 * Epoch 2 (valid): … loss=1.4724` is epoch 2 of 4's finished validation. Read as a validation
    # at 50 % (2/4) that never ended: no alert 15 minutes on.
    v = diagnose(evidence(log("misc-catalyst-check-dl-epoch-2-of-4-valid"), age=age), DefaultRun("r"))
    assert (v.phase, v.level) == (phase, level) and "epoch 2" in v.headline, v.headline


def test_an_evaluation_line_with_its_own_fraction_is_still_a_pass_in_progress():
    # MMEngine's `Epoch(val) [20][200/1160]`: the pass's own count beside the epoch's (round 3's real log).
    text = (ROUND5.parent / "round3" / "misc-mmengine-yoloworld-val-after-epoch20" / "log").read_text(errors="replace")
    v = diagnose(evidence(text, age=10), DefaultRun("r"))
    assert v.phase is Phase.EVALUATING and "200/1160" in v.headline, v.headline
