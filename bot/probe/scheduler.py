"""The one probe scheduler: every probe — a /run command, a button, a CLI call, a watchdog sweep — goes through it.

It applies the caps once (per host, then overall), serves a person's question before a sweep's
routine look — its turn at the gates and its parse —, lets concurrent questions about a run share one
probe, bounds how long a question (or a sweep's look) waits for its turn, and adds what each probe saw
to the runs' memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import math
import itertools
import os
import queue
import threading
import time
from collections import deque
from concurrent.futures import Executor, Future
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from bot.core.diagnose import unreachable
from bot.core.learned import Learned
from bot.core.verdict import Verdict
from bot.probe.checkup import PROBE_GRACE_S, check_group_within, check_within
from bot.probe.looks import Looks
from config.registry import LOCAL, Registry, Run

if TYPE_CHECKING:
    from bot.core.host_view import HostView

# Probes at once, whatever their host. A local probe costs ~85 ms of CPU in bash and its children and
# ~20-40 ms of parsing in this process: on 2 cores, 50 at once pushed the ack p99 to 1.2 s, 16 to
# 280 ms, 8 to 70 ms (bench/slack_ack.py --runs 50). Acks come first: Slack drops a command it has
# not heard back about in 3 s.
PROBES_AT_ONCE = max(8, 4 * (os.cpu_count() or 2))
LOCAL_PROBES = 16  # at once on this machine (an SSH host's own cap is its max_channels)
ASK_RESERVED = 1  # slots of each host's gate only a person's question may take
# A verdict this young answers anyone else who asks about the run: 200 `/run runs` in 10 s over
# 20 runs are then a probe of each run every few seconds, not one per command. Short enough that
# "4 s ago" is still true.
FRESH_S = 3.0
BUSY = "busy"  # a verdict's failure_kind when no probe was made: the turn did not come in time
# A question keeps its run on the watchdog's every-sweep cadence this long (bot.core.cadence.Why.ASKED):
# someone looking at a run is a reason to look at it too.
ASKED_RECENTLY_S = 600.0
# Runs of one container probed by one script at most: the script reads their logs one after another
# (~10-30 ms each), so a batch answers within a second, and a slow log delays at most its batch.
GROUP_MAX = 16


def batches(runs: Iterable[Run], most: int = GROUP_MAX) -> list[list[Run]]:
    """The runs grouped by where they live — a host's container, or a host itself for CT-less and local runs —
    in batches of at most `most`, in the order given: each batch is one probe, one round trip."""
    where: dict[tuple[str, int | None], list[Run]] = {}
    for run in runs:
        where.setdefault((run.host, run.container), []).append(run)
    return [group[i:i + most] for group in where.values() for i in range(0, len(group), most)]


K = TypeVar("K")
T = TypeVar("T")


class Priority(enum.IntEnum):
    """Who is waiting: a person (served first) or the watchdog's routine sweep."""

    SWEEP = 0
    ASK = 1


class FairGate:
    """A semaphore whose waiters are served by priority, then in arrival order, and that keeps `reserved`
    slots for people: a sweep queued at a host never stands between a person and their answer, and a
    sweep's long probes never hold every slot when a question comes."""

    def __init__(self, capacity: int, reserved: int = 0) -> None:
        self.capacity = max(1, capacity)
        self.reserved = min(max(0, reserved), self.capacity - 1)  # a sweep always keeps one slot
        self._free = self.capacity
        self._waiting: dict[Priority, deque[asyncio.Future]] = {p: deque() for p in Priority}

    @property
    def busy(self) -> int:
        return self.capacity - self._free

    @property
    def queued(self) -> int:
        return sum(1 for q in self._waiting.values() for f in q if not f.done())

    def _may_take(self, priority: Priority) -> bool:
        return self._free > (0 if priority is Priority.ASK else self.reserved)

    async def acquire(self, priority: Priority) -> None:
        if self._may_take(priority) and not self._queued_at_or_above(priority):
            self._free -= 1
            return
        turn = asyncio.get_running_loop().create_future()
        self._waiting[priority].append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.release()  # handed the slot in the same moment it gave up: pass it on
            raise

    def _queued_at_or_above(self, priority: Priority) -> bool:
        return any(not f.done() for p, q in self._waiting.items() if p >= priority for f in q)

    def release(self) -> None:
        self._free = min(self.capacity, self._free + 1)
        for priority in sorted(Priority, reverse=True):
            queue = self._waiting[priority]
            while queue and self._may_take(priority):
                turn = queue.popleft()
                if not turn.done():
                    self._free -= 1
                    turn.set_result(None)  # the slot goes straight to the waiter: nobody can take it in between
                    return

    @contextlib.asynccontextmanager
    async def slot(self, priority: Priority) -> AsyncIterator[None]:
        await self.acquire(priority)
        try:
            yield
        finally:
            self.release()


def not_probed(verdict: Verdict) -> bool:
    """Was this no probe at all (its turn did not come in time)? Such a verdict says nothing about the run."""
    return verdict.failure_kind == BUSY


class ParseQueue:
    """One parse thread for everyone, a person's work first. Parsing is CPU under one GIL: a second thread adds no
    throughput, it only shares the CPU between a sweep and a question; one thread that always takes the most
    urgent work next makes a sweep's parsing wait while a question's runs. The checkup hands in a group probe's
    parse one run at a time, so a question waits at most one run's parse (~30 ms), never a sweep's remaining work."""

    def __init__(self) -> None:
        self._work: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count()  # arrival order within a priority
        self._thread: threading.Thread | None = None
        self._start = threading.Lock()

    def lane(self, priority: Priority) -> Executor:
        """An Executor whose work goes into this queue at `priority` (what run_in_executor is given)."""
        return _Lane(self, priority)

    def submit(self, priority: Priority, fn: Callable[..., T], *args: Any) -> Future:
        future: Future = Future()
        self._work.put((-priority, next(self._order), future, fn, args))
        with self._start:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="parse", daemon=True)
                self._thread.start()
        return future

    def _serve(self) -> None:
        while True:
            _, _, future, fn, args = self._work.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits it
                future.set_exception(exc)


class _Lane(Executor):
    def __init__(self, parse: ParseQueue, priority: Priority) -> None:
        self.parse, self.priority = parse, priority

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[override]
        return self.parse.submit(self.priority, (lambda: fn(*args, **kwargs)) if kwargs else fn, *args)


class Shared(Generic[K, T]):
    """One call per key at a time: whoever asks while it runs, or within `fresh` seconds of its answer, gets that
    answer. `keep` says which answers may be handed out again (a "busy" answer was no probe at all)."""

    def __init__(self, clock: Callable[[], float], fresh: float = FRESH_S,
                 keep: Callable[[T], bool] = lambda answer: True) -> None:
        self.clock, self.fresh, self.keep = clock, fresh, keep
        self._running: dict[K, asyncio.Future] = {}
        self._answers: dict[K, tuple[T, float]] = {}  # key -> (answer, clock() it came)

    async def get(self, key: K, call: Callable[[], Awaitable[T]]) -> T:
        answer = self._answers.get(key)
        if answer is not None and self.clock() - answer[1] < self.fresh:
            return answer[0]
        running = self._running.get(key)
        if running is None:
            running = self._running[key] = asyncio.ensure_future(call())
            running.add_done_callback(lambda done: self._settled(key, done))
        return await asyncio.shield(running)  # a caller that gives up must not cancel the others' call

    def _settled(self, key: K, done: asyncio.Future) -> None:
        self._running.pop(key, None)
        if not done.cancelled() and done.exception() is None and self.keep(done.result()):
            self._answers[key] = (done.result(), self.clock())

    def forget(self) -> None:
        """Hand out no earlier answer again (each next question gets a call of its own)."""
        self._answers.clear()


class Scheduler:
    """Probes runs through `targets`, within the caps; one per process, shared by everyone who asks."""

    def __init__(self, registry: Registry, targets: Any, *, history: Any = None,
                 probes_at_once: int = PROBES_AT_ONCE, local_probes: int = LOCAL_PROBES,
                 clock: Callable[[], float] = time.monotonic, save_probe: Path | None = None) -> None:
        self.registry, self.targets, self.history, self.clock = registry, targets, history, clock
        self.save_probe = save_probe  # keep every probe's raw output here (`--save-probe`)
        self.group_max = GROUP_MAX  # runs one probe reads at most (1: each run its own probe, as canned runners need)
        # A slot of each kept for people (two overall): a question starts at once, even mid-sweep.
        self.overall = FairGate(probes_at_once, reserved=ASK_RESERVED + 1)
        # A sweep never holds more of a host's slots than it may run probes overall: more would only be slots held
        # while waiting for an overall turn, kept from people asking about that host (500 local runs: 15 of
        # the 16 local slots were held, 9 of them waiting, and 50 questions went through the one left).
        sweeping = self.overall.capacity - self.overall.reserved
        self.hosts = {name: self._host_gate(h.max_channels, sweeping) for name, h in registry.hosts.items()}
        self.hosts[LOCAL] = self._host_gate(local_probes, sweeping)
        # Parsing is CPU under one GIL: more threads add no throughput, only starve the event loop (its lag
        # p99 was ~200 ms with the default pool mid-sweep). One thread, questions first (ParseQueue).
        self.parse = ParseQueue()
        self._parsers = {p: self.parse.lane(p) for p in Priority}
        # Questions share probes: of a run by its name ("busy" was no probe: never handed out again), of a host by
        # what was asked of it.
        self.answers: Shared[str, Verdict] = Shared(clock, keep=lambda v: not not_probed(v))
        self.host_answers: Shared[tuple[str, bool, str], HostView] = Shared(clock)
        self.probed = 0
        # What the last look at each run saw of its log, and its parse of it: the next probe sends only what changed.
        self.looks = Looks()
        self._asked: dict[str, float] = {}  # run -> clock() of the last question about it

    @staticmethod
    def _host_gate(capacity: int, sweeping: int) -> FairGate:
        return FairGate(capacity, reserved=max(ASK_RESERVED, capacity - sweeping))

    def asked_lately(self, run_name: str) -> bool:
        """Did a person ask about this run within ASKED_RECENTLY_S?"""
        at = self._asked.get(run_name)
        return at is not None and self.clock() - at < ASKED_RECENTLY_S

    async def check(self, run: Run, *, previous: Verdict | None = None, priority: Priority = Priority.ASK,
                    wait: float | None = None) -> Verdict:
        """Probe one run; whatever goes wrong comes back as a verdict, never as an exception.

        Everyone who asks about a run while a probe of it is running, or within FRESH_S of its answer,
        gets that probe's answer (a team pressing Refresh after an alert costs the host one probe, not
        twenty). A caller with a `previous` verdict (the watchdog) always gets a probe of its own: its
        diagnosis reads what changed since. `wait`: how long a question waits for a turn before the answer
        says runbot is busy (None: the run's probe timeout; math.inf: as long as it takes, for a list of
        every run); a sweep waits as long as it takes, unless given a `wait` (then, past it, the same "busy"
        verdict, which not_probed() tells apart: the watchdog carries that run over to its next sweep).
        """
        if priority is Priority.ASK and wait != math.inf:  # a list of every run is no worry about any one of them
            self._asked[run.name] = self.clock()
        if previous is not None or priority is Priority.SWEEP:
            return await self._probe(run, previous, priority, wait)
        return await self.answers.get(run.name, lambda: self._probe(run, None, priority, wait))

    def _limit(self, priority: Priority, wait: float | None) -> float | None:
        """How long a turn may take: a question's `wait` (None: the probe timeout), a sweep's (None: no limit)."""
        limit = wait if wait is not None else self.registry.bot.probe_timeout if priority is Priority.ASK else math.inf
        return None if math.isinf(limit) else limit

    @contextlib.asynccontextmanager
    async def _turn(self, host_name: str, priority: Priority, limit: float | None) -> AsyncIterator[FairGate | None]:
        """Both gates, the host's first, then the overall one (a probe waiting on a busy host holds no overall slot
        that probes of idle hosts could use). Yields None while holding both, or the gate whose turn did not come
        within `limit` seconds (holding neither)."""
        host = self.hosts.get(host_name, self.hosts[LOCAL])
        started, missed = self.clock(), None
        try:
            async with asyncio.timeout(limit):
                await host.acquire(priority)
        except TimeoutError:
            missed = host
        if missed is not None:
            yield missed
            return
        try:
            try:
                remaining = None if limit is None else max(0.0, limit - (self.clock() - started))
                async with asyncio.timeout(remaining):
                    await self.overall.acquire(priority)
            except TimeoutError:
                missed = self.overall
            if missed is not None:
                yield missed
                return
            try:
                yield None
            finally:
                self.overall.release()
        finally:
            host.release()

    async def _probe(self, run: Run, previous: Verdict | None, priority: Priority, wait: float | None) -> Verdict:
        timeout, started = self.registry.bot.probe_timeout, self.clock()
        async with self._turn(run.host, priority, self._limit(priority, wait)) as missed:
            if missed is not None:
                return self._busy(run, started, missed)
            self.probed += 1
            memory = self.history.recent(run.name) if self.history is not None else ()
            verdict = await check_within(run, self.targets.runner_for, timeout=timeout, previous=previous,
                                         history=memory, save_probe=self.save_probe, parser=self._parsers[priority],
                                         learned=self._learned(run.name, previous), look=self.looks.of(run))
        if self.history is not None:
            self.history.record(run.name, verdict)
        return verdict

    def _learned(self, run: str, previous: Verdict | None) -> Learned | None:
        """What earlier looks learned of the run's log: the runs' memory keeps it (across restarts, with a state
        file); without one, the caller's previous verdict carries it."""
        if self.history is not None:
            return self.history.learned(run)
        return previous.learned if previous is not None else None

    async def check_group(self, runs: Sequence[Run], previous: Mapping[str, Verdict], *,
                          priority: Priority = Priority.SWEEP, wait: float | None = None) -> list[Verdict]:
        """Runs that share a container (or a host) probed in one round trip, one channel and one turn; their
        verdicts in order. One run goes the single-run way (check). `wait`: as in check()."""
        if len(runs) == 1:
            return [await self.check(runs[0], previous=previous.get(runs[0].name), priority=priority, wait=wait)]
        started = self.clock()
        async with self._turn(runs[0].host, priority, self._limit(priority, wait)) as missed:
            if missed is not None:
                return [self._busy(run, started, missed) for run in runs]
            self.probed += 1
            memory = {r.name: self.history.recent(r.name) for r in runs} if self.history is not None else {}
            taught = {r.name: t for r in runs if (t := self._learned(r.name, previous.get(r.name))) is not None}
            verdicts = await check_group_within(runs, self.targets.runner_for,
                                                timeout=self.registry.bot.probe_timeout, previous=previous,
                                                histories=memory, parser=self._parsers[priority], learned=taught,
                                                looks=[self.looks.of(r) for r in runs])
        if self.history is not None:
            for run, verdict in zip(runs, verdicts):
                self.history.record(run.name, verdict)
        return verdicts

    async def host_view(self, host: str, *, discover: bool = False, priority: Priority = Priority.ASK,
                        proc_root: str | None = None) -> HostView:
        """One probe of a host itself (outside every CT), within that host's cap and the overall one. Like
        check(), everyone asking while it runs, or within FRESH_S of its answer, shares it (a team's
        `/run gpus` of one box costs the box one look). `proc_root`: where its /proc is read (only tests set it)."""
        # The host view's modules load with the first host probe: a run's probe (`runbot status`) needs none.
        from bot.probe.host_script import PROC_ROOT  # noqa: PLC0415

        proc_root = PROC_ROOT if proc_root is None else proc_root
        return await self.host_answers.get((host, discover, proc_root),
                                           lambda: self._host_probe(host, discover, priority, proc_root))

    async def _host_probe(self, host: str, discover: bool, priority: Priority, proc_root: str) -> HostView:
        from bot.core.host_view import HostView  # noqa: PLC0415 - see host_view()
        from bot.probe.host_probe import probe_host  # noqa: PLC0415

        gate = self.hosts.get(host, self.hosts[LOCAL])
        async with gate.slot(priority), self.overall.slot(priority):
            self.probed += 1
            timeout = self.registry.bot.probe_timeout
            try:
                async with asyncio.timeout(timeout + PROBE_GRACE_S):
                    return await probe_host(self.targets.host_runner(host), host, discover=discover, timeout=timeout,
                                            proc_root=proc_root)
            except TimeoutError:
                return HostView(host, failure=f"the host probe on {host} took over {timeout:g} s", failure_kind="timeout")

    def _busy(self, run: Run, started: float, gate: FairGate) -> Verdict:
        where = "" if gate is self.overall else " on this machine" if run.host == LOCAL else f" on {run.host}"
        return unreachable(run, f"not probed: runbot waited {self.clock() - started:.0f} s for a turn "
                                f"({gate.busy} probes running{where}, {gate.queued} waiting)", BUSY)
