"""A channel's storm, pure: which rows fold into the digest, the ledger's digest rows and threads, the digest's text."""

from __future__ import annotations

import pytest

from bot.core import digest
from bot.core.alerts import Post, Reply, RunState, Status, Update
from bot.core.digest import Fold, Row, digest_key, fold
from bot.core.ledger import Ledger, Outgoing
from bot.core.verdict import Concern, Worry
from bot.render import alerts as render_alerts

T0 = 1_796_000_000.0
SILENT, CRASHED = Concern(Worry.SILENT), Concern(Worry.CRASHED)


def row(id, run="a", *, op="post", note="opened", priority=3, in_doubt=False, digest_seq=None, seq=1):
    return Row(id, run, seq, op, note, priority, in_doubt, digest_seq)


BUSY = {f"r{i}": T0 - 10 for i in range(digest.STORM_RUNS)}  # five runs with news in the last minute
OLD = {f"r{i}": T0 - digest.STORM_WINDOW_S - 1 for i in range(20)}  # twenty, but longer ago than a storm's window

FOLDS = [
    # (what, rows, news, the fold)
    ("a calm channel posts as before", [row(1)], {}, Fold()),
    ("news older than the window is no storm", [row(1)], OLD, Fold()),
    ("five runs with news: a post folds, its replies and edits with it",
     [row(1), row(2, op="reply", note="recovered"), row(3, op="update", note="")], BUSY,
     Fold(drop=(1, 2, 3), attach=(("a", 1),))),
    ("a crash is never folded", [row(1, priority=5, note="opened")], BUSY, Fold()),
    ("nor a post that may be in Slack already", [row(1, in_doubt=True)], BUSY, Fold()),
    ("a summary behind a folded post stays: a reply in the digest's thread",
     [row(1, note="finished", priority=0), row(2, op="reply", note="summary", priority=0)], BUSY,
     Fold(drop=(1,), attach=(("a", 1),))),
    ("more waiting than the burst sends is a storm too", [row(i, run=f"r{i}") for i in range(1, 9)], {},
     Fold(drop=tuple(range(1, 9)), attach=tuple((f"r{i}", 1) for i in range(1, 9)))),
    ("a thread of its own keeps its news: recovery in the same thread", [row(1, op="reply", note="recovered")], BUSY,
     Fold()),
    ("told in a digest, out of a storm: a reply in the digest's thread, and an edit of the digest",
     [row(1, op="reply", note="recovered", digest_seq=2), row(2, op="update", note="", digest_seq=2)], {},
     Fold(drop=(2,), edit=(2,))),
    ("told in a digest, in a storm: the digest's edit says it", [row(1, op="reply", note="reopened", digest_seq=2)], BUSY,
     Fold(drop=(1,), edit=(2,))),
]


@pytest.mark.parametrize("what, rows, news, expected", FOLDS, ids=[f[0] for f in FOLDS])
def test_what_a_storm_folds(what, rows, news, expected):
    assert fold(rows, news, T0) == expected


def test_a_crash_of_a_run_told_in_a_digest_is_a_parent_of_its_own():
    crash = [Reply("changed", CRASHED), Update()]
    assert digest.alone(crash, in_digest=True) == [Post("opened")]
    assert digest.alone(crash, in_digest=False) == crash  # its own thread: a reply there, as always
    quiet = [Reply("recovered", SILENT), Update()]
    assert digest.alone(quiet, in_digest=True) == quiet


def _ledger_with_storm() -> tuple[Ledger, list[int]]:
    led = Ledger()
    state = RunState(status=Status.OPEN, concern=SILENT, seq=1, announced=True)
    ids = [led.commit(run, state, [Outgoing("post", {"text": run}, "C1", priority=3, note="opened")], T0)[0]
           for run in ("a", "b")]
    led.fold("C1", Fold(drop=tuple(ids), attach=(("a", 1), ("b", 1))), T0)
    return led, ids


def test_the_ledger_tells_folded_incidents_in_one_digest_thread():
    led, _ = _ledger_with_storm()
    assert led.pending() == [] and led.open_digest("C1").seq == 1
    assert led.members("C1", 1) == [("a", 1), ("b", 1)]
    assert led.take_stale() == [("C1", 1)] and led.take_stale() == []
    post = led.tell_digest("C1", 1, {"text": "2 runs"}, T0, calm=False)
    assert led.tell_digest("C1", 1, {"text": "2 runs, newer"}, T0, calm=False) == post  # not out yet: it takes the newer text
    [p] = led.pending()
    assert (p.run, p.op, p.payload["text"]) == (digest_key("C1"), "post", "2 runs, newer")
    led.sent(p, "100.1", T0, channel="C1ID")
    # A run told in it: its edits become the digest's, its replies go in the digest's thread.
    state = RunState(status=Status.RESOLVED, concern=SILENT, seq=1, announced=True)
    led.commit("a", state, [Outgoing("reply", {"text": "a recovered"}, note="recovered"), Outgoing("update", {"text": "a"})], T0)
    [reply] = led.pending()
    assert (reply.op, reply.channel, reply.parent_ts, reply.digest) == ("reply", "C1ID", "100.1", 1)
    assert led.thread("a", 1) == ("C1ID", "100.1")
    assert led.take_stale() == [("C1", 1)]
    edit = led.tell_digest("C1", 1, {"text": "1 calm"}, T0, calm=False)
    assert led.messages[edit].op == "update"
    led.tell_digest("C1", 1, {"text": "all calm"}, T0 + 5, calm=True)
    assert led.open_digest("C1") is None and led.incidents[(digest_key("C1"), 1)].closed_at == T0 + 5


def test_a_crash_takes_its_run_out_of_the_digest():
    led, _ = _ledger_with_storm()
    led.take_stale()
    state = RunState(status=Status.RESOLVED, concern=SILENT, seq=1, announced=True)
    led.commit("a", state, [Outgoing("reply", {"text": "a recovered"}, note="recovered")], T0)
    crashed = RunState(status=Status.OPEN, concern=CRASHED, seq=1, announced=True)
    [post] = led.commit("a", crashed, [Outgoing("post", {"text": "a crashed"}, "C1", priority=5, note="opened")], T0 + 9)
    # Its own parent now (the same incident, opened when it was), and nothing of it left waiting for the digest.
    assert [p.id for p in led.pending()] == [post]
    incident = led.incidents[("a", 1)]
    assert (incident.digest, incident.parent_ts, incident.opened_at) == (None, None, T0)
    assert led.members("C1", 1) == [("b", 1)] and led.take_stale() == [("C1", 1)]


def test_the_digest_reads_worst_first_and_short():
    now = T0 + 600
    flapping = RunState(status=Status.OPEN, concern=SILENT, seq=1, opened_at=T0, flapping=True, flips=(T0,) * 6)
    members = [(f"flap{i}", flapping) for i in range(100)] + [
        ("ok", RunState(status=Status.RESOLVED, concern=SILENT, seq=1)),
        ("dead", RunState(status=Status.OPEN, concern=CRASHED, seq=1, opened_at=T0)),
        ("<!channel>", RunState(status=Status.OPEN, concern=SILENT, seq=1, opened_at=T0)),
        ("moved", None)]
    message = render_alerts.digest(members, T0, now)
    assert message["text"] == "104 runs changed at once: 1 crashed, 100 flapping, 1 silent, 2 calm again"
    lines = message["blocks"][1]["text"]["text"].splitlines()
    assert [line.split("*")[1] for line in lines] == ["crashed", "flapping", "silent", "calm again"]
    assert lines[1].startswith(":red_circle: *flapping* (100): flap0, flap1, flap2,") and "more" in lines[1]
    assert "<!channel>" not in str(message) and "&lt;!channel&gt;" in lines[2]  # a name is text, never a mention
    assert len(message["blocks"][1]["text"]["text"]) < 1500  # a phone's few screens, not 104 lines
    calm = render_alerts.digest([("ok", members[100][1]), ("moved", None)], T0, now)
    assert calm["text"] == "2 runs changed at once: all calm again"
