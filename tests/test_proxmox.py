"""bot.probe.proxmox: pct exec failures recognised from their text, and never from probe output."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bot.probe.proxmox import pct_failure

STOPPED = "container 201 is stopped"
MISSING = "container 201 is not on host pve1"

CASES = [
    # (stdout, stderr, expected substring or None)
    ("", "container '201' not running!\n", STOPPED),
    ("", "Error: container '201' not running!\n", STOPPED),
    ("", "CT 201 not running\n", STOPPED),
    ("", "CT 201 is not running\n", STOPPED),
    ("", "container 201 is not running\n", STOPPED),
    ("", "lxc-attach: 201: attach.c: get_attach_context: 405 Connection refused - Failed to get init pid\n", STOPPED),
    ("", "Configuration file 'nodes/pve1/lxc/201.conf' does not exist\n", MISSING),
    # The node in pct's text may differ from the name the config gives the host.
    ("", "Configuration file 'nodes/proxmox-a/lxc/201.conf' does not exist\n", MISSING),
    ("", "unable to find configuration file for VM 201 on node 'pve1'\n", MISSING),
    ("", "unable to find configuration file for CT 201 - no such machine\n", MISSING),
    ("", "no such VM ('201')\n", MISSING),
    ("", "CT 201 does not exist\n", MISSING),
    # Merged streams: pct's one line on stdout.
    ("container '201' not running!\n", "", STOPPED),
    ("", "bash: line 1: pct: command not found\n", "`pct` was not found on host pve1"),
    ("", "bash: pct: command not found\n", "`pct` was not found on host pve1"),
    ("", 'lxc-attach: 201: attach.c: lxc_attach_run_command: 1841 No such file or directory - Failed to exec "bash"\n',
     "has no bash"),
    ("", "ERROR: only root can run this command\n", "needs root"),
    # Not failures: the probe ran.
    ("@@RB:x@@ meta\nsize=1\n", "", None),
    ("", "", None),
    ("", "tail: cannot open '/x/train.log' for reading: No such file or directory\n", None),
    ("", "grep: warning: stray \\ before -\n", None),
]


@pytest.mark.parametrize("stdout,stderr,expected", CASES)
def test_pct_failure_table(stdout: str, stderr: str, expected: str | None) -> None:
    verdict = pct_failure(stdout, stderr, 201, "pve1")
    if expected is None:
        assert verdict is None
    else:
        assert verdict is not None and expected in verdict
        assert "pve1" in verdict  # every verdict names the host


def test_verdicts_use_the_configured_container_and_host() -> None:
    assert pct_failure("", "container '7' not running!\n", 7, "gpu-a") == "container 7 is stopped on host gpu-a"
    assert pct_failure("", "Configuration file 'nodes/x/lxc/999.conf' does not exist\n", 999, "pve1").startswith(
        "container 999 is not on host pve1"
    )


def test_a_log_that_quotes_pct_errors_is_not_a_failure() -> None:
    # The probe ran (multi-line stdout) and its window happens to contain pct's words.
    out = "@@RB:abc@@ window\ncontainer '201' not running!\nConfiguration file 'nodes/a/lxc/1.conf' does not exist\n"
    assert pct_failure(out, "", 201, "pve1") is None
    # Mid-line mentions in stderr (a tool quoting a log line) do not count either.
    assert pct_failure("", "grep: (standard input): container '201' not running!\n", 201, "pve1") is None


@given(st.text(max_size=300), st.text(max_size=300))
def test_never_raises(stdout: str, stderr: str) -> None:
    verdict = pct_failure(stdout, stderr, 5, "h")
    assert verdict is None or "h" in verdict
