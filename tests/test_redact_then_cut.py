"""Redact first, cut after: a credential that straddles a cut is redacted whole, on every surface that
shortens log text (a crash's message, a headline, a writer's command line, an announced line, an
nvidia-smi error, a log line past the line cap). Cut first, its head no longer has the shape a rule
knows (`hf_` needs 30 characters after it) and up to that many characters of it were shown."""

from __future__ import annotations

import pytest

from bot.core.alerts import RunState, Status
from bot.core.diagnose import diagnose
from bot.core.gpus import MAX_ERROR_CHARS, parse_gpu_section
from bot.core.markers import Mark, Marker
from bot.core.markers import words as announced
from bot.core.sections import LINE_CAP
from bot.core.stages.activity import last_result
from bot.core.verdict import Concern, Worry
from bot.render import alerts as render_alerts
from bot.render import slack as render_slack
from bot.render import text as render_text
from tests.builders import evidence
from tests.test_diagnose import Run
from tests.credential_shapes import ALNUM, Shape, leaks, rnd, strings

TOKEN = rnd(ALNUM, 34, "straddle")
HF = Shape("hf", "hf_" + TOKEN, TOKEN)  # kept: `hf_`; what must not show: the 34 characters after it


def straddling(cut_at: int, before: str = "", sep: str = " ") -> str:
    """`before`, filler words, then the token, so that a cut at `cut_at` falls some 16 characters into it.
    A `sep` other than a space makes it one long word, which a cut at a word boundary cannot avoid."""
    fill = before + sep.join(["w" * 9] * ((cut_at - len(before)) // 10 + 1))
    return fill[: cut_at - 16].rstrip(sep) + sep + "hf_" + TOKEN


def shown(v) -> list[str]:
    state = RunState(Status.OPEN, Concern(Worry.CRASHED), seq=1, announced=True, opened_at=1.0, changed_at=1.0,
                     headline=v.headline)
    return [v.headline, render_text.status(v), *strings(render_slack.status_message(v, "r")),
            *strings(render_alerts.parent("r", state, v, 2.0))]


@pytest.mark.parametrize("cut_at", [90, 200], ids=["headline", "crash message"])
def test_a_crash_message_with_a_token_across_the_cut(cut_at: int) -> None:
    message = straddling(cut_at, "could not upload: ")
    log = f"step=1 loss=2.0\nTraceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nRuntimeError: {message}\n"
    v = diagnose(evidence(log, writers=()), Run())
    assert v.crash is not None and not leaks(HF, v.crash.message)
    assert not leaks(HF, *shown(v)), shown(v)[1]


def test_a_logged_error_with_a_token_across_the_cut() -> None:
    log = f"step=1 loss=2.0\n[ERROR] {straddling(200)}\n"
    v = diagnose(evidence(log, writers=()), Run())
    assert v.crash is not None and not leaks(HF, *shown(v)), shown(v)[1]


def test_a_writers_command_line_with_a_token_across_the_cut() -> None:
    command = "python3 " + straddling(60, "train.py --tags=", sep=",")
    v = diagnose(evidence("step=1 loss=2.0\nstep=2 loss=1.9\n", writers=((692, 40, command),)), Run())
    assert not leaks(HF, *shown(v)), shown(v)[1]


def test_an_announced_line_with_a_token_across_the_cut() -> None:
    for limit in (70, 80):
        line = straddling(limit, "Saving checkpoint to ")
        assert not leaks(HF, announced(Marker(Mark.SAVING, 1, line), limit))


def test_a_result_line_with_a_token_across_the_cut() -> None:
    ev = evidence(f"step=10 loss=1.0\n{straddling(60, 'eval_loss = 0.9 ')}\n")
    result = last_result(ev, None)
    assert result is not None and not leaks(HF, result)


def test_an_nvidia_smi_error_with_a_token_across_the_cut() -> None:
    said = straddling(MAX_ERROR_CHARS, "nvidia-smi: Failed to initialize NVML: ").removeprefix("nvidia-smi: ")
    section = f"# sample 1 t=1.0 rc=9\n{said}\n"
    error = parse_gpu_section(section).error
    assert error is not None and not leaks(HF, error)


def test_a_log_line_past_the_line_cap_with_a_token_across_it() -> None:
    v = diagnose(evidence(f"step=1 loss=2.0\n{straddling(LINE_CAP)}\nstep=2 loss=1.9\n"), Run())
    tail = render_text.tail(v, 5)
    assert not leaks(HF, tail, *strings(render_slack.tail_message(v, 5)))
    assert tail.splitlines()[-1] == "step=2 loss=1.9"


async def test_a_probe_that_fails_unexpectedly_says_so_redacted_then_cut() -> None:
    """An exception nobody expected becomes the verdict (`the probe failed: …`), cut at 300 characters."""
    from bot.probe.checkup import check_within
    from bot.probe.replay import DefaultRun

    class Broken:
        async def run(self, script: str, *, timeout: float, limit=None):
            raise ValueError(straddling(300, "the probe failed: ValueError: bad line \x1b[2J").split(": ", 2)[2])

    v = await check_within(DefaultRun("r"), lambda run: Broken(), timeout=5)
    assert not leaks(HF, *shown(v)), v.headline
    assert v.headline.startswith("the probe failed: ValueError") and v.headline.isprintable()
