"""The environment: Slack tokens, the HTTP port and where the configuration lives.

Read from environment variables and from a `.env` file in the working directory
(environment variables win). Unknown variables are ignored; empty ones count as unset.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from config.registry import ConfigError

DEFAULT_CONFIG = "config/runs.toml"


class Settings(BaseSettings):
    """Everything runbot takes from the environment (see docs/configuration.md)."""

    model_config = SettingsConfigDict(
        env_file=".env",
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

    @property
    def socket_mode(self) -> bool:
        """Socket Mode when an app-level token is set; HTTP mode otherwise."""
        return self.slack_app_token is not None


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment, with a bad value (`PORT=abc`) as a one-line ConfigError."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = ".".join(str(part) for part in first["loc"]).upper()
        raise ConfigError("environment", name, first["msg"]) from None


def config_path(cli_value: str | None, settings: Settings) -> Path:
    """The TOML file to read: `--config`, else `RUNBOT_CONFIG`, else `config/runs.toml`."""
    chosen = cli_value or settings.runbot_config or DEFAULT_CONFIG
    return Path(chosen).expanduser()
