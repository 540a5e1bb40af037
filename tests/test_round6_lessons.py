"""Round 6's lessons, on its real logs (tests/fixtures/round6/FIRST_SIGHT.txt has what was misread at first
sight): configuration dumps are no progress and no announcement, a thread's death with its traceback cut."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.core.crashes import find_crashes
from bot.core.diagnose import diagnose
from bot.core.facts import Kind
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


def line(case: str, start: str) -> str:
    """The log's own line that starts so (the tests read real text, never a retyped copy)."""
    return next(x for x in log(case).split("\n") if x.lstrip().startswith(start))


@pytest.mark.parametrize("case,phase,level,words,never", [
    # LSF's job report: `Successfully completed.` above its resource summary (read as stopped: a false CRIT)
    ("misc-wandb-lsf-t5-mimic-successfully-completed", Phase.FINISHED, Level.OK, "successfully completed", "stopped"),
    # PyCharm's `Process finished with exit code -1073741819 (0xC0000005)`: Windows' access violation
    ("misc-megengine-hdr-transformer-exit-0xc0000005-epoch0", Phase.CRASHED, Level.CRIT, "0xC0000005", "stopped"),
    # every iteration done (50/50), then Slurm's time limit: the work is finished, the exit hung (a false CRIT)
    ("llm-megatron-bridge-nemotron-h-iteration-50-of-50-slurm-time-limit", Phase.FINISHED, Level.WARN, "50/50", "crashed"),
    # Lightning's `Trainer.fit stopped: max_epochs=6000 reached.`: "stopped" is runbot's word for a kill
    ("cv-piper-tts-max-epochs-6000-reached", Phase.FINISHED, Level.OK, "max_epochs=6000 reached", "stopped"),
])
def test_how_a_process_ended_in_the_words_of_what_ran_it(case, phase, level, words, never):
    v = diagnose(evidence(log(case), age=120, writers=()), DefaultRun("r"))
    assert (v.phase, v.level) == (phase, level), v.headline
    assert words.casefold() in v.headline.casefold() and never not in v.headline, v.headline


def test_lsfs_exit_line_is_the_jobs_end():
    [crash] = find_crashes([line("misc-big-vision-lsf-paligemma-load-keyerror-img", "Exited with exit code")])
    assert crash.exit_code == 1
    assert find_crashes(["Process finished with exit code 0"]) == []


def test_an_end_word_on_the_loops_own_progress_line_ends_a_unit_not_the_run():
    # DLRM reports `Finished training it N/2000 of epoch 0, … ms/it, loss …` at every report (built from its line).
    real = line("misc-dlrm-kaggle-it-1000-of-2000-saving-model", "Finished training it 1000/2000")
    window = "\n".join(real.replace("1000/2000", f"{n}/2000") for n in (800, 900, 1000))
    v = diagnose(evidence(window, age=20), DefaultRun("r"))
    assert v.phase is Phase.TRAINING and "1000/2000" in v.headline, v.headline


@pytest.mark.parametrize("age,phase,level", [(20, Phase.TRAINING, Level.OK), (15 * 60, Phase.SILENT, Level.CRIT)])
def test_a_separator_after_a_save_closes_it(age, phase, level):
    # flair: `saving best model`, then its `-----` rule before the next epoch. Read as saving for 15 min, no alert.
    v = diagnose(evidence(log("llm-flair-epoch-6-done-dev-f1-saving-best-model"), age=age), DefaultRun("r"))
    assert (v.phase, v.level) == (phase, level), v.headline


def test_a_save_with_nothing_after_it_is_still_saving():
    text = log("llm-flair-epoch-6-done-dev-f1-saving-best-model")
    v = diagnose(evidence(text[:text.index("saving best model") + len("saving best model")], age=20), DefaultRun("r"))
    assert v.phase is Phase.SAVING, v.headline


@pytest.mark.parametrize("age,alive,phase,level", [
    (20, True, Phase.TRAINING, Level.OK),
    (20 * 60, False, Phase.STOPPED, Level.CRIT),  # gone after the next epoch began: no end (read as finished)
])
def test_an_epoch_announced_after_the_last_progress_is_where_the_loop_stands(age, alive, phase, level):
    # st-gcn: `Iter 0 Done.`, `Done.` (the epoch's), then `Training epoch: 1`: epoch 1 has begun.
    writers = ((692, 40, "python3 main.py"),) if alive else ()
    v = diagnose(evidence(log("cv-st-gcn-kinetics-cpu-gone-after-training-epoch-1"), age=age, writers=writers), DefaultRun("r"))
    assert (v.phase, v.level) == (phase, level) and "epoch 1" in v.headline, v.headline


def test_an_announced_epoch_behind_the_counter_changes_nothing():
    lines = ["epoch 5 step 100 loss 0.3", "epoch 5 step 200 loss 0.2", "Starting epoch 4: reshuffling"]
    assert evidence("\n".join(lines)).steps[-1].epoch == 5


def test_a_throughput_beside_a_growing_total_is_a_loops_report():
    # Sample Factory names no counter: `Fps is (10 sec: …). Total num frames: 438272. … Samples: 113450.`
    v = diagnose(evidence(log("cv-sample-factory-appo-doom-policy-lag-growing"), age=4), DefaultRun("r"))
    assert v.phase is Phase.TRAINING and v.level is Level.OK, v.headline


def test_a_throughput_beside_numbers_that_do_not_grow_is_no_loop():
    lines = [f"cache hit rate 98.{n} it/s, shard 3 of 8, worker 2" for n in range(5)]
    assert read_progress(lines).steps == ()


@pytest.mark.parametrize("text,values", [
    ("Total num frames: 438272. Throughput: 0", [438272, 0]),  # a full stop ends the sentence, not the number
    ("torch 2.1.0 with CUDA 12.1", [12.1]),  # a version is no number
])
def test_a_number_at_a_sentences_end(text, values):
    from bot.core.grammar import fields
    assert [f.value for f in fields(text)] == values


@pytest.mark.parametrize("case,start,kind,words", [
    # bash's `Killed` in a zh_CN locale, under DreamerV3
    ("cv-dreamerv3-killed-by-oom-killer-after-metrics-write", "已杀死", Kind.KILLED, "已杀死"),
    # CNTK stops itself: `EXCEPTION occurred: The training criterion is not a number (NAN). Stop`
    ("misc-cntk-cifar10-nan-criterion-exception-epoch1", "EXCEPTION occurred", Kind.TRACEBACK, "not a number (NAN)"),
])
def test_an_end_in_the_words_of_whatever_printed_it(case, start, kind, words):
    [crash] = find_crashes([line(case, start)])
    assert crash.kind is kind and words in f"{crash.exc_type} {crash.message}"


def test_a_trainers_statement_of_the_error_names_a_traceback_cut_before_its_exception_line():
    # Chainer: `Exception in main training loop: cudaErrorMemoryAllocation: out of memory`, then a traceback the
    # paste cuts. Read as "a Python exception".
    crashes = find_crashes(log("misc-chainer-see-svhn-oom-in-main-training-loop").split("\n"))
    assert crashes[-1].kind is Kind.OOM and "out of memory" in crashes[-1].message


def test_a_sigsegv_is_called_a_segmentation_fault():
    [crash] = find_crashes(["*** SIGSEGV (@0x0) received by PID 1181 (TID 0x7f) from PID 0; stack trace: ***"])
    assert "segmentation fault" in crash.message


@pytest.mark.parametrize("case,age,phase,words", [
    # a model class loading, after a bar under `- quantizing 40 transformer blocks` (read as training at 40/40)
    ("cv-ai-toolkit-wan-lora-loading-umt5-encoder", 60, Phase.LOADING, "UMT5EncoderModel"),
    # sentence-transformers' evaluator after the epoch's save (read as saving)
    ("llm-sentence-transformers-uni-rep-epoch-3-ir-evaluation", 180, Phase.EVALUATING, "760/762"),
    # Kaldi's `Generating training examples on disk` (read as starting)
    ("cv-kaldi-nnet3-chain-generating-egs-before-iter-0", 180, Phase.PREPARING, "Generating training examples"),
])
def test_the_phase_between_steps_in_the_words_that_announce_it(case, age, phase, words):
    v = diagnose(evidence(log(case), age=age), DefaultRun("r"))
    assert v.phase is phase and words in v.headline and "step 40" not in v.headline, v.headline


def test_a_rank_column_before_the_stamp_is_no_part_of_the_message():
    from bot.core.grammar import message
    text = line("llm-sentence-transformers-uni-rep-epoch-3-ir-evaluation", "0 | 2023-06-01 02:22:35,218 - INFO - src.eval")
    assert message(text).startswith("src.eval : Information Retrieval Evaluation")


def test_a_loop_that_reports_only_its_validation_stands_at_that_epoch():
    # Theano's alexnet: `epoch 35: validation loss nan` / `validation error nan %`, and no training line (read
    # as "no steps yet").
    v = diagnose(evidence(log("misc-theano-alexnet-windows-validation-nan-epoch-35"), age=15), DefaultRun("r"))
    assert v.phase is Phase.TRAINING and "epoch 35" in v.headline, v.headline


def test_an_evaluation_series_beside_a_training_one_stays_an_evaluation():
    lines = [x for n in range(3, 7) for x in (f"epoch {n} step 100 loss 0.{n}", f"epoch {n}: validation loss 0.{n + 1}")]
    last = read_progress(lines).steps[-1]
    assert (last.epoch, last.step, last.loss) == (6, 100, 0.6)


def test_the_last_line_is_shown_without_its_clock():
    # InternVL's ranks stuck after DeepSpeed's init: the phone's 60 characters showed the stamp and `[INFO]…`.
    v = diagnose(evidence(log("llm-internvl-deepspeed-4-ranks-stuck-after-init-distributed"), age=25 * 60), DefaultRun("r"))
    assert v.level is Level.CRIT and "init_distributed" in v.headline, v.headline


def test_hfs_train_metrics_table_says_the_runs_figures():
    v = diagnose(evidence(log("llm-firefly-qwen1.5-14b-lora-train-metrics-loss-4.8e9"), age=300, writers=()), DefaultRun("r"))
    assert v.phase is Phase.FINISHED and "train_loss 4.784e+09" in v.headline and "3:32:59" in v.headline, v.headline


def test_a_nan_in_a_loop_that_reports_only_its_validation_is_the_runs():
    # Theano's AlexNet: `epoch 35: validation loss nan` / `validation error nan %` are the only series: a warning.
    v = diagnose(evidence(log("misc-theano-alexnet-windows-validation-nan-epoch-35"), age=15), DefaultRun("r"))
    assert v.level is Level.WARN and "epoch 35" in v.headline and "nan" in v.headline.lower(), v.headline
    # An evaluation's NaN beside a training loop stays the evaluation's: the training loss says how the run goes.
    lines = [f"step {i} loss 2.{i}" for i in range(1, 6)] + ["epoch 1: validation loss nan", "step 6 loss 2.1"]
    assert diagnose(evidence("\n".join(lines) + "\n", age=15), DefaultRun("r")).level is Level.OK
