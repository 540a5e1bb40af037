"""The run's memory at work: real H200 logs (tests/fixtures/gpu-slowdown) replayed as the watchdog sees them,
one sweep every 10 s — a noisy neighbour that halves the rate opens a "slow" incident and closes it when it
leaves; one that costs 13 % stays quiet — plus the history's own rules on plain data."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from bot.core import alerts
from bot.core.alerts import Policy, Reply, Seen
from bot.core.diagnose import diagnose
from bot.core.facts import Step
from bot.core.history import Point, keep_recent, observe
from bot.core.stages.trends import LOSS_MIN_SPAN, RATE_MIN_SPAN, SPARK_CELLS, RunNumbers, loss_spike, slow, spark, trend
from bot.core.verdict import Concern, Finding, Level, Phase, Verdict, Worry
from bot.probe.replay import DefaultRun
from bot.render.alerts import message
from tests.builders import evidence

SLOWDOWN = Path(__file__).parent / "fixtures" / "gpu-slowdown"
T0 = 1_800_000_000.0
SWEEP_S = 10.0


def events(folder: Path) -> dict[str, float]:
    """The driver's marks and the loop's start, as seconds of the loop's own `elapsed`."""
    text = (folder / "events.txt").read_text()
    first_step = float(re.search(r"^(\S+) step step=(\d+)$", text, re.M)[1])
    first_elapsed = float(re.search(r"elapsed=([\d.]+)s", (folder / "train.log").read_text())[1])
    start = first_step - first_elapsed
    return {name: float(t) - start for t, name in re.findall(r"^(\S+) (load_begin|load_end)$", text, re.M)}


def sweeps(folder: Path, run: DefaultRun):
    """(elapsed, verdict) every SWEEP_S: the log as it stood then, read with the memory of the sweeps before."""
    lines = (folder / "train.log").read_text().splitlines(keepends=True)
    stamped = [(float(m[1]) if (m := re.search(r"elapsed=([\d.]+)s", x)) else 0.0, x) for x in lines]
    end = max(e for e, _ in stamped)
    history: list[Point] = []
    previous = None
    t = SWEEP_S
    while t <= end + SWEEP_S:
        shown = "".join(x for e, x in stamped if e <= t and "training done" not in x)
        last = max((e for e, x in stamped if e <= t), default=0.0)
        ev = evidence(shown, age=max(0.0, t - last), now=T0 + t)
        verdict = diagnose(ev, run, previous=previous, history=keep_recent(history, T0 + t))
        history += observe(verdict, T0 + t, history[-1] if history else None)
        previous = verdict
        yield t, verdict
        t += SWEEP_S


RUN = DefaultRun("contention", slow_for=60.0)


def test_a_neighbour_that_halves_the_rate_opens_a_slow_incident_and_closes_it():
    marks = events(SLOWDOWN / "big-neighbour")
    seen = [(t, v) for t, v in sweeps(SLOWDOWN / "big-neighbour", RUN)]
    slow_at = [t for t, v in seen if Concern(Worry.SLOW) in v.concerns]
    assert slow_at, "never slow"
    # Told once it has been slow for slow_for (and no earlier), quiet again once the neighbour left.
    assert marks["load_begin"] + RUN.slow_for <= slow_at[0] <= marks["load_begin"] + RUN.slow_for + 3 * SWEEP_S
    assert slow_at[-1] <= marks["load_end"] + 2 * SWEEP_S
    v = dict(seen)[slow_at[0]]
    assert v.level is Level.WARN and v.phase is Phase.TRAINING
    assert re.match(r"slow: 13[67](?:\.\d)?K → 6[23](?:\.\d)?K tok/s \(-5\d %\) for 1 min · step \d+ · ", v.headline), v.headline

    # Through the incident machine: one thread, opened on the first slow sweep, recovered after.
    state, said = None, []
    for t, verdict in seen:
        state, actions = alerts.decide(state, Seen.of(verdict), T0 + t, Policy(recovery_sweeps=2))
        said += [(t, a) for a in actions if not isinstance(a, alerts.Update)]
    notes = [(getattr(a, "note", ""), t) for t, a in said]
    assert [n for n, _ in notes] == ["opened", "recovered"], notes
    assert notes[1][1] > marks["load_end"]
    text = message("contention", alerts.Post("opened"), state, dict(seen)[notes[0][1]], T0 + notes[0][1])["text"]
    assert "slow" in text and "tok/s" in text


def test_a_neighbour_that_costs_13_percent_says_nothing():
    seen = list(sweeps(SLOWDOWN / "small-neighbour", RUN))
    assert len(seen) > 30
    assert not [t for t, v in seen if any(c.kind in (Worry.SLOW, Worry.LOSS_SPIKE) for c in v.concerns)]
    # and its memory says how it went: an ETA needs a total, but the rate against its median shows
    assert any(v.trend is not None and v.trend.rate_spark for _, v in seen[-5:])


def test_every_healthy_real_curve_of_the_gpu_jobs_stays_quiet():
    """The device run's logs with rates (tests/fixtures/gpu-jobs), replayed the same way."""
    for log in sorted((Path(__file__).parent / "fixtures" / "gpu-jobs" / "logs").glob("*/train.log")):
        folder = log.parent
        text = log.read_text(errors="replace")
        if "elapsed=" not in text:
            continue
        for t, v in sweeps(folder, DefaultRun("job", slow_for=20.0)):
            assert not any(c.kind is Worry.SLOW for c in v.concerns), (log, t, v.headline)


# --- the history's rules, on plain data ----------------------------------------------------


def verdict_at(step: int, *, rate: float | None = 100.0, loss: float | None = 2.0, total: int | None = None,
               phase: Phase = Phase.TRAINING) -> Verdict:
    s = Step(f"step={step}", step=step, total=total, loss=loss, rate=rate, rate_unit="it/s")
    return Verdict(run="r", phase=phase, level=Level.OK, headline="", step=s, recent=(s,))


def test_each_step_is_remembered_once_and_a_restart_is_a_new_segment():
    p1 = observe(verdict_at(10), T0, None)
    assert [p.step for p in p1] == [10]
    assert observe(verdict_at(10), T0 + 60, p1[-1])[0].step == 10  # no new step: one point of phase and GPUs
    p2 = observe(verdict_at(20), T0 + 120, p1[-1])
    assert [(p.step, p.segment) for p in p2] == [(20, 0)]
    p3 = observe(verdict_at(3), T0 + 180, p2[-1])  # the log began again
    assert [(p.step, p.segment) for p in p3] == [(3, 1)]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 1e300])
def test_non_finite_or_absurd_values_never_reach_the_memory(bad):
    [p] = observe(verdict_at(5, rate=bad, loss=bad), T0, None)
    assert p.rate is None and p.loss is None


def test_the_memory_is_bounded():
    points = [Point(T0 + i, Phase.TRAINING, 0, i) for i in range(20_000)]
    kept = keep_recent(points, T0 + 20_000)
    assert len(kept) <= 4000 and kept[-1] == points[-1] and all(T0 + 20_000 - p.t <= 3 * 3600 for p in kept)


def history(rates, *, every=60.0, start=T0, unit="it/s", losses=None) -> list[Point]:
    return [Point(start + i * every, Phase.TRAINING, 0, i * 10, 10_000, (losses[i] if losses else 2.0), r, unit)
            for i, r in enumerate(rates)]


def test_an_eta_from_the_last_half_hour_and_the_rate_against_its_hour():
    h = history([100.0] * 40)  # 10 steps a minute
    t = trend(h, Step("x", step=390, total=10_000, rate=80.0, rate_unit="it/s"))
    assert t.eta == pytest.approx((10_000 - 390) / (10 / 60), rel=0.01)
    assert t.vs_median == pytest.approx(-0.2)
    assert len(t.rate_spark) >= 2 and set(t.rate_spark) <= set("▁▂▃▄▅▆▇█")


def test_slowness_waits_for_its_baseline_its_duration_and_training():
    numbers = RunNumbers(slow_below=0.6, slow_for=600.0)
    young = history([100.0] * 5 + [40.0] * 11)  # 16 min: too young for a baseline and a 10-minute stretch
    assert slow(young, Step("x", step=1, rate=40.0, rate_unit="it/s"), Phase.TRAINING, numbers) is None
    old = history([100.0] * 30 + [40.0] * 11)
    found = slow(old, Step("x", step=1, rate=40.0, rate_unit="it/s"), Phase.TRAINING, numbers)
    assert found is not None and found.what is Finding.SLOW and found.before == 100.0 and found.lasted >= 600
    assert slow(old, Step("x", step=1, rate=40.0, rate_unit="it/s"), Phase.EVALUATING, numbers) is None
    blip = history([100.0] * 30 + [40.0] * 5 + [100.0] + [40.0] * 5)  # one good reading inside: not a stretch
    assert slow(blip, Step("x", step=1, rate=40.0, rate_unit="it/s"), Phase.TRAINING, numbers) is None
    other_unit = history([100.0] * 30 + [40.0] * 11, unit="tok/s")
    assert slow(other_unit, Step("x", step=1, rate=40.0, rate_unit="it/s"), Phase.TRAINING, numbers) is None


def test_a_loss_spike_only_when_asked_and_only_when_it_lasts():
    losses = [2.0 - i * 0.001 for i in range(40)] + [9.0, 9.5]
    h = history([100.0] * 42, losses=losses)
    step = Step("x", step=420, loss=9.8, rate=100.0, rate_unit="it/s")
    assert loss_spike(h, step, RunNumbers()) is None  # off by default
    found = loss_spike(h, step, RunNumbers(loss_spike=True))
    assert found is not None and found.value == 9.8
    one = history([100.0] * 42, losses=[2.0] * 41 + [9.0])
    assert loss_spike(one, Step("x", step=420, loss=2.0), RunNumbers(loss_spike=True)) is None


WOBBLE = [100.0, 99.0, 101.0, 100.0, 99.5, 100.5]  # ±1 %: noise, on any screen


@pytest.mark.parametrize("values, min_span, drawn", [
    (WOBBLE, RATE_MIN_SPAN, "██████"),  # a rate's noise draws flat (it drew ▃▁█▃▂▅: a cliff on a phone)
    ([100, 100, 100, 50, 50, 50], RATE_MIN_SPAN, "███▅▅▅"),  # half the rate, half the bar
    ([100, 100, 0], RATE_MIN_SPAN, "██▁"),  # stopped
    ([0.0, 0.0, 0.0], RATE_MIN_SPAN, "▁▁▁"),  # nothing there: the bottom, not the top
    ([2.30, 2.28, 2.32, 2.30, 2.31], LOSS_MIN_SPAN, "█████"),  # a loss's noise draws flat too
    ([3.0, 2.75, 2.5, 2.25, 2.0], LOSS_MIN_SPAN, "█▇▅▃▁"),  # its real descent still shows
    ([2.3, 2.3, 2.3, 4.6], LOSS_MIN_SPAN, "▁▁▁█"),  # and a spike
    ([1, 2, 3, 4, 5, 6, 7, 8], LOSS_MIN_SPAN, "▁▂▃▄▅▆▇█"),  # a range wider than the least span: scaled to it
    ([3.0, 3.0, 3.0], LOSS_MIN_SPAN, "███"),  # flat is flat, at the top
    ([-1.0, -1.01, -0.99], LOSS_MIN_SPAN, "███"),  # a negative loss (some RL objectives) alike
    ([5.0, math.nan, 5.0], RATE_MIN_SPAN, "██"),
    ([5.0], RATE_MIN_SPAN, ""),
    ([], LOSS_MIN_SPAN, ""),
])
def test_a_sparkline_draws_noise_flat_and_a_drop_as_a_drop(values, min_span, drawn):
    assert spark(values, min_span=min_span) == drawn


def clocked(until: float) -> list[Point]:
    """A point a minute from T0 (a multiple of 5 min) to `until`, the rate 100 or 50 by wall-clock 5-minute cell."""
    return [Point(t, Phase.TRAINING, 0, i, None, 2.0, 100.0 if int(t // 300) % 2 else 50.0, "it/s")
            for i, t in enumerate(T0 + 60.0 * k for k in range(int((until - T0) // 60) + 1))]


@pytest.mark.parametrize("ask", [7200.0, 7320.0, 7440.0])  # asks a few minutes apart, inside the newest cell
def test_sparkline_cells_are_fixed_to_the_clock_not_sliding_with_now(ask):
    step = Step("x", step=1, rate=100.0, rate_unit="it/s")
    first = trend(clocked(T0 + 7200.0), step).rate_spark
    again = trend(clocked(T0 + ask), step).rate_spark
    assert len(first) == SPARK_CELLS
    # Every cell but the newest (still filling) reads the same, each a whole 5-minute cell: 100 or 50, never a mix.
    assert again[:-1] == first[:-1] and set(first) == {"█", "▅"}


def test_a_drop_in_the_rate_draws_a_drop_and_its_wobble_draws_flat():
    wobble = [100.0 * (1 + 0.01 * (-1) ** i) for i in range(60)]
    flat = trend(history(wobble), Step("x", step=590, rate=100.0, rate_unit="it/s")).rate_spark
    assert set(flat) == {"█"}
    dropped = trend(history(wobble[:30] + [50.0] * 30), Step("x", step=590, rate=50.0, rate_unit="it/s")).rate_spark
    assert dropped.startswith("███") and dropped.endswith("▄▄▄")  # half of its top, 101
