"""`runbot doctor` against real parts: an sshd on 127.0.0.1 with the pct stand-in, and the Slack stub.

Every ✗ doctor can print is set up for real, one fault at a time, and must be the only ✗ of its run.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from bot.render.doctor import Outcome, passed, report
from bot.service.doctor import MANIFEST_SCOPES, install_checks
from config.settings import Settings
from tests.slack_stub import APP_TOKEN, BOT_TOKEN, SlackStub
from tests.sshd import SKIP_REASON, SshLab, free_port, have_sshd, keygen
from tests.standins import REPO
from tests.test_cli import runbot

pytestmark = pytest.mark.skipif(not have_sshd(), reason=SKIP_REASON)

ALERTS = "C0ALERTS"


@pytest.fixture(scope="module")
def slack():
    with SlackStub() as stub:
        yield stub


@dataclass
class Install:
    """A working install: one Proxmox stand-in, one run in CT 200 with its log, Slack with an alert channel."""

    tmp: Path
    lab: SshLab
    slack: SlackStub
    host: dict = field(default_factory=dict)
    run: dict = field(default_factory=dict)
    extra: str = ""  # more TOML, appended
    bot_token: str | None = BOT_TOKEN
    app_token: str | None = APP_TOKEN

    def __post_init__(self) -> None:
        self.srv = self.lab.sshd("pve1")
        self.srv.set_ct(200, "running")
        self.srv.set_smi(200, "GPU 0: NVIDIA H200 (UUID: GPU-0)\nGPU 1: NVIDIA H200 (UUID: GPU-1)")
        self.log = self.tmp / "train.log"
        self.log.write_text("step=1 loss=2.0\n")
        self.host = {"address": "127.0.0.1", "port": self.srv.port, "user": self.lab.user,
                     "key": str(self.lab.client_key), "known_hosts": str(self.lab.known_hosts), "connect_timeout": "5s"}
        self.run = {"host": "pve1", "container": 200, "log": str(self.log)}
        self.slack.reset()
        self.slack.channels[ALERTS] = {"name": "alerts", "is_member": True}

    def config(self) -> Path:
        def table(name: str, values: dict) -> str:
            return f"[{name}]\n" + "".join(f"{k} = {v if isinstance(v, int) else chr(34) + str(v) + chr(34)}\n"
                                           for k, v in values.items())
        path = self.tmp / "runs.toml"
        path.write_text(f'[bot]\nalert_channel = "{ALERTS}"\n' + table("hosts.pve1", self.host)
                        + table("runs.dflash", self.run) + self.extra)
        return path

    def settings(self) -> Settings:
        return Settings(_env_file=None, slack_bot_token=self.bot_token, slack_app_token=self.app_token,
                        slack_api_base_url=self.slack.api_url)

    def env(self) -> dict:
        return {"SLACK_BOT_TOKEN": self.bot_token or "", "SLACK_APP_TOKEN": self.app_token or "",
                "SLACK_API_BASE_URL": self.slack.api_url, "RUNBOT_CONFIG": "", "RUNBOT_STATE_DB": ""}


@pytest.fixture
def install(tmp_path: Path, slack: SlackStub):
    lab = SshLab(tmp_path / "lab")
    yield Install(tmp_path, lab, slack)
    lab.close()


# --- each fault, set up for real ------------------------------------------------------------


def _unknown_host_key(i: Install) -> None:
    empty = i.tmp / "empty_known_hosts"
    empty.write_text("")
    i.host["known_hosts"] = str(empty)


def _changed_host_key(i: Install) -> None:
    other = keygen(i.tmp / "other_host_key")
    kind, key = other.with_suffix(".pub").read_text().split()[:2]
    changed = i.tmp / "changed_known_hosts"
    changed.write_text(f"[127.0.0.1]:{i.srv.port} {kind} {key}\n")
    i.host["known_hosts"] = str(changed)


def _refused_port(i: Install) -> None:
    i.host["port"] = free_port()


def _wrong_key(i: Install) -> None:
    i.host["key"] = str(keygen(i.tmp / "stranger_key"))


def _no_pct(i: Install) -> None:
    bare = i.lab.sshd("plain", pct=False)  # an ordinary Linux box, not a Proxmox node
    i.host["port"] = bare.port


def _unreadable_log(i: Install) -> None:
    if os.geteuid() == 0:
        # root reads through any mode bits: /proc/self/mem is a file that exists and that no read of
        # its first byte gets through (EIO), whoever asks.
        i.run["log"] = "/proc/self/mem"
    else:
        i.log.chmod(0)


def _log_is_a_folder(i: Install) -> None:
    i.run["log"] = str(i.tmp)


def _missing_scope(i: Install) -> None:
    i.slack.scopes = [s for s in MANIFEST_SCOPES if s != "files:write"]


FAULTS: list[tuple[str, Callable[[Install], None], dict[str, str]]] = [
    ("unknown host key", _unknown_host_key, {"pve1: host key known and matching": "host key is not in"}),
    ("changed host key", _changed_host_key, {"pve1: host key known and matching": "does NOT match"}),
    ("refused port", _refused_port, {"pve1: reachable": "refused the connection"}),
    ("wrong key", _wrong_key, {"pve1: authentication": "refused our SSH key"}),
    ("no pct", _no_pct, {"pve1: pct present": "`pct` is not on pve1's PATH"}),
    ("stopped CT", lambda i: i.srv.set_ct(200, "stopped"), {"pve1 CT 200: running": "container 200 is stopped"}),
    ("unknown CT", lambda i: i.run.update(container=999), {"pve1 CT 999: running": "container 999 is not on host pve1"}),
    ("no nvidia-smi", lambda i: i.srv.set_smi(200, None), {"pve1 CT 200: nvidia-smi answering": "not on the PATH"}),
    ("nvidia-smi failing", lambda i: i.srv.set_smi(200, "fail"),
     {"pve1 CT 200: nvidia-smi answering": "failed: NVIDIA-SMI has failed"}),
    ("missing log", lambda i: i.log.unlink(), {"pve1 CT 200: log {log} readable": "does not exist"}),
    ("unreadable log", _unreadable_log, {"pve1 CT 200: log {log} readable": "cannot be read"}),
    ("log is a folder", _log_is_a_folder, {"pve1 CT 200: log {log} readable": "is not a file"}),
    ("bad token", lambda i: i.slack.fail(200, method="auth.test", error="invalid_auth"),
     {"SLACK_BOT_TOKEN accepted (auth.test)": "Slack said invalid_auth"}),
    ("missing scope", _missing_scope, {"scopes granted": "missing files:write"}),
    ("channel not found", lambda i: i.slack.channels.clear(),
     {f"alert channel {ALERTS} reachable, bot in it": "Slack said channel_not_found"}),
    ("bot not in channel", lambda i: i.slack.channels[ALERTS].update(is_member=False),
     {f"alert channel {ALERTS} reachable, bot in it": "@runbot is not in #alerts"}),
    ("no scope to see channels", lambda i: i.slack.fail(200, method="conversations.info", error="missing_scope"),
     {f"alert channel {ALERTS} reachable, bot in it": "Slack said missing_scope"}),
    ("app token of the wrong shape", lambda i: setattr(i, "app_token", BOT_TOKEN),
     {"SLACK_APP_TOKEN shape": "is the bot token (xoxb-…)"}),
]


@pytest.mark.parametrize("setup, expected", [(s, e) for _, s, e in FAULTS], ids=[n for n, _, _ in FAULTS])
async def test_each_fault_is_its_own_cross_with_its_fix(install: Install, setup, expected) -> None:
    setup(install)
    checks = await install_checks(install.config(), install.settings())
    failed = {c.name: c for c in checks if c.outcome is Outcome.FAIL}
    log = install.run["log"]
    want = {name.format(log=log): words for name, words in expected.items()}
    assert set(failed) == set(want), report(checks)
    for name, words in want.items():
        assert words in failed[name].detail, report(checks)
        # A way out, always: the transport's verdicts on getting in name their fix themselves; the rest carry one.
        assert failed[name].fix or name in {"pve1: reachable", "pve1: host key known and matching", "pve1: authentication"}
    assert not passed(checks)
    assert BOT_TOKEN not in report(checks) and APP_TOKEN not in report(checks)


async def test_every_config_fault_at_once_and_nothing_probed(install: Install) -> None:
    install.extra = '[runs.orphan]\nhost = "nowhere"\nlog = "/x.log"\n[bot2]\n'
    install.host["port"] = "twenty-two"
    path = install.config()
    checks = await install_checks(path, install.settings())
    faults = [c for c in checks if c.outcome is Outcome.FAIL]
    assert [c.name for c in faults] == ["configuration valid"] * 3, report(checks)
    keys = [c.detail.removeprefix(f"{path}: ").split(":")[0] for c in faults]
    assert sorted(keys) == ["bot2", "hosts.pve1.port", "runs.orphan.host"], keys
    assert not any(c.name.startswith("pve1") for c in checks)  # nothing to connect with


async def test_no_token_skips_slack_with_a_line_saying_so(install: Install) -> None:
    install.bot_token = install.app_token = None
    checks = await install_checks(install.config(), install.settings())
    assert [(c.name, c.outcome) for c in checks if c.name.startswith("Slack")] == [("Slack", Outcome.SKIP)]
    assert "SLACK_BOT_TOKEN is not set" in report(checks)
    assert passed(checks)
    assert not any(m == "auth.test" for m, _ in install.slack.attempts)


def test_all_pass_exits_0_through_the_cli(install: Install) -> None:
    started = time.monotonic()
    out = runbot("--config", str(install.config()), "doctor", env=install.env())
    took = time.monotonic() - started
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert all(line.startswith("✓ ") for line in lines[:-1]), out.stdout
    assert lines[-1] == f"{len(lines) - 1} checks: all passed"
    for name in ("configuration valid", "pve1: reachable", "pve1: host key known and matching", "pve1: authentication",
                 "pve1: pct present", "pve1 CT 200: running", "pve1 CT 200: nvidia-smi answering: 2 GPUs",
                 f"pve1 CT 200: log {install.log} readable", "Socket Mode (SLACK_APP_TOKEN)",
                 "SLACK_BOT_TOKEN accepted (auth.test): @runbot in Test", "scopes granted",
                 f"alert channel {ALERTS} reachable, bot in it: #alerts"):
        assert any(line.startswith(f"✓ {name}") for line in lines), (name, out.stdout)
    assert BOT_TOKEN not in out.stdout + out.stderr and APP_TOKEN not in out.stdout + out.stderr
    assert "[redacted]" not in out.stdout  # doctor's own words are never taken for a `token: value`
    assert took < 10, took  # the loopback install, Python start-up included


def test_a_fault_exits_1_through_the_cli(install: Install) -> None:
    install.srv.set_ct(200, "stopped")
    out = runbot("--config", str(install.config()), "doctor", env=install.env())
    assert out.returncode == 1
    assert "✗ pve1 CT 200: running: container 200 is stopped" in out.stdout
    assert out.stdout.splitlines()[-1].endswith("1 failed")


def test_the_scopes_doctor_asks_for_are_the_manifests() -> None:
    manifest = (REPO / "slack-app-manifest.yml").read_text()
    asked = [line.split("#")[0].strip()[2:] for line in manifest.splitlines() if line.startswith("      - ")]
    assert tuple(asked) == MANIFEST_SCOPES


def test_what_a_cts_nvidia_smi_says_is_printable_and_redacted_before_it_is_cut(install: Install) -> None:
    # A tenant's nvidia-smi: terminal escapes, a bidi override, and a token that a cut at 160 characters
    # would split (the old answer cut first and never redacted on the CLI).
    token = "ghp_" + "Zx9Yw8Vu7T" * 4
    said = "NVIDIA-SMI has failed \033[2J\033]0;pwned\007 \u202e\u2028" + "x" * 120 + f" {token} and more"
    smi = install.srv.pct_state / "200.bin" / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '%s\\n' '{said}'\nexit 9\n")
    out = runbot("--config", str(install.config()), "doctor", env=install.env())
    assert out.returncode == 1
    [line] = [line for line in out.stdout.splitlines() if "nvidia-smi answering" in line]
    assert line.startswith("✗ pve1 CT 200: nvidia-smi answering: nvidia-smi failed: NVIDIA-SMI has failed")
    assert all(line.isprintable() for line in out.stdout.splitlines()), out.stdout
    assert token[:6] not in out.stdout and "pwned" not in out.stdout
    assert f"✓ pve1 CT 200: log {install.log} readable" in out.stdout  # its U+2028 broke no line of the answer
