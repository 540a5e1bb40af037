"""Two replicas, one leader: a PostgreSQL advisory lock on a session of its own decides who sweeps and posts; the
standby takes over when the leader's session ends, from what the leader wrote, in the same threads."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time

import psycopg

from bot.core.alerts import Status
from bot.probe.targets import Targets
from bot.service.leadership import AdvisoryLock, Replica, Role, Solo, leadership_for
from bot.service.state_file import StateFile
from bot.service.watchdog import Watchdog
from config.registry import parse_registry
from tests.standins import set_age, writer_holding
from tests.test_watchdog import CONFIG, STEPS, FakeChat


async def test_one_lock_one_leader_and_the_standby_takes_over_when_it_is_given_back(pg_server):
    url = pg_server.database()
    first, second = AdvisoryLock(url, name="a:1"), AdvisoryLock(url, name="b:2")
    try:
        assert await first.check() is Role.LEADER
        assert await second.check() is Role.STANDBY
        assert await first.check() is Role.LEADER  # still: its session lives
        assert sorted(await first.replicas(), key=lambda r: r.name) == [Replica("a:1", True), Replica("b:2", False)]
        first.close()  # a replica stopping gives the lock back with its session
        assert await second.check() is Role.LEADER
    finally:
        first.close()
        second.close()


def _cut(url: str, name: str) -> None:
    """The server cuts a replica's lock session (a failover, an admin, a network), and it is gone when this returns."""
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", (f"runbot {name}",))
        deadline = time.monotonic() + 10
        while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                            (f"runbot {name}",)).fetchone()[0]:
            assert time.monotonic() < deadline, "the cut session outlived its termination"
            time.sleep(0.02)


async def test_a_leader_whose_session_was_cut_stands_by_when_another_took_the_lock(pg_server):
    url = pg_server.database()
    StateFile.open(url).close()  # the schema, as runbot serve makes it before it leads
    leader, standby = AdvisoryLock(url, name="a:1"), AdvisoryLock(url, name="b:2")
    try:
        assert await leader.check() is Role.LEADER
        _cut(url, "a:1")
        assert await standby.check() is Role.LEADER and standby.retaken
        assert not await leader.still_leads()  # before its next message: the lock is another's
        assert leader.role is Role.STANDBY
    finally:
        leader.close()
        standby.close()


async def test_a_lock_taken_back_inside_a_sweep_holds_its_messages_until_the_tick_reconciles(pg_server):
    url = pg_server.database()
    StateFile.open(url).close()
    leader, other = AdvisoryLock(url, name="a:1"), AdvisoryLock(url, name="b:2")
    try:
        assert await leader.check() is Role.LEADER and leader.needs_reload()
        _cut(url, "a:1")
        assert await other.check() is Role.LEADER  # b leads a while (it may post), then stops
        other.close()
        assert not await leader.still_leads()  # a takes the lock back mid-sweep: its memory may be stale, so no post
        assert leader.role is Role.LEADER and leader.needs_reload()  # and its next tick reads the ledger afresh
        assert await leader.still_leads()
    finally:
        leader.close()
        other.close()


async def test_a_leader_that_takes_its_lock_back_knows_whether_another_led_in_between(pg_server):
    url = pg_server.database()
    StateFile.open(url).close()
    leader, other = AdvisoryLock(url, name="a:1"), AdvisoryLock(url, name="b:2")
    try:
        assert await leader.check() is Role.LEADER and not leader.continued
        assert leader.needs_reload()  # its first lead: the watchdog reads the ledger (and the news is taken)
        _cut(url, "a:1")
        assert await leader.check() is Role.LEADER and leader.retaken and leader.continued  # nobody did: its memory holds
        assert not leader.needs_reload()
        _cut(url, "a:1")
        assert await other.check() is Role.LEADER
        other.close()
        assert await leader.check() is Role.LEADER and leader.retaken and not leader.continued  # b led: read afresh
        assert leader.needs_reload() and not leader.needs_reload()  # told once
    finally:
        leader.close()
        other.close()


async def test_a_leader_killed_with_sigkill_frees_the_lock_at_once(pg_server):
    url = pg_server.database()
    child = textwrap.dedent(f"""
        import asyncio, time
        from bot.service.leadership import AdvisoryLock, Role
        lock = AdvisoryLock({url!r}, name="killed:1")
        assert asyncio.run(lock.check()) is Role.LEADER
        print("leading", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    standby = AdvisoryLock(url, name="b:2")
    try:
        assert proc.stdout.readline().strip() == "leading"
        assert await standby.check() is Role.STANDBY
        proc.kill()
        proc.wait()
        took = time.monotonic()
        while await standby.check() is not Role.LEADER:
            assert time.monotonic() - took < 5, "the killed leader's lock outlived its process"
            await asyncio.sleep(0.1)
    finally:
        proc.kill()
        standby.close()


def test_an_sqlite_bot_leads_alone(tmp_path):
    assert isinstance(leadership_for(str(tmp_path / "state.sqlite3")), Solo)
    assert isinstance(leadership_for("postgresql://runbot@127.0.0.1:9/x"), AdvisoryLock)


async def test_the_standby_takes_over_mid_incident_and_tells_the_recovery_in_the_same_thread(pg_server, tmp_path):
    url = pg_server.database()
    config = tmp_path / "runs.toml"
    config.write_text(CONFIG.format(timeout="5s"))
    registry = parse_registry(config.read_text(), config)
    chat = FakeChat()  # one Slack workspace, seen by both replicas

    def replica(name: str) -> Watchdog:
        wd = Watchdog(registry, Targets(registry), StateFile.open(url), chat)
        wd.leadership = AdvisoryLock(url, name=name)
        return wd

    for name in ("alpha", "beta"):
        (tmp_path / f"{name}.log").write_text(STEPS)
    first, second = replica("first:1"), replica("second:2")
    alpha = tmp_path / "alpha.log"
    try:
        with writer_holding(alpha), writer_holding(tmp_path / "beta.log"):
            assert await first.tick() is Role.LEADER
            assert await second.tick() is Role.STANDBY
            set_age(alpha, 60)  # alpha goes silent: the leader opens an incident
            await first.tick()
            await second.tick()  # the standby sweeps nothing and posts nothing
            [parent] = chat.parents()
            assert parent["text"].startswith("alpha: silent") and len(chat.posts) == 1
            first.leadership.close()  # the leader's session ends (its process killed): no stop(), no last flush
            with alpha.open("a") as f:
                f.write("".join(f"step={i} loss=1.9 tok/s=14100\n" for i in range(6, 9)))
            assert await second.tick() is Role.LEADER  # took over: reads the incident the leader wrote
            # took the incident and its thread over (a first healthy look: recovering, not yet told)
            assert second.states["alpha"].status is Status.RECOVERING
            assert second.ledger.thread("alpha", second.states["alpha"].seq)[1] == parent["ts"]
            with alpha.open("a") as f:
                f.write("".join(f"step={i} loss=1.9 tok/s=14100\n" for i in range(9, 12)))
            await second.tick()
        assert len(chat.parents()) == 1  # no alert posted twice
        assert "recovered after" in chat.thread(parent["ts"])[-1]
    finally:
        for wd in (first, second):
            wd.leadership.close()
            wd.state_file.close()


async def test_a_standby_changes_no_state_and_says_so(pg_server, tmp_path):
    from bot.service.leadership import StandingBy

    url = pg_server.database()
    config = tmp_path / "runs.toml"
    config.write_text(CONFIG.format(timeout="5s"))
    registry = parse_registry(config.read_text(), config)
    leader, standby = (Watchdog(registry, Targets(registry), StateFile.open(url), FakeChat()) for _ in range(2))
    leader.leadership, standby.leadership = AdvisoryLock(url, name="a:1"), AdvisoryLock(url, name="b:2")
    try:
        assert await leader.leadership.check() is Role.LEADER and await standby.leadership.check() is Role.STANDBY
        run = registry.runs["alpha"]
        for ask in (standby.mute(run, time.time() + 60, "U1"), standby.watch(run, "C1", "U1")):
            try:
                await ask
            except StandingBy as exc:
                assert "stands by" in str(exc)
            else:
                raise AssertionError("a standby changed the shared state")
        assert standby.ledger.take_changes() == [] and standby.chat.posts == []
        assert (await leader.mute(run, time.time() + 60, "U1")).muted_until is not None
    finally:
        for wd in (leader, standby):
            wd.leadership.close()
            wd.state_file.close()


async def test_doctor_says_how_many_replicas_it_sees_and_which_leads(pg_server):
    from bot.service.doctor import state_checks

    url = pg_server.database()
    assert [c.detail for c in await state_checks(url)][1] == "0 replicas connected; none leads (no runbot serve is running)"
    first, second = AdvisoryLock(url, name="host-a:11"), AdvisoryLock(url, name="host-b:22")
    try:
        await first.check()
        await second.check()
        [reachable, replicas] = await state_checks(url)
        assert reachable.ok and replicas.detail == "2 replicas connected; host-a:11 leads"
    finally:
        first.close()
        second.close()
    [down] = await state_checks("postgresql://runbot:secret@127.0.0.1:9/x")
    assert not down.ok and "secret" not in down.detail
