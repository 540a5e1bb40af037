"""Round 9's lessons, on its real logs and lines (tests/fixtures/round9/FIRST_SIGHT.txt has what was misread at first
sight; gpu-jobs4 is the same round's H200 batch): ends in a model's name, in other languages and as a JSON record;
a reloaded checkpoint's test as the end; an evaluation with nothing that moves; a terminal's ^C; a C-style source
prefix; torchrun restarting its workers without a word; an epochs bar over nested batch bars."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.core.diagnose import diagnose
from bot.core.facts import Kind, Process
from bot.core.grammar import message
from bot.core.markers import Mark, find_markers
from bot.core.verdict import Level, Phase
from bot.probe.replay import DefaultRun
from tests.builders import evidence

FIXTURES = Path(__file__).parent / "fixtures"
ALIVE = ((692, 40, "python3 train.py"),)


def log(case: str) -> str:
    return (FIXTURES / case / "log").read_text(errors="replace")


def verdict(text: str, age: float, alive: bool, writers=ALIVE):
    return diagnose(evidence(text, age=age, writers=writers if alive else ()), DefaultRun("r"))


# --- ends, as other people's scripts say them ----------------------------------------------------------------------

@pytest.mark.parametrize("case,says", [
    ("round9/cv-paddlevideo-res3d-ucf101-finished", "Res18"),  # `training Res18 finished`
    ("round9/llm-custom-qlora-petition", "concluído"),  # `Treinamento concluído com sucesso`
    ("round9/llm-minllama-sst-finetune", "test acc"),  # `load model from …`, then `dev acc`, `test acc :: 0.390`
])
def test_a_clean_end_in_a_scripts_own_words_is_an_end(case, says):
    v = verdict(log(case), 600, alive=False)
    assert (v.phase, v.level) == (Phase.FINISHED, Level.OK) and says in v.headline, v.headline


def test_a_json_loggers_end_record_is_an_end_and_a_step_record_is_not():
    assert [m.kind for m in find_markers(['{"event": "done", "steps": 150, "elapsed": 20.2}'])] == [Mark.ENDED]
    assert find_markers(['{"step": 150, "loss": 9.7594, "tokens_per_sec": 32716, "elapsed": 20.1}']) == ()


def test_a_reload_that_is_not_followed_by_results_is_no_end():
    text = "epoch 0: train loss :: 1.696, train acc :: 0.412, dev acc :: 0.391\nload model from finetune-1-2e-05.pt\n"
    assert verdict(text, 600, alive=False).phase is Phase.STOPPED


# --- an evaluation with nothing that moves ------------------------------------------------------------------------

OPENNMT = "round9/llm-opennmt-tf-eval-restore-hang"


@pytest.mark.parametrize("minutes,phase", [(20, Phase.EVALUATING), (40, Phase.SILENT)])
def test_an_evaluation_that_shows_nothing_is_a_hang_after_three_silences(minutes, phase):
    """`Starting evaluation`, `Restoring parameters …`, then nothing: no bar, no earlier evaluation to go by."""
    v = verdict(log(OPENNMT), minutes * 60, alive=True)
    assert v.phase is phase, v.headline
    assert "so far" not in v.headline or phase is Phase.EVALUATING  # the silence says how long, once


# --- what a terminal and a C-style logger put around a message ----------------------------------------------------

def test_a_terminals_ctrl_c_echo_is_an_interrupt_named_by_what_followed():
    v = verdict(log("round9/llm-deepspeed-qwen-ckpt-hang-ctrlc"), 300, alive=False)
    assert v.phase is Phase.CRASHED and "Ctrl-C" in v.headline and "22523" in v.headline
    [crash] = [c for c in evidence("^C\n").crashes]
    assert crash.kind is Kind.INTERRUPTED


def test_a_source_location_closing_a_prefix_is_no_part_of_the_message():
    line = "ERROR 2021-05-16 22:14:00,649 launch_utils.py:545] ABORT!!! Out of all 4 trainers, the trainer process"
    assert message(line).startswith("ABORT!!!")
    v = verdict(log("round9/misc-paddleclas-launch-abort-ranks"), 120, alive=False)
    assert v.phase is Phase.CRASHED and "rank=[1, 2, 3]" in v.headline


# --- torchrun restarting its workers (gpu-jobs4: --max-restarts 1) ------------------------------------------------

def new_workers(ev, crash):
    from bot.core.stages.activity import new_workers  # round 9's: imported where used, so the rest run on older code

    return new_workers(ev, crash)


def _elastic(job: str, moment: str) -> str:
    return (FIXTURES / "gpu-jobs4" / job / moment / "log" / "train.log").read_text()


AGENT = (1680, 15, "python3 -u -m torch.distributed.run --nproc_per_node 2 --max-restarts 1 dist_job.py --mode flaky")
NEW = ((2553, 1, "python3 -u dist_job.py --mode flaky"), (2554, 1, "python3 -u dist_job.py --mode flaky"))


def test_new_workers_writing_the_log_after_the_failure_are_a_restart():
    text = _elastic("elastic", "restarting")
    v = verdict(text, 2, alive=True, writers=(AGENT, *NEW))
    assert v.phase is Phase.STARTING and v.level is Level.WARN and "restart" in v.headline and "IndexError" in v.headline
    # the agent alone, or the failed worker itself still alive: no new group
    assert verdict(text, 2, alive=True, writers=(AGENT,)).phase is Phase.CRASHED
    failed = (1918, 15, "python3 -u dist_job.py --mode flaky")
    assert verdict(text, 2, alive=True, writers=(AGENT, failed)).phase is Phase.CRASHED


def test_workers_the_agent_names_after_its_failure_report_are_a_new_group():
    """Static rendezvous: the restarted group hung, then the agent was SIGTERMed and named its new workers."""
    ev = evidence(_elastic("elastic", "finished"), age=5, writers=())
    first = next(c for c in ev.crashes if c.exc_type and c.exc_type.endswith("IndexError"))
    assert new_workers(ev, first) == (2553, 2554)
    v = verdict(_elastic("elastic", "finished"), 5, alive=False)
    assert v.phase is Phase.CRASHED and "SIGTERM" in v.headline


def test_one_group_torn_down_is_no_restart():
    ev = evidence((FIXTURES / "gpu-jobs3" / "logs" / "ddp-hang" / "train.log").read_text(), age=5, writers=())
    assert all(new_workers(ev, c) == () for c in ev.crashes)


def test_a_launchers_own_process_is_no_new_worker():
    ev = evidence(_elastic("elastic", "restarting"), age=2, writers=(AGENT,))
    assert isinstance(ev.writers[0], Process) and all(new_workers(ev, c) == () for c in ev.crashes)


# --- an epochs bar over each epoch's batch bar --------------------------------------------------------------------

def test_an_epochs_bar_counts_epochs_and_the_bar_below_it_the_steps():
    text = (FIXTURES / "gpu-jobs4" / "nested" / "training" / "log" / "train.log").read_text()
    v = verdict(text, 1, alive=True)
    assert (v.phase, v.level) == (Phase.TRAINING, Level.OK) and "epoch 1/3 · batch 29/60" in v.headline, v.headline


# --- a loop that announced its first epoch and nothing since -------------------------------------------------------

@pytest.mark.parametrize("age,phase", [(60, Phase.TRAINING), (3 * 3600, Phase.SILENT)])
def test_a_first_epoch_announced_alone_is_where_the_loop_stands(age, phase):
    v = verdict(log("round9/cv-nnunet-v2-epoch0-silent"), age, alive=True)
    assert v.phase is phase and "epoch 0" in v.headline, v.headline
    assert verdict("Epoch 3 of my notes\n", 60, alive=True).phase is Phase.STARTING  # words after it: no header


def test_a_restarted_group_that_trains_again_reads_as_training():
    """Once the new workers print progress, the restart is history: the loop's lines say what it does."""
    again = _elastic("elastic", "restarting") + "".join(f"step={n} loss=9.87 elapsed={n * 0.2:.1f}s\n" for n in range(1, 6))
    v = verdict(again, 1, alive=True, writers=(AGENT, *NEW))
    assert v.phase is Phase.TRAINING and "step 5" in v.headline, v.headline
