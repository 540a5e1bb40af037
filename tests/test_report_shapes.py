"""Counters where reports put them, on real logs: a report block's header, a bar's postfix, and evaluation
words that only say what a rate times (rounds 4 and 5's remaining misses, by structure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.core.progress import read_progress
from tests.builders import evidence

FIXTURES = Path(__file__).parent / "fixtures"


def window(case: str) -> str:
    return (FIXTURES / case / "log").read_text(errors="replace")


@pytest.mark.parametrize("case,counted", [
    # rsl_rl: one ~30-line block an iteration, its counter centred in the header, the losses below it
    ("round4/cv-rsl-rl-hover-learning-iteration-156025", ("step", 156025, 10000000)),
    # rl_games: `fps step and policy inference: …` is a throughput, the line is training's (`epoch: 14/1000`)
    ("round5/cv-rl-games-brax-ant-epoch-14-of-1000", ("epoch", 14, 1000)),
    # Tianshou: each epoch's bar restarts at 0; its postfix's `env_step` goes on
    ("round4/cv-tianshou-ppo-epoch5-env-step-250000", ("step", 250000, None)),
])
def test_the_runs_counter_is_read_where_its_report_puts_it(case, counted):
    last = evidence(window(case)).steps[-1]
    kind, number, total = counted
    assert (last.step, last.total) == (number, total) if kind == "step" else (last.epoch, last.epoch_total) == (number, total)


@pytest.mark.parametrize("text,evaluation", [
    ("fps step: 524282.0 fps step and policy inference: 349520.9  fps total: 209712.3 epoch: 14/1000", False),
    # the word as the line's own label still makes it an evaluation's line
    ("inference step: 14/1000 loss: 0.3", True),
])
def test_an_evaluation_word_in_a_rates_name_does_not_make_the_line_an_evaluation(text, evaluation):
    lines = [text.replace("14/", f"{n}/") for n in range(3, 15)]
    steps = read_progress(lines).steps
    assert (steps == ()) is evaluation


def test_a_postfix_counter_behind_the_bars_own_count_is_not_the_runs():
    # `step=3` in a postfix of a bar at 40/100 is some inner count: the bar's own counter stands.
    ev = evidence("Training:  40%|████      | 40/100 [00:10<00:15,  4.0it/s, loss=0.5, step=3]")
    assert (ev.steps[-1].step, ev.steps[-1].total) == (40, 100)
