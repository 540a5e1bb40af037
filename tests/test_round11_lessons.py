"""Round 11's lessons, on its real logs and lines (tests/fixtures/round11/FIRST_SIGHT.txt has what was misread at
first sight): clean ends in words runbot had no entry for, crashes a C++ program or a runner reports, a tuple of
slash-joined numbers taken for a counter, a bar's last frame, a table that has no pipes, a dump's lists."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.core.bars import last_bar
from bot.core.crashes import find_crashes
from bot.core.diagnose import diagnose
from bot.core.facts import Kind
from bot.core.grammar import fields, message
from bot.core.markers import Mark, find_markers
from bot.core.progress import drop_mappings, fold_headed_tables
from bot.core.verdict import Level, Phase
from bot.probe.replay import DefaultRun
from tests.builders import evidence

FIXTURES = Path(__file__).parent / "fixtures" / "round11"


def log(case: str) -> bytes:
    return (FIXTURES / case / "log").read_bytes()


def verdict(case: str, *, age: float = 300, alive: bool = False):
    writers = ((692, 40, "python3 train.py"),) if alive else ()
    return diagnose(evidence(log(case), age=age, writers=writers), DefaultRun("r"))


# --- whole logs: the first line at the moment the collector described -----------------------------------------------

@pytest.mark.parametrize("case,phase,level,says", [
    # tqdm redrew its epoch bar in place after drawing it a row down: the line's last frame is the loop's bar
    ("ops-tianshou-ppo-200-epochs-end", Phase.STOPPED, Level.CRIT, "409600"),
    # one line of \r frames fills the probe's whole window and ends it: its frames are the log, not nothing
    ("ops-slurm-medians-export-preprocess-done", Phase.FINISHED, Level.OK, "1540/1540"),
    # `C/S/I/D: 20641/11172/4651/6467` is a scorer's tuple, not step 4651 of 6467
    ("nlp-xnmt-early-stopping-finished", Phase.FINISHED, Level.OK, "Early stopping"),
    # a bar after the end drawn at 100 % (298/299.0: tqdm rounds up) is finished work, not a loop going on
    ("sci-ocp-dimenet-early-stop-tqdm-tail", Phase.FINISHED, Level.OK, "Early stopping due to low learning rate"),
    # skorch's table has no pipes: its rule of dashes says where the columns are
    ("sci-skorch-tst-early-stop-finished", Phase.FINISHED, Level.OK, "33"),
    ("ops-raytune-two-trials-terminated", Phase.FINISHED, Level.OK, "2/2"),
    ("nlp-marian-valid-oom", Phase.CRASHED, Level.CRIT, "out of memory"),
    ("nlp-tf-estimator-nan-loss-step0", Phase.CRASHED, Level.CRIT, "NanLossDuringTrainingError"),
    ("sci-lightgbm-killed-binning", Phase.CRASHED, Level.CRIT, "Killed"),
    ("ops-nvflare-client-abort-killed", Phase.CRASHED, Level.CRIT, "-9"),
    ("ops-optuna-trial-dataloader-worker-died", Phase.CRASHED, Level.CRIT, "DataLoader worker"),
    # `[049500/50000] WMS | … | batch 16`: the batch size stands, the counter moves
    ("cv-vfi-custom-finished", Phase.FINISHED, Level.OK, "49500/50000"),
])
def test_round_11_logs_read_as_their_collectors_read_them(case, phase, level, says):
    v = verdict(case)
    assert (v.phase, v.level) == (phase, level) and says in v.headline, v.headline


def test_a_save_announced_on_the_step_line_after_the_last_step_says_its_own_iteration():
    # SSD prints `iter 14000 || Loss: 2.3617 || Saving state, iter: 14000`; its step lines had a warning glued after
    # them, so the last one read as a step is 13990: the save stands at 14000 (issue 20: "one step behind").
    v = verdict("cv-ssd-pytorch-voc-saving-14000", age=5, alive=True)
    assert v.phase is Phase.SAVING and "14000" in v.headline, v.headline


def test_a_colour_dump_of_a_config_with_lists_in_it_is_no_progress():
    # detectron2's YAML dump, coloured: `LOSS_WEIGHT: 1.0` under sections and lists read as "loss 1", `TEST:` over
    # `- voc_2007_test` as an evaluation
    v = verdict("cv-detectron2-moco-voc-startup", age=30, alive=True)
    assert v.phase is Phase.STARTING and "loss" not in v.headline, v.headline


# --- the rules, line by line ------------------------------------------------------------------------------------------

def test_four_numbers_joined_by_slashes_are_a_tuple_and_three_may_be_a_counter():
    line = "| CER: 58.23% ( C/S/I/D: 20641/11172/4651/6467; hyp_len=36464, ref_len=38280 )"
    assert all(f.total is None for f in fields(line))
    assert [f.total for f in fields("At iteration 2966/3300/3300, Mean rms=0.2%")][:1] == [3300]  # tesstrain


def test_open_catalysts_level_in_parentheses_is_no_part_of_the_message():
    assert message("2023-11-16 08:13:15 (INFO): Early stopping due to low learning rate") == \
        "Early stopping due to low learning rate"


def test_a_bar_drawn_at_100_percent_is_finished():
    bar = last_bar("device 0: 100% 298/299.0 [00:20<00:00, 14.66it/s]")
    assert bar is not None and bar.finished
    assert not last_bar("device 0:  99% 297/299.0 [00:20<00:00, 14.66it/s]").finished


@pytest.mark.parametrize("line,ended", [
    ("03-21 21:23:12 INFO     [trainer_dual_opt.py:163]: Early stopping counter: 1 out of 10", False),  # patience
    ("Stopping since valid_loss has not improved in the last 3 epochs.", True),  # skorch
    ("Number of trials: 2/2 (2 TERMINATED)", True),  # Ray Tune, every trial ended
    ("Number of trials: 2/2 (1 RUNNING, 1 TERMINATED)", False),
    ("Number of trials: 3/4 (3 TERMINATED)", False),
    ("  Early stopping", True),
])
def test_ends_and_what_only_counts_towards_one(line, ended):
    assert any(m.kind is Mark.ENDED for m in find_markers([line])) is ended


@pytest.mark.parametrize("lines,kind,says", [
    (["[2019-04-15 08:34:14] Error: CUDA error 2 'out of memory' - /data/home/mt/tools/marian/src/tensors/gpu/device.cu:32: cudaMalloc(&data_, size)",
      "[2019-04-15 08:34:14] Error: Aborted from virtual void marian::gpu::Device::reserve(size_t) in /data/home/mt/tools/marian/src/tensors/gpu/device.cu:32"],
     Kind.OOM, "out of memory"),
    (["NanLossDuringTrainingErrorTraceback (most recent call last)", "<ipython-input-43-2f65d1e5e9c4> in <module>()",
      "---> 34     estimator.train(input_fn=train_input_fn, steps=200)"], None, "NanLossDuringTrainingError"),
    (["**Training LightGBM model", "[LightGBM] [Info] Total Bins 212045", "Killed**"], Kind.KILLED, "Killed"),
    (["2022-03-17 00:04:10,502 - ProcessExecutor - INFO - process finished with execution code: -9"], Kind.CHILD_FAILED, ""),
    (["[2024-09-23 13:55:18] Error: DataLoader worker (pid(s) 1142198) exited unexpectedly"], Kind.FATAL, "DataLoader worker"),
])
def test_fatal_reports_that_are_not_python_tracebacks(lines, kind, says):
    crash = find_crashes(lines)[0]  # the first: what the headline names
    assert kind is None or crash.kind is kind
    assert says in f"{crash.exc_type} {crash.message}"


@pytest.mark.parametrize("line", [
    "2022-03-17 00:04:10,502 - ProcessExecutor - INFO - process finished with execution code: 0",
    "2024-01-02 10:00:00 ERROR: wandb upload failed, retrying",  # a logger's level is not a program's fatal report
])
def test_what_is_no_crash(line):
    assert find_crashes([line]) == []


def test_a_plain_table_is_read_by_the_columns_its_rule_draws():
    lines = ["  epoch    auprc    auroc      f1    train_loss    valid_acc    valid_loss    cp      dur",
             "-------  -------  -------  ------  ------------  -----------  ------------  ----  -------",
             "     32   0.4273   0.8519  0.2868        0.1853       0.9314        0.1988        11.3954",
             "     31   0.4341   0.8523  0.2977        0.1852       0.9314        0.1967     +  11.3632"]
    folded = fold_headed_tables(lines)
    assert folded[2] == "epoch: 32 | auprc: 0.4273 | auroc: 0.8519 | f1: 0.2868 | train_loss: 0.1853 | valid_acc: 0.9314 | valid_loss: 0.1988 | dur: 11.3954"
    assert "cp: +" in folded[3]


def test_a_dump_with_sections_and_lists_is_blanked_whole_and_a_recurring_heading_is_not_a_dump():
    dump = ["  ROI_HEADS:", "    BATCH_SIZE_PER_IMAGE: 512", "    IN_FEATURES:", "    - p5", "    LOSS_WEIGHT: 1.0",
            "    NAME: StandardROIHeads", "VERSION: 2"]
    assert all(not x for x in drop_mappings(dump)[1:])
    tcr = ["Training_Statistics: ",
           " Epoch: 1/10000 Training loss: 1.38409 Validation loss: 1.37432 Testing AUC: 0.25",
           "Training_Statistics: ",
           " Epoch: 2/10000 Training loss: 1.36950 Validation loss: 1.36737 Testing AUC: 0.33333",
           "Training_Statistics: ",
           " Epoch: 3/10000 Training loss: 1.35901 Validation loss: 1.36124 Testing AUC: 0.41667"]
    assert drop_mappings(tcr)[-1] == tcr[-1]


# --- gpu-jobs6's lessons, on its real lines ---------------------------------------------------------------------------

GPU6 = Path(__file__).parent / "fixtures" / "gpu-jobs6"


def test_a_traceback_the_program_says_it_caught_is_no_crash():
    # A batch-size search prints each OOM's traceback and `… retrying with 4096`: the run goes on, alive.
    text = (GPU6 / "oom-retry" / "after-oom" / "log" / "train.log").read_bytes()
    v = diagnose(evidence(text, age=3), DefaultRun("r"))
    assert v.phase is Phase.STARTING and "retrying" in v.headline, v.headline


def test_an_exception_that_itself_says_retries_is_still_a_crash():
    text = ("step=3 loss=2.0\nTraceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
            "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='hub'): Max retries exceeded with url: /x\n")
    v = diagnose(evidence(text, age=60, writers=()), DefaultRun("r"))
    assert v.phase is Phase.CRASHED, v.headline


def test_a_relaunch_reading_its_checkpoint_by_path_is_loading():
    assert [m.kind for m in find_markers(["resuming from /tmp/runbot-jobs/ckpt/resume/ckpt-30.pt"])] == [Mark.LOADING]
    assert find_markers(["resuming from where we left off"]) == ()


def test_a_scale_halving_on_every_step_line_is_fp16_overflowing():
    text = (GPU6 / "scale" / "training" / "log" / "train.log").read_bytes()
    v = diagnose(evidence(text, age=1), DefaultRun("r"))
    assert v.level is Level.WARN and "fp16 overflow" in v.headline, v.headline
    steady = "".join(f"it {i} | loss 2.{i} | scale 65536 | 0.12 s/it\n" for i in range(1, 20))
    assert diagnose(evidence(steady, age=1), DefaultRun("r")).level is Level.OK


def test_an_errno_a_long_message_ends_on_is_said_first():
    # torchrun's rendezvous store (llm-torchrun-kd-eaddrinuse-startup): the cause is the sentence's last words
    line = ("RuntimeError: The server socket has failed to listen on any local network address. useIpv6: 0, code: -98, "
            "name: EADDRINUSE, message: address already in use")
    [crash] = find_crashes(["Traceback (most recent call last):", '  File "x.py", line 1, in <module>', line])
    assert crash.message.startswith("EADDRINUSE: address already in use — The server socket")


def test_lsfs_reason_is_said_in_its_own_word():
    [crash] = find_crashes(["TERM_RUNLIMIT: job killed after reaching LSF run time limit."])
    assert "TERM_RUNLIMIT" in crash.message
