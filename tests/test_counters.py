"""Issue 20, classes 1 and 2 — the right counter, and formats that parse — held on real lines: the number that
advances, its total, padding and thousands separators, evaluation passes, summary blocks, bar roles, the
announcement's own number. Each table's lines come from a real log (the fixture or source it names)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bot.core.bars import Role, frames
from bot.core.diagnose import diagnose
from bot.core.formats import step_grep_ere
from bot.core.grammar import SUMMARY_LINES, fields, is_setting, template
from bot.core.progress import recognise
from bot.core.verdict import Phase
from tests.builders import evidence
from tests.test_diagnose import Run

PUBLIC = Path(__file__).parent / "fixtures" / "public"


def lines_of(case: str) -> list[str]:
    return (PUBLIC / case / "log").read_text(encoding="utf-8").split("\n")


def line_with(case: str, needle: str) -> str:
    return next(x for x in reversed(lines_of(case)) if needle in x)


KAIR = "misc-kair-swinir-thousands-iter"
RTDETR = "misc-ppdet-rtdetr-padded-batch-counter"
PADDLE_EE = "misc-paddlenlp-ee-dev-lines-download-bars"
MM_VAL = "misc-mmengine-mmdet3d-val-after-train-epoch4"
MM_PADDED = "misc-mmengine-mmdet3d-val-padded-counter"
UIE = "misc-paddlenlp-uie-summary-block-ansi"
SAGEMAKER = "misc-lightning-sagemaker-epoch-boundary"

# --- the numbers of a line: (case, a piece of the line, the key, the value, its total)
FIELDS = [
    (KAIR, "iter:   5,000,", "iter", 5000, None),  # a thousands separator before a list comma
    (KAIR, "iter:   4,800,", "iter", 4800, None),
    (RTDETR, "Epoch: [2] [  0/464]", "", 0, 464),  # a right-aligned counter in its brackets
    (PADDLE_EE, "step: 1050 (total: 1060)", "total", 1060, None),
    (MM_VAL, "Epoch(train)  [4][5/5]", "epoch", 4, None),  # MMEngine's `Epoch(train)`: the epoch, qualified
    (MM_PADDED, "Epoch(val)  [1][ 600/4931]", "", 600, 4931),
]


@pytest.mark.parametrize(("case", "piece", "key", "value", "total"), FIELDS, ids=[f"{c}:{p}" for c, p, *_ in FIELDS])
def test_the_numbers_of_real_lines(case, piece, key, value, total):
    line = line_with(case, piece)
    at = line.index(piece)
    found = [f for f in fields(line) if at <= f.start < at + len(piece)]
    assert any((f.key, f.value, f.total) == (key, value, total) for f in found), [(f.key, f.value, f.total) for f in found]


# --- one statement, one template, whatever width its numbers print at
SAME_STATEMENT = [
    (RTDETR, "Epoch: [2] [  0/464]", "Epoch: [1] [200/464]"),
    (KAIR, "<epoch:  3, iter:   5,000,", "<epoch:  0, iter:     200,"),
    (MM_PADDED, "[1][ 600/4931]", "[1][ 200/4931]"),
]


@pytest.mark.parametrize(("case", "one", "other"), SAME_STATEMENT)
def test_padding_is_the_numbers_not_the_statements(case, one, other):
    assert template(line_with(case, one)) == template(line_with(case, other))


# --- the loop's counter, read from a window of real lines: (case, what the last step must say)
COUNTERS = [
    (KAIR, dict(step=5000, epoch=3.0)),  # not 5: the thousands separator
    (RTDETR, dict(step=0, total=464, epoch=2.0)),  # the batch, not only the epoch
    (PADDLE_EE, dict(step=1050, total=1060, epoch=19.0)),  # `(total: 1060)`; the `dev step:` line is no loop
    (MM_VAL, dict(step=5, total=5, epoch=4.0)),  # `Epoch(val)` is no loop
]


@pytest.mark.parametrize(("case", "want"), COUNTERS, ids=[c for c, _ in COUNTERS])
def test_the_loop_counter_of_real_logs(case, want):
    last = evidence((PUBLIC / case / "log").read_bytes()).steps[-1]
    assert {k: getattr(last, k) for k in want} == want


def test_a_dev_evaluation_line_lends_the_loop_neither_its_loss_nor_a_download_bar_its_rate():
    last = evidence((PUBLIC / PADDLE_EE / "log").read_bytes()).steps[-1]
    assert last.loss == pytest.approx(0.017909) and last.rate is None


def test_a_bar_with_no_description_and_another_total_than_the_loops_is_the_download_it_follows():
    ev = evidence((PUBLIC / PADDLE_EE / "log").read_bytes())
    downloads = [b for b in ev.bars if b.bar.total == 392507]
    assert downloads and {b.bar.role for b in downloads} == {Role.LOADING}


# --- evaluation passes: their progress lines are the evaluation's bar, never the loop's counter
@pytest.mark.parametrize(("case", "counts"), [(MM_VAL, "(1/8)"), (MM_PADDED, "(600/4931)")])
def test_an_evaluation_progress_line_reads_as_an_evaluation(case, counts):
    verdict = diagnose(evidence((PUBLIC / case / "log").read_bytes(), age=10), Run())
    assert verdict.phase is Phase.EVALUATING and "validation" in verdict.headline and counts in verdict.headline


# --- summary blocks are configuration: every shape in the table, and the real blocks
@pytest.mark.parametrize(("line", "source"), SUMMARY_LINES)
def test_every_summary_shape_is_a_setting(line, source):
    assert is_setting(line), source


@pytest.mark.parametrize("line", [line_with(KAIR, "iter:   5,000,"), line_with(PADDLE_EE, "step: 1050 (total"),
                                  line_with(RTDETR, "[  0/464]"),
                                  "I0628 11:52:34.587659 18013 solver.cpp:228] Iteration 2000, loss = 0.0319893"])
def test_a_progress_line_is_no_setting(line):
    assert not is_setting(line)


def test_the_real_summary_block_is_not_the_first_step():
    assert evidence((PUBLIC / UIE / "log").read_bytes()).steps == ()


# PaddleNLP Trainer prints its evaluation block at every evaluation: `Total prediction steps = 3` recurs, but is
# configuration (a PaddleNLP fine-tune's log, lines as printed, the colour codes already gone).
PADDLENLP_EVALS = """\
[2022-08-31 15:21:48,891] [    INFO] - loss: 0.60147681, learning_rate: 2.73e-06, global_step: 90, interval_runtime: 0.9499, interval_samples_per_second: 8.422, interval_steps_per_second: 10.527, epoch: 4.5
[2022-08-31 15:21:49,786] [    INFO] - loss: 0.50334263, learning_rate: 2.7e-06, global_step: 100, interval_runtime: 0.8952, interval_samples_per_second: 8.937, interval_steps_per_second: 11.171, epoch: 5.0
[2022-08-31 15:21:49,787] [    INFO] - ***** Running Evaluation *****
[2022-08-31 15:21:49,787] [    INFO] -   Num examples = 160
[2022-08-31 15:21:49,787] [    INFO] -   Pre device batch size = 64
[2022-08-31 15:21:49,787] [    INFO] -   Total Batch size = 64
[2022-08-31 15:21:49,787] [    INFO] -   Total prediction steps = 3
[2022-08-31 15:21:50,490] [    INFO] - eval_loss: 0.7092321515083313, eval_accuracy: 0.71875, eval_runtime: 0.702, eval_samples_per_second: 227.93, eval_steps_per_second: 4.274, epoch: 5.0
[2022-08-31 15:21:50,491] [    INFO] - Saving model checkpoint to ./checkpoints/checkpoint-100
[2022-08-31 15:22:07,666] [    INFO] - loss: 0.34469995, learning_rate: 2.43e-06, global_step: 190, interval_runtime: 0.9367, interval_samples_per_second: 8.54, interval_steps_per_second: 10.676, epoch: 9.5
[2022-08-31 15:22:08,552] [    INFO] - loss: 0.27687857, learning_rate: 2.4000000000000003e-06, global_step: 200, interval_runtime: 0.8858, interval_samples_per_second: 9.031, interval_steps_per_second: 11.289, epoch: 10.0
[2022-08-31 15:22:08,553] [    INFO] - ***** Running Evaluation *****
[2022-08-31 15:22:08,553] [    INFO] -   Num examples = 160
[2022-08-31 15:22:08,553] [    INFO] -   Pre device batch size = 64
[2022-08-31 15:22:08,553] [    INFO] -   Total Batch size = 64
[2022-08-31 15:22:08,553] [    INFO] -   Total prediction steps = 3"""


def test_a_recurring_summary_block_is_not_the_loop():
    last = recognise(PADDLENLP_EVALS.split("\n"))[-1]
    assert (last.step, last.counter, last.loss) == (200, "global_step", pytest.approx(0.27687857))


# --- bars: a tqdm frame with no bar drawn is a bar; each role from its description, relative to the loop
def test_a_tqdm_frame_with_no_bar_drawn_is_a_bar():
    ev = evidence((PUBLIC / SAGEMAKER / "log").read_bytes())
    bar = frames(next(x for x in reversed(ev.lines) if "Epoch 1:" in x))[-1]
    assert (bar.desc, bar.n, bar.total, bar.role) == ("Epoch 1", 0, 2, Role.TRAINING)
    assert ev.steps[-1].epoch == 1.0


# --- the announcement's own number, when the loop's last line is behind it (the format strings of a loop that
# counts from 0, logs every 10th iteration and saves at the 1000th: `iter {i}: loss …`, `saving checkpoint at
# iteration {i+1}...`)
def test_a_save_announced_at_a_later_iteration_than_the_last_line_says_that_iteration():
    log = "\n".join([f"iter {i}: loss 2.{i % 97:02d}, lr 6.00e-04, time 120.45ms" for i in range(900, 1000, 10)]
                    + ["saving checkpoint at iteration 1000..."])
    verdict = diagnose(evidence(log, age=5), Run())
    assert verdict.phase is Phase.SAVING and "1000" in verdict.headline and "990" not in verdict.headline


def test_a_save_announced_by_epoch_keeps_the_loops_step():
    log = "\n".join([f"iter {i}: loss 2.{i % 97:02d}" for i in range(900, 1000, 10)] + ["saving checkpoint at epoch 3000"])
    assert "990" in diagnose(evidence(log, age=5), Run()).headline


# --- the remote pre-filter keeps every real progress line the recogniser reads
@pytest.mark.parametrize("line", [line_with(KAIR, "iter:   5,000,"), line_with(RTDETR, "[  0/464]"),
                                  line_with(PADDLE_EE, "step: 1050 (total"), line_with(MM_VAL, "Epoch(train)  [4][5/5]")])
def test_the_prefilter_keeps_the_real_progress_lines(line):
    assert re.search(step_grep_ere(), line)


# --- a bar glued to the next message: the message came after the frame (an HF Trainer log, lines as printed:
# the bar's \r was lost when the save's first line was written after it)
HF_SAVE_GLUED = """\
{'eval_loss': 0.018584178760647774, 'eval_f1': 0.9785344189489267, 'eval_runtime': 164.1653, 'eval_samples_per_second': 134.011, 'eval_steps_per_second': 2.095, 'epoch': 2.91}
 97%|████████████████████████████████████████████████████████████████████████████████████▎  | 8000/8250 [5:22:48<03:04,  1.36it/s]Saving model checkpoint to ./results/checkpoint-8000"""

GLUED = [
    (HF_SAVE_GLUED, Phase.SAVING, "8000"),
    # issue 20's own example: a message with no number in it
    ("{'loss': 2.3, 'learning_rate': 1e-05, 'epoch': 0.5}\n"
     "Training:  45%|████▌     | 450/1000 [00:30<00:37, 14.80it/s]Saving checkpoint...", Phase.SAVING, "450/1000"),
    # a Lightning frame cut at the terminal's width, the save's message glued into its postfix
    ("Epoch 3:  45%|████▌     | 450/1000 [00:30<00:37, 14.80it/s, loss=0.123, v_num=1, train_loss_step=0.1"
     "Saving checkpoint to /out/ep3.ckpt", Phase.SAVING, "450/1000"),
    # cut frames redrawn with \r and nothing glued: the loop, its loss from what the cut left
    ("Epoch 3:  44%|████▌     | 440/1000 [00:30<00:37, 14.80it/s, loss=0.123, v_num=1, train_lo\r"
     "Epoch 3:  45%|████▌     | 450/1000 [00:30<00:37, 14.80it/s, loss=0.123, v_num=1, train_lo\n", Phase.TRAINING, "loss 0.123"),
]


@pytest.mark.parametrize(("log", "phase", "says"), GLUED)
def test_a_message_glued_after_a_bar_is_the_lines_later_news(log, phase, says):
    verdict = diagnose(evidence(log, age=3), Run())
    assert verdict.phase is phase and says in verdict.headline, verdict.headline


# --- an inner bar inside the loop's step (GRPO's rollouts, a weight sync) is the loop's, not its counter; the
# frames as vLLM and HF Trainer print them: vLLM's `Processed prompts` bar with its est. speed postfix, vLLM's
# `Loading safetensors checkpoint shards: 50% Completed | 2/4`, HF's loop bar with no description
ROLLOUT = "Processed prompts: {pct:3d}%|{bar}| {n}/32 [00:05<00:00,  6.12it/s, est. speed input: 1000.00 toks/s, output: 500.00 toks/s]"
SHARDS = "Loading safetensors checkpoint shards: {pct:3d}% Completed | {n}/4 [00:01<00:01,  1.50it/s]"


def loop_with(inner: str, steps=(54, 55, 56), *, inside: bool = True) -> str:
    out = []
    for step in steps:
        out += [inner.format(pct=50, bar="█████     ", n=2 if "shards" in inner else 16)] if inside else []
        out.append(f"  2%|▏         | {step}/2290 [10:00<6:00:00,  9.50s/it]")
    return "\n".join(out + [inner.format(pct=50, bar="█████     ", n=2 if "shards" in inner else 16)])


@pytest.mark.parametrize("inner", [ROLLOUT, SHARDS], ids=["rollout", "weight sync"])
def test_a_bar_that_runs_inside_the_loops_steps_is_the_loops(inner):
    verdict = diagnose(evidence(loop_with(inner), age=3), Run())
    assert verdict.phase is Phase.TRAINING and "56/2290" in verdict.headline, verdict.headline


def test_shards_loading_after_the_loop_with_no_sign_of_it_inside_is_loading():
    verdict = diagnose(evidence(loop_with(SHARDS, inside=False), age=3), Run())
    assert verdict.phase is Phase.LOADING and "2/4" in verdict.headline, verdict.headline
