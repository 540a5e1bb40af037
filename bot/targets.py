"""Which Runner reaches a run: this machine for `host = "local"`, a pooled SSH connection otherwise (shell)."""

from __future__ import annotations

from typing import Mapping

from bot.runners import LocalRunner, Runner
from config.registry import LOCAL, Registry, Run


class Targets:
    """Hands out runners; SSH connections are opened lazily, one per host, and closed together."""

    def __init__(self, registry: Registry, *, local_env: Mapping[str, str] | None = None) -> None:
        self._registry = registry
        self._local = LocalRunner(local_env)
        self._pool = None  # created on first use so local-only setups never import asyncssh

    def runner_for(self, run: Run) -> Runner:
        if run.host == LOCAL:
            return self._local
        if self._pool is None:
            from bot.ssh import SshPool, SshTarget  # noqa: PLC0415 - asyncssh only when a host needs it

            self._pool = SshPool({name: SshTarget(**_target_fields(h)) for name, h in self._registry.hosts.items()})
        return self._pool.runner(run.host, run.container)

    def stats(self) -> dict:
        return self._pool.stats() if self._pool is not None else {}

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()


def _target_fields(host) -> dict:
    return {
        "name": host.name, "address": host.address, "port": host.port, "user": host.user, "key": host.key,
        "known_hosts": host.known_hosts, "jump": host.jump, "connect_timeout": host.connect_timeout,
        "command_timeout": host.command_timeout, "keepalive": host.keepalive, "max_channels": host.max_channels,
    }

