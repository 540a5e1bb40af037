"""The runs' memory in the state file: points and tallies round-trip, retention thins and ends them, a renamed run
starts afresh, a restarted bot remembers, and a state file that cannot be written leaves the memory in RAM.
Each test that takes `state_db` runs on both engines, SQLite and PostgreSQL."""

from __future__ import annotations

import math
import sqlite3

import pytest

from bot.core.facts import Step
from bot.core.history import Point, RoleLoad, Tally, tally
from bot.core.verdict import Level, Phase, Verdict
from bot.service.history import History
from bot.service.state_file import StateFile
from bot.service.store import PHASES, Store
from tests.postgres import open_store

T0 = 1_800_000_000.0
H = 3600.0


def point(t: float, step: int | None = None, **kw) -> Point:
    return Point(t, kw.pop("phase", Phase.TRAINING), kw.pop("level", 0), step, **kw)


def test_every_field_of_a_point_round_trips(state_db):
    store = open_store(state_db)
    points = [
        point(T0, 10, total=100, loss=2.5, rate=14_200.0, unit="tok/s", segment=2,
              gpus=(RoleLoad("target", 0.8, 70.5), RoleLoad("drafter", 1.0, None))),
        point(T0 + 60, None, phase=Phase.LOADING, level=int(Level.WARN)),
        point(T0 + 120, 11, rate=3.1, unit="it/s", gpus=(RoleLoad("GPUs", 0.0, 0.0),)),
    ]
    store.apply([], [("a", p) for p in points])
    assert store.points("a", T0) == points
    assert store.recent(T0) == {"a": points}
    # Units and role names are stored once each, not in every row.
    with store._session() as db:
        assert sorted(r["word"] for r in db.execute("SELECT word FROM words")) == ["GPUs", "drafter", "it/s", "target", "tok/s"]


def test_phases_are_stored_by_a_place_that_never_moves():
    # Stored integers point into PHASES: a new phase goes at the end, or old files would read wrong.
    assert PHASES[:5] == tuple(Phase)[:5] and len(PHASES) == len(Phase)


def test_the_same_second_twice_keeps_the_later_point(state_db):
    store = open_store(state_db)
    store.apply([], [("a", point(T0, 1))])
    store.apply([], [("a", point(T0 + 0.4, 2))])
    assert [p.step for p in store.points("a", T0 - 1)] == [2]


def test_retention_keeps_a_day_whole_then_one_a_bucket_then_nothing(state_db):
    store = open_store(state_db)
    now = T0 + 40 * 86400
    minutes = [now - m * 60 for m in range(0, 40 * 1440, 1)]  # a point a minute for 40 days
    store.apply([], [("a", point(t, int(t - T0))) for t in reversed(minutes)])
    gone = store.prune(now, full=86400, every=600, keep=30 * 86400)
    kept = store.points("a", 0)
    assert gone == len(minutes) - len(kept)
    day = [p for p in kept if p.t >= now - 86400]
    older = [p for p in kept if p.t < now - 86400]
    assert len(day) == 1441  # every point of the last day
    assert min(p.t for p in kept) >= now - 30 * 86400  # nothing past keep
    # One per 10-minute bucket before that: the bucket's last point (its newest step).
    assert len(older) == 29 * 144
    assert len({int(p.t) // 600 for p in older}) == len(older)
    assert all(int(p.t) % 600 == 540 for p in older)  # T0 is on a bucket's edge: the last minute of each
    assert store.prune(now, full=86400, every=600, keep=30 * 86400) == 0  # idempotent


def test_a_restart_within_a_bucket_keeps_both_segments(state_db):
    store = open_store(state_db)
    now = T0 + 3 * 86400
    old = now - 2 * 86400
    store.apply([], [("a", point(old, 900, segment=0)), ("a", point(old + 60, 3, segment=1))])
    store.prune(now, full=86400, every=600, keep=30 * 86400)
    assert [(p.segment, p.step) for p in store.points("a", 0)] == [(0, 900), (1, 3)]


def test_a_run_gone_from_the_config_is_forgotten_with_its_tally(state_db):
    store = open_store(state_db)
    t = Tally(0, T0, T0 + 60, 1, 5, 2.0, 1.9, 28_400.0, 2, "tok/s")
    store.apply([], [("old-name", point(T0, 5)), ("kept", point(T0, 7))], [("old-name", t), ("kept", t)])
    assert store.forget(["kept"]) == 1
    assert store.recent(0) == {"kept": [point(T0, 7)]} and store.tallies() == {"kept": t}


def test_a_tally_round_trips(state_db):
    store = open_store(state_db)
    t = Tally(3, T0, T0 + 7200, 100, 1200, 2.31, 2.10, 14_200.0 * 40, 40, "tok/s")
    store.apply([], [], [("a", t)])
    assert store.tallies() == {"a": t}
    assert math.isclose(store.tallies()["a"].mean_rate, 14_200.0)


def test_a_tally_follows_its_segment():
    first = tally(None, [point(T0, 1, loss=3.0, rate=10.0, unit="it/s"), point(T0 + 10, 2, loss=2.0, rate=12.0, unit="it/s")])
    assert (first.first_step, first.last_step, first.final_loss, first.best_loss, first.mean_rate) == (1, 2, 2.0, 2.0, 11.0)
    later = tally(first, [point(T0 + 20, 3, loss=2.5, rate=11.0, unit="it/s", phase=Phase.TRAINING),
                          point(T0 + 30, 3, phase=Phase.EVALUATING, rate=1.0, unit="it/s")])
    assert (later.last_step, later.final_loss, later.best_loss, later.rate_n) == (3, 2.5, 2.0, 3)  # eval rates don't count
    again = tally(later, [point(T0 + 40, 1, loss=4.0, segment=1)])  # the log restarted: a new tally
    assert (again.segment, again.started, again.first_step, again.best_loss, again.rate_n) == (1, T0 + 40, 1, 4.0, 0)
    assert tally(again, []) is again


def verdict(step: int) -> Verdict:
    s = Step(f"step={step}", step=step, loss=2.0, rate=100.0, rate_unit="it/s")
    return Verdict(run="a", phase=Phase.TRAINING, level=Level.OK, headline="", step=s, recent=(s,))


async def test_a_restarted_bot_remembers_and_a_renamed_run_does_not(state_db):
    clock = [T0]
    state = StateFile.open(state_db)
    history = History(state, clock=lambda: clock[0], runs=["a", "b"])
    for i in range(1, 4):
        clock[0] += 60
        history.record("a", verdict(i))
        history.record("b", verdict(i))
    assert await state.flush()
    state.close()
    state = StateFile.open(state_db)
    again = History(state, clock=lambda: clock[0], runs=["a"])  # b was renamed in the config
    assert [p.step for p in again.recent("a")] == [1, 2, 3] and again.recent("b") == ()
    assert again.tally("a").first_step == 1 and again.tally("b") is None
    assert [p.step for p in await again.points("a", 0)] == [1, 2, 3]
    state.close()


async def test_without_a_writable_file_the_memory_stays_in_ram(tmp_path, monkeypatch):
    clock = [T0]
    state = StateFile.open(tmp_path / "state.db")
    history = History(state, clock=lambda: clock[0])

    def full(self, *args):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(Store, "apply", full)
    for i in range(1, 4):
        clock[0] += 60
        history.record("a", verdict(i))
    assert not await state.flush() and not state.healthy  # one clear fault, said once by the state file
    assert [p.step for p in history.recent("a")] == [1, 2, 3] and history.tally("a").last_step == 3
    assert [p.step for p in await history.points("a", 0)] == []  # the file answers reads: it holds none yet
    monkeypatch.undo()
    assert await state.flush()  # the disk is back: the ledger is rewritten whole...
    assert await state.flush()  # ...and the points it kept queued follow with the next write
    assert [p.step for p in await history.points("a", 0)] == [1, 2, 3]
    state.close()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 1e300])
def test_non_finite_numbers_never_reach_the_file(state_db, bad):
    from bot.core.history import observe

    s = Step("step=1", step=1, loss=bad, rate=bad, rate_unit="it/s")
    v = Verdict(run="a", phase=Phase.TRAINING, level=Level.OK, headline="", step=s, recent=(s,))
    [p] = observe(v, T0, None)
    store = open_store(state_db)
    store.apply([], [("a", p)])
    [back] = store.points("a", 0)
    assert back.loss is None and back.rate is None and back.step == 1


def test_a_step_past_any_counter_never_reaches_the_file(state_db):
    # A log's "step=99999999999999999999" used to end every write of the state file in an OverflowError (SQLite's
    # integers stop at 2**63): every run's points and the sweep's decisions went unwritten, with a traceback each time.
    from bot.core.history import observe

    huge = 10**20
    s = Step(f"step={huge}", step=huge, total=huge + 1, loss=2.0)
    [p] = observe(Verdict(run="a", phase=Phase.TRAINING, level=Level.OK, headline="", step=s, recent=(s,)), T0, None)
    assert (p.step, p.total, p.loss) == (None, None, 2.0)
    store = open_store(state_db)
    store.apply([], [("a", p)])
    assert store.points("a", 0) == [p]
