"""The watchdog: APScheduler sweeps probe each run when its look is due, the alert machine decides, the outbox delivers (shell)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, tzinfo
from typing import Any

from bot.core import alerts, digest
from bot.render import alerts as render_alerts
from bot.core.alerts import Policy, Post, RunState, Seen, Status, Update
from bot.core.cadence import Look, Why, due, next_look
from bot.service.chat import Chat, ChatError, SlackChat
from bot.probe.scheduler import Priority, Scheduler, batches, not_probed
from bot.core.budget import RESERVED, Bucket
from bot.core.digest import digest_key, is_digest_key
from bot.core.ledger import Outgoing, Pending, Watch
from bot.core.outages import HOST_FAILURES, HOST_GROUP_MIN, HostRun, answering, host_key, is_host_key, outage
from bot.service.leadership import AdvisoryLock, Role, Solo, StandingBy, leadership_for
from bot.service.state_file import StateFile
from bot.core.verdict import Concern, Verdict, Worry
from bot.service.history import History
from bot.service.observe import ObservedChat, Observers
from config.registry import LOCAL, Registry, Run

log = logging.getLogger("runbot.watchdog")

CHAT_CONCURRENCY = 4  # Slack calls at once: a burst of alerts should meet rate limits gently
WATCH_EVERY_S = 3.0
WATCH_LIMIT_S = 1800.0
KEEP_SENT_S = 7 * 86400.0  # sent outbox rows are kept this long (for a look at what went out)
# Slack's Retry-After is obeyed up to this long: past it, one call asks again (a 429 costs nothing),
# so a 120 s answer cannot hold every alert back for two minutes after Slack is healthy.
RETRY_AFTER_CAP_S = 30.0
# A sweep's non-urgent news waits at most this long for the sweep's other probes to be judged, so that a
# storm (many runs of one channel changing together) is seen whole, not after its first few were posted.
STORM_HOLD_S = 2.0
# A cut sweep waits this much longer for the probes whose turn did not come to say so: their deadline is its own,
# and the report then counts them as carried over, not as still out.
CUT_GRACE_S = 0.05
LIVE = (Status.OPEN, Status.RECOVERING)  # an incident's states in which a run is looked at every sweep


@dataclass(frozen=True)
class SweepReport:
    seconds: float
    probed: int
    still_running: tuple[str, ...]  # runs whose probe from an earlier sweep has not come back
    queued: int  # messages this sweep decided
    waiting: int  # runs with messages still waiting for Slack afterwards
    outbox: int = 0  # messages still waiting for Slack afterwards (the metrics' outbox depth)
    resting: int = 0  # runs whose next look was not due (bot.core.cadence)
    carried: int = 0  # runs due whose turn did not come before the sweep's end: first in line next sweep
    skipped: bool = False  # the sweep before was still running: this one did nothing


class _Round:
    """One sweep's probes being judged: `wait()` returns once all are, or after `hold` seconds."""

    def __init__(self, probes: int, hold: float) -> None:
        self._left, self._done = probes + 1, asyncio.Event()
        self._timer = asyncio.get_running_loop().call_later(hold, self._done.set)
        self.judged()  # none to wait for: done at once

    def judged(self) -> None:
        self._left -= 1
        if self._left <= 0:
            self._done.set()
            self._timer.cancel()

    async def wait(self) -> None:
        await self._done.wait()


class Watchdog:
    """Owns the scheduler's jobs, the per-run states (in the ledger, written to the state file) and delivery."""

    def __init__(self, registry: Registry, targets: Any, state_file: StateFile, chat: Chat, *,
                 clock: Callable[[], float] = time.time, tz: tzinfo | None = None, policy: Policy | None = None,
                 watch_every: float = WATCH_EVERY_S, scheduler: Scheduler | None = None, observer: Any = None) -> None:
        self.registry, self.state_file, self.chat = registry, state_file, chat
        # Told of each sweep and verdict (bot.service.observe): the metrics, a dead-man's switch; none by default.
        self.observer = observer if observer is not None else Observers()
        # Every probe goes through the one scheduler (the Slack app's, in `runbot serve`), which adds what
        # it saw to each run's memory: the diagnosis reads it (trends, slowness), the summaries too.
        if scheduler is None:
            scheduler = Scheduler(registry, targets, history=History(state_file, clock=clock, runs=list(registry.runs)))
        self.probes = scheduler  # (self.scheduler is APScheduler's, which runs the sweeps)
        self.ledger = state_file.ledger  # every question and change goes here, in memory; flush() makes it durable
        self.clock, self.tz, self.watch_every = clock, tz, watch_every
        self.policy = policy or Policy(remind_every=registry.bot.remind_every, flap_window=registry.bot.flap_window,
                                       flap_changes=registry.bot.flap_changes)
        self.states: dict[str, RunState] = self.ledger.states
        # Who sweeps and posts (bot.service.leadership): a lone bot leads; replicas on PostgreSQL take turns.
        self.leadership: Solo | AdvisoryLock = Solo()
        self.verdicts: dict[str, Verdict] = {}  # the latest, for the parent's evidence and "since last check"
        self.scheduler = None
        self._inflight: dict[str, asyncio.Task] = {}
        # Each run's next look (memory only: after a restart every run is looked at once); hosts whose runs did
        # not answer as an up host's do (all their runs are looked at next sweep: an outage is told whole).
        self.looks: dict[str, Look] = {}
        self._host_trouble: set[str] = set()
        self._sweeping = False
        self._carried = 0
        self._sending: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._slack_down = False  # this sweep: Slack failed, send no more until the next
        self._quiet_until = 0.0  # the bot's clock: Slack asked for quiet (a 429) until then
        self._chat_gate = asyncio.Semaphore(CHAT_CONCURRENCY)
        self._background: set[asyncio.Task] = set()  # deliveries a command started and did not wait for
        self._budgets: dict[str, Bucket] = {}  # per channel
        self._queued = 0
        self._backlog = {row.run for row in self.ledger.pending()}
        # Runs whose queue Slack refused for certain (channel_not_found, not_in_channel…): refusals in a
        # row, and sweeps still to sit out. The gaps double, so a wrong channel costs a few calls an hour.
        self._refused: dict[str, list[int]] = {}
        self._trails: dict[str, tuple[str, ...]] = {}
        # Per alert channel, when each run last had news (a post or a reply): what tells a storm (memory only:
        # after a restart a storm is seen afresh). Channels with rows not yet folded; digest edits waiting for their turn.
        self._news: defaultdict[str, dict[str, float]] = defaultdict(dict)
        self._unfolded: set[str] = {c for row in self.ledger.pending() if (c := self._channel_of(row.run))}
        self._digest_timers: dict[str, asyncio.Task] = {}
        for run in registry.runs.values():
            if run.alert_channel is None:
                log.warning("run %s has no alert_channel: its alerts are tracked but not posted", run.name)
        state_file.on_note = self.note
        for text in state_file.notes:  # said at start: a corrupt state file moved aside
            self.note(text)

    def note(self, text: str) -> None:
        """Tell the bot's alert channel something about runbot itself (its state file failing), once,
        straight to Slack: not through the outbox, which may be what cannot be written."""
        channel = self.registry.bot.alert_channel
        if channel is None:
            return

        async def post() -> None:
            try:
                await self.chat.post(channel, f":warning: {text}", None)
            except Exception as exc:  # noqa: BLE001 - said in the log already; Slack may be down too
                log.warning("could not post a note to %s: %s", channel, exc)

        self._in_background(post(), "note")

    def _in_background(self, work, name: str) -> None:
        try:
            task = asyncio.get_running_loop().create_task(work, name=name)
        except RuntimeError:  # no loop yet (built before serve's loop runs): said in the log only
            work.close()
            return
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- sweeps -------------------------------------------------------------------------------

    async def sweep(self, wait: float | None = None) -> SweepReport:
        """Probe every run whose look is due (bot.core.cadence), all at once; judge each as its probe comes back,
        so a slow host delays only itself.

        Returns after `wait` seconds even if some probes are still out (they finish on their own, and the next
        sweep skips their runs); None waits for all. A probe whose turn has not come by then is not made: its
        run stays due, the most overdue first next sweep, so an overrunning sweep is cut into the next one rather
        than stacking behind it. Never two at once: one called while another runs does nothing."""
        if self._sweeping:
            log.warning("sweep: the one before is still running; this one does nothing")
            return SweepReport(0.0, 0, tuple(self._inflight_names()), 0, len(self._backlog), len(self.ledger.pending()),
                               skipped=True)
        self._sweeping = True
        try:
            return await self._sweep(wait)
        finally:
            self._sweeping = False

    async def _sweep(self, wait: float | None) -> SweepReport:
        started = time.perf_counter()
        self.observer.sweep_started()
        self._slack_down = False
        queued_before, self._carried = self._queued, 0
        launched, busy = [], []
        held = self._sit_out()  # refused for certain lately: not tried this sweep
        tried: set[str] = set()  # delivered by their own probe's task: not tried twice
        probed = 0
        now = self.clock()
        due_runs = self._due(now)
        groups = []
        for host, runs in self._groups(due_runs):
            if any((t := self._inflight.get(r.name)) is not None and not t.done() for r in runs):
                busy += [r.name for r in runs]
            else:
                groups.append((host, runs))
        round_ = _Round(len(groups), STORM_HOLD_S)
        for host, runs in groups:
            task = asyncio.create_task(self._sweep_group(host, runs, tried, held, round_, now, wait),
                                       name=f"probe:{host or runs[0].name}")
            for run in runs:
                self._inflight[run.name] = task
            launched.append(task)
            probed += len(runs)
        if launched:
            _, out = await asyncio.wait(launched, timeout=wait)
            if out:  # the cut: a moment for the probes whose turn did not come (the same deadline) to say so
                await asyncio.wait(out, timeout=CUT_GRACE_S)
        # Runs whose earlier messages still wait and that no probe task delivered (its judging failed,
        # the run left the configuration, Slack's budget ran out): the most important first.
        waiting = self._backlog - set(self._inflight_names()) - tried - held
        for run in sorted(waiting, key=self._urgency, reverse=True):
            await self._deliver_or_log(run)
        await self.state_file.flush()  # the sweep's points (those of probes still out go with the next)
        report = SweepReport(time.perf_counter() - started, probed - self._carried, tuple(busy),
                             self._queued - queued_before, len(self._backlog), len(self.ledger.pending()),
                             resting=len(self.registry.runs) - len(due_runs), carried=self._carried)
        self.observer.sweep_finished(report)
        log.info("sweep: %d runs in %.2f s (%d not due, %d carried over) · %d messages queued · %d runs with messages "
                 "waiting%s", report.probed, report.seconds, report.resting, report.carried, report.queued, report.waiting,
                 f" · still probing {', '.join(busy)}" if busy else "")
        return report

    def _due(self, now: float) -> list[Run]:
        """The runs this sweep looks at, the most overdue first (a run a cut sweep did not reach heads the line)."""
        every = self.registry.bot.check_every
        runs = [r for r in self.registry.runs.values()
                if self._attention(r) is not None or due(self.looks.get(r.name), now, every)]
        return sorted(runs, key=lambda r: self.looks[r.name].at if r.name in self.looks else -math.inf)

    def _attention(self, run: Run) -> Why | None:
        """A reason the watchdog knows to look at a run every sweep, whatever its last verdict said."""
        state = self.states.get(run.name)
        if state is not None and (state.status in LIVE or state.streaks or state.flapping):
            return Why.INCIDENT
        if run.name in self._trails:
            return Why.WATCHED
        if self.probes.asked_lately(run.name):
            return Why.ASKED
        host = self.states.get(host_key(run.host))
        if run.host in self._host_trouble or (host is not None and host.status in LIVE):
            return Why.HOST
        return None

    def _looked(self, run: Run, verdict: Verdict, began: float) -> None:
        # The first look after the bot's start is followed at a share of the steady gap fixed by the run's name: a
        # fleet first seen in one sweep is then due over all the gap's sweeps, not all in one every so often.
        spread = (zlib.crc32(run.name.encode()) % 1000 + 1) / 1000 if run.name not in self.looks else 1.0
        self.looks[run.name] = next_look(verdict, began, run.silence_after, self.registry.bot.check_every,
                                         attention=self._attention(run), spread=spread)

    def _inflight_names(self) -> list[str]:
        return [name for name, task in self._inflight.items() if not task.done()]

    def _sit_out(self) -> set[str]:
        """The runs whose queue waits out this sweep after definite refusals (and count the sweep)."""
        held = set()
        for name, refusal in self._refused.items():
            if refusal[1] > 0:
                refusal[1] -= 1
                held.add(name)
        return held

    def _refusal(self, run_name: str) -> int:
        """Count a definite refusal; returns the sweeps the run's queue now sits out: 0, 1, 3, 7…,
        at most those in `remind_every` (a message held back is tried at least that often)."""
        count = self._refused.get(run_name, [0, 0])[0] + 1
        most = max(0, math.ceil(self.policy.remind_every / max(self.registry.bot.check_every, 1e-3)) - 1)
        skip = min(2 ** min(count - 1, 30) - 1, most)
        self._refused[run_name] = [count, skip]
        return skip

    def _groups(self, due_runs: list[Run]) -> list[tuple[str | None, list[Run]]]:
        """The due runs of each SSH host with several runs together (their outage is one incident); every
        other run with those of its container (or host) it is probed with, judged as soon as that probe is back."""
        by_host: dict[str, list[Run]] = defaultdict(list)
        for run in due_runs:
            by_host[run.host].append(run)
        many = {host for host, n in Counter(r.host for r in self.registry.runs.values()).items() if n >= HOST_GROUP_MIN}
        groups: list[tuple[str | None, list[Run]]] = []
        for host, runs in by_host.items():
            if host in self.registry.hosts and host in many:
                groups.append((host, runs))
            else:
                groups += [(None, batch) for batch in batches(runs, self.probes.group_max)]
        return groups

    async def _probe_all(self, runs: list[Run], wait: float | None = None) -> list[Verdict]:
        """Every run's verdict, in order: one probe per batch of runs sharing a container, all at once (a batch
        whose turn does not come within `wait`: not_probed verdicts)."""
        found: dict[str, Verdict] = {}

        async def one(batch: list[Run]) -> None:
            for run, verdict in zip(batch, await self.probes.check_group(batch, self.verdicts, wait=wait)):
                found[run.name] = verdict

        await asyncio.gather(*(one(batch) for batch in batches(runs, self.probes.group_max)))
        return [found[run.name] for run in runs]

    def _urgency(self, run_name: str) -> int:
        return max((row.priority for row in self.ledger.pending(run_name)), default=0)

    async def _sweep_group(self, host: str | None, runs: list[Run], tried: set[str], held: set[str],
                           round_: _Round, began: float, wait: float | None) -> None:
        try:
            try:
                verdicts = await self._probe_all(runs, wait)
                reached = [(r, v) for r, v in zip(runs, verdicts) if not not_probed(v)]
                self._carried += len(runs) - len(reached)  # their looks stay due: first in line next sweep
                seen = [v for _, v in reached]
                down = outage(host, seen) if host is not None else None
                if host is not None and seen:
                    self.judge(self._host_run(host, runs), down or answering(host, seen))
                    if any(not v.reached and v.failure_kind in HOST_FAILURES for v in seen):
                        self._host_trouble.add(host)  # every run of it looked at next sweep: its outage seen whole
                    else:
                        self._host_trouble.discard(host)
                for run, verdict in reached:
                    self.judge(run, verdict, held=down is not None)
                    self._looked(run, verdict, began)
            finally:
                round_.judged()
            # The decisions on disk before anything is sent (if the disk allows); points alone wait for the
            # sweep's end, so 500 runs' history is one transaction and not 500 fsyncs.
            await self.state_file.flush(decisions_only=True)
            names = [r.name for r in runs] + ([host_key(host)] if host is not None else [])
            for name in sorted((n for n in names if n in self._backlog and n not in held), key=self._urgency, reverse=True):
                if self._urgency(name) < alerts.CRASH_SEVERITY:
                    await round_.wait()  # a crash goes at once; the rest once the sweep's storm, if any, is known
                tried.add(name)
                await self.deliver(name)
        except Exception:  # one run's bug must not end the sweep for the others
            log.exception("watchdog: checking %s failed", host or runs[0].name)

    def _host_run(self, host: str, runs: list[Run]) -> HostRun:
        return HostRun(host_key(host), host, self.registry.bot.alert_channel or runs[0].alert_channel)

    def _channel_of(self, name: str) -> str | None:
        """The alert channel, as configured, that a run's (a host's, a digest's) news goes to; None: not configured."""
        if (run := self.registry.runs.get(name)) is not None:
            return run.alert_channel
        if is_digest_key(name):
            return name.removeprefix(digest_key(""))
        if is_host_key(name):
            runs = [r for r in self.registry.runs.values() if host_key(r.host) == name]
            return self._host_run(runs[0].host, runs).alert_channel if runs else None
        return None

    @property
    def history(self) -> History:
        return self.probes.history

    @property
    def targets(self) -> Any:
        """Where the runs are reached: the scheduler's (a test may put stand-ins there)."""
        return self.probes.targets

    @targets.setter
    def targets(self, targets: Any) -> None:
        self.probes.targets = targets

    async def probe(self, run: Run) -> Verdict:
        """One routine probe (a person's question goes first), with a hard deadline; whatever goes wrong
        comes back as an unreachable verdict."""
        return await self.probes.check(run, previous=self.verdicts.get(run.name), priority=Priority.SWEEP)

    def judge(self, run: Run | HostRun, verdict: Verdict, *, held: bool = False) -> list[int]:
        """Decide, render and commit in one go (no await in between: a mute can't slip in).

        `held`: the run's whole host is down and its own incident tells that; the run holds still."""
        now = self.clock()
        self.verdicts[run.name] = verdict
        self.observer.judged(run.name, verdict)
        seen = Seen((Concern(Worry.HELD),), headline=verdict.headline) if held else Seen.of(verdict)
        new, actions = alerts.decide(self.states.get(run.name), seen, now, self.policy)
        return self._commit(run, new, actions, verdict, now)

    def _commit(self, run: Run | HostRun, new: RunState, actions: list, verdict: Verdict | None, now: float) -> list[int]:
        incident = self.ledger.incidents.get((run.name, new.seq))
        actions = digest.alone(actions, incident is not None and incident.digest is not None)
        messages = []
        for action in actions:
            if isinstance(action, Update):
                messages.append(Outgoing("update", render_alerts.parent(run.name, new, verdict, now, self.tz)))
            else:
                payload = render_alerts.message(run.name, action, new, verdict, now, self.tz)
                concern = getattr(action, "concern", None) or new.concern
                messages.append(Outgoing("post" if isinstance(action, Post) else "reply", payload, run.alert_channel,
                                         priority=concern.severity if concern is not None else 0, note=action.note))
        if messages and getattr(run, "summary", False) and alerts.told_end(actions, new):
            # Right after the message that tells the end, before the parent's edit: the thread reads in order.
            last_said = max(i for i, m in enumerate(messages) if m.op != "update")
            messages.insert(last_said + 1, self._summary(run.name, new, verdict))
        if run.alert_channel is None:
            messages = []
        old = self.states.get(run.name)
        if not messages and old is not None and replace(old, headline="") == replace(new, headline=""):
            self.states[run.name] = new  # only the latest headline changed: memory, no write
            return []
        ids = self.ledger.commit(run.name, new, messages, now)  # before anything is sent
        if run.alert_channel is not None and messages:
            self._unfolded.add(run.alert_channel)
            if any(m.op != "update" for m in messages):
                self._heard(run.alert_channel, run.name, now)
        ids += self._refresh_digests(now)  # an edit of a run told in a digest is an edit of the digest
        if ids:
            self._queued += len(ids)
            self._backlog.add(run.name)
            said = ", ".join(f"{type(a).__name__.lower()} {getattr(a, 'note', '')}".strip() for a in actions)
            log.info("%s: %s (now %s)", run.name, said, new.status.value)
        return ids

    def _summary(self, run_name: str, state: RunState, verdict: Verdict | None) -> Outgoing:
        """The end-of-run summary, a reply in the thread that tells the end (once: the machine tells each end once)."""
        tally = self.history.tally(run_name)
        since = tally.started if tally is not None else math.inf
        earlier = sum(1 for i in self.ledger.incidents.values() if i.run == run_name and i.seq != state.seq and i.opened_at >= since)
        return Outgoing("reply", render_alerts.summary(run_name, tally, verdict, earlier), note=digest.SUMMARY)

    # --- storms: one digest per channel ----------------------------------------------------------

    def _heard(self, channel: str, run_name: str, now: float) -> None:
        news = self._news[channel]
        news[run_name] = now
        for name in [n for n, t in news.items() if now - t >= digest.STORM_WINDOW_S]:
            del news[name]

    def _fold(self, channel: str) -> None:
        """Fold the channel's unsent rows into its digest if it is in a storm (pure: digest.fold), and queue
        the digest's post or edit. No await: nothing is sent between the decision and its rows."""
        self._unfolded.discard(channel)
        now = self.clock()
        rows = [digest.Row(p.id, p.run, p.seq, p.op, p.note, p.priority, p.tried_at is not None, p.digest)
                for p in self.ledger.pending() if not is_digest_key(p.run) and self._channel_of(p.run) == channel]
        plan = digest.fold(rows, self._news.get(channel, {}), now)
        if plan.drop or plan.attach or plan.edit:
            opened = plan.attach and self.ledger.open_digest(channel) is None
            self.ledger.fold(channel, plan, now)
            if opened:
                log.info("%s: %d runs changed at once; their news goes into one digest message", channel,
                         len(self._news.get(channel, {})))
        self._queued += len(self._refresh_digests(now))

    def _refresh_digests(self, now: float) -> list[int]:
        """Queue the post or edit of each digest whose runs changed, rendered as they stand now."""
        ids = []
        for channel, seq in self.ledger.take_stale():
            if (told := self.ledger.incidents.get((digest_key(channel), seq))) is None:
                continue
            members = [(run, state if (state := self.states.get(run)) is not None and state.seq == s else None)
                       for run, s in self.ledger.members(channel, seq)]
            payload = render_alerts.digest(members, told.opened_at, now, self.tz)
            row = self.ledger.tell_digest(channel, seq, payload, now, calm=all(digest.calm(s) for _, s in members),
                                          priority=digest.DIGEST_PRIORITY)
            if row is not None:
                ids.append(row)
                self._backlog.add(digest_key(channel))
        return ids

    async def _deliver_digest(self, channel: str) -> None:
        """The channel's digest goes out now if its last message is EDIT_EVERY_S old (or it was never posted);
        else once that time is up. The sweep's end sends it anyway."""
        key = digest_key(channel)
        if key not in self._backlog:
            return
        sent = [m.sent_at for m in self.ledger.messages.values() if m.run == key and m.sent_at is not None]
        wait = digest.EDIT_EVERY_S - (self.clock() - max(sent)) if sent else 0.0
        if wait <= 0:
            await self.deliver(key)
        elif key not in self._digest_timers:
            async def later() -> None:
                try:
                    await asyncio.sleep(wait)
                    await self._deliver_or_log(key)
                finally:
                    self._digest_timers.pop(key, None)

            self._digest_timers[key] = asyncio.create_task(later(), name=f"digest:{channel}")

    # --- delivery -----------------------------------------------------------------------------

    async def deliver(self, run_name: str) -> None:
        """Send a run's waiting messages in order; stop at the first failure (the next sweep retries).

        Its channel's rows are folded first when it is in a storm, and the channel's digest goes before
        the run's own rows (it carries many runs' first alerts), unless it was edited a moment ago."""
        channel = self._channel_of(run_name)
        if channel is not None and channel in self._unfolded:
            self._fold(channel)
        if channel is not None and not is_digest_key(run_name):
            await self._deliver_digest(channel)
        async with self._sending[run_name]:
            rows = self.ledger.pending(run_name)
            while rows:
                row = rows[0]
                if self._slack_down or self.clock() < self._quiet_until or (row.op != "post" and row.parent_ts is None):
                    break  # Slack is down or asked for quiet, or the thread's parent has not gone out yet
                if not await self._send(row):
                    break
                # A parent that just went out gives the rows behind it their thread, and a storm may have
                # folded the rows behind this one meanwhile: read them again.
                rows = self.ledger.pending(run_name)
            if not self.ledger.pending(run_name):
                self._backlog.discard(run_name)

    async def _deliver_or_log(self, run_name: str) -> None:
        """deliver(), with a surprise (an unmapped slack_sdk error, SQLite busy past its timeout) kept to
        this run: logged, and its rows left for the next sweep (one tried in the call stays in doubt)."""
        try:
            await self.deliver(run_name)
        except Exception:  # noqa: BLE001 - one run's failure must not end the sweep for the others
            log.exception("watchdog: delivering %s's messages failed; they wait for the next sweep", run_name)

    async def _send(self, row: Pending) -> bool:
        async with self._chat_gate:
            fresh = self.ledger.pending_row(row.id)  # a storm may have folded it while this waited for the gate
            return True if fresh is None else await self._send_now(fresh)

    def _held_back(self) -> bool:
        return self._slack_down or self.clock() < self._quiet_until

    async def _send_now(self, row: Pending) -> bool:
        if self._held_back():
            return False
        # Slack's pace per channel: a storm uses the budget, but its last tokens wait for a crash.
        bucket = self._budgets.setdefault(row.channel, Bucket())
        if not bucket.take(self.clock(), reserve=0.0 if row.priority >= alerts.CRASH_SEVERITY else RESERVED):
            return False
        in_doubt = row.tried_at is not None
        self.ledger.trying(row.id, self.clock())  # written before the call: a crash from here on leaves it in doubt
        await self.state_file.flush()
        if not await self.leadership.still_leads():
            # This replica's lock session ended since its tick: another may lead and send this row. Not sent here;
            # the row is in doubt, so whoever sends it first looks for it in Slack (its key) rather than post twice.
            self.ledger.failed(row.id, "not sent: this replica no longer leads", in_doubt=True)
            return False
        if self._held_back():  # Slack failed for another run while this row's doubt was being written
            self.ledger.failed(row.id, "not sent: Slack was failing", in_doubt=in_doubt)
            return False
        text, blocks = row.payload.get("text", ""), row.payload.get("blocks")
        try:
            if in_doubt and row.op != "update" and (ts := await self._find(row)):
                log.info("%s: %s %s was already posted (ts %s); not posting it again", row.run, row.op, row.key, ts)
            elif row.op == "update":
                await self.chat.update(row.channel, row.parent_ts, text, blocks)  # type: ignore[arg-type]
                ts = row.parent_ts
            else:
                ts = await self.chat.post(row.channel, text, blocks, row.parent_ts, key=row.key)
        except ChatError as exc:
            # Slack's state first, before any await: another run's send must see it at once.
            self._slack_down = self._slack_down or exc.transient
            if exc.retry_after:
                self._quiet_until = max(self._quiet_until, self.clock() + min(exc.retry_after, RETRY_AFTER_CAP_S))
            skip = 0 if exc.transient else self._refusal(row.run)
            self.ledger.failed(row.id, str(exc), in_doubt=exc.in_doubt or in_doubt)
            log.warning("%s: %s not delivered (%s attempt%s): %s%s", row.run, row.op, row.attempts + 1,
                        "" if row.attempts == 0 else "s", exc,
                        f"; next try in {skip + 1} sweeps" if skip else "")
            await self.state_file.flush()
            return False
        channel = getattr(self.chat, "channel_id", lambda c: c)(row.channel)
        self.ledger.sent(row, ts, self.clock(), channel=channel)  # after the call
        await self.state_file.flush()
        self._refused.pop(row.run, None)
        return True

    async def _find(self, row: Pending) -> str | None:
        """Look for the message an interrupted attempt may have posted (None: not there, or no way to tell)."""
        find = getattr(self.chat, "find", None)
        if find is None:
            return None
        try:
            # Where to start reading is a ts of Slack's own (the thread's last message we know of):
            # the bot's clock, which may be minutes off, never decides what is looked at.
            thread = row.parent_ts if row.op == "reply" else None
            after = self.ledger.last_ts(row.run, row.seq) if thread else None
            return await find(row.channel, row.key, thread_ts=thread, after_ts=after)
        except ChatError as exc:
            if exc.transient:
                raise
            # No history scope (or a stand-in without the method): a rare duplicate beats a lost alert.
            log.warning("%s: cannot look for an earlier attempt (%s); posting again", row.run, exc)
            return None

    # --- mutes --------------------------------------------------------------------------------

    async def mute(self, run: Run, until: float | None, by: str | None = None) -> RunState:
        """Mute a run until `until` (None: unmute); a live alert's parent is edited to say so.

        Returns once the mute is committed: the edit goes out in the background, so a slow or
        rate-limiting Slack never holds up the command's answer (a failed edit waits for a sweep)."""
        self._leading_or_say()
        now = self.clock()
        new, actions = alerts.mute(self.states.get(run.name), until, now, by)
        if self._commit(run, new, actions, self.verdicts.get(run.name), now):
            self._in_background(self._flush_and_deliver(run.name), f"deliver:{run.name}")
        elif self.states.get(run.name) is new:
            self._in_background(self.state_file.flush(), f"flush:{run.name}")
        return new

    async def _flush_and_deliver(self, run_name: str) -> None:
        await self.state_file.flush()
        await self._deliver_or_log(run_name)

    async def settled(self, timeout: float | None = None) -> None:
        """Wait for the deliveries commands started in the background (tests, a clean stop)."""
        if self._background:
            await asyncio.wait(set(self._background), timeout=timeout)

    def muted_until(self, run_name: str) -> float | None:
        state = self.states.get(run_name)
        return state.muted_until if state is not None and state.muted(self.clock()) else None

    # --- /run watch ---------------------------------------------------------------------------

    async def watch(self, run: Run, channel: str, user: str | None = None) -> tuple[Watch, bool]:
        """Start watching a restart; (the watch, True) — or (the live one in the way, False)."""
        self._leading_or_say()
        now = self.clock()
        live = next((w for w in self.ledger.watches() if w.run == run.name and w.started_at > now - WATCH_LIMIT_S), None)
        if live is not None or run.name in self._trails:
            return live or Watch(run.name, channel, "", now, user), False
        self._trails[run.name] = ()  # claimed before the first await: a second /run watch sees it
        try:
            first = render_alerts.watch_message(run.name, (), None, now, now)
            ts = await self.chat.post(channel, first["text"], first["blocks"])
        except BaseException:
            del self._trails[run.name]
            raise
        watch = Watch(run.name, getattr(self.chat, "channel_id", lambda c: c)(channel), ts, now, user)
        self.ledger.start_watch(watch, stale_before=now - WATCH_LIMIT_S)
        await self.state_file.flush()
        self._schedule_watch(watch)
        return watch, True

    def _schedule_watch(self, watch: Watch) -> None:
        self._trails.setdefault(watch.run, ())
        if self.scheduler is not None:
            self.scheduler.add_job(self.watch_tick, "interval", seconds=self.watch_every, args=[watch.run],
                                   id=f"watch:{watch.run}", replace_existing=True, max_instances=1, coalesce=True,
                                   next_run_time=datetime.now(self.scheduler.timezone))

    async def watch_tick(self, run_name: str) -> str | None:
        """One look at a watched run: edit the message; returns why the watch ended, or None."""
        watch = next((w for w in self.ledger.watches() if w.run == run_name), None)
        run = self.registry.runs.get(run_name)
        if watch is None or run is None:
            self._end_watch(run_name)
            return "gone"
        verdict = await self.probe(run)
        now = self.clock()
        trail = render_alerts.advance(self._trails.get(run_name, ()), render_alerts.watch_stage(verdict))
        self._trails[run_name] = trail
        done = render_alerts.watch_outcome(verdict, watch.started_at, now, WATCH_LIMIT_S)
        message = render_alerts.watch_message(run_name, trail, done, watch.started_at, now)
        try:
            await self.chat.update(watch.channel, watch.ts, message["text"], message["blocks"])
        except ChatError as exc:  # progress, not an alert: the next tick shows the newer state anyway
            log.warning("watch %s: edit failed: %s", run_name, exc)
        if done:
            self._end_watch(run_name)
        return done

    def _end_watch(self, run_name: str) -> None:
        self.ledger.end_watch(run_name)
        self._trails.pop(run_name, None)
        if self.scheduler is not None and self.scheduler.get_job(f"watch:{run_name}"):
            self.scheduler.remove_job(f"watch:{run_name}")

    # --- the scheduler ------------------------------------------------------------------------

    def start(self) -> None:
        """Start sweeping on the running event loop (APScheduler 3's AsyncIOScheduler), and resume watches."""
        from apscheduler.schedulers.asyncio import AsyncIOScheduler

        self.scheduler = AsyncIOScheduler(event_loop=asyncio.get_running_loop())
        every = self.registry.bot.check_every
        self.scheduler.add_job(self.tick, "interval", seconds=every, id="sweep", max_instances=1,
                               coalesce=True, misfire_grace_time=None, next_run_time=datetime.now(self.scheduler.timezone))
        self.scheduler.start()
        logging.getLogger("apscheduler").setLevel(logging.WARNING)  # not two lines a sweep about running a job
        if self.leads:  # a replica resumes them when it comes to lead
            self._resume_watches()
        log.info("watchdog: %d runs every %g s", len(self.registry.runs), every)

    def _resume_watches(self) -> None:
        now = self.clock()
        for watch in self.ledger.watches():
            if watch.started_at > now - WATCH_LIMIT_S and watch.run in self.registry.runs:
                self._schedule_watch(watch)
            else:
                self.ledger.end_watch(watch.run)

    @property
    def leads(self) -> bool:
        return self.leadership.role is Role.LEADER

    def _leading_or_say(self) -> None:
        """A standby changes no state: its view of the shared ledger is stale, and the leader would write over it."""
        if not self.leads:
            raise StandingBy("this runbot replica stands by; the leader takes mutes and watches — ask again "
                             "(Slack hands the next request to either)")

    async def tick(self) -> Role:
        """The sweep job: lead or stand by, then sweep if leading. A replica that has just come to lead reads the
        ledger the leader before it wrote (its incidents, threads and outbox), then resumes its watches."""
        was = self.leadership.role
        role = await self.leadership.check()
        if role is Role.STANDBY:
            return role
        # Cut off from the database, it sweeps on from memory (its sends are held: still_leads says no); taking the
        # lock back with nobody having led in between, its memory is the latest and is written whole, not reloaded.
        if role is Role.LEADER and self.leadership.needs_reload():
            await self._take_over()
        await self._scheduled_sweep()
        return role

    async def _take_over(self) -> None:
        if not await self.state_file.reload():
            log.warning("watchdog: leading without the shared state's latest (it cannot be read now)")
        self._backlog = {row.run for row in self.ledger.pending()}
        self._unfolded = {c for row in self.ledger.pending() if (c := self._channel_of(row.run))}
        self._resume_watches()
        log.info("watchdog: leading %d runs (%d incidents open, %d messages waiting)", len(self.registry.runs),
                 sum(i.closed_at is None for i in self.ledger.incidents.values()), len(self.ledger.pending()))

    async def _scheduled_sweep(self) -> None:
        # The sweep job returns before the next tick, so a slow host never holds up the next sweep.
        try:
            await self.sweep(wait=self.registry.bot.check_every * 0.9)
        except asyncio.CancelledError:  # the scheduler's shutdown cancels a running job: that is a stop, not an error
            log.debug("sweep cancelled by shutdown")
            return
        except Exception as exc:  # noqa: BLE001 - logged; the prune and the next sweep still happen
            log.exception("watchdog: the sweep failed")
            self.observer.sweep_failed(f"the sweep failed: {type(exc).__name__}")
        self.ledger.prune(self.clock() - KEEP_SENT_S)
        await self.state_file.flush()  # the sweep's last changes, and a retry of a failing disk

    async def stop(self) -> None:
        if self.scheduler is not None and self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        await self.settled(timeout=2.0)  # a mute's edit under way: a moment to land, else it waits in the outbox
        # A digest edit waiting for its turn waits in the outbox instead (the next start sends it).
        tasks = [t for t in (*self._inflight.values(), *self._background, *self._digest_timers.values()) if not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.state_file.flush()  # what the last sweep decided, on disk before the bot goes


async def on_start(services: Any) -> None:
    """bot.service.serve's start hook: the state file, the watchdog on this loop, both handed to listeners via Services."""
    if services.store is None:
        services.store = StateFile.open(services.registry.bot.state_db)
    # Services.chat is the Web API client; anything with chat_postMessage gets the adapter.
    chat = SlackChat(services.chat) if hasattr(services.chat, "chat_postMessage") else services.chat
    clock = getattr(services, "clock", None) or time.time
    bot = services.registry.bot
    services.store.retention = (bot.history_full, bot.history_every, bot.history_keep)
    if services.history is None:
        services.history = History(services.store, clock=clock, runs=list(services.registry.runs))
    observer = getattr(services, "observer", None)  # bot.service.monitoring's, when [bot] asks for one
    if observer is not None:
        chat = ObservedChat(chat, observer)
    services.watchdog = Watchdog(services.registry, services.targets, services.store, chat, clock=clock,
                                 scheduler=services.scheduler, observer=observer)
    services.watchdog.leadership = leadership_for(bot.state_db)
    services.watchdog.start()


async def on_stop(services: Any) -> None:
    if services.watchdog is not None:
        await services.watchdog.stop()
        services.watchdog.leadership.close()  # the lock goes with its session: a standby leads at its next tick
    if services.store is not None:
        services.store.close()
