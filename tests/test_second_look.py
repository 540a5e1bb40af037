"""The second look: what a run's own log taught runbot at one look makes the next one right (bot.core.learned)."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path

import pytest

from bot.core.diagnose import diagnose
from bot.core.evidence import read_evidence
from bot.core import state_rows as rows
from bot.core.learned import CounterRule, Learned, Sighting, learn, learn_counter, news_line, stood_for, to_record
from bot.core.progress import clean
from bot.core.sections import Sections
from bot.core.verdict import Level, Phase
from bot.probe.checkup import check
from bot.probe.replay import DefaultRun
from bot.probe.runners import LocalRunner
from bot.service.history import History
from bot.service.state_file import StateFile
from tests.builders import NOW, sections
from tests.standins import set_age, writer_holding

FIXTURES = Path(__file__).parent / "fixtures"
# XGBoost's evaluation log (round 3's misc-xgboost-round-12000-eval-logloss-rising, real): `[N]` has no name.
XGB = (FIXTURES / "round3" / "misc-xgboost-round-12000-eval-logloss-rising" / "log").read_text().splitlines()
# TRL/HF loss dicts after the step number, as a user's log numbered them (round 3's trl case, real).
TRL = (FIXTURES / "round3" / "hf-trl-sft-train-runtime-save-last-checkpoint" / "log").read_text().splitlines()
# torch's c10d retrying to reach its store, the same warnings again and again (hpcaitech/Open-Sora#667, real).
RETRIES = FIXTURES / "second-look" / "opensora-c10d-connect-retries" / "log"
RUN = DefaultRun("r", "/workspace/train.log")


def look(window: str, *, size: int, now: float, inode: int = 12) -> Sections:
    """A probe of a log of `size` bytes whose window holds `window` (a quiet log's new lines since the last look)."""
    # The window starts where a line starts (the end of the one before it): a window cut mid-file drops its first
    # partial line.
    parts = dict(sections(f"\n{window}\n", now=now, age=3).parts)
    parts["meta"] = f"now={now}\nhost=ct200\nsize={size} mtime={int(now - 3)} inode={inode}\n".encode()
    return Sections(parts)


def sequence(windows, *, start=NOW, every=60.0, grow=4096):
    """Each window diagnosed in turn, each look starting from what the ones before it learned."""
    verdicts, learned = [], None
    for i, window in enumerate(windows):
        ev = read_evidence(look(window, size=grow * (i + 1), now=start + i * every), RUN.log, None, learned)
        verdict = diagnose(ev, RUN)
        verdicts.append(verdict)
        learned = verdict.learned
    return verdicts


# --- learning, table-driven -------------------------------------------------------------------------

def sight(tpl: str, *values: float, countable=None, measured=True) -> Sighting:
    countable = tuple(i for i, v in enumerate(values) if float(v).is_integer()) if countable is None else countable
    return Sighting(tpl, tuple(float(v) for v in values), countable, measured)


CASES = [
    # (name, before's sightings, now's sightings, the window's own loop, the counter learned)
    ("the number that advanced is the counter", [sight("[#] loss:#", 500, 0.4)], [sight("[#] loss:#", 1000, 0.3)],
     None, CounterRule("[#] loss:#", 0)),
    ("the window's own counter stands when it advanced", [sight("ep # it # l #", 3, 1200, 0.5)],
     [sight("ep # it # l #", 3, 1300, 0.4)], CounterRule("ep # it # l #", 1), CounterRule("ep # it # l #", 1)),
    ("the window's counter did not move, another did: the one that moved", [sight("e # i # l #", 3, 1200, 0.5)],
     [sight("e # i # l #", 3, 1300, 0.4)], CounterRule("e # i # l #", 0), CounterRule("e # i # l #", 1)),
    ("an epoch beside an iteration: the one that went furthest", [sight("# #: #", 3, 1200, 0.5)],
     [sight("# #: #", 4, 1300, 0.4)], None, CounterRule("# #: #", 1)),
    ("numbers with no measurement beside them count no loop", [sight("loaded # files", 2000, measured=False)],
     [sight("loaded # files", 4000, measured=False)], None, None),
    ("a number that fell is no counter", [sight("[#] loss:#", 1000, 0.4)], [sight("[#] loss:#", 500, 0.3)], None, None),
    ("a template not seen before teaches nothing yet", [sight("a # b #", 1, 0.5)], [sight("[#] loss:#", 1000, 0.3)],
     None, None),
]


@pytest.mark.parametrize("name,before,now,loop,want", CASES, ids=[c[0] for c in CASES])
def test_the_counter_is_the_number_that_advanced_between_looks(name, before, now, loop, want):
    first = learn(None, inode=1, size=10, now=0.0, sightings=before, counter=None, news="")
    assert learn_counter(first, now, loop) == want


def test_what_was_learned_holds_only_for_the_same_log_not_shorter():
    learned = Learned(inode=7, size=1000)
    assert learned.holds_for(7, 1000) and learned.holds_for(7, 5000) and learned.holds_for(None, 1000)
    assert not learned.holds_for(8, 5000)  # a new file at the path: a new run
    assert not learned.holds_for(7, 999)  # truncated or restarted
    assert not learned.holds_for(7, None)


def test_heartbeats_are_not_news_and_a_retry_loop_is_the_same_news_at_the_next_look():
    beat = ["[12:00:01] step 1", "2024-01-01 12:00:01 waiting for rank 3", "2024-01-01 12:01:01 waiting for rank 3"]
    assert news_line(beat, clean) == "[12:00:01] step 1"
    retries = RETRIES.read_text().splitlines()
    once, twice = news_line(retries, clean), news_line(retries + retries[-2:], clean)
    assert once.startswith("repeats ") and once == twice
    assert news_line(retries + ["Initted"], clean) == "Initted"
    learned = Learned(inode=1, size=1, news=once, news_since=100.0)
    assert stood_for(learned, twice, 820.0) == 720.0
    assert stood_for(learned, "Initted", 820.0) is None


def test_a_learned_format_survives_its_json_and_odd_records_are_refused():
    learned = Learned(inode=3, size=99, counter=CounterRule("[#] l:#", 0),
                      sightings=(sight("[#] l:#", 5, 0.5),), news="x", news_since=1.5)
    assert rows.learned(json.dumps(to_record(learned))) == learned
    for spoil in ({"size": -1}, {"size": 1.5}, {"counter": ["t", "0"]}, {"news": 7}, {"news_since": "soon"},
                  {"sightings": [["t", [float("nan")], [], True]]}, {"sightings": [["t", [1.0], [0], "yes"]]}):
        with pytest.raises((ValueError, TypeError, KeyError, IndexError)):
            rows.learned(json.dumps({**to_record(learned), **spoil}))


# --- sequences in a format read badly at first sight ----------------------------------------------------

@pytest.mark.parametrize("lines,steps", [
    (XGB[1:4], [500, 1000, 1500]),  # `[500]\teval-logloss:… train-logloss:…`: a round with no name
    (TRL[0:3], [2368, 2369, 2370]),  # `2368 {'loss': 1.5472, …}`: the user's line numbers were the step
], ids=["xgboost-rounds", "numbered-loss-dicts"])
def test_a_window_of_one_report_is_read_right_from_the_second_look(lines, steps):
    verdicts = sequence(lines)
    first, *later = verdicts
    # At first sight one line of an unnamed count is not a loop's counter (a lone number in prose is not either).
    assert first.step is None or first.step.step is None, first.headline
    for verdict, step in zip(later, steps[1:]):
        assert verdict.phase is Phase.TRAINING and verdict.step.step == step, verdict.headline
        assert str(step) in verdict.headline


def test_the_learned_counter_is_forgotten_when_the_log_restarts():
    verdicts = sequence(XGB[1:3])
    learned = verdicts[-1].learned
    assert learned.counter is not None
    ev = read_evidence(look(XGB[3], size=100, now=NOW + 200), RUN.log, None, learned)  # shorter: a new run
    assert ev.learned is None and (not ev.steps or ev.steps[-1].step is None)


async def test_a_retry_loop_that_keeps_the_log_fresh_is_a_hang_at_the_look_past_silence_after(tmp_path):
    # The real probe on the real warnings, a live writer: at first sight the fresh log reads as starting up.
    log = tmp_path / "train.log"
    log.write_text(RETRIES.read_text())
    run = DefaultRun("r", str(log))
    with writer_holding(log):
        set_age(log, 5)
        first = await check(run, LocalRunner())
        assert (first.phase, first.level) == (Phase.STARTING, Level.NOTE), first.headline
        # Twelve minutes on (that look is moved back, not waited for), the same warnings again, the file fresh.
        earlier = dataclasses.replace(first.learned, news_since=first.learned.news_since - 720)
        with log.open("a") as f:
            f.write("\n".join(RETRIES.read_text().splitlines()[-2:]) + "\n")
        set_age(log, 5)
        second = await check(run, LocalRunner(), previous=first, learned=earlier)
        blind = await check(run, LocalRunner(), previous=first)
    assert (second.phase, second.level) == (Phase.SILENT, Level.CRIT), second.headline
    assert second.headline.startswith("silent 12 min"), second.headline
    assert blind.level is not Level.CRIT  # without the first look's lesson the fresh file hides the hang


async def test_the_learned_format_is_kept_in_the_state_file_across_a_restart(tmp_path):
    path = tmp_path / "state.sqlite3"
    verdicts = sequence(XGB[1:3])
    sf = StateFile.open(path)
    history = History(sf, runs=["r"])
    for v in verdicts:
        history.record("r", v)
    assert await sf.flush()
    sf.close()
    again = History(StateFile.open(path), runs=["r"])
    kept = again.learned("r")
    assert kept is not None and kept.counter == verdicts[-1].learned.counter
    ev = read_evidence(look(XGB[3], size=4096 * 3, now=NOW + 120), RUN.log, None, kept)
    assert ev.steps[-1].step == 1500
    rows = sqlite3.connect(path).execute("SELECT length(learned) FROM formats").fetchall()
    assert len(rows) == 1 and rows[0][0] < 4096  # small, per run
    StateFile.open(path, ).close()
    History(StateFile.open(path), runs=[])  # the run is gone from the config: its format is forgotten with it
    assert sqlite3.connect(path).execute("SELECT count(*) FROM formats").fetchone()[0] == 0
