"""SSH runner: one kept-open asyncssh connection per host, capped channels, clear verdicts."""

from __future__ import annotations

import math
import shlex
from typing import Mapping

from bot.probe.proxmox import pct_exec_argv, with_pct_verdict
from bot.probe.runners import RunResult

# SshHost and SshFailure live in their own modules; bot.probe.ssh stays the one import callers need.
from bot.probe.ssh_connection import REAP_WAIT_S, SshHost
from bot.probe.ssh_errors import DEFAULT_KNOWN_HOSTS, SshFailure, known_hosts_files
from config.registry import Host, jump_host

__all__ = ["DEFAULT_KNOWN_HOSTS", "REAP_WAIT_S", "Host", "SshFailure", "SshHost", "SshPool", "SshRunner",
           "known_hosts_files"]
# The remote `timeout` wrapped around every command (see SshRunner.command): a timed-out
# channel keeps its slot up to REAP_WAIT_S (bot.probe.ssh_connection) while it ends the command.
_REMOTE_GRACE_S = 2  # the remote timeout fires after ours, so the verdict is always ours
_REMOTE_KILL_S = 3  # TERM first, then KILL (which also takes down `timeout` itself)


class SshRunner:
    """Runner for one run on one host, inside container `container` when it is set."""

    def __init__(self, host: SshHost, container: int | None) -> None:
        self.host = host
        self.container = container

    def command(self, script: str, timeout: float) -> str:
        """The remote command line: bash -c <script>, inside `pct exec` for a container."""
        bash = ["bash", "-c", script]
        inner = shlex.join(bash if self.container is None else pct_exec_argv(self.container, *bash))
        # A remote `timeout` on the host (coreutils, outside the container) ends a hung probe
        # even though we log in as root, whose sessions OpenSSH will not signal; until the
        # command exits, sshd keeps its session and its MaxSessions slot.
        limit = math.ceil(timeout) + _REMOTE_GRACE_S
        return f"timeout -k {_REMOTE_KILL_S} {limit} {inner}"

    async def run(self, script: str, *, timeout: float, limit: int | None = None) -> RunResult:
        t = self.host.target
        what = t.name if self.container is None else f"{t.name} (container {self.container})"
        timeout = min(timeout, t.command_timeout)
        result = await self.host.run(self.command(script, timeout), timeout=timeout, what=what, limit=limit)
        return result if self.container is None else with_pct_verdict(result, self.container, t.name)


class SshPool:
    """Every configured host's SshHost, created on first use; jump hosts shared."""

    def __init__(self, hosts: Mapping[str, Host]) -> None:
        self._targets = dict(hosts)
        self._hosts: dict[str, SshHost] = {}
        self._resolving: set[str] = set()

    def host(self, name: str) -> SshHost:
        """The SshHost for a configured host name (KeyError for an unknown one)."""
        if name not in self._hosts:
            if name in self._resolving:  # the configuration refuses loops; a pool built by hand may not
                raise ValueError(f"jump hosts loop back to {name!r}")
            self._resolving.add(name)
            try:
                target = self._targets[name]
                self._hosts[name] = SshHost(target, self._jump_for(target))
            finally:
                self._resolving.discard(name)
        return self._hosts[name]

    def _jump_for(self, target: Host) -> SshHost | None:
        jump = jump_host(target, self._targets)  # the config's rule, so what was validated is what connects
        if jump is None:
            return None
        if target.jump in self._targets:
            return self.host(jump.name)
        key = f"jump:{target.jump}|{target.key}|{target.known_hosts}"
        if key not in self._hosts:
            self._hosts[key] = SshHost(jump)
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

