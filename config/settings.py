"""The environment: Slack tokens, the HTTP port and where the configuration lives.

Read from environment variables and from a `.env` file in the working directory
(environment variables win). Unknown variables are ignored; empty ones count as unset.
"""

from __future__ import annotations

import typing
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from config.environment import DEFAULT_CONFIG, DOT_ENV, config_path, log_level
from config.registry import ConfigError

__all__ = ["DEFAULT_CONFIG", "LogLevel", "Settings", "check_tokens", "config_path", "load_settings"]

LogLevel = Literal["debug", "info", "warning", "error"]


class Settings(BaseSettings):
    """Everything runbot takes from the environment (see docs/configuration.md)."""

    model_config = SettingsConfigDict(
        env_file=DOT_ENV,
        env_file_encoding="utf-8",
        extra="ignore",
        env_ignore_empty=True,
    )

    runbot_config: str | None = None  # RUNBOT_CONFIG: path of the TOML file
    runbot_state_db: str | None = None  # RUNBOT_STATE_DB: overrides [bot] state_db
    slack_bot_token: SecretStr | None = None  # SLACK_BOT_TOKEN: xoxb-…
    slack_app_token: SecretStr | None = None  # SLACK_APP_TOKEN: xapp-…, selects Socket Mode
    slack_signing_secret: SecretStr | None = None  # SLACK_SIGNING_SECRET: HTTP mode
    slack_api_base_url: str | None = None  # SLACK_API_BASE_URL: proxies, GovSlack, tests
    port: int = Field(default=3000, ge=1, le=65535)  # PORT: HTTP mode listen port
    runbot_log_level: LogLevel | None = None  # RUNBOT_LOG_LEVEL: debug, info, warning, error

    @field_validator("runbot_log_level", mode="before")
    @classmethod
    def _level_in_any_case(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value  # INFO, Info and info alike

    @property
    def socket_mode(self) -> bool:
        """Socket Mode when an app-level token is set; HTTP mode otherwise."""
        return self.slack_app_token is not None

    def log_level(self, default: int, *, verbose: bool = False) -> int:
        """The logging level: --verbose (debug), else RUNBOT_LOG_LEVEL, else the command's own default."""
        return log_level(self.runbot_log_level, default, verbose=verbose)

    def kept(self) -> dict[str, object]:
        """What config.environment may keep between calls: every field but the secrets, as JSON values."""
        return self.model_dump(mode="json", exclude={name for name, field in type(self).model_fields.items()
                                                     if _holds_secret(field.annotation)})


def _holds_secret(annotation: object) -> bool:
    return annotation is SecretStr or any(_holds_secret(arg) for arg in typing.get_args(annotation))


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment, with a bad value (`PORT=abc`) as a one-line ConfigError."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = ".".join(str(part) for part in first["loc"]).upper()
        raise ConfigError("environment", name, first["msg"]) from None


# What each Slack credential starts with (Slack's token types; rotated bot tokens are "xoxe.xoxb-").
_BOT_PREFIXES = ("xoxb-", "xoxe.xoxb-")
_APP_PREFIX = "xapp-"


def check_tokens(settings: Settings) -> None:
    """A token in the wrong variable, or pasted with a space, as a one-line ConfigError before Slack is asked:
    otherwise Socket Mode's answer to a bot token is a reconnect loop, not a sentence. Never shows a token."""
    bot = settings.slack_bot_token.get_secret_value() if settings.slack_bot_token else None
    app = settings.slack_app_token.get_secret_value() if settings.slack_app_token else None
    for name, token in (("SLACK_BOT_TOKEN", bot), ("SLACK_APP_TOKEN", app)):
        if token is not None and any(c.isspace() for c in token):
            raise ConfigError("environment", name, "holds a space or a line break (pasted with one?)")
    if bot is not None and bot.startswith(_APP_PREFIX):
        raise ConfigError("environment", "SLACK_BOT_TOKEN", "is an app-level token (xapp-…): the bot token starts "
                                                            "xoxb- (OAuth & Permissions → Bot User OAuth Token)")
    if app is not None and not app.startswith(_APP_PREFIX):
        kind = "the bot token (xoxb-…)" if app.startswith(_BOT_PREFIXES) else "not an app-level token"
        raise ConfigError("environment", "SLACK_APP_TOKEN", f"is {kind}: Socket Mode needs an app-level token, xapp-… "
                                                            "(Basic Information → App-Level Tokens, with connections:write)")
