"""One SSH host's connection: opened once and shared, reopened when it dies, channels capped."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import replace
from typing import TYPE_CHECKING

import asyncssh

from bot.probe.runners import STDERR_CAP, RunResult, read_capped
from bot.probe.ssh_errors import SshFailure, connect_failure, error_reason, known_hosts_files

if TYPE_CHECKING:
    from config.registry import Host

_CLOSE_WAIT_S = 2.0  # how long close() waits for a connection to say goodbye
# How long a timed-out channel keeps its slot at most, waiting for the remote `timeout`
# (command time + _REMOTE_GRACE_S + _REMOTE_KILL_S, see bot.probe.ssh) to end the command and
# free the session.
REAP_WAIT_S = 15.0


class SshHost:
    """One host: a single lazily opened connection shared by all probes, and a channel cap."""

    def __init__(self, target: Host, jump: "SshHost | None" = None) -> None:
        self.target = target
        self._jump = jump
        self._conn: asyncssh.SSHClientConnection | None = None
        # Single flight: every probe that needs a connection while one is being opened awaits
        # that same attempt (and shares its failure) instead of queueing a connect of its own;
        # so a dead host costs one connect_timeout, not one per queued probe.
        self._connecting: asyncio.Future | None = None
        self._slots = asyncio.Semaphore(max(1, target.max_channels))
        self.connects = 0
        self.active = 0
        self.peak_channels = 0
        self.channel_open_refusals = 0  # sshd said no to a session; retried
        self.channel_open_failures = 0  # ...until the deadline: the probe failed
        self.timeouts = 0
        self._reapers: set[asyncio.Task] = set()

    @property
    def jump(self) -> SshHost | None:
        """The host whose connection carries this one's; None for a direct connection."""
        return self._jump

    async def connection(self, stale: asyncssh.SSHClientConnection | None = None):
        """The open connection, opening one if needed; `stale` is one the caller saw die."""
        while True:
            conn = self._conn
            if conn is not None and conn is not stale and not conn.is_closed():
                return conn
            if self._connecting is None:
                if conn is not None:
                    conn.close()  # dead or stale: never keep two connections to one host
                    self._conn = None
                self._connecting = asyncio.ensure_future(self._connect())
                self._connecting.add_done_callback(self._connect_done)
            conn = await asyncio.shield(self._connecting)
            if conn is not stale:
                return conn

    def _connect_done(self, fut: asyncio.Future) -> None:
        if self._connecting is fut:
            self._connecting = None
        if not fut.cancelled():
            fut.exception()  # retrieved here: waiters may all have been cancelled

    async def _connect(self) -> asyncssh.SSHClientConnection:
        t = self.target
        tunnel = await self._jump.connection() if self._jump else ()
        try:
            # The outer wait_for is a backstop: asyncssh's connect_timeout already covers TCP,
            # key exchange and auth.
            conn = await asyncio.wait_for(
                asyncssh.connect(
                    t.address,
                    t.port,
                    tunnel=tunnel,
                    username=t.user,
                    # Always files: known_hosts=None would turn verification off.
                    known_hosts=known_hosts_files(t),
                    client_keys=[os.path.expanduser(t.key)] if t.key else (),
                    # A configured key is the only one offered (like IdentitiesOnly): a full
                    # agent would otherwise use up sshd's MaxAuthTries before it.
                    agent_path=None if t.key else (),
                    # ~/.ssh/config is not read: a HostName, ProxyCommand or
                    # `UserKnownHostsFile none` there must not silently change what we verify.
                    config=None,
                    connect_timeout=t.connect_timeout,
                    keepalive_interval=t.keepalive,
                    keepalive_count_max=3,
                    agent_forwarding=False,
                ),
                t.connect_timeout + 1.0,
            )
        except Exception as exc:  # noqa: BLE001 - every failure becomes a verdict
            raise connect_failure(exc, t, self._jump.target if self._jump else None) from exc
        self._conn = conn
        self.connects += 1
        return conn

    async def run(self, command: str, *, timeout: float, what: str, limit: int | None = None) -> RunResult:
        """Run command on the shared connection: retry once on a fresh one if it died. `limit`: at most that
        many bytes of stdout are read; past it the command is stopped and the result says `truncated`."""
        started = time.monotonic()
        try:
            # Connect before queueing for a channel, so every probe waiting on a dead host
            # shares one attempt rather than paying one connect_timeout per batch of slots.
            await self.connection()
        except SshFailure as f:
            return RunResult(failure=f.message, failure_kind=f.kind, elapsed_s=time.monotonic() - started)
        await self._slots.acquire()
        slot = _Slot(self)
        self.active += 1
        self.peak_channels = max(self.peak_channels, self.active)
        try:
            return await self._run_with_retry(command, timeout, what, started, slot, limit)
        finally:
            self.active -= 1
            slot.release()

    async def _run_with_retry(self, command: str, timeout: float, what: str, started: float, slot: "_Slot",
                              limit: int | None) -> RunResult:
        def fail(msg: str, kind: str) -> RunResult:
            return RunResult(failure=msg, failure_kind=kind, elapsed_s=time.monotonic() - started)

        timed_out = RunResult(failure=f"probe timed out after {timeout:g} s on {what}", failure_kind="timeout")

        deadline = time.monotonic() + timeout  # shared by every attempt and any reconnect
        stale, reconnected, backoff = None, False, 0.01
        while True:
            try:
                conn = await self.connection(stale)
            except SshFailure as f:
                return fail(f.message, f.kind)
            try:
                return await self._exec(conn, command, deadline, started, slot, timed_out, limit)
            except asyncssh.ChannelOpenError as exc:
                if conn.is_closed():
                    exc_lost: BaseException = exc
                else:
                    # sshd frees a finished session a loop pass after our close, so a burst can
                    # briefly exceed MaxSessions: wait a moment and ask again.
                    self.channel_open_refusals += 1
                    if self.active == 1 and not reconnected:
                        # Nothing else of ours runs, yet sshd has no session left: commands we
                        # abandoned hold them all. Only a new connection frees them.
                        stale, reconnected = conn, True
                        continue
                    if time.monotonic() + backoff >= deadline:
                        self.channel_open_failures += 1
                        return fail(
                            f"{self.target.where} refused a new SSH session ({error_reason(exc)}) until the "
                            f"probe's deadline: is its sshd MaxSessions below max_channels={self.target.max_channels}?",
                            "unreachable",
                        )
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 0.5)
                    continue
            except (asyncssh.Error, OSError, EOFError) as exc:
                if not conn.is_closed():
                    return fail(f"SSH error on {self.target.where}: {error_reason(exc)}", "unreachable")
                exc_lost = exc
            # The connection died under us (sshd restarted, host rebooted, network cut).
            # Probes are read-only, so running one again on a fresh connection is safe.
            if reconnected:
                return fail(f"lost the SSH connection to {self.target.where} twice in a row: {error_reason(exc_lost)}", "unreachable")
            stale, reconnected = conn, True

    async def _exec(self, conn, command: str, deadline: float, started: float, slot: "_Slot", timed_out: RunResult,
                    limit: int | None) -> RunResult:
        budget = deadline - time.monotonic()
        try:
            # Opening the channel counts against the deadline too: a frozen sshd may never answer.
            proc = await asyncio.wait_for(
                conn.create_process(command, stdin=asyncssh.DEVNULL, encoding=None), max(budget, 0.001)
            )
        except asyncio.TimeoutError:
            self.timeouts += 1
            return replace(timed_out, elapsed_s=time.monotonic() - started)
        more = False
        try:
            out, err, more = await asyncio.wait_for(_collect(proc, limit), max(deadline - time.monotonic(), 0.001))
        except asyncio.TimeoutError:
            self.timeouts += 1
            slot.hand_over(proc)
            return replace(timed_out, elapsed_s=time.monotonic() - started)
        except (asyncssh.Error, OSError, EOFError):
            proc.close()  # gone with its connection; we keep our slot for the retry
            raise
        except BaseException:  # cancelled: leave it as we leave a timed-out command
            slot.hand_over(proc)
            raise
        if more:  # past the limit: stopped as a timed-out command is, its slot kept until sshd frees the session
            slot.hand_over(proc)
            return RunResult(out, err, None, elapsed_s=time.monotonic() - started, truncated=True)
        if proc.exit_status is None and proc.exit_signal is None and conn.is_closed():
            raise asyncssh.ConnectionLost("connection closed before the command finished")
        return RunResult(out or b"", err or b"", _exit_status(proc), elapsed_s=time.monotonic() - started)

    async def close(self) -> None:
        """Close the connection (a later probe would open a new one)."""
        for task in list(self._reapers):
            task.cancel()
        if self._connecting is not None:
            self._connecting.cancel()  # or it would open a connection nobody closes
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            try:
                await asyncio.wait_for(conn.wait_closed(), _CLOSE_WAIT_S)
            except (asyncio.TimeoutError, OSError, asyncssh.Error):
                pass

    def stats(self) -> dict:
        return {
            "connects": self.connects,
            "peak_channels": self.peak_channels,
            "active_channels": self.active,
            "channel_open_refusals": self.channel_open_refusals,
            "channel_open_failures": self.channel_open_failures,
            "timeouts": self.timeouts,
            "connected": self._conn is not None and not self._conn.is_closed(),
        }


class _Slot:
    """One of a host's channel slots; a timed-out channel keeps it until sshd frees the session."""

    def __init__(self, host: SshHost) -> None:
        self._host = host
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._host._slots.release()

    def hand_over(self, proc) -> None:
        """Abandon a timed-out command; the slot is released once its channel is really closed."""
        # OpenSSH keeps a session, and its MaxSessions slot, until the command exits, even after
        # we close the channel; counting it as busy until then keeps us under MaxSessions.
        self._held = False
        task = asyncio.ensure_future(_abandon(proc))
        self._host._reapers.add(task)
        task.add_done_callback(self._reaped)

    def _reaped(self, task: asyncio.Task) -> None:
        self._host._reapers.discard(task)
        self._host._slots.release()


async def _collect(proc, limit: int | None) -> tuple[bytes, bytes, bool]:
    """communicate(), or with a `limit` at most that many bytes of stdout (and STDERR_CAP of stderr) held:
    asyncssh stops taking data past its window while nobody reads, so the bot never holds more."""
    if limit is None:
        out, err = await proc.communicate()
        return out, err, False
    errs = asyncio.ensure_future(read_capped(proc.stderr, STDERR_CAP, drain=True))
    try:
        out, more = await read_capped(proc.stdout, limit)
        if more:
            return out, b"", True
        err, _ = await errs
    finally:
        errs.cancel()
    await proc.wait_closed()
    return out, err, False


async def _abandon(proc) -> None:
    """Kill a timed-out command and close its channel, leaving the connection usable."""
    # The `signal` request works for non-root logins only (OpenSSH ignores it for root, which
    # pct needs); the remote `timeout` wrapper (see SshRunner.command) is what ends it there.
    try:
        proc.send_signal("KILL")
    except (OSError, asyncssh.Error, ValueError):
        pass
    proc.close()
    try:
        await asyncio.wait_for(proc.wait_closed(), REAP_WAIT_S)
    except (asyncio.TimeoutError, OSError, asyncssh.Error):
        pass


def _exit_status(proc) -> int | None:
    if proc.exit_status is not None and proc.exit_status >= 0:
        return proc.exit_status
    if proc.exit_signal:  # like subprocess: -N for "killed by signal N"
        try:
            return -int(signal.Signals["SIG" + proc.exit_signal[0]])
        except KeyError:
            return -1
    return None
