"""A quick CLI: each command imports what it needs when it runs, so `runbot status` of a local run loads no heavy part."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.sshd import SKIP_REASON, SshLab, have_sshd
from tests.standins import REAL_FIXTURES, writer_holding
from tests.test_cli import runbot

# What a local run's probe never needs: the bot's libraries, the SSH transport, SQLite, charts, the alerts'
# ledger, the host view, the Slack renderer, saved probes, the example config.
HEAVY = {"apscheduler", "slack_bolt", "slack_sdk", "aiohttp", "asyncssh", "matplotlib", "sqlite3",
         "prometheus_client", "bot.service.app", "bot.service.state_file", "bot.service.store", "bot.core.ledger",
         "bot.core.alerts", "bot.core.host_view", "bot.render.slack", "bot.probe.replay", "config.example"}


def imported(out_stderr: str) -> set[str]:
    """The modules a run under PYTHONPROFILEIMPORTTIME (`-X importtime`) imported, from its stderr."""
    return {m[1] for m in re.finditer(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", out_stderr, re.M)}


@pytest.fixture
def local(tmp_path: Path) -> Path:
    (tmp_path / "ok.log").write_bytes((REAL_FIXTURES / "train_ok.log").read_bytes())
    config = tmp_path / "runs.toml"
    config.write_text('[defaults]\ngpu_samples = 1\n[runs.dflash]\nhost = "local"\nlog = "ok.log"\n')
    return config


@pytest.mark.parametrize("command, needs", [
    (("status", "dflash"), set()),
    (("tail", "dflash", "-n", "2"), set()),
    (("runs",), set()),
    (("check-config",), set()),
    (("status", "dflash", "--json"), {"bot.core.ledger", "bot.core.alerts"}),  # the JSON's incident fields
    (("status", "dflash", "--check"), {"bot.core.ledger", "bot.core.alerts"}),
])
def test_a_local_command_loads_none_of_the_heavy_parts(local, tmp_path, command, needs):
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    runbot("--config", str(local), *command, env=env)  # a first call may keep what the next one reuses
    out = runbot("--config", str(local), *command, env={**env, "PYTHONPROFILEIMPORTTIME": "1"})  # -X importtime
    assert out.returncode in (0, 1, 2) and out.stdout, out.stderr  # --check exits with the plugin's status
    loaded = imported(out.stderr)
    assert "bot.cli" in loaded  # the parse worked: this is the CLI's own import list
    assert loaded & HEAVY == needs, sorted(loaded & HEAVY)
