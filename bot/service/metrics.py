"""Prometheus metrics fed by the watchdog's observer hook: each run's verdict in numbers, and runbot's own health (shell).

Labels are bounded: run names and GPU roles from the configuration, and fixed sets of words (phases, outcomes,
Slack methods) — never log text, never a host's answer, so a run cannot grow the number of series."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest

from bot import __version__
from bot.core.history import role_loads
from bot.core.outages import PROBE_OUTCOMES, probe_outcome, unreached
from bot.core.verdict import Phase, Verdict
from bot.render.machine import number, phase_id
from bot.service.observe import SLACK_METHODS, SLACK_OUTCOMES
from config.registry import Run

PHASES = tuple(phase_id(p) for p in Phase)
SWEEP_OUTCOMES = ("ok", "unreached", "failed")
# A sweep of a few local runs takes tens of milliseconds; 1000 runs on slow hosts, most of check_every.
SWEEP_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
NO_ROLE = "GPUs"  # the role label of a run with no roles (bot.core.history.role_loads' name for all its GPUs)


class Metrics:
    """A SweepObserver keeping its own CollectorRegistry (never the process-wide one: two bots in one test
    process, or a library's metrics, stay apart); `exposition()` is the text a scrape gets."""

    def __init__(self, runs: Iterable[Run], *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.runs = {run.name: run for run in runs}
        self.registry = r = CollectorRegistry()
        Info("runbot", "runbot's version", registry=r).info({"version": __version__})
        self.level = Gauge("runbot_run_level", "the run's level: 0 ok, 1 note, 2 warn, 3 crit", ["run"], registry=r)
        self.phase = Gauge("runbot_run_phase", "1 for the run's phase, 0 for every other phase", ["run", "phase"], registry=r)
        self.step = Gauge("runbot_run_step", "the latest step the log printed", ["run"], registry=r)
        self.total = Gauge("runbot_run_total_steps", "the planned steps, when the log says", ["run"], registry=r)
        self.rate = Gauge("runbot_run_rate", "the throughput, in the run's own unit (runbot status RUN --json says which)",
                          ["run"], registry=r)
        self.loss = Gauge("runbot_run_loss", "the latest loss, when finite", ["run"], registry=r)
        self.age = Gauge("runbot_run_progress_age_seconds", "seconds since the step counter last moved", ["run"], registry=r)
        self.seen = Gauge("runbot_run_last_probe_timestamp_seconds", "when the watchdog last judged the run", ["run"],
                          registry=r)
        self.busy = Gauge("runbot_run_gpu_busy_ratio", "the mean share of time the role's GPUs were busy, 0 to 1",
                          ["run", "role"], registry=r)
        self.memory = Gauge("runbot_run_gpu_memory_bytes", "the memory the role's GPUs hold together", ["run", "role"],
                            registry=r)
        self.sweep_seconds = Histogram("runbot_sweep_duration_seconds", "how long a watchdog sweep took",
                                       buckets=SWEEP_BUCKETS, registry=r)
        self.sweeps = Counter("runbot_sweeps", "sweeps by outcome: ok, unreached (no run answered), failed", ["outcome"],
                              registry=r)
        self.probes = Counter("runbot_probes", "probes by outcome: ok, or how the run could not be reached", ["outcome"],
                              registry=r)
        self.slack = Counter("runbot_slack_calls", "the watchdog's Slack calls by method and outcome", ["method", "outcome"],
                             registry=r)
        self.outbox = Gauge("runbot_outbox_messages", "messages decided and still waiting for Slack", registry=r)
        self.last_ok = Gauge("runbot_last_successful_sweep_timestamp_seconds",
                             "when the last sweep that reached a run ended", registry=r)
        self._judged: list[Verdict] = []
        self._phases: dict[str, str] = {}  # each run's phase as last exported
        for outcome in SWEEP_OUTCOMES:  # every series from the start: rate() needs a zero before the first failure
            self.sweeps.labels(outcome)
        for outcome in PROBE_OUTCOMES:
            self.probes.labels(outcome)
        for method in SLACK_METHODS:
            for outcome in SLACK_OUTCOMES:
                self.slack.labels(method, outcome)

    # --- the observer -----------------------------------------------------------------------------

    def sweep_started(self) -> None:
        self._judged = []

    def judged(self, run: str, verdict: Verdict) -> None:
        config = self.runs.get(run)
        if config is None:  # a host's own verdict ("host pve1"), or a run no longer configured: no series
            return
        self._judged.append(verdict)
        self.probes.labels(probe_outcome(verdict)).inc()
        self.seen.labels(run).set(self.clock())
        self.level.labels(run).set(int(verdict.level))
        now, before = phase_id(verdict.phase), self._phases.get(run)
        if now != before:  # two series touched, not fifteen, on every sweep the phase stays
            for phase in PHASES if before is None else (before, now):
                self.phase.labels(run, phase).set(1.0 if phase == now else 0.0)
            self._phases[run] = now
        step = verdict.step if verdict.reached else None
        self._set(self.step, run, step.step if step else None)
        self._set(self.total, run, step.total if step else None)
        self._set(self.rate, run, number(step.rate) if step else None)
        self._set(self.loss, run, number(step.loss) if step else None)
        self._set(self.age, run, verdict.progress_age if verdict.reached else None)
        loads = {load.role: load for load in role_loads(verdict.gpu)} if verdict.reached else {}
        for role in [name for name, _ in config.gpus] or [NO_ROLE]:  # the configured roles only: bounded
            load = loads.get(role)
            self._set(self.busy, (run, role), load.busy if load else None)
            self._set(self.memory, (run, role), load.mem_gib * 2**30 if load and load.mem_gib is not None else None)

    def sweep_finished(self, report: Any) -> None:
        self.sweep_seconds.observe(report.seconds)
        self.outbox.set(report.outbox)
        if unreached(self._judged, len(report.still_running)) is None:
            self.sweeps.labels("ok").inc()
            self.last_ok.set(self.clock())
        else:
            self.sweeps.labels("unreached").inc()

    def sweep_failed(self, reason: str) -> None:
        self.sweeps.labels("failed").inc()

    def slack_call(self, method: str, outcome: str) -> None:
        if method in SLACK_METHODS and outcome in SLACK_OUTCOMES:
            self.slack.labels(method, outcome).inc()

    # --- the scrape -------------------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The Prometheus text format (version 0.0.4) of every metric."""
        return generate_latest(self.registry)

    @staticmethod
    def _set(gauge: Gauge, labels: str | tuple[str, ...], value: float | int | None) -> None:
        """Set the series, or remove it when runbot does not know the value: no series, not a stale or a made-up 0."""
        labels = (labels,) if isinstance(labels, str) else labels
        if value is None:
            try:
                gauge.remove(*labels)
            except KeyError:  # prometheus-client before 0.21 raises for a series that was never set
                pass
        else:
            gauge.labels(*labels).set(value)
