"""The terminal rendering: what `runbot tail` and friends print, secrets redacted."""

from __future__ import annotations

import pytest

from bot.render import text as render_text
from bot.core.diagnose import diagnose
from bot.core.verdict import Level, Phase, Verdict
from config.registry import Run
from tests.builders import KEY_BODY, KEY_LOGS, evidence, gpu_section, gpu_window

RUN = Run(name="r", host="local", container=None, log="/workspace/train.log")


@pytest.mark.parametrize("name", KEY_LOGS)
def test_a_private_key_block_in_the_tail_is_never_printed(name):
    out = render_text.tail(diagnose(evidence("\n".join(KEY_LOGS[name]) + "\n"), RUN), 20)
    for line in KEY_BODY:
        assert line[:8] not in out and line[-8:] not in out, out
    assert "[redacted]" in out


def test_the_tail_keeps_ordinary_lines_and_redacts_tokens():
    v = diagnose(evidence("step=1 loss=2.0\nHF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123456789\nstep=2 loss=1.9\n"), RUN)
    assert render_text.tail(v, 3).splitlines()[1:] == ["step=1 loss=2.0", "HF_TOKEN=hf_[redacted]", "step=2 loss=1.9"]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_short_tail_that_starts_inside_a_key_block_prints_none_of_it(n):
    out = render_text.tail(diagnose(evidence("\n".join(KEY_LOGS["cut off"]) + "\n"), RUN), n)
    assert not any(line[:8] in out or line[-8:] in out for line in KEY_BODY), out


ROLES = Run(name="r", host="local", container=None, log="/workspace/train.log", gpus=(("target", (0,)), ("drafter", (1,))))


def test_gpus_from_the_drivers_window_say_so_and_show_avg_min_max_and_now():
    gpus = gpu_section([[(0, 31395, 75), (1, 18211, 0)]], bus_ids=True)
    v = diagnose(evidence("step=1 loss=2.0\n", gpus=gpus, window=gpu_window([(0, 99, 0, 49), (1, 0, 0, 0)])), ROLES)
    assert render_text.gpus(v).splitlines()[1:] == [
        "  target 0 oscillating · drafter 1 idle (memory held)",
        "  util from driver window 14 s, 71 samples",
        "  target (0)",
        "    GPU 0: oscillating 31/140 GiB       util % avg 49 · 0–99 · now 75",
        "  drafter (1)",
        "    GPU 1: idle        18/140 GiB       util % avg 0 · 0–0 · now 0",
        "  ! drafter GPU 1 idle with 18 GiB held",
    ]


def test_gpus_from_readings_say_how_many_and_why_not_the_window():
    gpus = gpu_section([[(0, 31395, u)] for u in (100, 0, 100)], bus_ids=True)
    na = gpu_window([(0, 99, 0, 49)]).replace("14.00 sec", "18446744073709 sec")
    v = diagnose(evidence("step=1 loss=2.0\n", gpus=gpus, window=na), RUN)
    out = render_text.gpus(v).splitlines()
    assert out[2] == "  util from 3 readings over 0.5 s (driver window: absurd duration)"
    assert out[-1] == "    GPU 0: busy        31/140 GiB       util % 100 0 100"


def test_runs_are_listed_worst_first_then_by_name_with_levels_in_one_casing():
    def v(level):
        return Verdict(run="x", phase=Phase.TRAINING, level=level, headline=f"{level.name} line")

    out = render_text.runs([("zeta", v(Level.OK)), ("Beta", v(Level.CRIT)), ("alpha", v(Level.CRIT)),
                            ("gamma", v(Level.WARN)), ("delta", v(Level.NOTE))])
    assert [line.split()[:2] for line in out.splitlines()] == [
        ["alpha", "crit"], ["Beta", "crit"], ["gamma", "warn"], ["delta", "note"], ["zeta", "ok"]]


def test_a_level_has_one_spelling():
    assert [lvl.word for lvl in Level] == ["ok", "note", "warn", "crit"]
