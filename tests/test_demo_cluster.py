"""`runbot demo --cluster`: the walk init → doctor → discover → status → serve on a real sshd, and its alert thread."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from bot.demo import cluster
from tests.sshd import SKIP_REASON, have_sshd
from tests.standins import REPO


def _leftovers() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("runbot-cluster-*")}


@pytest.mark.slow
@pytest.mark.skipif(not have_sshd(), reason=SKIP_REASON)
def test_the_cluster_walk_shows_each_step_and_the_alert_thread(tmp_path):
    before = _leftovers()
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "bot", "demo", "--cluster", "--fast"], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    took = time.monotonic() - started
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    steps = [line.split("$ runbot ", 1)[1].split()[0] for line in out.splitlines() if line.startswith("$ runbot ")]
    assert steps == ["init", "doctor", "discover", "status", "serve"]
    assert re.search(r"^  wrote .*/runs\.toml: a commented example", out, re.M)
    assert "  12 checks: all passed" in out and "✗" not in out  # doctor: hosts, CT, log and Slack, all green
    assert "# already configured as [runs.train-7b]: CT 200" in out  # discover: the configured run…
    assert "  [runs.llama-13b]  # CT 201 llama-13b" in out  # …and the one nobody configured, in its own CT only
    assert re.search(r"^  step \d+ · .* tok/s · loss ", out, re.M)  # status: training, over SSH
    assert "    run     train-7b (pve1 CT 200 · " in out
    alert = [line for line in out.splitlines() if line.startswith(("  #training-alerts", "  ↳ in the thread"))]
    assert "train-7b: silent" in alert[0] and alert[0].startswith("  #training-alerts")
    replies = [line for line in alert[1:] if line.startswith("  ↳ in the thread")]
    assert "recovered" in replies[0] and "crashed" in replies[1] and "OutOfMemoryError" in replies[1]
    assert "summary — crashed" in replies[-1]
    assert "(runbot serve stopped by SIGTERM: exit 0)" in out
    assert _leftovers() <= before  # its temp dir (keys, known_hosts, state) is gone
    assert took < 300


def test_without_sshd_it_says_so_in_one_line_with_the_fix(monkeypatch, capsys):
    monkeypatch.setattr(cluster, "have_sshd", lambda: False)
    assert cluster.run_cluster_demo(fast=True) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "apt-get install openssh-server" in err
