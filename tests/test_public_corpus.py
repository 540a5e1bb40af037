"""The public corpus: real logs other teams wrote, probed by the real probe and scored against the first line
an on-call engineer needs (tests/fixtures/public/README.md). Prints the figure; holds runbot to it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bot.core.verdict import Level, Phase, Verdict
from tests.corpus import moments, probe_all, report

CORPUS = Path(__file__).parent / "fixtures" / "public"
MOMENTS = moments(CORPUS)


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory) -> dict[str, Verdict]:
    return probe_all(CORPUS, MOMENTS, tmp_path_factory.mktemp)


def test_the_corpus_is_what_the_issue_asks_for():
    cases = {m.case for m in MOMENTS}
    assert len(cases) >= 60
    families = {re.match(r"[a-z]+", c)[0] for c in cases}
    assert families == {"hf", "dist", "misc"}


def test_the_first_lines_are_right(verdicts, capsys):
    right, lines = report("public corpus", MOMENTS, verdicts)
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert right / len(MOMENTS) >= 0.95


def test_no_false_crit_on_a_healthy_or_cleanly_finished_run(verdicts):
    false = [m.id for m in MOMENTS if m.level != "crit" and verdicts[m.id].level is Level.CRIT]
    assert false == []


def test_every_hung_run_is_alerted_within_silence_after(verdicts):
    hung = [m for m in MOMENTS if m.phase == "silent"]
    assert len(hung) >= 20
    missed = [m.id for m in hung if verdicts[m.id].phase is not Phase.SILENT or verdicts[m.id].level is not Level.CRIT]
    assert missed == []
