"""One pass per box (issue 21 #3): a sweep probes the runs of one place — a CT, or a host itself, this machine
included — with one bash (one /proc scan, one GPU read), in batches of at most GROUP_MAX runs, and each
run's verdict is the one it gets when probed alone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bot.probe.runners import LocalRunner
from bot.probe.scheduler import GROUP_MAX, Priority, Scheduler
from bot.probe.targets import Targets
from bot.service.state_file import StateFile
from bot.service.watchdog import Watchdog
from config.registry import parse_registry
from tests.standins import fake_nvidia_smi, path_with, set_age, writer_holding
from tests.test_watchdog import FakeChat

GPU = "0, 70000, 143771, 99\n"


class CountingTargets(Targets):
    """The real targets, counting every script run on this machine: one call is one bash process started."""

    def __init__(self, registry, env) -> None:
        super().__init__(registry, local_env=env)
        self.scripts: list[str] = []
        counted, real = self, self._local

        class Counted(LocalRunner):
            async def run(self, script, *, timeout, limit=None):
                counted.scripts.append(script)
                return await real.run(script, timeout=timeout, limit=limit)

        self._local = Counted(env)


def place(tmp_path: Path, n: int) -> tuple[object, list[Path]]:
    """n runs with `host = "local"` and no container: training, silent and crashed ones in turn. (No missing log:
    its verdict names whatever python runs on this machine, which other tests start and stop.)"""
    logs, text = [], '[bot]\nalert_channel = "#a"\n[defaults]\ngpu_samples = 1\nsilence_after = "5m"\n'
    for i in range(n):
        log = tmp_path / f"r{i}" / "train.log"
        log.parent.mkdir()
        kind = i % 3
        if kind == 0:
            log.write_text("step=1 loss=2.0 tok/s=10\nstep=2 loss=1.9 tok/s=10\n")
        elif kind == 1:
            log.write_text("step=7 loss=2.0 tok/s=10\n")
            set_age(log, 3600)
        else:
            log.write_text("step=3 loss=2.0\nTraceback (most recent call last):\ntorch.OutOfMemoryError: CUDA out of memory.\n")
        logs.append(log)
        text += f'[runs.r{i}]\nhost = "local"\nlog = "{log}"\n'
    config = tmp_path / "runs.toml"
    config.write_text(text)
    return parse_registry(text, config), logs


def headlines(verdicts) -> list[tuple[str, str]]:
    # The age words ("2 s ago") may differ between two probes a second apart; the phase and what it is do not.
    return [(v.phase.value, v.headline.split(" · ")[0]) for v in verdicts]


@pytest.mark.parametrize("n, probes", [(6, 1), (GROUP_MAX, 1), (GROUP_MAX + 4, 2)])
async def test_the_local_runs_of_a_sweep_are_one_bash_per_batch_with_the_verdicts_of_one_by_one(tmp_path, n, probes):
    registry, logs = place(tmp_path, n)
    fake_nvidia_smi(tmp_path / "bin", [GPU])
    env = path_with(tmp_path / "bin")
    with writer_holding(logs[0]):
        targets = CountingTargets(registry, env)
        wd = Watchdog(registry, targets, StateFile.open(tmp_path / "state.sqlite3"), FakeChat())
        report = await wd.sweep()
        swept = [wd.verdicts[name] for name in registry.runs]
        assert report.probed == n
        assert len(targets.scripts) == probes  # one bash per batch, not one per run
        assert (tmp_path / "bin" / "smi-rounds" / "counter").read_text().strip() == str(probes)  # one GPU read each

        alone_targets = CountingTargets(registry, env)
        scheduler = Scheduler(registry, alone_targets)
        alone = [await scheduler.check(run, priority=Priority.SWEEP) for run in registry.runs.values()]
        assert len(alone_targets.scripts) == n
    await targets.close()
    await alone_targets.close()
    assert headlines(swept) == headlines(alone)
    assert {v.phase.value for v in swept} >= {"crashed", "stopped"}  # the place held runs of several kinds


def test_a_place_is_its_host_and_container_whatever_the_host(tmp_path):
    from bot.probe.scheduler import batches  # noqa: PLC0415

    text = ('[hosts.pve1]\naddress = "10.0.0.1"\n'
            + "".join(f'[runs.h{i}]\nhost = "pve1"\nlog = "/h{i}.log"\n' for i in range(3))
            + "".join(f'[runs.l{i}]\nhost = "local"\nlog = "/l{i}.log"\n' for i in range(3))
            + '[runs.c0]\nhost = "pve1"\ncontainer = 200\nlog = "/c.log"\n')
    registry = parse_registry(text, tmp_path / "runs.toml")
    got = sorted(sorted(r.name for r in b) for b in batches(registry.runs.values()))
    assert got == [["c0"], ["h0", "h1", "h2"], ["l0", "l1", "l2"]]  # (pve1, None), (local, None), (pve1, 200)
