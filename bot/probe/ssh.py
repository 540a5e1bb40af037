"""SSH runner: one kept-open asyncssh connection per host, capped channels, clear verdicts."""

from __future__ import annotations

import math
import os
import shlex
from dataclasses import dataclass, replace
from typing import Mapping

from bot.probe.proxmox import pct_failure
from bot.probe.runners import RunResult

# SshHost and SshFailure live in their own modules; bot.probe.ssh stays the one import callers need.
from bot.probe.ssh_connection import REAP_WAIT_S, SshHost
from bot.probe.ssh_errors import SshFailure

__all__ = ["DEFAULT_KNOWN_HOSTS", "REAP_WAIT_S", "SshFailure", "SshHost", "SshPool", "SshRunner", "SshTarget"]

DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "/etc/ssh/ssh_known_hosts")
# The remote `timeout` wrapped around every command (see SshRunner.command): a timed-out
# channel keeps its slot up to REAP_WAIT_S (bot.probe.ssh_connection) while it ends the command.
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
        hosts = sorted(self._hosts.values(), key=lambda h: h.jump is None)
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
