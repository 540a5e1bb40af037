"""The one probe scheduler: caps applied once (per host, then overall), a person served before a sweep, shared
probes for concurrent questions, a bounded wait for a turn, and every probe added to the runs' memory."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from bot.core.verdict import Phase
from bot.probe.runners import RunResult
from bot.probe.scheduler import FairGate, Priority, Scheduler, batches
from config.registry import parse_registry

CONFIG = """
[bot]
probe_timeout = "{timeout}"

[hosts.pve1]
address = "10.1.2.6"
max_channels = 3

[defaults]
gpu_samples = 1
"""


def registry(tmp_path: Path, ssh_runs: int = 6, local_runs: int = 0, timeout: str = "5s"):
    text = CONFIG.format(timeout=timeout)
    text += "".join(f'[runs.s{i}]\nhost = "pve1"\ncontainer = {200 + i}\nlog = "/l{i}.log"\n' for i in range(ssh_runs))
    text += "".join(f'[runs.l{i}]\nhost = "local"\nlog = "/l{i}.log"\n' for i in range(local_runs))
    path = tmp_path / "runs.toml"
    path.write_text(text)
    return parse_registry(text, path)


class Targets:
    """Runners that take `delay` seconds and record who ran when, and how many at once."""

    def __init__(self, delay: float = 0.05) -> None:
        self.delay, self.started, self.active, self.peak, self.peak_by_host = delay, [], 0, 0, {}
        self._by_host: dict[str, int] = {}

    def runner_for(self, run):
        targets = self

        class Runner:
            async def run(self, script, *, timeout, limit=None):
                targets.started.append(run.name)
                targets.active += 1
                targets._by_host[run.host] = targets._by_host.get(run.host, 0) + 1
                targets.peak = max(targets.peak, targets.active)
                targets.peak_by_host[run.host] = max(targets.peak_by_host.get(run.host, 0), targets._by_host[run.host])
                try:
                    await asyncio.sleep(targets.delay)
                    return RunResult(failure="stand-in host", failure_kind="unreachable")
                finally:
                    targets.active -= 1
                    targets._by_host[run.host] -= 1

        return Runner()


async def test_a_gate_serves_a_person_before_a_sweep_then_in_arrival_order():
    gate = FairGate(1)
    await gate.acquire(Priority.SWEEP)
    order = []

    async def wait(name, priority):
        await gate.acquire(priority)
        order.append(name)
        gate.release()

    tasks = [asyncio.create_task(wait(n, p)) for n, p in
             (("sweep-1", Priority.SWEEP), ("sweep-2", Priority.SWEEP), ("ask-1", Priority.ASK), ("ask-2", Priority.ASK))]
    await asyncio.sleep(0)
    assert gate.queued == 4 and gate.busy == 1
    gate.release()
    await asyncio.gather(*tasks)
    assert order == ["ask-1", "ask-2", "sweep-1", "sweep-2"]
    assert gate.busy == 0 and gate.queued == 0


async def test_a_waiter_that_gives_up_leaves_its_slot_to_the_next():
    gate = FairGate(1)
    await gate.acquire(Priority.ASK)
    quitter = asyncio.create_task(gate.acquire(Priority.ASK))
    stayer = asyncio.create_task(gate.acquire(Priority.SWEEP))
    await asyncio.sleep(0)
    gate.release()  # handed to the quitter...
    quitter.cancel()  # ...which gives up in the same moment: the slot must go on, not vanish
    await asyncio.wait_for(stayer, 1)
    assert gate.busy == 1
    gate.release()
    assert gate.busy == 0


@pytest.mark.parametrize("priority, pve1, local, overall", [
    (Priority.ASK, 3, 4, 5),  # people may use every slot: pve1's max_channels, the local cap, the overall cap
    (Priority.SWEEP, 2, 3, 3),  # a sweep leaves one slot of each host, and two overall, for them
])
async def test_caps_are_applied_per_host_and_overall(tmp_path, priority, pve1, local, overall):
    reg = registry(tmp_path, ssh_runs=10, local_runs=10)
    targets = Targets()
    scheduler = Scheduler(reg, targets, probes_at_once=5, local_probes=4)
    await asyncio.gather(*(scheduler.check(run, priority=priority) for run in reg.runs.values()))
    assert len(targets.started) == 20
    assert targets.peak_by_host["pve1"] == pve1 and 2 <= targets.peak_by_host["local"] <= local
    assert targets.peak == overall  # never more in all (and the caps were reached: the gates do not under-serve)


async def test_a_sweep_filling_a_host_leaves_a_slot_for_a_question(tmp_path):
    reg = registry(tmp_path, ssh_runs=30)
    targets = Targets(delay=0.5)
    scheduler = Scheduler(reg, targets)
    runs = list(reg.runs.values())
    sweep = [asyncio.create_task(scheduler.check(r, priority=Priority.SWEEP)) for r in runs[:-1]]
    await asyncio.sleep(0.05)
    started = asyncio.get_running_loop().time()
    await scheduler.check(runs[-1])
    assert asyncio.get_running_loop().time() - started < 0.7  # its own probe's time, no sweep probe's before it
    for task in sweep:
        task.cancel()
    await asyncio.gather(*sweep, return_exceptions=True)


async def test_a_question_during_a_sweep_is_probed_next(tmp_path):
    reg = registry(tmp_path, ssh_runs=30)
    targets = Targets(delay=0.02)
    scheduler = Scheduler(reg, targets)
    runs = list(reg.runs.values())
    sweep = [asyncio.create_task(scheduler.check(r, priority=Priority.SWEEP)) for r in runs[:-1]]
    await asyncio.sleep(0.01)  # the sweep holds pve1's 3 channels, 26 more wait
    answer = await scheduler.check(runs[-1])
    position = targets.started.index(runs[-1].name)
    assert position <= 3 + 3, targets.started  # right after the probes already running (at most one round)
    assert answer.phase is Phase.UNREACHABLE and "stand-in host" in answer.headline
    await asyncio.gather(*sweep)


async def test_people_asking_about_one_run_share_its_probe_but_a_sweep_gets_its_own(tmp_path):
    reg = registry(tmp_path, ssh_runs=1)
    targets = Targets(delay=0.05)
    scheduler = Scheduler(reg, targets)
    run = reg.runs["s0"]
    answers = await asyncio.gather(*(scheduler.check(run) for _ in range(20)))
    assert len(targets.started) == 1 and len({id(a) for a in answers}) == 1
    await scheduler.check(run)  # fresh: answered from the last probe
    assert len(targets.started) == 1
    await scheduler.check(run, previous=answers[0], priority=Priority.SWEEP)
    assert len(targets.started) == 2


async def test_a_question_that_cannot_get_a_turn_says_runbot_is_busy(tmp_path):
    reg = registry(tmp_path, ssh_runs=4)
    targets = Targets(delay=0.5)
    scheduler = Scheduler(reg, targets)
    runs = list(reg.runs.values())
    hogs = [asyncio.create_task(scheduler.check(r)) for r in runs[:3]]  # three people take pve1's three channels
    await asyncio.sleep(0.01)
    answer = await scheduler.check(runs[3], wait=0.1)
    assert answer.phase is Phase.UNREACHABLE and answer.failure_kind == "busy"
    assert answer.headline == "not probed: runbot waited 0 s for a turn (3 probes running on pve1, 0 waiting)"
    listed = await scheduler.check(runs[3], wait=math.inf)  # a list of every run waits for each
    assert listed.failure_kind == "unreachable"
    await asyncio.gather(*hogs)


async def test_every_probe_is_added_to_the_runs_memory(tmp_path):
    reg = registry(tmp_path, ssh_runs=2)

    class Memory:
        def __init__(self):
            self.recorded = []

        def recent(self, run):
            return ()

        def learned(self, run):
            return None

        def record(self, run, verdict):
            self.recorded.append(run)

    memory = Memory()
    scheduler = Scheduler(reg, Targets(), history=memory)
    await scheduler.check(reg.runs["s0"])
    await scheduler.check(reg.runs["s1"], priority=Priority.SWEEP)
    assert memory.recorded == ["s0", "s1"]


@pytest.mark.parametrize("module", ["bot/service/app.py", "bot/service/watchdog.py", "bot/cli.py", "handlers/commands.py"])
def test_no_other_module_caps_probes_itself(module):
    # One scheduler: the caps live in bot/probe/scheduler.py, not again in each caller.
    text = (Path(__file__).resolve().parents[1] / module).read_text()
    assert "Semaphore(" not in text.replace("Semaphore(CHAT_CONCURRENCY)", ""), module


async def test_serve_wires_one_scheduler_for_commands_and_the_watchdog(tmp_path):
    from bot.service.app import make_services
    from bot.service.state_file import StateFile
    from bot.service.watchdog import on_start, on_stop
    from config.settings import Settings

    services = make_services(registry(tmp_path, ssh_runs=1), Settings(_env_file=None))
    services.store = StateFile.open(tmp_path / "state.sqlite3")
    await on_start(services)
    try:
        assert services.watchdog.probes is services.scheduler
        assert services.watchdog.history is services.history is services.scheduler.history is not None
    finally:
        await on_stop(services)


def test_runs_are_batched_by_their_container_in_order(tmp_path):
    reg = registry(tmp_path, ssh_runs=3, local_runs=3)
    text = (tmp_path / "runs.toml").read_text() + '[runs.t0]\nhost = "pve1"\ncontainer = 200\nlog = "/t.log"\n'
    reg = parse_registry(text, tmp_path / "runs.toml")
    got = [[r.name for r in b] for b in batches(reg.runs.values())]
    assert got == [["s0", "t0"], ["s1"], ["s2"], ["l0", "l1", "l2"]]
    assert [len(b) for b in batches(list(reg.runs.values()) * 10, most=16)][:2] == [16, 4]  # s0,t0 x10 = 20


async def test_a_container_that_does_not_answer_holds_up_only_its_own_batch(tmp_path):
    reg = registry(tmp_path, ssh_runs=3)

    class Targets2(Targets):
        def runner_for(self, run):
            inner = super().runner_for(run)

            class Runner:
                async def run(self, script, *, timeout, limit=None):
                    if run.container == 201:
                        await asyncio.sleep(3600)
                    return await inner.run(script, timeout=timeout)

            return Runner()

    scheduler = Scheduler(reg, Targets2())
    runs = list(reg.runs.values())
    stuck = asyncio.create_task(scheduler.check_group([runs[1]], {}))
    answers = await asyncio.wait_for(asyncio.gather(scheduler.check_group([runs[0]], {}),
                                                    scheduler.check_group([runs[2]], {})), 2)
    assert all(a[0].phase is Phase.UNREACHABLE and "stand-in host" in a[0].headline for a in answers)
    stuck.cancel()


async def test_every_probe_starts_from_the_format_the_runs_memory_learned(tmp_path, monkeypatch):
    # A person's question, a sweep's look and a group's look alike: what the run's log taught earlier looks
    # (bot.core.learned) is passed to the probe's parse.
    from bot.core.learned import Learned
    from bot.probe import scheduler as module

    taught = {"s0": Learned(inode=1, size=10), "l0": Learned(inode=2, size=20), "l1": Learned(inode=3, size=30)}
    seen: list = []
    single, group = module.check_within, module.check_group_within

    async def spy_one(run, runner_for, **kw):
        seen.append({run.name: kw["learned"]})
        return await single(run, runner_for, **kw)

    async def spy_group(runs, runner_for, **kw):
        seen.append(dict(kw["learned"]))
        return await group(runs, runner_for, **kw)

    monkeypatch.setattr(module, "check_within", spy_one)
    monkeypatch.setattr(module, "check_group_within", spy_group)

    class Memory:
        def recent(self, run):
            return ()

        def learned(self, run):
            return taught.get(run)

        def record(self, run, verdict):
            pass

    reg = registry(tmp_path, ssh_runs=1, local_runs=2)
    scheduler = Scheduler(reg, Targets(), history=Memory())
    await scheduler.check(reg.runs["s0"])
    await scheduler.check_group([reg.runs["l0"], reg.runs["l1"]], {})
    assert seen == [{"s0": taught["s0"]}, {"l0": taught["l0"], "l1": taught["l1"]}]
