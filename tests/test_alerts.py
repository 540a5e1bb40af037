"""The incident state machine, table-driven: (previous state, what a sweep saw, now) -> (status, actions)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.core.alerts import (
    Policy,
    Post,
    Reply,
    RunState,
    Seen,
    Status,
    Update,
    decide,
    mute,
    worst,
)
from bot.core.verdict import Concern, Worry

T0 = 1_800_000_000.0
OK = Seen(headline="step 10 · 14.2K tok/s")
SILENT = Seen((Concern(Worry.SILENT),), headline="silent 12 min — last step 1200")
CRASHED = Seen((Concern(Worry.CRASHED),), headline="crashed — OOM")
UNREACHABLE = Seen((Concern(Worry.UNREACHABLE),), headline="host pve1 did not answer")
IDLE = Seen((Concern(Worry.GPU_IDLE, "drafter"),), headline="step 10; drafter GPUs idle")
THREAD = Seen((Concern(Worry.THREAD_DIED, "drafter-1"),), headline="training, but thread drafter-1 died")
DONE = Seen(finished=True, headline="finished — last step 60000")
LOADING = Seen(headline="no steps yet — loading weights 15%")

QUIET = RunState(headline=OK.headline)
OPEN = RunState(Status.OPEN, Concern(Worry.SILENT), seq=1, announced=True, opened_at=T0, changed_at=T0, notified_at=T0,
                headline=SILENT.headline, streaks=((Concern(Worry.SILENT), 1),))
RECOVERING = replace(OPEN, status=Status.RECOVERING, healthy=1, streaks=())
RESOLVED = replace(OPEN, status=Status.RESOLVED, closed_at=T0 + 600, streaks=())
FINISHED = RunState(Status.FINISHED, seq=1, closed_at=T0, headline=DONE.headline)
MUTED_OPEN = replace(OPEN, announced=False, muted_until=T0 + 3600, notified_at=None)

# (name, previous state, seen, seconds after T0, expected status, expected actions)
TABLE = [
    ("first sight, healthy", None, OK, 0, Status.QUIET, []),
    ("first sight, crashed: alert", None, CRASHED, 0, Status.OPEN, [Post("opened")]),
    ("first sight, finished long ago: no news", None, DONE, 0, Status.FINISHED, []),
    ("healthy stays quiet", QUIET, OK, 60, Status.QUIET, []),
    ("loading is not a problem", QUIET, LOADING, 60, Status.QUIET, []),
    ("silent opens an incident", QUIET, SILENT, 60, Status.OPEN, [Post("opened")]),
    ("a thread died opens an incident", QUIET, THREAD, 60, Status.OPEN, [Post("opened")]),
    ("one idle-GPU sweep is not enough", QUIET, IDLE, 60, Status.QUIET, []),
    ("one unanswered probe is a blip", QUIET, UNREACHABLE, 60, Status.QUIET, []),
    ("finished while quiet: one calm post", QUIET, DONE, 60, Status.FINISHED, [Post("finished")]),
    ("still silent: nothing new", OPEN, SILENT, 600, Status.OPEN, []),
    ("still silent after remind_every: reminder", OPEN, SILENT, 3600, Status.OPEN, [Reply("still", Concern(Worry.SILENT)), Update()]),
    ("silent, then crashed", OPEN, CRASHED, 60, Status.OPEN, [Reply("changed", Concern(Worry.CRASHED)), Update()]),
    ("healthy once: recovering, not told", OPEN, OK, 60, Status.RECOVERING, []),
    ("an unanswered probe while open: hold", OPEN, UNREACHABLE, 60, Status.OPEN, []),
    ("healthy twice: recovered", RECOVERING, OK, 120, Status.RESOLVED, [Reply("recovered", Concern(Worry.SILENT)), Update()]),
    ("flap: silent again while recovering", RECOVERING, SILENT, 120, Status.OPEN, []),
    ("crashed while recovering", RECOVERING, CRASHED, 120, Status.OPEN, [Reply("changed", Concern(Worry.CRASHED)), Update()]),
    ("silent again within 30 min: same thread", RESOLVED, SILENT, 600 + 1700, Status.OPEN, [Reply("reopened", Concern(Worry.SILENT)), Update()]),
    ("silent again after 30 min: a new incident", RESOLVED, SILENT, 600 + 1900, Status.OPEN, [Post("opened")]),
    ("resolved and healthy: quiet", RESOLVED, OK, 700, Status.RESOLVED, []),
    ("finished during an incident: told in the thread", OPEN, DONE, 60, Status.FINISHED, [Reply("finished"), Update()]),
    ("finished, still finished: told once", FINISHED, DONE, 60, Status.FINISHED, []),
    ("finished, then a new run writes the log", FINISHED, OK, 60, Status.QUIET, []),
    ("finished, then a new run crashes: new incident", FINISHED, CRASHED, 60, Status.OPEN, [Post("opened")]),
    ("opened while muted: nothing posted", replace(QUIET, muted_until=T0 + 3600), SILENT, 60, Status.OPEN, []),
    ("mute over, still silent: posted now", replace(MUTED_OPEN, muted_until=T0 + 60), SILENT, 120, Status.OPEN, [Post("opened")]),
    ("opened muted, recovered muted: never told", replace(MUTED_OPEN, status=Status.RECOVERING, healthy=1), OK, 60, Status.QUIET, []),
    ("muted open incident crashes: parent edited only", replace(OPEN, muted_until=T0 + 3600), CRASHED, 60, Status.OPEN, [Update()]),
    ("muted: no reminder", replace(OPEN, muted_until=T0 + 9000), SILENT, 4000, Status.OPEN, []),
    ("mute expires on a live incident: parent edited", replace(OPEN, muted_until=T0 + 60), SILENT, 120, Status.OPEN, [Update()]),
]


@pytest.mark.parametrize("name, prev, seen, dt, status, actions", TABLE, ids=[row[0] for row in TABLE])
def test_table(name, prev, seen, dt, status, actions):
    new, got = decide(prev, seen, T0 + dt)
    assert (new.status, got) == (status, actions)


def run(seens, *, start: RunState | None = None, step: float = 60.0, policy: Policy | None = None):
    """Feed a sequence of sweeps; return the actions of each."""
    state, out = start, []
    for i, seen in enumerate(seens):
        state, actions = decide(state, seen, T0 + i * step, policy or Policy())
        out.append(actions)
    return state, out


def test_unreachable_needs_three_sweeps_in_a_row():
    _, out = run([UNREACHABLE, UNREACHABLE, OK, UNREACHABLE, UNREACHABLE, UNREACHABLE])
    assert out == [[], [], [], [], [], [Post("opened")]]


def test_gpu_idle_needs_two_sweeps_in_a_row():
    state, out = run([IDLE, OK, IDLE, IDLE])
    assert out == [[], [], [], [Post("opened")]]
    assert state.concern == Concern(Worry.GPU_IDLE, "drafter")


def test_the_worst_confirmed_concern_names_the_incident():
    both = Seen((Concern(Worry.GPU_IDLE, "drafter"), Concern(Worry.SILENT)))
    state, out = run([both])
    assert state.concern == Concern(Worry.SILENT) and out == [[Post("opened")]]
    state, out = run([both, both], start=None)
    assert out[1] == []  # gpu_idle now confirmed too, but silent is worse: no change
    assert worst([Concern(Worry.THREAD_DIED, "x"), Concern(Worry.CRASHED), Concern(Worry.SILENT)]) == Concern(Worry.CRASHED)


def test_a_whole_incident_silent_recovered_crashed():
    state, out = run([OK, SILENT, SILENT, OK, OK, CRASHED, OK, OK], step=30)
    assert out == [[], [Post("opened")], [], [], [Reply("recovered", Concern(Worry.SILENT)), Update()],
                   [Reply("changed", Concern(Worry.CRASHED)), Update()], [], [Reply("recovered", Concern(Worry.CRASHED)), Update()]]
    assert state.seq == 1  # one incident, one thread


def test_reminders_come_at_most_every_remind_every():
    policy = Policy(remind_every=600)
    _, out = run([SILENT] * 25, step=60, policy=policy)
    reminders = [i for i, actions in enumerate(out) if Reply("still", Concern(Worry.SILENT)) in actions]
    assert reminders == [10, 20]


def test_recovery_can_be_told_at_once_when_configured():
    _, out = run([SILENT, OK], policy=Policy(recovery_sweeps=1))
    assert out[1] == [Reply("recovered", Concern(Worry.SILENT)), Update()]


def test_mute_edits_a_live_parent_and_ends_by_itself():
    state, actions = mute(OPEN, T0 + 3600, T0, by="U1")
    assert actions == [Update()] and state.muted(T0 + 10) and state.muted_by == "U1"
    assert not state.muted(T0 + 3600)
    _, actions = mute(state, T0 + 3600, T0 + 5, by="U1")
    assert actions == []  # nothing changed
    unmuted, actions = mute(state, None, T0 + 10)
    assert actions == [Update()] and unmuted.muted_until is None and unmuted.muted_by is None
    quiet, actions = mute(None, T0 + 3600, T0)
    assert actions == [] and quiet.muted(T0)  # no incident: nothing to edit


def test_time_is_only_what_is_passed_in():
    a = decide(OPEN, SILENT, T0 + 3600)
    b = decide(OPEN, SILENT, T0 + 3600)
    assert a == b


_SEENS = st.sampled_from([OK, SILENT, CRASHED, UNREACHABLE, IDLE, THREAD, DONE, LOADING])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_SEENS, st.integers(1, 1200), st.booleans()), max_size=40))
def test_threads_are_never_orphaned_nor_doubled(sweeps):
    """Whatever happens: one parent per incident, replies and edits only after their parent."""
    state, now, posted = None, T0, set()
    for seen, gap, toggle_mute in sweeps:
        now += gap
        if toggle_mute:
            state, actions = mute(state, None if state and state.muted(now) else now + 900, now)
            assert all(isinstance(a, Update) for a in actions)
            assert not actions or (state.seq in posted)
        state, actions = decide(state, seen, now)
        for action in actions:
            if isinstance(action, Post):
                assert state.seq not in posted
                posted.add(state.seq)
            else:
                assert state.seq in posted, (action, state)
        assert [type(a) for a in actions].count(Post) <= 1
        if state.muted(now):
            assert all(isinstance(a, Update) for a in actions)


# --- the payloads ---------------------------------------------------------------------------

from datetime import UTC

from bot.render import alerts as render_alerts


def test_the_parent_is_safe_says_the_verdict_first_and_has_the_buttons():
    state = replace(OPEN, headline="silent 12 min — <!channel> token=xoxb-123456789012-abcdefghijkl", muted_until=T0 + 600,
                    muted_by="U1")
    message = render_alerts.parent("dflash", state, None, T0, UTC)
    first = message["text"].splitlines()[0]
    # The text (a lock screen) leads as every answer does, run then verdict; the emoji is the block's.
    assert first.startswith("dflash: silent 12 min") and "<!channel>" not in message["text"]
    assert message["blocks"][0]["text"]["text"].startswith(":red_circle: *dflash*: silent 12 min")
    assert "xoxb-123456789012" not in str(message)
    assert message["text"].splitlines()[1] == f"muted until <!date^{int(T0 + 600)}^{{time}}|{render_alerts.clock(T0 + 600, UTC)}> by <@U1>"
    actions = message["blocks"][-1]
    assert [e["action_id"] for e in actions["elements"]][-1] == "runbot.mute"
    assert {e["value"] for e in actions["elements"]} == {"dflash"}


def test_replies_say_what_changed():
    state = replace(OPEN, headline="crashed — torch.OutOfMemoryError", concern=Concern(Worry.CRASHED))
    changed = render_alerts.reply("dflash", Reply("changed", Concern(Worry.CRASHED)), state, T0)
    assert changed["text"] == "dflash: now crashed — torch.OutOfMemoryError"  # said once, not "now crashed: crashed —"
    assert changed["blocks"][0]["text"]["text"] == ":red_circle: *dflash*: now crashed — torch.OutOfMemoryError"
    resolved = replace(RESOLVED, headline="step 1300 · 14.2K tok/s")
    recovered = render_alerts.reply("d", Reply("recovered", Concern(Worry.SILENT)), resolved, T0 + 720)
    assert recovered["text"] == "d: recovered after 12 min: step 1300 · 14.2K tok/s"
    assert recovered["blocks"][0]["text"]["text"].startswith(":white_check_mark: *d*: recovered")
    # A GPU-idle incident's headline is the one its verdict writes ("…; drafter GPUs idle"): the reply says it once.
    gpu = replace(OPEN, concern=Concern(Worry.GPU_IDLE, "drafter"), headline="step 1200 · 14.2K tok/s; drafter GPUs idle")
    still = render_alerts.reply("d", Reply("still", Concern(Worry.GPU_IDLE, "drafter")), gpu, T0 + 3900)["text"]
    assert still == "d: still, after 1 h 05 min: step 1200 · 14.2K tok/s; drafter GPUs idle"
    assert render_alerts.parent("d", gpu, None, T0)["blocks"][0]["text"]["text"].startswith(":large_orange_circle:")


def test_every_kind_of_concern_has_its_words():
    words = render_alerts.concern_words
    assert words(None) == "a problem"
    assert words(Concern(Worry.THREAD_DIED, "drafter-1")) == "thread drafter-1 died"
    assert words(Concern(Worry.GPU_IDLE, "drafter")) == "drafter GPUs idle"
    assert words(Concern(Worry.NAN_LOSS)) == "loss NaN"
    assert words(Concern(Worry.LOG_REPLACED)) == "log replaced"
    assert words(Concern(Worry.LOG_REPLACED, "/data/run2/train.log")) == "log replaced by /data/run2/train.log"
    assert words(Concern(Worry.HELD)) == "host down"
    assert words(Concern(Worry.NO_LOG)) == "log missing" and words(Concern(Worry.HUNG_ON_EXIT)) == "hung on exit"
    assert all(words(Concern(w, "x")) and words(Concern(w, "x")) != w.value for w in Worry if "_" in w.value)


def test_worst_ties_go_to_the_first_named():
    first, second = Concern(Worry.THREAD_DIED, "a"), Concern(Worry.NAN_LOSS)
    assert first.severity == second.severity
    assert worst([first, second]) == first and worst([second, first]) == second and worst([]) is None


def test_a_watch_trail_keeps_a_moving_bar_short():
    trail = ()
    for stage in ("starting…", "loading weights 15% (131/851)", "loading weights 40% (340/851)",
                  "loading weights 60% (511/851)", "step 1 · 14.2K tok/s"):
        trail = render_alerts.advance(trail, stage)
    assert trail == ("starting…", "loading weights 15% (131/851)", "loading weights 60% (511/851)", "step 1 · 14.2K tok/s")
    text = render_alerts.watch_message("dflash", trail, "trained", T0, T0 + 90)["text"]
    assert text == "dflash: starting… → loading weights 15% (131/851) → 60% (511/851) → first step 1 · 14.2K tok/s :white_check_mark:"


def test_times_are_slack_dates_each_reader_sees_in_their_own_zone(monkeypatch):
    import time

    monkeypatch.setenv("TZ", "Asia/Kolkata")  # the server's zone must not leak into the text
    time.tzset()
    try:
        opened, muted = 1_800_000_000.0, 1_800_003_600.0  # 08:00 and 09:00 UTC
        state = replace(OPEN, opened_at=opened, changed_at=opened + 60, muted_until=muted, muted_by="U1",
                        headline="silent 12 min <!date^1800000000^{time}|forged> & more")
        message = render_alerts.parent("dflash", state, None, opened + 120)
        assert render_alerts.clock(muted) == "09:00 UTC"
        assert message["text"].splitlines()[1] == "muted until <!date^1800003600^{time}|09:00 UTC> by <@U1>"
        notes = message["blocks"][-2]["elements"][0]["text"]
        assert notes == ("silent since <!date^1800000000^{time}|08:00 UTC> · updated <!date^1800000060^{time}|08:01 UTC>"
                         " · muted until <!date^1800003600^{time}|09:00 UTC> by <@U1>")
        # A date token in a log line is text, escaped like any other: only the bot's own are live.
        assert "&lt;!date^1800000000^{time}|forged&gt; &amp; more" in message["text"].splitlines()[0]
        assert message["text"].count("<!date") == 1
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_a_fallback_time_can_name_the_bots_zone():
    from datetime import timedelta, timezone

    ist = timezone(timedelta(hours=5, minutes=30), "IST")
    assert render_alerts.clock(1_800_000_000.0, ist) == "13:30 IST"
    assert render_alerts.slack_time(1_800_000_000.9, ist) == "<!date^1800000000^{time}|13:30 IST>"


# --- flapping -------------------------------------------------------------------------------

def run_sweeps(pattern: list[Seen], every: float, state: RunState | None = QUIET, policy: Policy = Policy()):
    """Feed a sequence of sweeps; returns the final state and every action, with its sweep's index."""
    said = []
    for i, seen in enumerate(pattern):
        state, actions = decide(state, seen, T0 + i * every, policy)
        said += [(i, a) for a in actions]
    return state, said


def test_a_flapping_run_is_one_incident_not_a_storm():
    # silent / healthy / healthy, every 22 s for an hour: the reviewer's storm, per run.
    cycle = [SILENT, OK, OK]
    state, said = run_sweeps(cycle * 54, every=22 / 3 * 2)
    posts = [a for _, a in said if isinstance(a, Post)]
    replies = [a for _, a in said if isinstance(a, Reply)]
    edits = [a for _, a in said if isinstance(a, Update)]
    assert len(posts) == 1 and [r.note for r in replies].count("flapping") == 1
    # Told as it is until the third cycle (opened, recovered, again, recovered, again, recovered),
    # then once that it flaps, then nothing for the rest of the hour.
    assert len(posts) + len(replies) == 7 and len(edits) == 6, (posts, replies, edits)
    assert max(i for i, _ in said) < 20
    assert state.flapping


def test_flapping_settles_and_says_where_it_landed():
    state, said = run_sweeps([SILENT, OK, OK] * 6 + [OK] * 40, every=15)
    notes = [a.note for _, a in said if isinstance(a, (Post, Reply))]
    assert "flapping" in notes and notes[-1] == "settled"
    assert not state.flapping and state.status is Status.RESOLVED
    state, said = run_sweeps([SILENT, OK, OK] * 6 + [SILENT] * 60, every=15)
    settled = [a for _, a in said if isinstance(a, Reply) and a.note == "settled"]
    assert settled == [Reply("settled", Concern(Worry.SILENT))] and state.status is Status.OPEN


def test_a_crash_gets_through_while_flapping():
    state, said = run_sweeps([SILENT, OK, OK] * 6 + [CRASHED], every=15)
    assert state.flapping and said[-2:] == [(18, Reply("changed", Concern(Worry.CRASHED))), (18, Update())]


def test_a_steady_problem_is_no_flap():
    state, said = run_sweeps([SILENT] * 100, every=60)
    assert not state.flapping and [a for _, a in said] == [Post("opened"), Reply("still", Concern(Worry.SILENT)), Update()]


def test_unsure_sweeps_are_not_changes():
    # An unanswered probe between healthy ones holds still; it must not count as two changes.
    state, _ = run_sweeps([OK, UNREACHABLE, OK] * 20, every=15)
    assert state.flips == () and not state.flapping


def test_finishing_ends_the_flap():
    state, said = run_sweeps([SILENT, OK, OK] * 6 + [DONE], every=15)
    assert not state.flapping and state.status is Status.FINISHED and said[-2][1] == Reply("finished")


def test_the_flapping_messages_read_as_one_story():
    from bot.render import alerts as render_alerts

    state, said = run_sweeps([SILENT, OK, OK] * 4, every=15)
    assert state.flapping
    line = render_alerts.parent("dflash", state, None, T0)["text"].splitlines()[0]
    n = len(state.flips)
    assert line.startswith(f"dflash: flapping — silent and back {n} times lately; now ")
    flapping = render_alerts.reply("dflash", Reply("flapping", Concern(Worry.SILENT)), state, T0)["text"]
    assert flapping.startswith(f"dflash: flapping — silent and back {n} times lately: only how it settles")
    healthy = render_alerts.reply("dflash", Reply("settled"), replace(state, status=Status.RESOLVED), T0)["text"]
    assert healthy.startswith("dflash: stopped flapping, healthy again:")
    assert render_alerts.reply("dflash", Reply("settled", Concern(Worry.SILENT)), state, T0)["text"].startswith(
        f"dflash: stopped flapping, now {state.headline}")
