"""One odd row costs that row: a real state file spoiled row by row, column by column (SQLite's types are dynamic and
its integrity check passes all of it), read by serve's start, `runbot status` with the file, `runbot plot` and
/run history — each skips the bad row, counts it, and goes on."""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import sqlite3
import time
import types
from collections import Counter
from dataclasses import dataclass, fields
from pathlib import Path

import pytest

from bot import cli
from bot.core.alerts import RunState, Status
from bot.core.history import Point, RoleLoad, Tally
from bot.core.ledger import Incident, Message, PutIncident, PutMessage, PutState, PutWatch, Watch
from bot.core.verdict import Concern, Phase, Worry
from bot.probe.targets import Targets
from bot.service.state_file import StateFile
from bot.service.store import Store
from bot.service.watchdog import Watchdog
from config.registry import load_registry
from handlers import history as history_handler
from handlers.commands import CommandRequest
from tests.test_plot import a_readable_png
from tests.test_serve import free_port, healthy, serve_env, slack, start_serve, stub  # noqa: F401 - the Slack stand-in
from tests.test_watchdog import FakeChat
from tests.slack_stub import post, sign, slash_body
from tests.standins import writer_holding

NOW = time.time()
TABLES = ("runs", "incidents", "outbox", "watches", "points", "tallies")


def t_of(slot: int) -> int:
    """When the point of a slot was taken: within the last 3 hours, the memory a restarted bot reloads."""
    return int(NOW) - 2 * 3600 + 60 * slot


def build(path: Path, slots: int) -> None:
    """A state file written by runbot's own code: `slots` rows in each table, one per slot."""
    store = Store(path)
    changes: list = []
    for i in range(slots):
        changes += [
            PutState(f"r{i}", RunState(Status.OPEN, Concern(Worry.CRASHED), seq=i + 1, announced=True, opened_at=NOW - 600,
                                       headline="crashed", streaks=((Concern(Worry.CRASHED), 2),), bad=True,
                                       flips=(NOW - 60,))),
            PutIncident(Incident("dflash", i + 1, "C0ALERTS", f"{1000 + i}.000100", NOW - 3600 + i,
                                 Concern(Worry.CRASHED), NOW - 1800 + i if i % 2 else None)),
            PutMessage(Message(i + 1, f"dflash#{i + 1}:{i + 1}", "dflash", i + 1, "post",
                               {"text": "dflash: crashed", "blocks": [{"type": "section"}]}, NOW - 3600 + i, attempts=1,
                               sent_at=NOW - 3599 + i, ts=f"{1000 + i}.000100", priority=3)),
            PutWatch(Watch(f"r{i}", "C0TEAM", f"{2000 + i}.000100", NOW - 60, "U0ALICE")),
        ]
    points = [("dflash", Point(t_of(i), Phase.TRAINING, 0, 100 + i, 10_000, 2.5 - i / 100, 14_000.0 + i, "tok/s", 0,
                               (RoleLoad("target", 0.9, 70.5), RoleLoad("drafter", 0.4, None))))
              for i in range(slots)]
    tallies = [(f"r{i}", Tally(0, NOW - 7200, NOW - 60, 1, 100 + i, 2.4, 2.3, 14_000.0 * 5, 5, "tok/s")) for i in range(slots)]
    store.apply(changes, points, tallies)
    store.close()


# Where each table's row of a slot is (its SQL, the parameter), and how the loaded memory names it.
WHERE = {
    "runs": ("run = ?", lambda i: f"r{i}", lambda i: f"r{i}"),
    "incidents": ("run = 'dflash' AND seq = ?", lambda i: i + 1, lambda i: ("dflash", i + 1)),
    "outbox": ("id = ?", lambda i: i + 1, lambda i: i + 1),
    "watches": ("run = ?", lambda i: f"r{i}", lambda i: f"r{i}"),
    "points": ("run = (SELECT id FROM point_runs WHERE run = 'dflash') AND t = ?", t_of, t_of),
    "tallies": ("run = (SELECT id FROM point_runs WHERE run = ?)", lambda i: f"r{i}", lambda i: f"r{i}"),
}

# The spoils: what a hand, another program or a newer minor might leave in a cell.
VALUES = {
    "text": "abc", "blob": b"\x00\xffrunbot", "null": None, "nan": math.nan,  # SQLite keeps a NaN as NULL
    "zero": 0, "neg": -1, "real": 1.5, "negreal": -1.5, "huge": 2**63 - 1, "tiny": -(2**63), "big": 1e308,
    "inf": math.inf, "-inf": -math.inf, "enum": "exploded", "long": "x" * (2 << 20),
    "badjson": "{", "deepjson": "[" * 100_000, "jsonlist": "[]", "jsonnull": "null",
}
# Per kind of column: the spoils that make the row unreadable, and those it still reads as.
KINDS = {
    "text": ({"blob", "long"}, {"text", "zero", "huge", "real"}),  # a TEXT column keeps a number as its digits
    # A count past 2**53 is no counter: it would overflow SQLite's integers once added to (a tally, a retry).
    "count": ({"text", "blob", "real", "neg", "inf", "big", "huge", "tiny", "negreal"}, {"zero", "999"}),
    "int": ({"text", "blob", "real", "inf", "big", "huge", "tiny"}, {"zero", "999", "neg"}),
    "clock": ({"text", "blob", "negreal", "neg", "inf", "-inf", "big", "huge", "tiny"}, {"zero", "real"}),
    "point_t": ({"text", "blob", "real", "neg", "inf", "big", "huge", "tiny"}, set()),
    "real": ({"text", "blob", "inf", "-inf", "big"}, {"zero", "negreal", "huge", "tiny"}),
    "level": ({"text", "blob", "neg", "huge", "real", "big"}, {"zero"}),
    "phase": ({"text", "blob", "neg", "real", "enum", "huge"}, {"zero", "999"}),  # 999: a newer runbot's phase
    "word": ({"text", "blob", "real"}, {"999", "huge"}),  # an id not among the words: no unit
    "concern": ({"blob", "long"}, {"enum", "huge"}),  # a worry a newer runbot named loads as the closest known
    "op": ({"enum", "blob", "text"}, set()),
    "gpus": ({"blob", "text", "zero", "huge", "real", "1:50:lots", "1:50:inf", "1:50:nan", "1:50:-1", "1:150:1", "1:2",
              "1:50:1:9", "x:50:1", "1:-5:1", "1:٥:1"}, {"1:50:", "999:50:1.5", ""}),
    "state": ({"blob", "text", "huge", "badjson", "deepjson", "jsonlist", "jsonnull", "long",
               '{"status": "exploded"}', '{"status": 1}', '{"seq": "3"}', '{"seq": -1}', '{"announced": 1}',
               '{"streaks": [["crashed", "x"]]}', '{"streaks": [["crashed"]]}', '{"streaks": "crashed"}',
               '{"flips": [1e308]}', '{"flips": 3}', '{"headline": 5}', '{"opened_at": "soon"}', '{"concern": 5}',
               '{"opened_at": NaN}', '{"muted_until": Infinity}', '{"bad": "yes"}'},
              {"{}", '{"status": "open", "from_a_newer_runbot": [1, 2]}', '{"concern": "no_such_worry:x"}'}),
    "payload": ({"blob", "text", "huge", "badjson", "deepjson", "jsonlist", "jsonnull", '{"text": 5}',
                 '{"blocks": "x"}', '{"text": ["a"]}'}, {"{}", '{"text": "hi", "blocks": null}'}),
}
NULLS = {"null", "nan"}


@dataclass(frozen=True)
class Column:
    table: str
    name: str
    kind: str
    null: str  # "kept", "skipped", or "refused": SQLite refuses NULL where the schema says NOT NULL (no file holds it)
    key: bool = False  # part of the row's key: a spoil it reads keeps the row under another key


COLUMNS = [
    Column("runs", "run", "text", "skipped", key=True),  # a TEXT PRIMARY KEY takes NULL (SQLite's old quirk)
    Column("runs", "state", "state", "refused"),
    Column("incidents", "run", "text", "refused", key=True), Column("incidents", "seq", "count", "refused", key=True),
    Column("incidents", "channel", "text", "refused"), Column("incidents", "parent_ts", "text", "kept"),
    Column("incidents", "opened_at", "clock", "refused"), Column("incidents", "concern", "concern", "kept"),
    Column("incidents", "closed_at", "clock", "kept"), Column("incidents", "digest", "count", "kept"),
    Column("outbox", "key", "text", "refused"), Column("outbox", "run", "text", "refused"), Column("outbox", "seq", "count", "refused"),
    Column("outbox", "op", "op", "refused"), Column("outbox", "payload", "payload", "refused"),
    Column("outbox", "created_at", "clock", "refused"), Column("outbox", "attempts", "count", "refused"),
    Column("outbox", "tried_at", "clock", "kept"), Column("outbox", "last_error", "text", "kept"),
    Column("outbox", "sent_at", "clock", "kept"), Column("outbox", "ts", "text", "kept"),
    Column("outbox", "priority", "int", "refused"), Column("outbox", "note", "text", "refused"),
    Column("watches", "run", "text", "skipped", key=True), Column("watches", "channel", "text", "refused"),
    Column("watches", "ts", "text", "refused"), Column("watches", "started_at", "clock", "refused"),
    Column("watches", "user", "text", "kept"),
    Column("points", "t", "point_t", "refused", key=True), Column("points", "segment", "count", "refused"),
    Column("points", "phase", "phase", "refused"), Column("points", "level", "level", "refused"),
    Column("points", "step", "count", "kept"), Column("points", "total", "count", "kept"), Column("points", "loss", "real", "kept"),
    Column("points", "rate", "real", "kept"), Column("points", "unit", "word", "kept"), Column("points", "gpus", "gpus", "kept"),
    Column("tallies", "segment", "count", "refused"), Column("tallies", "started", "clock", "refused"),
    Column("tallies", "last_t", "clock", "refused"), Column("tallies", "first_step", "count", "kept"),
    Column("tallies", "last_step", "count", "kept"), Column("tallies", "final_loss", "real", "kept"),
    Column("tallies", "best_loss", "real", "kept"), Column("tallies", "rate_sum", "real", "refused"),
    Column("tallies", "rate_n", "count", "refused"), Column("tallies", "unit", "text", "kept"),
]


@dataclass(frozen=True)
class Case:
    column: Column
    spoil: str
    kept: bool  # the row still reads (as something runbot could have written)

    @property
    def counted(self) -> bool:
        """Is the row read, and so counted when it cannot be? A point's time before every window is never read."""
        return not self.kept and not (self.column.name == "t" and self.spoil in ("neg", "tiny", "real"))

    @property
    def value(self):
        return VALUES.get(self.spoil, self.spoil)  # a spoil not named is the cell's text itself

    def __str__(self) -> str:
        return f"{self.column.table}.{self.column.name}={self.spoil[:24]}"


def cases() -> list[Case]:
    out = []
    for column in COLUMNS:
        bad, good = KINDS[column.kind]
        for spoil, kept in [*((s, False) for s in sorted(bad)), *((s, True) for s in sorted(good)),
                            *((s, column.null == "kept") for s in sorted(NULLS))]:
            if spoil in NULLS and column.null == "refused":
                continue  # no file holds it
            out.append(Case(column, spoil, kept))
    return out


CASES = cases()


def spoil(path: Path, *spoils: tuple[Case, int]) -> None:
    """Write each case's value into its slot's row, as a hand or another program may (CHECKs off: op IN (…))."""
    db = sqlite3.connect(path)
    db.execute("PRAGMA ignore_check_constraints = ON")
    for case, slot in spoils:
        where, key, _ = WHERE[case.column.table]
        db.execute(f"UPDATE {case.column.table} SET {case.column.name} = ? WHERE {where}", (case.value, key(slot)))
        assert db.execute("SELECT changes()").fetchone()[0] == 1, case
    db.commit()
    db.close()
    sound(path)


def sound(path: Path) -> None:
    """SQLite's own check passes the file: nothing but the CHECK on outbox.op, which it sees the spoil broke."""
    db = sqlite3.connect(path)
    assert {line for (line,) in db.execute("PRAGMA integrity_check")} <= {"ok", "CHECK constraint failed in outbox"}
    db.close()


def config(tmp: Path, state: Path, slots: int) -> Path:
    (tmp / "dflash.log").write_text("step=41 loss=2.25 tok/s=14100\nstep=42 loss=2.21 tok/s=14200\n")
    text = f'[bot]\nstate_db = "{state}"\nalert_channel = "C0ALERTS"\n[defaults]\ngpu_samples = 1\n'
    for name in ["dflash", *(f"r{i}" for i in range(slots))]:
        text += f'[runs.{name}]\nhost = "local"\nlog = "{tmp / "dflash.log"}"\n'
    path = tmp / "runs.toml"
    path.write_text(text)
    return path


def keys(sf: StateFile, memory) -> dict[str, set]:
    """What a started bot remembers, table by table, named as WHERE names a slot."""
    ledger = sf.ledger
    return {"runs": set(ledger.states), "incidents": set(ledger.incidents),
            "outbox": set(ledger.messages), "watches": set(ledger.watch_rows),
            "points": {int(p.t) for p in memory.recent("dflash")},
            "tallies": {run for run in (f"r{i}" for i in range(64)) if memory.tally(run) is not None}}


def expect_skipped(found: dict[str, set], whole: dict[str, set], case: Case, slot: int) -> None:
    table = case.column.table
    for other in TABLES:
        if other == table and not case.kept:
            assert found[table] == whole[table] - {WHERE[table][2](slot)}, case  # that row, and only it
        elif other == table and case.column.key:
            assert len(found[table]) == len(whole[table]), case  # read, under the key the spoil gave it
        else:
            assert found[other] == whole[other], (case, other)


@pytest.fixture(scope="module")
def two_slots(tmp_path_factory) -> tuple[Path, dict[str, set]]:
    """A sound file of two rows a table, and what a bot started on it remembers."""
    folder = tmp_path_factory.mktemp("template")
    path = folder / "state.sqlite3"
    build(path, 2)
    registry = load_registry(config(folder, path, 2))
    sf = StateFile.open(path)
    whole = keys(sf, Watchdog(registry, Targets(registry), sf, FakeChat()).probes.history)
    sf.close()
    assert all(len(v) == 2 for v in whole.values()), whole
    return path, whole


def test_the_table_covers_every_column_of_every_table_the_bot_loads():
    from bot.core import state_rows  # noqa: PLC0415
    from bot.service.store import columns  # noqa: PLC0415

    spoiled = {(c.table, c.name) for c in COLUMNS}
    skipped = {("outbox", "id"), ("points", "run"), ("tallies", "run")}  # integer keys: SQLite refuses anything else
    assert spoiled | skipped == {(t, c) for t in TABLES for c in columns()[t]}
    assert set(state_rows.STATE_FIELDS) == {f.name for f in fields(RunState)}  # every field of a run's state is checked
    assert len(CASES) > 250


@pytest.mark.parametrize("case", CASES, ids=str)
async def test_one_spoiled_cell_costs_its_row_and_nothing_else(tmp_path, two_slots, case):
    template, whole = two_slots
    state = tmp_path / "state.sqlite3"
    shutil.copy(template, state)
    registry = load_registry(config(tmp_path, state, 2))
    spoil(state, (case, 0))

    # serve's start: the state file, the runs' memory and the watchdog, which says what it skipped in the channel
    sf = StateFile.open(state)
    chat = FakeChat()
    wd = Watchdog(registry, Targets(registry), sf, chat)
    await wd.settled(timeout=5)
    expect_skipped(keys(sf, wd.probes.history), whole, case, 0)
    table = case.column.table
    assert dict(sf.unreadable) == ({table: 1} if case.counted else {}), case
    said = [p["text"] for p in chat.posts if "it cannot read" in p["text"]]
    assert said == ([] if not case.counted else [f":warning: runbot's state file {state} holds 1 row ({table} 1) it cannot read "
                                          "(values runbot never writes: edited by hand, or by another program?); they "
                                          "were skipped and the rest loaded. An incident among them may be posted again"])
    sf.ledger.commit("r1", RunState(Status.QUIET))  # and the file still takes writes
    assert await sf.flush() and sf.healthy

    # /run history, from that memory
    services = types.SimpleNamespace(history=wd.probes.history, store=sf, clock=time.time)
    req = CommandRequest("U0ALICE", "C0TEAM", ["dflash"], False, registry, services)  # type: ignore[arg-type]
    answer = (await history_handler.history(req)).payload()
    assert answer["text"].startswith("dflash: "), answer
    sf.close()



def combined(path: Path) -> Counter:
    """Every case at once, each in its own slot of its table: the rows that must be skipped, by table."""
    slot: Counter = Counter()
    spoils = []
    for case in CASES:
        spoils.append((case, slot[case.column.table]))
        slot[case.column.table] += 1
    spoil(path, *spoils)
    return Counter({table: sum(c.counted for c in CASES if c.column.table == table) for table in TABLES})


SLOTS = max(Counter(c.column.table for c in CASES).values())


def skipped_in(log: str) -> Counter:
    """What the "skipped N rows (table k, …)" lines of a log add up to."""
    found: Counter = Counter()
    for words in re.findall(r"skipped \d+ rows? \(([^)]*)\) it could not read", log):
        found.update({table: int(n) for table, n in (w.split() for w in words.split(", "))})
    return found


def test_a_file_spoiled_in_every_way_at_once_serves_answers_and_charts(tmp_path, slack, monkeypatch, capsys):
    state = tmp_path / "state.sqlite3"
    build(state, SLOTS)
    bad = combined(state)
    config(tmp_path, state, 0)  # dflash alone: serve forgets the other runs' tallies before reading them (the CLI does not)
    with writer_holding(tmp_path / "dflash.log"):  # the run's training process
        check_everything_serves(tmp_path, slack, state, bad, monkeypatch, capsys)


def check_everything_serves(tmp_path: Path, slack, state: Path, bad: Counter, monkeypatch, capsys) -> None:

    # runbot status with the state file: the answer, and the rows it read around said on stderr
    runs = str(tmp_path / "runs.toml")
    monkeypatch.setenv("RUNBOT_STATE_DB", str(state))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--config", runs, "status", "dflash"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("step 42 · 14.2K tok/s"), out
    assert skipped_in(out.err) == bad, out.err
    monkeypatch.delenv("RUNBOT_STATE_DB")

    # runbot plot, each metric: the points that read, the bad ones said
    points = SLOTS - sum(not c.kept for c in CASES if c.column.table == "points")
    for metric in ("loss", "rate", "gpus"):
        assert cli.main(["--config", runs, "plot", "dflash", "--metric", metric, "-o", f"{metric}.png"]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"wrote {metric}.png ({points + 1} points, since 6h ago; skipped "), out  # + status's
        a_readable_png((tmp_path / f"{metric}.png").read_bytes())

    # runbot serve: starts, says it in the alert channel and its ready line, answers /run status, history and plot
    bad = bad - Counter({"tallies": bad["tallies"]})
    said = f"holds {sum(bad.values())} rows ({', '.join(f'{t} {n}' for t, n in sorted(bad.items()))}) it cannot read"
    (tmp_path / "bin").mkdir()
    port = free_port()
    proc = start_serve(tmp_path, serve_env(tmp_path, slack, port, RUNBOT_STATE_DB=str(state)))
    try:
        slack.wait_for(lambda: healthy(port) or proc.poll() is not None, timeout=30)
        assert proc.poll() is None, proc.communicate()
        note = slack.wait_for(lambda: [p for p in slack.posts("chat.postMessage") if "it cannot read" in p["text"]], 20)
        assert note[0]["channel"] == "C0ALERTS" and said in note[0]["text"], note
        url = f"http://127.0.0.1:{port}/slack/events"
        for n, text in enumerate(("status dflash", "history dflash", "plot dflash rate")):
            body = slash_body(text, response_url=slack.response_url(f"ask{n}"))
            assert post(url, body, sign(body))[0] == 200
        answers = [slack.wait_for(lambda n=n: slack.responses_to(f"ask{n}"), 30)[0]["text"] for n in range(3)]
        assert answers[0].startswith("dflash: step 42") and answers[1].startswith("dflash: "), answers
        charted = re.search(r"posted dflash's rate chart \(last 6 h, (\d+) points\)", answers[2])
        assert charted and int(charted[1]) >= points + 1, answers  # and the probes serve made meanwhile
        a_readable_png(slack.files[0]["content"])
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err, err
    ready = next(json.loads(line) for line in err.splitlines() if '"event": "ready"' in line)
    assert ready["unreadable_rows"] == dict(bad) and ready["state_fault"] is None
