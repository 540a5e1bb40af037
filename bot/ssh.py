"""SSH runner: one kept-open asyncssh connection per host, capped channels, clear verdicts."""

from __future__ import annotations

import asyncio
import math
import os
import shlex
import signal
import socket
import time
from dataclasses import dataclass, replace
from typing import Mapping

import asyncssh

from bot.proxmox import pct_failure
from bot.runners import RunResult

DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "/etc/ssh/ssh_known_hosts")
_CLOSE_WAIT_S = 2.0  # how long close() waits for a connection to say goodbye
# How long a timed-out channel keeps its slot at most, waiting for the remote `timeout`
# (command time + _REMOTE_GRACE_S + _REMOTE_KILL_S) to end the command and free the session.
REAP_WAIT_S = 15.0
_REMOTE_GRACE_S = 2  # the remote timeout fires after ours, so the verdict is always ours
_REMOTE_KILL_S = 3  # TERM first, then KILL (which also takes down `timeout` itself)


@dataclass(frozen=True)
class SshTarget:
    """How to reach one host (built from the config's [hosts.*] entry)."""

    name: str
    address: str
    port: int = 22
    user: str = "root"
    key: str | None = None  # private key file; None: the agent and ~/.ssh/id_* defaults
    known_hosts: str | None = None  # None: the usual files (never "no verification")
    jump: str | None = None  # "user@bastion:22", or the name of another [hosts.*] entry
    connect_timeout: float = 10.0
    command_timeout: float = 60.0  # upper bound on any one probe, whatever the caller asks
    keepalive: float = 30.0
    max_channels: int = 8  # below OpenSSH's MaxSessions (10) so bursts never get refused

    @property
    def known_hosts_files(self) -> list[str]:
        """The known_hosts files to trust: the configured one, else the usual ones that exist."""
        if self.known_hosts:
            return [os.path.expanduser(self.known_hosts)]
        found = [p for p in map(os.path.expanduser, DEFAULT_KNOWN_HOSTS) if os.path.exists(p)]
        # Missing altogether: still name the user's file, so the error says what to create.
        return found or [os.path.expanduser(DEFAULT_KNOWN_HOSTS[0])]

    @property
    def where(self) -> str:
        return f"{self.name} ({self.user}@{self.address}:{self.port})"


class SshFailure(Exception):
    """Could not get a usable connection; carries the user-facing verdict."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.message, self.kind = message, kind


class SshHost:
    """One host: a single lazily opened connection shared by all probes, and a channel cap."""

    def __init__(self, target: SshTarget, jump: "SshHost | None" = None) -> None:
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
                    known_hosts=t.known_hosts_files,
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
            raise _connect_failure(exc, t, self._jump.target if self._jump else None) from exc
        self._conn = conn
        self.connects += 1
        return conn

    async def run(self, command: str, *, timeout: float, what: str) -> RunResult:
        """Run command on the shared connection: retry once on a fresh one if it died."""
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
            return await self._run_with_retry(command, timeout, what, started, slot)
        finally:
            self.active -= 1
            slot.release()

    async def _run_with_retry(self, command: str, timeout: float, what: str, started: float, slot: "_Slot") -> RunResult:
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
                return await self._exec(conn, command, deadline, started, slot, timed_out)
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
                            f"{self.target.where} refused a new SSH session ({exc.reason}) until the "
                            f"probe's deadline: is its sshd MaxSessions below max_channels={self.target.max_channels}?",
                            "unreachable",
                        )
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 0.5)
                    continue
            except (asyncssh.Error, OSError, EOFError) as exc:
                if not conn.is_closed():
                    return fail(f"SSH error on {self.target.where}: {_reason(exc)}", "unreachable")
                exc_lost = exc
            # The connection died under us (sshd restarted, host rebooted, network cut).
            # Probes are read-only, so running one again on a fresh connection is safe.
            if reconnected:
                return fail(f"lost the SSH connection to {self.target.where} twice in a row: {_reason(exc_lost)}", "unreachable")
            stale, reconnected = conn, True

    async def _exec(self, conn, command: str, deadline: float, started: float, slot: "_Slot", timed_out: RunResult) -> RunResult:
        budget = deadline - time.monotonic()
        try:
            # Opening the channel counts against the deadline too: a frozen sshd may never answer.
            proc = await asyncio.wait_for(
                conn.create_process(command, stdin=asyncssh.DEVNULL, encoding=None), max(budget, 0.001)
            )
        except asyncio.TimeoutError:
            self.timeouts += 1
            return replace(timed_out, elapsed_s=time.monotonic() - started)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), max(deadline - time.monotonic(), 0.001))
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


class SshRunner:
    """Runner for one run on one host, inside container `container` when it is set."""

    def __init__(self, host: SshHost, container: int | None) -> None:
        self.host = host
        self.container = container

    def command(self, script: str, timeout: float) -> str:
        """The remote command line: bash -c <script>, inside `pct exec` for a container."""
        inner = f"bash -c {shlex.quote(script)}"
        if self.container is not None:
            inner = f"pct exec {int(self.container)} -- {inner}"
        # A remote `timeout` on the host (coreutils, outside the container) ends a hung probe
        # even though we log in as root, whose sessions OpenSSH will not signal; until the
        # command exits, sshd keeps its session and its MaxSessions slot.
        limit = math.ceil(timeout) + _REMOTE_GRACE_S
        return f"timeout -k {_REMOTE_KILL_S} {limit} {inner}"

    async def run(self, script: str, *, timeout: float) -> RunResult:
        t = self.host.target
        what = t.name if self.container is None else f"{t.name} (container {self.container})"
        timeout = min(timeout, t.command_timeout)
        result = await self.host.run(self.command(script, timeout), timeout=timeout, what=what)
        if result.failure is None and self.container is not None:
            verdict = pct_failure(
                result.stdout.decode(errors="replace"),
                result.stderr.decode(errors="replace"),
                self.container,
                t.name,
            )
            if verdict:
                return replace(result, failure=verdict, failure_kind="container")
        return result


class SshPool:
    """Every configured host's SshHost, created on first use; jump hosts shared."""

    def __init__(self, targets: Mapping[str, SshTarget]) -> None:
        self._targets = dict(targets)
        self._hosts: dict[str, SshHost] = {}
        self._resolving: set[str] = set()

    def host(self, name: str) -> SshHost:
        """The SshHost for a configured host name (KeyError for an unknown one)."""
        if name not in self._hosts:
            if name in self._resolving:
                raise ValueError(f"jump hosts loop back to {name!r}")
            self._resolving.add(name)
            try:
                target = self._targets[name]
                self._hosts[name] = SshHost(target, self._jump_for(target))
            finally:
                self._resolving.discard(name)
        return self._hosts[name]

    def _jump_for(self, target: SshTarget) -> SshHost | None:
        if not target.jump:
            return None
        if target.jump in self._targets and target.jump != target.name:
            return self.host(target.jump)
        key = f"jump:{target.jump}|{target.key}|{target.known_hosts}"
        if key not in self._hosts:
            self._hosts[key] = SshHost(_parse_jump(target))
        return self._hosts[key]

    def runner(self, host_name: str, container: int | None = None) -> SshRunner:
        return SshRunner(self.host(host_name), container)

    def stats(self) -> dict[str, dict]:
        return {name: h.stats() for name, h in self._hosts.items()}

    async def close(self) -> None:
        # Targets before their jump hosts, whose connections carry theirs.
        hosts = sorted(self._hosts.values(), key=lambda h: h._jump is None)
        for h in hosts:
            await h.close()


def _parse_jump(target: SshTarget) -> SshTarget:
    """SshTarget for `jump = "[user@]host[:port]"`, with the target's key and known_hosts."""
    spec = target.jump or ""
    user, _, hostport = spec.rpartition("@")
    host, port = hostport, 22
    if hostport.startswith("["):  # [v6addr]:port
        host, _, rest = hostport[1:].partition("]")
        port = int(rest[1:]) if rest.startswith(":") else 22
    elif hostport.count(":") == 1:
        host, p = hostport.split(":")
        port = int(p)
    return replace(target, name=f"jump host {host}", address=host, port=port, user=user or target.user, jump=None)


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


def _reason(exc: BaseException) -> str:
    return getattr(exc, "reason", None) or str(exc) or type(exc).__name__


def _connect_failure(exc: BaseException, t: SshTarget, jump: SshTarget | None) -> SshFailure:
    """Turn whatever connecting raised into a verdict that names the host and the fix."""
    if isinstance(exc, SshFailure):
        return exc
    via = f" via {jump.where}" if jump else ""
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        return SshFailure(_hostkey_message(t), "hostkey")
    if isinstance(exc, asyncssh.PermissionDenied):
        keys = f"key {t.key}" if t.key else "the ssh-agent and default keys (~/.ssh/id_*)"
        return SshFailure(
            f"{t.where} refused our SSH key ({keys}): add the public key to "
            f"~{t.user}/.ssh/authorized_keys there, or set `key` for this host",
            "auth",
        )
    if isinstance(exc, (asyncssh.KeyImportError, asyncssh.KeyEncryptionError)):
        return SshFailure(
            f"cannot use the SSH key {t.key} for {t.name}: {exc} "
            "(a passphrase-protected key must be loaded into ssh-agent, with `key` unset)",
            "auth",
        )
    if isinstance(exc, OSError) and exc.filename and t.key and os.path.expanduser(t.key) in str(exc.filename):
        return SshFailure(f"cannot read the SSH key {t.key} for {t.name}: {exc.strerror}", "auth")
    if isinstance(exc, OSError) and exc.filename and str(exc.filename) in t.known_hosts_files:
        return SshFailure(
            f"cannot read known_hosts {exc.filename} for {t.name}: {exc.strerror}; "
            f"see docs/ssh.md to add {t.address}'s host key",
            "hostkey",
        )
    if isinstance(exc, socket.gaierror):
        return SshFailure(f"cannot resolve {t.name}'s address {t.address!r}{via}: {exc.strerror}", "unreachable")
    if isinstance(exc, ConnectionRefusedError):
        return SshFailure(f"{t.where} refused the connection{via}: is sshd running there?", "unreachable")
    if isinstance(exc, ConnectionResetError):
        return SshFailure(f"{t.where} reset the connection{via} (sshd restarting, or a firewall?)", "unreachable")
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return SshFailure(
            f"no answer from {t.where}{via} within {t.connect_timeout:g} s (host down, or a firewall dropping SSH?)",
            "unreachable",
        )
    if isinstance(exc, asyncssh.ChannelOpenError):  # the jump host could not reach the target
        return SshFailure(f"{jump.where if jump else 'the jump host'} could not reach {t.where}: {exc.reason}", "unreachable")
    if isinstance(exc, asyncssh.ConnectionLost):
        return SshFailure(
            f"{t.where} closed the connection during the SSH handshake{via} (sshd overloaded, MaxStartups, or a firewall?)",
            "unreachable",
        )
    if isinstance(exc, OSError):
        return SshFailure(f"cannot reach {t.where}{via}: {exc.strerror or exc}", "unreachable")
    return SshFailure(f"SSH to {t.where}{via} failed: {_reason(exc)}", "unreachable")


def _hostkey_message(t: SshTarget) -> str:
    """Unknown key or changed key: the fixes differ, so say which."""
    files = t.known_hosts_files
    path = " or ".join(files)
    entry = t.address if t.port == 22 else f"[{t.address}]:{t.port}"
    try:
        keys, ca_keys, *_ = asyncssh.read_known_hosts(files).match(t.address, t.address, t.port)
        known = bool(keys or ca_keys)
    except (OSError, ValueError, asyncssh.Error):
        known = False
    if known:
        return (
            f"{t.where} presented a host key that does NOT match {path}: refusing to connect. "
            "If the host was reinstalled, verify its new fingerprint out of band, then "
            f"`ssh-keygen -R '{entry}' -f {files[0]}` and add the new key (docs/ssh.md)"
        )
    return (
        f"{t.where}'s host key is not in {path}: refusing to connect to an unverified host. "
        f"Add it with `ssh-keyscan -p {t.port} {t.address} >> {files[0]}` and check the fingerprint "
        "against the host's own `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` (docs/ssh.md)"
    )
