"""A quick CLI: each command imports what it needs when it runs, so `runbot status` of a local run loads no heavy part."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from config import environment
from config.registry import ConfigError
from config.settings import Settings
from tests.sshd import SKIP_REASON, SshLab, have_sshd
from tests.standins import REAL_FIXTURES, writer_holding
from tests.test_cli import runbot
from tests.test_cli_ssh import ssh_config
from tests.test_settings import VARIABLES

# What a local run's probe never needs: pydantic (the settings it validated are kept, config.environment), the
# bot's libraries, the SSH transport, SQLite, charts, the alerts' ledger, the host view, the Slack renderer,
# saved probes, the example config.
HEAVY = {"pydantic", "pydantic_settings", "pydantic_core", "apscheduler", "slack_bolt", "slack_sdk", "aiohttp",
         "asyncssh", "matplotlib", "sqlite3",
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


@pytest.mark.skipif(not have_sshd(), reason=SKIP_REASON)
def test_a_run_over_ssh_still_answers_and_loads_asyncssh_then(tmp_path):
    lab = SshLab(tmp_path / "lab")
    try:
        config, log = ssh_config(tmp_path, lab, lab.sshd("pve1"))
        env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
        runbot("--config", str(config), "check-config", env=env)
        with writer_holding(log):
            out = runbot("--config", str(config), "status", "dflash", env={**env, "PYTHONPROFILEIMPORTTIME": "1"})
    finally:
        lab.close()
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("step 10 · 41.3K tok/s · loss 10.77") and "pve1 CT 200" in out.stdout
    assert "asyncssh" in imported(out.stderr)  # the transport, now that a host needs it
    assert not imported(out.stderr) & {"pydantic", "slack_bolt", "apscheduler", "sqlite3"}


# -- config.environment: Settings' answer, kept between calls -------------------------------------------------


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No runbot variable from the outside, a working directory with no .env, a cache folder of the test's own."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path


def kept_file(home: Path) -> Path:
    return home / "cache" / "runbot" / "settings.json"


def same_as_settings(kept: environment.Remembered) -> None:
    """Every value kept is what Settings says of the same environment, and no field is left out but the secrets."""
    settings = Settings()
    values = settings.kept()
    assert {name: getattr(kept, name) for name in values} == values
    assert set(type(settings).model_fields) - set(values) == {"slack_bot_token", "slack_app_token",
                                                              "slack_signing_secret"}


@pytest.mark.parametrize("env, dot_env", [
    ({}, None),
    ({"RUNBOT_CONFIG": "/etc/runbot.toml", "RUNBOT_STATE_DB": "/var/lib/runbot.db", "PORT": "8080"}, None),
    ({"RUNBOT_LOG_LEVEL": " Warning "}, "PORT=4000\nRUNBOT_CONFIG=conf/runs.toml\n"),
    ({"PORT": "5000"}, "PORT=4000\nSLACK_APP_TOKEN=xapp-file\n"),  # the environment wins over .env
    ({"runbot_config": "lower.toml"}, None),  # any case, as pydantic-settings reads it
    ({"SLACK_API_BASE_URL": ""}, "PORT=\n"),  # empty counts as unset
])
def test_the_second_call_reuses_what_settings_validated(home, monkeypatch, env, dot_env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if dot_env is not None:
        Path(".env").write_text(dot_env)
    first = environment.load(secrets=False)
    assert isinstance(first, Settings)  # nothing kept yet: Settings itself
    second = environment.load(secrets=False)
    assert isinstance(second, environment.Remembered)
    same_as_settings(second)
    assert environment.config_path(None, second) == environment.config_path(None, first)
    assert second.log_level(7) == first.log_level(7) and second.log_level(7, verbose=True) == first.log_level(7, verbose=True)


def _change_env(monkeypatch, home):
    monkeypatch.setenv("RUNBOT_CONFIG", "other.toml")


def _change_case(monkeypatch, home):
    monkeypatch.setenv("runbot_config", "other.toml")


def _add_secret(monkeypatch, home):
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-another")


def _change_dot_env(monkeypatch, home):
    Path(".env").write_text("PORT=4001\n")


def _remove_dot_env(monkeypatch, home):
    Path(".env").unlink()


def _change_version(monkeypatch, home):
    monkeypatch.setattr(environment, "__version__", "99.0.0")


def _change_definition(monkeypatch, home):
    changed = home / "settings.py"
    changed.write_bytes(environment.DEFINITION.read_bytes() + b"\n# a new field, one day\n")
    monkeypatch.setattr(environment, "DEFINITION", changed)


def _reinstall_a_validator(monkeypatch, home):
    os.utime(home / "fake_validator.py", ns=(1, 1))


@pytest.mark.parametrize("change", [_change_env, _change_case, _add_secret, _change_dot_env, _remove_dot_env,
                                    _change_version, _change_definition, _reinstall_a_validator])
def test_anything_that_differs_asks_settings_again(home, monkeypatch, change):
    Path(".env").write_text("PORT=4000\n")
    (home / "fake_validator.py").write_text("")
    monkeypatch.syspath_prepend(str(home))
    monkeypatch.setattr(environment, "VALIDATORS", (*environment.VALIDATORS, "fake_validator"))
    environment.load(secrets=False)
    assert isinstance(environment.load(secrets=False), environment.Remembered)
    change(monkeypatch, home)
    again = environment.load(secrets=False)
    assert isinstance(again, Settings)
    assert isinstance(environment.load(secrets=False), environment.Remembered)  # and kept again
    same_as_settings(environment.load(secrets=False))


def test_no_secret_is_kept_and_the_file_is_the_users_alone(home, monkeypatch):
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-1111-SECRET")
    Path(".env").write_text("SLACK_SIGNING_SECRET=sigSECRET\nSLACK_APP_TOKEN=xapp-1-SECRET\n")
    environment.load(secrets=False)
    assert b"SECRET" not in kept_file(home).read_bytes()
    assert kept_file(home).stat().st_mode & 0o777 == 0o600 and kept_file(home).parent.stat().st_mode & 0o777 == 0o700
    kept = environment.load(secrets=False)
    with pytest.raises(AttributeError, match="slack_bot_token is not kept"):
        kept.slack_bot_token
    settings = environment.load(secrets=True)  # serve and doctor: Settings itself, secrets and all
    assert isinstance(settings, Settings) and settings.slack_bot_token.get_secret_value() == "xoxb-1111-SECRET"


def test_a_bad_value_is_never_kept(home, monkeypatch):
    monkeypatch.setenv("PORT", "abc")
    for _ in range(2):
        with pytest.raises(ConfigError, match="^environment: PORT: "):
            environment.load(secrets=False)
    assert not kept_file(home).exists()


@pytest.mark.parametrize("text", ["", "{", "[]", '{"format": 1}', '{"format": 1, "key": 3, "fields": 1, "values": 1}',
                                  '{"format": 1, "key": "", "fields": [1], "values": {}}', "\xff\xfe"])
def test_a_file_runbot_did_not_write_is_nothing_kept_and_is_replaced(home, text):
    kept_file(home).parent.mkdir(parents=True)
    kept_file(home).write_text(text)
    assert isinstance(environment.load(secrets=False), Settings)
    assert json.loads(kept_file(home).read_text())["format"] == environment.FORMAT


def test_a_forged_value_under_an_old_key_is_not_believed(home, monkeypatch):
    environment.load(secrets=False)
    kept = json.loads(kept_file(home).read_text())
    monkeypatch.setenv("RUNBOT_STATE_DB", "/elsewhere.db")
    kept["values"]["runbot_state_db"] = "/elsewhere.db"  # right value, but the key is the old environment's
    kept_file(home).write_text(json.dumps(kept))
    assert isinstance(environment.load(secrets=False), Settings)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_cache_that_cannot_be_written_is_only_slower(home):
    (home / "cache").mkdir()
    (home / "cache").chmod(0o500)
    try:
        assert isinstance(environment.load(secrets=False), Settings)
        assert isinstance(environment.load(secrets=False), Settings)
    finally:
        (home / "cache").chmod(0o700)


def test_a_cache_folder_that_is_a_file_is_only_slower(home):
    (home / "cache").write_text("not a folder")
    assert isinstance(environment.load(secrets=False), Settings)
    assert isinstance(environment.load(secrets=False), Settings)


def test_a_dot_env_that_is_no_plain_file_is_left_to_settings(home):
    Path(".env").mkdir()  # (or a FIFO, which Settings would read): nothing is kept of it
    assert isinstance(environment.load(secrets=False), Settings)
    assert not kept_file(home).exists()


def test_the_cli_with_nothing_kept_still_validates_the_environment(local, tmp_path):
    out = runbot("--config", str(local), "status", "dflash", env={"XDG_CACHE_HOME": str(tmp_path / "c"), "PORT": "0"})
    assert out.returncode == 2 and out.stderr.startswith("runbot: environment: PORT: ")
