"""Round 7's lessons, on its real logs (tests/fixtures/round7/FIRST_SIGHT.txt has what was misread at first
sight): text glued after a bar's frame, schedulers' and glog's ends, numbers in paths, counters' totals from
their headers and bars, ends by structure (a total reached, an aggregate printed once, more passes to go)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.core.crashes import find_crashes
from bot.core.diagnose import diagnose
from bot.core.facts import Kind
from bot.core.grammar import fields
from bot.core.verdict import Level, Phase
from bot.probe.replay import DefaultRun
from tests.builders import evidence

ROUND7 = Path(__file__).parent / "fixtures" / "round7"
ALIVE = ((692, 40, "python3 train.py"),)


def log(case: str) -> str:
    return (ROUND7 / case / "log").read_text(errors="replace")


def verdict(case: str, age: float, alive: bool):
    return diagnose(evidence(log(case), age=age, writers=ALIVE if alive else ()), DefaultRun("r"))


# --- what another writer glued after a bar's frame -------------------------------------------------------------

SLURM = "misc-slurm-polymergnn-time-limit-at-11-of-50"
SIGHUP = "llm-chinese-llama-alpaca3-sighup-2844"


def glued_after(line: str) -> str:
    """The text the evidence reads as glued after the line's bar frame ("" when none)."""
    return next((b.after for b in evidence(line + "\n").bars), "")


def test_text_glued_after_a_bars_frame_is_read_as_a_line_of_its_own():
    frame = " 22%|██▏       | 11/50 [1:55:26<6:49:05, 629.37s/it]"
    glued = "slurmstepd: error: *** JOB 42221 ON clr1247 CANCELLED AT 2022-04-14T16:20:46 DUE TO TIME LIMIT ***"
    assert glued_after(frame + glued) == glued
    assert glued_after(frame) == ""  # a frame alone stays itself
    assert glued_after("| epoch 3 | loss 2.1 |") == ""  # a table row is no frame
    [crash] = evidence(log(SLURM)).crashes  # the crash scan reads the glued text as its own line
    assert crash.kind is Kind.CANCELLED and "time limit" in crash.message


@pytest.mark.parametrize("case,words", [(SLURM, ("time limit", "11/50")), (SIGHUP, ("SIGHUP", "2844/5772"))])
def test_a_kill_glued_after_the_last_frame_is_the_runs_end(case, words):
    v = verdict(case, 120, alive=False)
    assert (v.phase, v.level) == (Phase.CRASHED, Level.CRIT), v.headline
    assert all(w in v.headline for w in words), v.headline


# --- schedulers' and C++ loggers' own accounts of an end -------------------------------------------------------

def test_lsfs_term_reason_is_the_end_and_a_path_is_no_counter():
    v = verdict("misc-lsf-painn-term-runlimit-no-epochs", 180, alive=False)
    assert (v.phase, v.level) == (Phase.CRASHED, Level.CRIT), v.headline
    assert "LSF" in v.headline and "run time limit" in v.headline and "59/9" not in v.headline, v.headline


def test_glogs_fatal_severity_is_a_crash_named_by_its_message():
    v = verdict("llm-paddlespeech-ds2-cuda-oom", 60, alive=False)
    assert (v.phase, v.level) == (Phase.CRASHED, Level.CRIT) and "out of memory" in v.headline, v.headline
    [crash] = find_crashes(["F0109 01:49:19.022586   845 hl_cuda_device.cc:273] Check failed: cudaSuccess == "
                            "cudaStat (0 vs. 2) Cuda Error: out of memory", "*** Check failure stack trace: ***"])
    assert crash.kind is Kind.OOM
    # glog's other severities are no end
    assert find_crashes(["W0109 01:49:19.022586   845 init.cc:12] Check failure stack trace: soon"]) == []


@pytest.mark.parametrize("text,counts", [
    ("[WARNING] WON'T CONVERT update /zhome/59/9/198225/Desktop/Deep_learning_2023/PaiNN.py line 94", [(94, None)]),
    ("At iteration 2966/3300/3300, Mean rms=4.274%", [(2966, 3300), (3300, None)]),  # tesstrain's slashes: no path
    ("Saving LoRA weights to '/home/x/lora/iter-000031-ckpt.pth'", [(31, None)]),  # a checkpoint's name says its step
])
def test_a_directory_named_by_a_number_is_no_count(text, counts):
    assert [(int(f.value), f.total) for f in fields(text) if f.is_int and f.value > 10] == counts


# --- ends by structure -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case,must", [
    ("cv-cqpes-lm-potential-1000-epochs", "1000/1000"),  # Keras' last epoch of one batch: its total reached
    ("misc-fedavg-uniform-vs-skewed-round-50-of-50", "50/50"),  # `Round 50/50` above `Round 50, Global Loss`
    ("misc-dgl-graphsage-multigpu-30-epochs-done", "29"),  # `Avg epoch time: 19.61` printed once, after the loop
    ("cv-asgl-snn-cifar100-finished-epoch-299", "299"),  # `Finish training: the best validation accuracy …`
])
def test_a_clean_end_with_no_end_line_of_the_usual_words_is_finished(case, must):
    v = verdict(case, 600, alive=False)
    assert (v.phase, v.level) == (Phase.FINISHED, Level.OK), v.headline
    assert must in v.headline and "killed" not in v.headline, v.headline


def test_a_finished_warm_up_bar_fills_nothing_into_the_rounds_after_it():
    # fedavg: a local `Epoch 10/10` bar, then fifty federated rounds: the rounds are the loop, alone.
    step = evidence(log("misc-fedavg-uniform-vs-skewed-round-50-of-50")).steps[-1]
    assert (step.counter, step.step, step.total, step.epoch) == ("round", 50, 50, None)


def test_an_aggregate_printed_every_epoch_is_no_end():
    lines = [f"Epoch {e:05d} | Step 00140 | Loss 0.3 | Speed (samples/sec) 12703.6 | GPU 493.6 MB\nAvg loss: 0.3"
             for e in range(5)]
    v = diagnose(evidence("\n".join(lines) + "\n", age=600, writers=()), DefaultRun("r"))
    assert v.phase is Phase.STOPPED, v.headline  # the same `Avg` line after each epoch: the loop's, not a summary


# --- a loop's passes: headers, announcements, more to go -------------------------------------------------------

APO = "misc-apo-metaheuristic-lstm-search-iter-71-of-75"


@pytest.mark.parametrize("age,alive,phase,level", [
    (30, True, Phase.TRAINING, Level.OK),  # `Evaluating new candidates...` opens every iteration: the loop's work
    (15 * 60, True, Phase.SILENT, Level.CRIT),  # ... so the loop's silence rule holds, not an evaluation's grace
    (5 * 60, False, Phase.STOPPED, Level.CRIT),  # 71 of 75 iterations: a best-so-far line is no end
])
def test_a_header_announces_the_next_pass_and_its_total(age, alive, phase, level):
    v = verdict(APO, age, alive)
    assert (v.phase, v.level) == (phase, level) and "71/75" in v.headline, v.headline


def test_a_bars_description_names_the_epochs_planned():
    step = evidence(log("cv-seqar-diffusion-epoch-56-nested-bars")).steps[-1]
    assert (step.epoch, step.epoch_total, step.step, step.total) == (56, 400, 1695, 2590)
    assert "56/400" in verdict("cv-seqar-diffusion-epoch-56-nested-bars", 20, True).headline


# --- causes named, not guessed -------------------------------------------------------------------------------------

def test_a_wrappers_exception_names_what_it_carries_and_a_list_of_maybes_names_nothing():
    # Ray: the worker-died warning lists `potential root causes` (SIGKILL, SIGSEGV…); the trial's own error follows.
    [crash] = find_crashes(log("llm-ray-train-worker-died-system-error").split("\n"))
    assert crash.exc_type == "ray.exceptions.RayTaskError(RuntimeError)"
    v = verdict("llm-ray-train-worker-died-system-error", 60, alive=False)
    assert v.phase is Phase.CRASHED and "RuntimeError" in v.headline and "SIGSEGV" not in v.headline, v.headline
    [oom] = find_crashes(["ray.exceptions.RayTaskError(OutOfMemoryError): ray::train() (pid=1, ip=10.0.0.1)"])
    assert oom.kind is Kind.OOM
    # said as the cause, not as a possibility, a signal still counts
    assert find_crashes(["Fatal Python error: Segmentation fault"])[0].kind is Kind.SEGFAULT
