"""People first (issue 21 #1): a question's parse never waits behind a sweep's, and a sweep that overruns
check_every is cut into the next one, its runs not reached first in line, never two sweeps at once."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from pathlib import Path

import pytest

import bot.probe.checkup as checkup
from bot.probe.scheduler import Priority, Scheduler
from bot.probe.targets import Targets
from bot.service.state_file import StateFile
from bot.service.watchdog import Watchdog
from config.registry import parse_registry
from tests.standins import writer_holding
from tests.test_watchdog import FakeChat

PARSE_CPU_S = 0.03  # what one run's parse costs here, made sure of (a real one is 10-30 ms)


def local_runs(tmp_path: Path, n: int, extra: str = "") -> object:
    text = f'[bot]\nalert_channel = "#a"\n{extra}[defaults]\ngpu_samples = 1\nsilence_after = "5m"\n'
    for i in range(n):
        log = tmp_path / f"r{i:02d}.log"
        log.write_text("".join(f"step={k} loss=2.0 tok/s=10\n" for k in range(1, 30)))
        text += f'[runs.r{i:02d}]\nhost = "local"\nlog = "{log}"\n'
    config = tmp_path / "runs.toml"
    config.write_text(text)
    return parse_registry(text, config)


@pytest.fixture
def timed_parses(monkeypatch):
    """Each run's diagnosis made to cost PARSE_CPU_S of CPU (Python, holding the GIL as a real parse does), and
    recorded: (run, start, end) on the monotonic clock."""
    real, seen, lock = checkup.diagnose, [], threading.Lock()

    def diagnose(evidence, run, **kw):
        start = time.monotonic()
        cpu = time.thread_time()
        while time.thread_time() - cpu < PARSE_CPU_S:
            pass
        verdict = real(evidence, run, **kw)
        with lock:
            seen.append((run.name, start, time.monotonic()))
        return verdict

    monkeypatch.setattr(checkup, "diagnose", diagnose)
    return seen


async def test_a_question_is_parsed_before_the_sweeps_remaining_work(tmp_path, timed_parses):
    registry = local_runs(tmp_path, 33)
    scheduler = Scheduler(registry, Targets(registry))
    runs = list(registry.runs.values())
    sweep = asyncio.gather(*(scheduler.check_group(runs[i:i + 16], {}, priority=Priority.SWEEP) for i in (0, 16)))
    while not timed_parses:  # a sweep probe is back and the 32 parses (~1 s of CPU) have begun
        await asyncio.sleep(0.005)
    answer = await scheduler.check(runs[32], priority=Priority.ASK)
    asked = next((start, end) for name, start, end in timed_parses if name == runs[32].name)
    verdicts = [v for group in await sweep for v in group]
    assert answer.run == runs[32].name and all(v.reached for v in verdicts)
    swept = [(start, end) for name, start, end in timed_parses if name != runs[32].name]
    assert len(swept) == 32
    # The question's parse ran alone: no sweep parse shared the CPU with it (a second thread would have).
    assert not [s for s in swept if s[0] < asked[1] and asked[0] < s[1]], (asked, swept)
    # ... and ahead of the sweep's remaining work, which was still to do when it was answered.
    assert sum(1 for start, _ in swept if start >= asked[1]) >= 4


class SlowHost:
    """A stand-in runner: every probe takes `delay` seconds and finds the run's host away; who started, in order."""

    def __init__(self, delay: float) -> None:
        self.delay, self.started = delay, []

    def runner_for(self, run):
        outer = self

        class Runner:
            async def run(self, script, *, timeout, limit=None):
                outer.started.append(run.name)
                await asyncio.sleep(outer.delay)
                return checkup.RunResult(failure="stand-in host", failure_kind="unreachable")

        return Runner()


def overrun_watchdog(tmp_path: Path, delay: float) -> tuple[Watchdog, SlowHost]:
    registry = local_runs(tmp_path, 4, extra='check_every = "10s"\n')
    targets = SlowHost(delay)
    # Two local slots, one kept for people: the sweep probes one run at a time, 4 x 0.4 s > its 0.5 s.
    scheduler = Scheduler(registry, targets, local_probes=2)
    scheduler.group_max = 1
    return Watchdog(registry, targets, StateFile.open(tmp_path / "state.sqlite3"), FakeChat(), scheduler=scheduler), targets


async def test_an_overrunning_sweep_is_cut_and_its_rest_goes_first_next_time(tmp_path):
    wd, targets = overrun_watchdog(tmp_path, 0.4)
    first = await wd.sweep(wait=0.5)
    # r00 probed, r01 under way at the cut, r02 and r03 never started: carried, not queued behind the next sweep.
    assert targets.started == ["r00", "r01"] and first.carried == 2 and first.probed == 2
    second = await wd.sweep(wait=2.0)
    assert second.still_running == ("r01",)  # its probe from the sweep before is still out: not asked twice
    assert targets.started[2:4] == ["r02", "r03"], targets.started  # the carry-over first in line
    assert targets.started[4:] == ["r00"] and second.carried == 0
    await wd.stop()


async def test_no_two_sweeps_at_once(tmp_path):
    wd, targets = overrun_watchdog(tmp_path, 0.2)
    running = asyncio.create_task(wd.sweep())
    await asyncio.sleep(0.05)
    meanwhile = await wd.sweep()
    assert meanwhile.skipped and meanwhile.probed == 0 and targets.started == ["r00"]
    done = await running
    assert done.probed == 4 and sorted(targets.started) == ["r00", "r01", "r02", "r03"]  # each once
    await wd.stop()


async def test_a_sweep_holds_no_host_slot_it_cannot_probe_with(tmp_path):
    """A sweep's probe waiting for an overall turn holds no host slot meanwhile (500 local runs: 15 of the 16 local
    slots were held, 9 of them only waiting, and 50 questions went through the one left): people asking about that
    host find its other slots free."""
    from tests.test_scheduler import Targets as StandIns, registry as standin_registry

    reg = standin_registry(tmp_path, ssh_runs=0, local_runs=20)
    targets = StandIns(delay=0.3)
    scheduler = Scheduler(reg, targets, probes_at_once=4, local_probes=8)  # a sweep: 2 overall, 2 kept for people
    runs = list(reg.runs.values())
    sweep = [asyncio.create_task(scheduler.check(r, priority=Priority.SWEEP)) for r in runs[:14]]
    await asyncio.sleep(0.05)
    local = scheduler.hosts["local"]
    assert local.busy == 2 and targets.active == 2  # held only by the probes running
    asked = [asyncio.create_task(scheduler.check(r)) for r in runs[14:]]
    await asyncio.sleep(0.05)
    assert targets.active == 4  # two questions at once, at once (the overall slots kept for people)
    await asyncio.gather(*asked)
    # ... and the rest as the sweep's running probes end: every question before the sweep's next probe.
    assert all(targets.started.index(r.name) < targets.started.index(runs[2].name) for r in runs[14:]), targets.started
    for task in sweep:
        task.cancel()
    await asyncio.gather(*sweep, return_exceptions=True)


async def test_a_question_about_a_run_puts_it_on_every_sweep_but_a_list_of_every_run_does_not(tmp_path):
    from tests.test_scheduler import Targets as StandIns, registry as standin_registry

    reg = standin_registry(tmp_path, ssh_runs=0, local_runs=2)
    scheduler = Scheduler(reg, StandIns(delay=0.0))
    one, other = reg.runs.values()
    await scheduler.check(one)  # /run status one
    await scheduler.check(other, wait=math.inf)  # /run runs: every run, however long
    assert scheduler.asked_lately(one.name) and not scheduler.asked_lately(other.name)
