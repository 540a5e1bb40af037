"""config.settings: the environment and `.env`, and which config file to read."""

from __future__ import annotations

from pathlib import Path

import pytest

from config.registry import ConfigError
import logging

from config.settings import Settings, check_tokens, config_path, load_settings

VARIABLES = [
    "RUNBOT_CONFIG",
    "RUNBOT_STATE_DB",
    "SLACK_BOT_TOKEN",
    "SLACK_APP_TOKEN",
    "SLACK_SIGNING_SECRET",
    "SLACK_API_BASE_URL",
    "PORT",
    "RUNBOT_LOG_LEVEL",
]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No runbot variable from the outside, and a working directory with no .env."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def test_defaults_with_nothing_set() -> None:
    settings = Settings()
    assert settings.runbot_config is None and settings.runbot_state_db is None
    assert settings.slack_bot_token is None and settings.slack_app_token is None
    assert settings.slack_signing_secret is None and settings.slack_api_base_url is None
    assert settings.port == 3000
    assert settings.socket_mode is False


def test_reads_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    values = {
        "RUNBOT_CONFIG": "/etc/runbot/runs.toml",
        "RUNBOT_STATE_DB": "/var/lib/runbot.sqlite3",
        "SLACK_BOT_TOKEN": "xoxb-1",
        "SLACK_APP_TOKEN": "xapp-1",
        "SLACK_SIGNING_SECRET": "s3cret",
        "SLACK_API_BASE_URL": "http://127.0.0.1:8888/api/",
        "PORT": "8080",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.runbot_config == "/etc/runbot/runs.toml"
    assert settings.runbot_state_db == "/var/lib/runbot.sqlite3"
    assert settings.slack_bot_token is not None and settings.slack_bot_token.get_secret_value() == "xoxb-1"
    assert settings.slack_app_token is not None and settings.slack_app_token.get_secret_value() == "xapp-1"
    assert settings.slack_signing_secret is not None
    assert settings.slack_signing_secret.get_secret_value() == "s3cret"
    assert settings.slack_api_base_url == "http://127.0.0.1:8888/api/"
    assert settings.port == 8080
    assert settings.socket_mode is True


def test_secrets_do_not_show_in_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-very-secret")
    monkeypatch.setenv("SLACK_SIGNING_SECRET", "signing-very-secret")
    shown = repr(Settings()) + str(Settings())
    assert "very-secret" not in shown


def test_reads_a_dot_env_in_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text(
        "SLACK_BOT_TOKEN=xoxb-from-file\nSLACK_SIGNING_SECRET=sig\nPORT=4000\nRUNBOT_CONFIG=conf/runs.toml\n",
        encoding="utf-8",
    )
    settings = Settings()
    assert settings.slack_bot_token is not None
    assert settings.slack_bot_token.get_secret_value() == "xoxb-from-file"
    assert settings.port == 4000
    assert settings.runbot_config == "conf/runs.toml"
    assert settings.socket_mode is False  # a signing secret alone means HTTP mode


def test_environment_wins_over_dot_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".env").write_text("PORT=4000\nSLACK_APP_TOKEN=xapp-file\n", encoding="utf-8")
    monkeypatch.setenv("PORT", "5000")
    settings = Settings()
    assert settings.port == 5000
    assert settings.socket_mode is True


def test_unknown_variables_are_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".env").write_text("SOMETHING_ELSE=1\nDATABASE_URL=x\n", encoding="utf-8")
    monkeypatch.setenv("RUNBOT_UNKNOWN", "1")
    assert Settings().port == 3000


def test_empty_values_count_as_unset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".env").write_text("SLACK_APP_TOKEN=\nPORT=\n", encoding="utf-8")
    monkeypatch.setenv("SLACK_SIGNING_SECRET", "")
    settings = Settings()
    assert settings.slack_app_token is None and settings.slack_signing_secret is None
    assert settings.socket_mode is False
    assert settings.port == 3000


@pytest.mark.parametrize("port", ["abc", "0", "70000"])
def test_a_bad_port_is_one_config_error(monkeypatch: pytest.MonkeyPatch, port: str) -> None:
    monkeypatch.setenv("PORT", port)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith("environment: PORT: ")
    assert len(message.splitlines()) == 1


def test_load_settings_returns_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PORT", "3001")
    assert load_settings().port == 3001


@pytest.mark.parametrize(
    ("cli", "env", "expected"),
    [
        (None, None, Path("config/runs.toml")),
        (None, "/etc/runbot.toml", Path("/etc/runbot.toml")),
        ("mine.toml", "/etc/runbot.toml", Path("mine.toml")),  # --config wins
        ("mine.toml", None, Path("mine.toml")),
        ("", "/etc/runbot.toml", Path("/etc/runbot.toml")),  # an empty --config is no --config
        ("~/runs.toml", None, Path.home() / "runs.toml"),
    ],
)
def test_config_path(
    monkeypatch: pytest.MonkeyPatch, cli: str | None, env: str | None, expected: Path
) -> None:
    if env is not None:
        monkeypatch.setenv("RUNBOT_CONFIG", env)
    assert config_path(cli, Settings()) == expected


# -- the log level (issue 15 #11) ---------------------------------------------------------------


@pytest.mark.parametrize("typed, level", [("debug", logging.DEBUG), ("INFO", logging.INFO), (" Warning ", logging.WARNING),
                                          ("error", logging.ERROR)])
def test_runbot_log_level_sets_the_level_in_any_case(monkeypatch: pytest.MonkeyPatch, typed: str, level: int) -> None:
    monkeypatch.setenv("RUNBOT_LOG_LEVEL", typed)
    settings = load_settings()
    assert settings.log_level(logging.CRITICAL) == level
    assert settings.log_level(logging.CRITICAL, verbose=True) == logging.DEBUG  # --verbose wins


def test_without_runbot_log_level_the_commands_default_holds() -> None:
    assert Settings().log_level(logging.WARNING) == logging.WARNING


def test_a_bad_runbot_log_level_is_one_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNBOT_LOG_LEVEL", "loud")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert str(caught.value).startswith("environment: RUNBOT_LOG_LEVEL: ") and "'debug'" in str(caught.value)


# -- the tokens' shapes, checked before Slack is asked (issue 15 #11) ----------------------------

BOT, APP = "xoxb-1111-2222-abcdefSECRET", "xapp-1-A111-222-abcdefSECRET"


@pytest.mark.parametrize("bot, app", [(BOT, APP), (BOT, None), ("xoxe.xoxb-1-rotatedSECRET", APP), (None, None)])
def test_tokens_of_the_right_kinds_pass(bot, app) -> None:
    check_tokens(Settings(_env_file=None, slack_bot_token=bot, slack_app_token=app))


@pytest.mark.parametrize("bot, app, name, says", [
    (BOT, BOT, "SLACK_APP_TOKEN", "is the bot token (xoxb-…): Socket Mode needs an app-level token, xapp-…"),
    (BOT, "xoxp-1-userSECRET", "SLACK_APP_TOKEN", "is not an app-level token"),
    (BOT, "abcdefSECRET", "SLACK_APP_TOKEN", "is not an app-level token"),
    (APP, APP, "SLACK_BOT_TOKEN", "is an app-level token (xapp-…): the bot token starts xoxb-"),
    (BOT, APP + "\n", "SLACK_APP_TOKEN", "holds a space or a line break"),
    (" " + BOT, APP, "SLACK_BOT_TOKEN", "holds a space or a line break"),
])
def test_a_token_of_the_wrong_kind_is_one_line_naming_the_variable(bot, app, name, says) -> None:
    with pytest.raises(ConfigError) as caught:
        check_tokens(Settings(_env_file=None, slack_bot_token=bot, slack_app_token=app))
    message = str(caught.value)
    assert message.startswith(f"environment: {name}: ") and says in message
    assert "SECRET" not in message and len(message.splitlines()) == 1  # a token is never echoed
