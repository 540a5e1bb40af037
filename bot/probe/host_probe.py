"""Run the host probe through a Runner and read what it saw as a HostView (shell: the one IO is the runner)."""

from __future__ import annotations

import secrets

from bot.core.host_view import HOST_ANSWER_BYTES, HostView, host_view_from_output
from bot.probe.host_script import PROC_ROOT, build_host_script
from bot.probe.runners import Runner


async def probe_host(runner: Runner, host: str, *, discover: bool, timeout: float,
                     proc_root: str = PROC_ROOT) -> HostView:
    """One round trip to the host; a probe that cannot run comes back as a HostView with `failure` set."""
    nonce, skip = secrets.token_hex(8), secrets.token_hex(8)  # the CTs see `skip`, never the nonce
    script = build_host_script(nonce, skip, discover=discover, proc_root=proc_root)
    result = await runner.run(script, timeout=timeout, limit=HOST_ANSWER_BYTES)
    if result.failure is not None:
        return HostView(host, failure=result.failure, failure_kind=result.failure_kind)
    view = host_view_from_output(host, result.stdout, nonce, cut=HOST_ANSWER_BYTES if result.truncated else None)
    if b"@@ end" not in result.stdout and not result.truncated:
        said = " ".join(result.stderr.decode(errors="replace").split())[:2000]  # the renderers redact it, then cut
        return HostView(host, failure=f"the host probe on {host} ended early (exit {result.exit_status})"
                        + (f": {said}" if said else ""), failure_kind="local")
    return view
