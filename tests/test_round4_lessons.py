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


def last_step(case: str):
    from bot.core.progress import recognise

    steps = recognise(log(case).split("\n"))
    return steps[-1] if steps else None


@pytest.mark.parametrize("case,step", [
    # A leading number that advances by one stride, line after line, the rest measurements: a loop's counter.
    ("misc-catboost-iteration-98-best-at-1", 98),  # `98:     learn: 0.9547390        test: 0.8340691 best: …`
    ("cv-awr-20000-iters-iteration-19950-table", 19950),  # AWR's bare columns, `19950   16.929…   43506148 …`
    # Counter words where no step is printed: episodes, trials (and rounds: one `[ROUND 4]` alone is still no loop).
    ("cv-custom-iqn-cartpole-episode502", 502),  # `Episode 502\tFrame 11509 \tAverage100 Score: 22.20`
    ("misc-optuna-pytorch-simple-trial-53-pruned", 53),  # `[I 2020-12-16 12:47:15,125] Trial 53 pruned.`: the stamp is no step
    # Of two named counters, the one that advances: litgpt's `iter 62 step 1` (the optimizer step waits).
    ("llm-litgpt-lora-epoch1-iter62-step1", 62),
])
def test_the_counter_is_the_number_that_advances_whatever_names_it(case, step):
    assert last_step(case).step == step


def test_a_results_table_keyed_by_a_parameter_is_no_loop():
    # DINO's k-NN evaluation: `10-NN … 20-NN … 100-NN … 200-NN classifier result`: the rows' numbers lead and
    # grow, but not by one stride (a loop logs every N steps).
    from bot.core.progress import recognise

    rows = [x for x in (Path(__file__).parent / "fixtures" / "public" / "misc-dino-knn-eval-finished" / "log")
            .read_text().split("\n") if "-NN classifier result" in x]
    assert len(rows) == 4 and recognise(rows) == ()


@pytest.mark.parametrize("line,ends", [
    ("INFO :      Run finished 5 rounds in 22.28s", True),  # Flower
    ("model.fit... done", True),  # a CatBoost script
    ("Total Execution Time: 415.10 seconds", True),  # a PINN script's last line
    ("completed 100 epochs in 3.2 hours", True),
    ("98:     learn: 0.9547390        test: 0.8340691 best: 0.8356368 (1)     total: 51.2s    remaining: 1h 42m 40s", False),
    ("Saving checkpoint... done", False),  # a save's end is no run's end
    ("the run is not finished yet", False),
])
def test_a_whole_jobs_end_in_its_own_words(line, ends):
    from bot.core.markers import Mark, find_markers

    assert any(m.kind is Mark.ENDED for m in find_markers([line])) is ends


@pytest.mark.parametrize("case,writer,phase,words", [
    # The shell's `Killed` glued to the end of a spinner's line the process never ended.
    ("cv-nerfstudio-nerfacc-cuda-setup-killed", False, Phase.CRASHED, "killed"),
    # W&B's run summary at exit (`wandb: train/global_step 260`) is no progress past the error before it.
    ("llm-trl-sft-llama2-save-disk-quota-step260", False, Phase.CRASHED, "SafetensorError"),
    # Phase words, one table each: mmcv's `load checkpoint from local path: …`, pycocotools' and AllenNLP's
    # `creating index` / `Creating a vocabulary` (its counting bar below counts that work), XLA's constant
    # folding while it compiles.
    ("cv-mmrotate-strip-rcnn-loading-stripnet-checkpoint", True, Phase.LOADING, "load checkpoint"),
    ("cv-mmdetection-redet-coco-index-created-stuck", True, Phase.PREPARING, "index"),
    ("misc-allennlp-sst-creating-vocabulary", True, Phase.PREPARING, "vocabulary"),
    ("misc-haiku-xla-constant-folding-compiling-train-step", True, Phase.COMPILING, "compiling"),
])
def test_what_the_run_does_is_read_from_its_own_announcements(case, writer, phase, words):
    alive = ((692, 40, "python3 train.py"),) if writer else ()
    verdict = diagnose(evidence(log(case), age=20 if writer else 120, writers=alive), DefaultRun("r"))
    assert verdict.phase is phase, verdict.headline
    assert words.casefold() in verdict.headline.casefold(), verdict.headline
