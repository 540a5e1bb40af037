"""The look budget (bot.core.cadence): when the watchdog next looks at a run, as a table."""

from __future__ import annotations

import pytest

from bot.core.cadence import Look, Why, due, next_look, steady_every
from bot.core.facts import Process
from bot.core.verdict import Concern, Level, Phase, Verdict, Worry

NOW, EVERY = 1000.0, 60.0


def seen(phase=Phase.TRAINING, level=Level.OK, age: float | None = 10.0, threshold: float | None = 600.0, **kw) -> Verdict:
    return Verdict("r", phase, level, "…", progress_age=age, threshold=threshold, **kw)


WRITER = Process(pid=7, elapsed_s=3600, command="python train.py")


@pytest.mark.parametrize("verdict, silence_after, attention, expected", [
    # Steady and far from silence: a quarter of silence_after, in whole sweeps (600 / 4 = 150 -> 2 sweeps).
    (seen(age=10), 600, None, Look(NOW + 120, Why.STEADY)),
    (seen(age=10, threshold=3600), 3600, None, Look(NOW + 900, Why.STEADY)),
    # Its last progress would pass the threshold before that: looked at right then (a hang told on time).
    (seen(age=550), 600, None, Look(NOW + 50, Why.EDGE)),
    (seen(age=599.5), 600, None, Look(NOW + 0.5, Why.EDGE)),
    (seen(age=600), 600, None, Look(NOW, Why.EDGE)),
    # "auto": the verdict's learnt threshold decides; the setting is not known.
    (seen(age=10, threshold=1200), None, None, Look(NOW + 300, Why.STEADY)),
    (seen(age=1150, threshold=1200), None, None, Look(NOW + 50, Why.EDGE)),
    # A short silence_after: a quarter of it is under a sweep, so every sweep (today's cadence).
    (seen(age=1, threshold=30), 30, None, Look(NOW, Why.STEADY)),
    (seen(age=1, threshold=239), 239, None, Look(NOW, Why.STEADY)),
    # Anything but steady training: every sweep.
    (seen(phase=Phase.SILENT, level=Level.CRIT, age=700, concerns=(Concern(Worry.SILENT),)), 600, None, Look(NOW, Why.NOT_OK)),
    (seen(phase=Phase.CRASHED, level=Level.CRIT, concerns=(Concern(Worry.CRASHED),)), 600, None, Look(NOW, Why.NOT_OK)),
    (seen(phase=Phase.TRAINING, level=Level.WARN), 600, None, Look(NOW, Why.NOT_OK)),
    (seen(phase=Phase.LOADING, level=Level.NOTE, age=None), 600, None, Look(NOW, Why.NOT_OK)),
    (seen(phase=Phase.UNREACHABLE, level=Level.CRIT, age=None, concerns=(Concern(Worry.UNREACHABLE),)), 600, None,
     Look(NOW, Why.NOT_OK)),
    (seen(level=Level.OK, concerns=(Concern(Worry.GPU_IDLE, "drafter"),)), 600, None, Look(NOW, Why.NOT_OK)),
    # Healthy, but when it could go silent is not known: every sweep.
    (seen(age=None), 600, None, Look(NOW, Why.UNSURE)),
    (seen(threshold=None), None, None, Look(NOW, Why.UNSURE)),
    (seen(phase=Phase.FINISHED, age=5, threshold=None, writer=WRITER), 600, None, Look(NOW, Why.UNSURE)),  # exiting
    # Finished and nothing left running: only a restart can change it.
    (seen(phase=Phase.FINISHED, age=5, threshold=None), 600, None, Look(NOW + 120, Why.STEADY)),
    # What the watchdog knows outranks the verdict: every sweep.
    (seen(age=10), 600, Why.INCIDENT, Look(NOW, Why.INCIDENT)),
    (seen(age=10), 600, Why.WATCHED, Look(NOW, Why.WATCHED)),
    (seen(age=10), 600, Why.ASKED, Look(NOW, Why.ASKED)),
    (seen(age=10), 600, Why.HOST, Look(NOW, Why.HOST)),
    (None, 600, None, Look(NOW, Why.FIRST)),
])
def test_next_look(verdict, silence_after, attention, expected):
    assert next_look(verdict, NOW, silence_after, EVERY, attention=attention) == expected


@pytest.mark.parametrize("spread, age, expected", [
    # A first steady look spread over the steady gap (3600 / 4 = 15 sweeps), in whole sweeps, at least one.
    (1.0, 10, Look(NOW + 900, Why.STEADY)), (0.5, 10, Look(NOW + 480, Why.STEADY)), (0.01, 10, Look(NOW + 60, Why.STEADY)),
    (0.0, 10, Look(NOW + 60, Why.STEADY)), (2.0, 10, Look(NOW + 900, Why.STEADY)),
    (0.5, 3300, Look(NOW + 300, Why.EDGE)),  # the edge still comes first
])
def test_a_spread_first_look_comes_sooner_never_later(spread, age, expected):
    verdict = seen(age=age, threshold=3600)
    assert next_look(verdict, NOW, 3600, EVERY, spread=spread) == expected


@pytest.mark.parametrize("silence_after, check_every, every", [
    (600, 60, 120), (3600, 60, 900), (30, 10, 10), (5, 1, 1), (600, 10, 150), (10, 60, 60), (479, 60, 60), (480, 60, 120),
])
def test_steady_every_is_whole_sweeps_at_most_a_quarter_of_silence_after(silence_after, check_every, every):
    assert steady_every(silence_after, check_every) == every
    assert every <= max(check_every, silence_after / 4)


@pytest.mark.parametrize("at, now, expected", [
    (NOW, NOW, True), (NOW + 29, NOW, True), (NOW + 30, NOW, True), (NOW + 31, NOW, False), (NOW - 500, NOW, True),
])
def test_due_within_half_a_sweep(at, now, expected):
    assert due(Look(at, Why.STEADY), now, EVERY) is expected
    assert due(None, now, EVERY)


@pytest.mark.parametrize("silence_after, check_every", [(600, 60), (3600, 60), (300, 10), (120, 7)])
def test_a_hang_is_seen_within_silence_after_plus_check_every(silence_after, check_every):
    """Sweeps every check_every, a run stepping until `stop` and frozen after: the sweep that sees its progress
    older than silence_after comes within silence_after + check_every of the stop, wherever the stop falls."""
    for offset in range(0, int(check_every), max(1, int(check_every) // 7)):
        stop = 10 * silence_after + offset + 0.3
        look, t = None, 0.0
        while True:
            if due(look, t, check_every):
                age = max(0.0, t - stop)
                if age > silence_after:
                    break
                verdict = seen(age=age if t >= stop else 0.0, threshold=silence_after)
                look = next_look(verdict, t, silence_after, check_every)
            t += check_every
        assert t - stop <= silence_after + check_every, (offset, t - stop)


# -- wired in the watchdog: a fake clock, a fake probe (the scheduler's check_group), sweeps every check_every ----


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def fleet_watchdog(tmp_path, clock: Clock):
    from bot.service.state_file import StateFile
    from bot.service.watchdog import Watchdog
    from config.registry import parse_registry
    from tests.test_watchdog import FakeChat

    text = ('[bot]\ncheck_every = "60s"\nalert_channel = "C0ALERTS"\n[defaults]\ngpu_samples = 1\nsilence_after = "10m"\n'
            + "".join(f'[runs.{name}]\nhost = "local"\nlog = "{name}.log"\n' for name in ("steady", "hangs", "crashes")))
    (tmp_path / "runs.toml").write_text(text)
    registry = parse_registry(text, tmp_path / "runs.toml")
    chat = FakeChat()
    posted: list[tuple[str, float]] = []
    real_post = chat.post

    async def post(channel, text, blocks, thread_ts=None, *, key=None):
        posted.append((text, clock()))
        return await real_post(channel, text, blocks, thread_ts, key=key)

    chat.post = post
    return Watchdog(registry, None, StateFile.open(tmp_path / "state.sqlite3"), chat, clock=clock), posted


@pytest.mark.parametrize("hang_at, crash_at", [(37.0, 61.0), (59.5, 119.9), (0.5, 150.0)])
async def test_a_steady_run_rests_between_looks_and_a_hang_and_a_crash_are_told_in_time(tmp_path, hang_at, crash_at):
    """silence_after 10 min, check_every 60 s: a steady run is looked at every other sweep (150 s would be a
    quarter of silence_after: two whole sweeps); a hang is told within silence_after + check_every of its last
    step, a crash within silence_after / 4 + check_every (docs/configuration.md)."""
    start = 100_000.0
    clock = Clock(start)
    wd, posted = fleet_watchdog(tmp_path, clock)
    probes: dict[str, int] = {}
    hang, crash = start + 5 * 60 + hang_at, start + 5 * 60 + crash_at

    def truth(name: str, t: float) -> Verdict:
        if name == "crashes" and t >= crash:
            return Verdict(name, Phase.CRASHED, Level.CRIT, "crashed — OOM", concerns=(Concern(Worry.CRASHED),))
        age = t - hang if name == "hangs" and t >= hang else 3.0
        if age > 600:
            return Verdict(name, Phase.SILENT, Level.CRIT, f"silent {age:.0f} s", concerns=(Concern(Worry.SILENT),),
                           progress_age=age, threshold=600.0)
        return Verdict(name, Phase.TRAINING, Level.OK, "training", progress_age=age, threshold=600.0)

    async def check_group(batch, previous, *, priority=None, wait=None):
        for run in batch:
            probes[run.name] = probes.get(run.name, 0) + 1
        return [truth(run.name, clock()) for run in batch]

    wd.probes.check_group = check_group
    sweeps = 30
    for _ in range(sweeps):
        await wd.sweep()
        clock.t += 60.0
    told = {name: next(t for text, t in posted if text.startswith(f"{name}: ")) for name in ("hangs", "crashes")}
    assert "steady" not in {text.split(":")[0] for text, _ in posted}
    assert probes["steady"] <= sweeps // 2 + 1, probes  # resting between looks, not probed every sweep
    assert told["hangs"] - hang <= 600 + 60, told["hangs"] - hang
    assert told["crashes"] - crash <= 600 / 4 + 60, told["crashes"] - crash
    await wd.stop()


async def test_a_fleet_first_seen_together_is_looked_at_spread_over_the_steady_gap(tmp_path):
    """40 steady runs, silence_after 1 h, check_every 60 s: a look every 15 sweeps each, and the fleet seen at the
    bot's start is not due all in one sweep ever after: each sweep takes a share of it."""
    from bot.service.state_file import StateFile
    from bot.service.watchdog import Watchdog
    from config.registry import parse_registry
    from tests.test_watchdog import FakeChat

    names = [f"run{i:02d}" for i in range(40)]
    text = ('[bot]\ncheck_every = "60s"\nalert_channel = "C0ALERTS"\n[defaults]\ngpu_samples = 1\nsilence_after = "1h"\n'
            + "".join(f'[runs.{name}]\nhost = "local"\nlog = "{name}.log"\n' for name in names))
    (tmp_path / "runs.toml").write_text(text)
    clock = Clock(50_000.0)
    wd = Watchdog(parse_registry(text, tmp_path / "runs.toml"), None, StateFile.open(tmp_path / "state.sqlite3"),
                  FakeChat(), clock=clock)
    per_sweep: list[list[str]] = []

    async def check_group(batch, previous, *, priority=None, wait=None):
        per_sweep[-1].extend(run.name for run in batch)
        return [Verdict(run.name, Phase.TRAINING, Level.OK, "training", progress_age=3.0, threshold=3600.0) for run in batch]

    wd.probes.check_group = check_group
    for _ in range(31):
        per_sweep.append([])
        await wd.sweep()
        clock.t += 60.0
    assert sorted(per_sweep[0]) == names  # the first look: every run
    after = per_sweep[1:]
    assert max(len(s) for s in after) <= 10, [len(s) for s in after]  # 40 / 15 a sweep on average, never all
    assert sorted(n for s in after[:15] for n in s) == names  # each looked at again within the gap...
    assert all(sum(n == name for s in after for n in s) == 2 for name in names)  # ...and every 15 sweeps since
    await wd.stop()
