"""Round 10's lessons, on its real logs and lines (tests/fixtures/round10/FIRST_SIGHT.txt has what was misread at
first sight): a finished run's headline says the result the run printed, where its end says only that it ended;
the trainer's final metrics above a launcher's exits."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.core.diagnose import diagnose
from bot.core.verdict import Level, Phase
from bot.probe.replay import DefaultRun
from tests.builders import evidence

FIXTURES = Path(__file__).parent / "fixtures"


def log(case: str) -> str:
    return (FIXTURES / case / "log").read_text(errors="replace")


def finished(text: str):
    v = diagnose(evidence(text, age=300, writers=()), DefaultRun("r"))
    assert (v.phase, v.level) == (Phase.FINISHED, Level.OK), v.headline
    return v.headline


# --- the result after a bare end ------------------------------------------------------------------------------------

@pytest.mark.parametrize("case,says", [
    ("round10/cv-monai-spleen-done", "Best validation Dice: 0.4603"),  # on the end's own line, after "Training complete."
    ("round9/llm-pytorch-finetune-gpt2-lora", "Loss=0.4886"),  # `Final Results: …` above "pipeline completed successfully"
    # a long line, quoted from the sentence that holds its figure, so the cut keeps it
    ("round10/misc-lightning-plain-gat-earlystop", "Best score: 0.024"),
])
def test_a_finished_run_says_the_result_it_printed_after_its_loop(case, says):
    assert says in finished(log(case))


def test_an_end_that_names_its_cause_keeps_it_over_the_result():
    text = "step 100/100 loss 0.25\nval_acc: 0.913\n`Trainer.fit` stopped: `max_steps=100` reached.\n"
    assert "max_steps=100 reached" in finished(text)


def test_a_line_the_loop_printed_every_epoch_is_not_the_runs_result():
    # person re-ID: `train Loss: 0.0898 … Acc: 0.4244` closes every epoch; the end's own words stay
    assert "End training" in finished(log("round10/cv-person-reid-triplet-done"))


def test_a_whole_number_is_a_setting_or_a_count_not_a_result():
    text = ("epoch 1/2 loss 0.5213\nepoch 2/2 loss 0.4127\n"
            "Starting evaluation num_episodes=100 num_workers=4\nTraining complete.\n")
    assert "num_episodes" not in finished(text)


# --- a trainer's metrics above its launcher's exits -------------------------------------------------------------------

def test_hf_final_metrics_far_above_the_launchers_exits_are_said_with_them():
    # HF's `{'train_runtime': 6311.5782, …, 'train_loss': 4.597…}`, then the model's repr (500 lines), then DeepSpeed's
    # launcher: `Process N exits successfully.` six times
    head = finished(log("round10/llm-hf-trainer-v4-miniphi3-lora-sft-done"))
    assert "train_loss 4.597" in head and "6 processes exited successfully" in head, head


# --- a stamp that names its month ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("line,rest", [
    ("[Mar 29, 16:34:28] 1016 5.299243152939811", "1016 5.299243152939811"),  # ColBERT's own logger
    ("Mar  9 16:34:28 gpu01 python[811]: step 5", "gpu01 python[811]: step 5"),  # syslog
    ("Wed Dec  2 21:17:46 2026 step 5 loss 1.2", "step 5 loss 1.2"),  # ctime, as `date` prints it
])
def test_a_stamp_that_names_its_month_is_a_stamp(line, rest):
    from bot.core.grammar import line_time, strip_stamp
    assert strip_stamp(line) == rest and line_time(line) is not None


def test_a_month_in_words_is_no_stamp():
    from bot.core.grammar import line_time, strip_stamp
    assert strip_stamp("March 29 was the last run") == "March 29 was the last run"
    assert line_time("May 3 runs were done") is None


def test_colberts_bare_counter_after_its_stamp_is_the_step_and_its_end_an_end():
    # `[Mar 29, 16:34:28] 1016 5.299243152939811`, then `#> Done with all triples!`, the saves, the ranks joined
    head = finished(log("round10/llm-colbert-instruct-triples-done"))
    assert "1016" in head


# --- a table with a header row; a number inside a name ------------------------------------------------------------------

RAY = "round10/cv-rllib-shogi-dqn-live"


def test_a_headed_tables_rows_are_read_under_their_header():
    from bot.core.progress import fold_headed_tables
    rows = ["| Trial name            | status   |   iter |      ts |",
            "|-----------------------+----------+--------+---------|",
            "| DQN_shogi_96499_00000 | RUNNING  |    325 | 1071840 |"]
    assert fold_headed_tables(rows) == ["", "", "Trial name: DQN_shogi_96499_00000 | status: RUNNING | iter: 325 | ts: 1071840"]


def test_a_table_of_numbers_alone_has_no_header():
    from bot.core.progress import fold_headed_tables
    rows = ["| 1 | 2 | 3 |", "|---|---|---|", "| 4 | 5 | 6 |"]
    assert fold_headed_tables(rows) == rows


def test_ray_tunes_status_table_is_where_the_loop_stands():
    # its `iter` column says 325 while the result block above it still says `training_iteration: 324`
    v = diagnose(evidence(log(RAY), age=5, writers=((692, 40, "python3 train.py"),)), DefaultRun("r"))
    assert v.phase is Phase.TRAINING and "325" in v.headline, v.headline


def test_a_number_inside_a_name_is_no_result():
    # `Result for DQN_shogi_96499_00000:` heads every one of Ray Tune's reports: the run did not end with it
    text = "".join(f"episode_reward_mean: 0.{k}\ntraining_iteration: {k}\nResult for DQN_shogi_96499_00000:\n" for k in range(1, 6))
    v = diagnose(evidence(text, age=7200, writers=()), DefaultRun("r"))
    assert (v.phase, v.level) == (Phase.STOPPED, Level.CRIT), v.headline


# --- an end after errors ------------------------------------------------------------------------------------------------

def test_an_end_after_logged_errors_is_a_warning_that_says_the_last():
    # every ablation `ERROR - Ablation … failed: default_collate: …`, then `Ablation study completed!`
    v = diagnose(evidence(log("round10/misc-hhgtn-fraud-ablation-allfail"), age=300, writers=()), DefaultRun("r"))
    assert (v.phase, v.level) == (Phase.FINISHED, Level.WARN) and "default_collate" in v.headline, v.headline


def test_an_error_the_loop_went_on_after_is_not_the_ends():
    text = ("step 1/3 loss 0.9\n2024-01-01 10:00:00 - ERROR - could not reach the metrics server\n"
            "step 2/3 loss 0.8\nstep 3/3 loss 0.7\nTraining complete.\n")
    assert "error" not in finished(text).lower()


# --- a log several launches were appended to ------------------------------------------------------------------------------

XCLIP = "round10/cv-x-clip-fit101-hang"


def test_a_relaunch_gone_before_its_first_step_is_stopped_there():
    # x-clip: `Train: [0/50][0/6]` at 09:36, then a new launch at 10:41 that got as far as `load pretrained CLIP`
    v = diagnose(evidence(log(XCLIP), age=7200, writers=()), DefaultRun("r"))
    assert v.phase is Phase.STOPPED and "CLIP" in v.headline, v.headline


def test_a_relaunch_that_hangs_before_its_first_step_is_silent_from_its_own_last_line():
    v = diagnose(evidence(log(XCLIP), age=1800, writers=((692, 40, "python3 main.py"),)), DefaultRun("r"))
    assert v.phase is Phase.SILENT and "30 min" in v.headline and "load pretrained CLIP" in v.headline, v.headline


def test_swins_logger_prefix_is_no_part_of_the_message():
    from bot.core.grammar import message
    assert message("[2024-09-24 10:41:58 ViT-B/16] (xclip.py 215): INFO load pretrained CLIP") == "load pretrained CLIP"


def test_a_long_evaluation_after_the_last_step_is_no_relaunch():
    # an hour between the last step and the results, but nothing of the start-up printed again
    lines = ["2024-01-01 10:00:00 INFO Build dataset: train images = 34", "2024-01-01 10:00:01 INFO Creating model: swin"]
    lines += [f"2024-01-01 10:0{k}:00 INFO step {k} loss 0.{9 - k}" for k in range(1, 6)]
    lines += ["2024-01-01 11:10:00 INFO Evaluation results: acc 0.91 on the test images"]
    from bot.core.launches import newest_launch
    from bot.core.progress import recognise
    from bot.core.grammar import LineStamps
    steps = recognise(lines, LineStamps(lines))
    assert steps and newest_launch(lines, LineStamps(lines), steps) is None
    again = lines + ["2024-01-01 11:10:05 INFO Build dataset: train images = 34"]
    assert newest_launch(again, LineStamps(again), recognise(again, LineStamps(again))) == 7


# --- a run's own handler of a termination signal (gpu-jobs5's `sigterm`) --------------------------------------------------

def test_a_run_that_says_it_received_sigterm_and_exits_was_stopped_by_it():
    # a preemptible loop: `received SIGTERM: saving a checkpoint at step 34 and exiting`, a save, exit 0
    text = "".join(f"step={k} loss=9.8{k % 10} tok/s=34000\n" for k in range(1, 35))
    text += ("received SIGTERM: saving a checkpoint at step 34 and exiting\n"
             "checkpoint saved to /tmp/ckpt/sigterm/ckpt-34.pt; exiting\n")
    v = diagnose(evidence(text, age=60, writers=()), DefaultRun("r"))
    assert (v.phase, v.level) == (Phase.CRASHED, Level.CRIT) and "SIGTERM" in v.headline, v.headline


def test_a_sigterm_handler_announced_before_the_loop_is_no_crash():
    # Lightning under SLURM: `[rank: 0] Received SIGTERM: 15` at start-up, and the loop trains on
    text = "[rank: 0] Received SIGTERM: 15\n" + "".join(f"step={k} loss=9.8{k % 10} tok/s=34000\n" for k in range(1, 35))
    v = diagnose(evidence(text, age=5, writers=((692, 40, "python3 train.py"),)), DefaultRun("r"))
    assert (v.phase, v.level) == (Phase.TRAINING, Level.OK), v.headline
