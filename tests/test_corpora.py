"""Real logs other teams wrote, probed by the real probe and scored against the first line an on-call
engineer needs (tests/fixtures/public/README.md). Three corpora: `public` (the development set), `heldout`
(round 2: expectations written blind, 27/41 right at first sight, 65.9 %) and `round3` (round 3: blind,
49/79 at first sight, 62.0 %; docs/diagnosis-corpus.md). Each guards what its misses taught since; `round4`
(63/113 at first sight, 55.8 %), `round5` (55/75, 73.3 %), `round6` (53/84, 63.1 %), `round7` (58/78, 74.4 %), `round8` (61/83, 73.5 %), `round9` (38/66, 57.6 %), `round10` (51/77, 66.2 %) and `round11` (62/98, 63.3 %) are held to
their current scores while their lessons are learned.
Prints each figure; holds runbot to it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bot.core.verdict import Level, Phase, Verdict
from tests.corpus import Moment, moments, probe_all, report

FIXTURES = Path(__file__).parent / "fixtures"
# name: (the fewest hung moments it must hold, the share of first lines it must get right). A round joins at
# its first-sight figure's lessons: round 3 went 49/79 -> 77/79 (docs/diagnosis-corpus.md).
BARS = {"public": (20, 0.95), "heldout": (8, 0.95), "round3": (20, 0.95)}
# name: (folder, its moments, the fewest hung moments it must hold)
CORPORA = {name: (FIXTURES / name, moments(FIXTURES / name), hung) for name, (hung, _) in BARS.items()}
# A round whose lessons are still being learned: held near what it scores now (round 4: 63/113 at first sight,
# 82 after its lessons so far; round 5: 55/75 at first sight, 67 after; round 6: 53/84 at first sight, 76 after;
# round 7: 58/78 at first sight, 75 after; round 8: 61/83 at first sight, 79 after; round 9: 38/66, 44 after; round 10: 51/77, 62 after; round 11: 62/98, 77 after;
# docs/diagnosis-corpus.md), with room for the odd moment a loaded machine's timing moves, so that no change makes
# it worse; it joins BARS once its lessons are in.
LEARNING = {"round4": 80, "round5": 67, "round6": 74, "round7": 73, "round8": 77, "round9": 44, "round10": 61, "round11": 76}
# Learning rounds with no false CRIT and every hang alerted now: held to that as the BARS corpora are.
CLEAN = {"round5", "round6", "round8"}


@pytest.fixture(scope="module", params=list(CORPORA))
def corpus(request, tmp_path_factory) -> tuple[str, list[Moment], dict[str, Verdict], int]:
    folder, found, hung = CORPORA[request.param]
    return request.param, found, probe_all(folder, found, tmp_path_factory.mktemp), hung


def test_the_public_corpus_is_what_the_issue_asks_for():
    cases = {m.case for m in CORPORA["public"][1]}
    assert len(cases) >= 60
    assert {re.match(r"[a-z]+", c)[0] for c in cases} == {"hf", "dist", "misc"}


def test_no_two_corpora_share_a_source():
    """A held-out round measures logs nothing was tuned on: no thread or committed file in two corpora."""
    def sources(folder: Path) -> set[str]:
        out = set()
        for case in folder.iterdir():
            if case.is_dir():
                text = (case / "case.toml").read_text()
                repo = re.search(r'^repository = "(.*)"', text, re.M)
                where = re.search(r'^(?:url|path) = "(.*)"', text, re.M)[1]
                out.add(f"{repo[1]}:{where}" if repo else where)
        return out

    folders = {**{name: folder for name, (folder, _, _) in CORPORA.items()}, **{n: FIXTURES / n for n in LEARNING}}
    seen = {name: sources(folder) for name, folder in folders.items()}
    shared = {(a, b): seen[a] & seen[b] for a in seen for b in seen if a < b}
    assert {pair: s for pair, s in shared.items() if s} == {}


def test_the_first_lines_are_right(corpus, capsys):
    name, found, verdicts, _ = corpus
    right, lines = report(f"{name} corpus", found, verdicts)
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert right / len(found) >= BARS[name][1]


def test_no_false_crit_on_a_healthy_or_cleanly_finished_run(corpus):
    _, found, verdicts, _ = corpus
    assert [m.id for m in found if m.level != "crit" and verdicts[m.id].level is Level.CRIT] == []


def test_every_hung_run_is_alerted_within_silence_after(corpus):
    _, found, verdicts, fewest = corpus
    hung = [m for m in found if m.phase == "silent"]
    assert len(hung) >= fewest
    assert [m.id for m in hung if (verdicts[m.id].phase, verdicts[m.id].level) != (Phase.SILENT, Level.CRIT)] == []


def test_no_row_under_a_headline_repeats_it(corpus):
    """Each fact once on a phone (issue 15): what the first line says, no row of the status says again."""
    from bot.render.facts import rows

    _, found, verdicts, _ = corpus
    repeated = [(m.id, r.label, r.text) for m in found for r in rows(verdicts[m.id]) if r.text in verdicts[m.id].headline]
    assert repeated == []


@pytest.mark.parametrize("name", list(LEARNING))
def test_a_round_being_learned_never_scores_less_than_it_does_now(name, tmp_path_factory, capsys):
    found = moments(FIXTURES / name)
    verdicts = probe_all(FIXTURES / name, found, tmp_path_factory.mktemp)
    right, lines = report(f"{name} corpus", found, verdicts)
    with capsys.disabled():
        print("\n" + lines[0])
    assert right >= LEARNING[name]
    if name in CLEAN:
        assert [m.id for m in found if m.level != "crit" and verdicts[m.id].level is Level.CRIT] == []
        hung = [m for m in found if m.phase == "silent"]
        assert [m.id for m in hung if (verdicts[m.id].phase, verdicts[m.id].level) != (Phase.SILENT, Level.CRIT)] == []
