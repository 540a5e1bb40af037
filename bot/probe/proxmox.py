"""Proxmox `pct exec` failures, read from their text because pct's exit code is unreliable."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bot.probe.runners import RunResult

# pct (Perl) dies before running anything, so its message is the whole of stderr's first
# lines; the command's own output can never produce these because it never ran. Patterns are
# anchored at a line start (after an optional "ERROR: "/"Error: ") so a log line quoted later
# in stderr by the probe does not match.
_PREFIX = r"^(?:error:\s*)?"
_STOPPED = re.compile(
    _PREFIX
    + r"(?:container\s+'?(?P<id>\d+)'?\s+(?:is\s+)?not\s+running"
    r"|CT\s+'?(?P<id2>\d+)'?\s+(?:is\s+)?not\s+running"
    r"|lxc-attach:.*(?:failed to get init pid|is not running))",
    re.IGNORECASE | re.MULTILINE,
)
_MISSING = re.compile(
    _PREFIX
    + r"(?:configuration file '(?:nodes/(?P<node>[^/']+)/)?(?:lxc|openvz)/(?P<id>\d+)\.conf' does not exist"
    r"|unable to find configuration file for (?:VM|CT) '?(?P<id2>\d+)'?"
    r"|no such (?:VM|CT|container) \(?'?(?P<id3>\d+)'?\)?"
    r"|(?:VM|CT|container) '?(?P<id4>\d+)'? does not exist)",
    re.IGNORECASE | re.MULTILINE,
)
_NO_PCT = re.compile(r"^(?:bash|sh)?[^\n]*\bpct: (?:command )?not found", re.MULTILINE)
_NO_BASH = re.compile(
    r"^lxc-attach:.*(?:failed to exec \"?bash|no such file or directory - failed to exec)",
    re.IGNORECASE | re.MULTILINE,
)
_NOT_ROOT = re.compile(r"^(?:error:\s*)?(?:only root can|permission denied - )", re.IGNORECASE | re.MULTILINE)


def pct_exec_argv(ct: int, *command: str) -> list[str]:
    """`pct exec CT -- COMMAND…`: how a command enters a CT, on the node itself or over SSH (one spelling for both)."""
    return ["pct", "exec", str(int(ct)), "--", *command]


def pct_failure(stdout_text: str, stderr_text: str, ct: int, host_name: str | None) -> str | None:
    """The user-facing verdict when `pct exec <ct>` failed before running the probe, else None.
    `host_name` None: pct ran on this machine (runbot on the Proxmox node)."""
    on = "this machine" if host_name is None else f"host {host_name}"
    root = "run runbot as root" if host_name is None else 'set user = "root" for this host'

    out = stdout_text.strip()
    if "\n" in out:
        return None  # the probe ran and printed its report: pct did not fail
    # pct writes to stderr; a one-line stdout counts too, for wrappers that merge the streams.
    texts = [stderr_text, out] if out else [stderr_text]
    for text in texts:
        head = text[:4096]  # pct's message comes first; do not scan a huge stderr
        if _MISSING.search(head):
            return f"container {ct} is not on {on} (pct has no config for it there)"
        if _STOPPED.search(head):
            return f"container {ct} is stopped on {on}"
        if _NO_PCT.search(head):
            return f"`pct` was not found on {on}: is it a Proxmox host? (or drop `container` for this run)"
        if _NO_BASH.search(head):
            return f"container {ct} on {on} has no bash to run the probe"
        if _NOT_ROOT.search(head):
            return f"pct on {on} refused our user: it needs root ({root})"
    return None


def with_pct_verdict(result: RunResult, ct: int, host_name: str | None) -> RunResult:
    """`result` of a command run through `pct exec CT`, with pct's own failure (if it failed before running
    anything) as the typed verdict: the one reading both transports share."""
    if result.failure is not None:
        return result
    verdict = pct_failure(result.stdout.decode(errors="replace"), result.stderr.decode(errors="replace"), ct, host_name)
    return replace(result, failure=verdict, failure_kind="container") if verdict else result
