"""The Runner seam: run one probe script somewhere and hand back what it printed (shell)."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Mapping, Protocol

from bot.probe.proxmox import pct_exec_argv, with_pct_verdict


@dataclass(frozen=True)
class RunResult:
    """What running a script produced. Failures to *reach* the target are data, not exceptions.

    `failure` is set when the script could not be run at all (host unreachable, key refused,
    container stopped, timeout…); it is a sentence for users, naming the host. `stdout` and
    `stderr` are raw bytes: logs may hold anything.
    """

    stdout: bytes = b""
    stderr: bytes = b""
    exit_status: int | None = None
    failure: str | None = None
    # What kind of failure, for the watchdog and the CLI's exit status: "unreachable",
    # "timeout", "auth", "hostkey", "container", "local".
    failure_kind: str | None = None
    elapsed_s: float = 0.0
    # stdout passed the `limit` the caller gave: `stdout` is its first `limit` bytes and the command was stopped.
    truncated: bool = False


STDERR_CAP = 64 * 1024  # stderr kept when the caller bounds stdout (the rest is read and dropped)


class Runner(Protocol):
    """Runs a bash script on one target (this machine, a host, a container)."""

    async def run(self, script: str, *, timeout: float, limit: int | None = None) -> RunResult:
        """`limit`: read at most that many bytes of stdout, then stop the command (None: all of it)."""
        ...


async def read_capped(stream, limit: int, *, drain: bool = False) -> tuple[bytes, bool]:
    """Up to `limit` bytes of an asyncio or asyncssh stream, and whether it held more. `drain`: read the
    rest and drop it (stderr must not fill up and stall the command); else stop at the limit."""
    chunks, size, more = [], 0, False
    while chunk := await stream.read(65536):
        if more:
            continue  # draining
        if size + len(chunk) > limit:
            chunks.append(chunk[:limit - size])
            more = True
            if not drain:
                break
        else:
            chunks.append(chunk)
            size += len(chunk)
    return b"".join(chunks), more


# What a local probe inherits from the bot: enough to find its tools and speak a locale. Never
# the rest: the bot's environment holds SLACK_BOT_TOKEN and the signing secret, and a log path
# of /proc/self/environ would post them.
PROBE_ENV_KEYS = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def probe_environment(env: Mapping[str, str] | None = None, base: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The minimal environment of a local probe: PROBE_ENV_KEYS from `base`, then `env` on top."""
    out = {k: base[k] for k in PROBE_ENV_KEYS if k in base}
    out.setdefault("PATH", DEFAULT_PATH)
    return {**out, **(env or {})}


class LocalRunner:
    """Runs scripts with bash on this machine (`host = "local"`), in a minimal environment; inside
    CT `container` through `pct exec` when it is set (runbot running on the Proxmox node itself).

    `env` adds to (or overrides) that environment; the demo and the tests use it to put a
    stand-in `nvidia-smi` first on the probe's PATH.
    """

    def __init__(self, env: Mapping[str, str] | None = None, container: int | None = None) -> None:
        self._env = probe_environment(env)
        self.container = container

    async def run(self, script: str, *, timeout: float, limit: int | None = None) -> RunResult:
        result = await self._run(script, timeout, limit)
        return result if self.container is None else with_pct_verdict(result, self.container, None)

    async def _run(self, script: str, timeout: float, limit: int | None) -> RunResult:
        started = time.monotonic()
        bash = ["bash", "-c", script]
        argv = bash if self.container is None else pct_exec_argv(self.container, *bash)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._env,
                start_new_session=True,  # so the whole probe can be killed, sleeps included
            )
        except FileNotFoundError:
            if self.container is None:
                return RunResult(failure="bash was not found on this machine", failure_kind="local")
            return RunResult(failure="`pct` was not found on this machine: is runbot on the Proxmox node? "
                                     "(or give the run a [hosts.*] host)", failure_kind="container")
        except OSError as exc:
            return RunResult(
                failure=f"could not start {argv[0]} on this machine: {exc.strerror or exc}",
                failure_kind="local",
            )
        truncated = False
        try:
            if limit is None:
                out, err = await asyncio.wait_for(proc.communicate(), timeout)
            else:
                out, err, truncated = await asyncio.wait_for(_bounded(proc, limit), timeout)
        except asyncio.TimeoutError:
            _kill_group(proc.pid)
            await proc.wait()
            return RunResult(
                failure=f"probe timed out after {timeout:g} s on this machine",
                failure_kind="timeout",
                elapsed_s=time.monotonic() - started,
            )
        except BaseException:
            # Cancelled (the watchdog stopping, a caller's wait_for backstop) or anything else: the
            # probe is no longer wanted, so bash and its children must not outlive it. The event
            # loop's child watcher reaps bash; the group's orphans go to init.
            _kill_group(proc.pid)
            raise
        return RunResult(out, err, proc.returncode, elapsed_s=time.monotonic() - started, truncated=truncated)


async def _bounded(proc: asyncio.subprocess.Process, limit: int) -> tuple[bytes, bytes, bool]:
    """communicate(), holding at most `limit` bytes of stdout: past it, the probe's group is killed."""
    async def out() -> tuple[bytes, bool]:
        data, more = await read_capped(proc.stdout, limit)
        if more:
            _kill_group(proc.pid)
        return data, more

    (data, more), (err, _) = await asyncio.gather(out(), read_capped(proc.stderr, STDERR_CAP, drain=True))
    await proc.wait()
    return data, err, more


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, 9)
    except ProcessLookupError:
        pass
