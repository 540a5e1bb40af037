"""Which Runner reaches a run: this machine for `host = "local"`, a pooled SSH connection otherwise (shell)."""

from __future__ import annotations

from typing import Mapping

from bot.probe.runners import LocalRunner, Runner
from config.registry import LOCAL, Registry, Run


class Targets:
    """Hands out runners; SSH connections are opened lazily, one per host, and closed together."""

    def __init__(self, registry: Registry, *, local_env: Mapping[str, str] | None = None) -> None:
        self._registry = registry
        self._local_env = local_env
        self._local = LocalRunner(local_env)
        self._local_cts: dict[int, LocalRunner] = {}  # runbot on the Proxmox node: `pct exec` right here
        self._pool = None  # created on first use so local-only setups never import asyncssh

    def runner_for(self, run: Run) -> Runner:
        return self.runner_on(run.host, run.container)

    def runner_on(self, host: str, container: int | None = None) -> Runner:
        """A runner on a host (LOCAL: this machine), inside `container` when it is set."""
        if host == LOCAL:
            if container is None:
                return self._local
            if container not in self._local_cts:  # one per CT, made once: a runner copies the environment
                self._local_cts[container] = LocalRunner(self._local_env, container)
            return self._local_cts[container]
        return self._ssh_pool().runner(host, container)

    def host_runner(self, host: str) -> Runner:
        """A runner on the host itself, outside every CT (the host view's probe)."""
        return self._local if host == LOCAL else self._ssh_pool().runner(host, None)

    def _ssh_pool(self):
        if self._pool is None:
            from bot.probe.ssh import SshPool  # noqa: PLC0415 - asyncssh only when a host needs it

            self._pool = SshPool(self._registry.hosts)  # the config's hosts are what the transport connects with
        return self._pool

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()

