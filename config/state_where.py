"""Where the state lives: an SQLite file path or a PostgreSQL URL (told apart without importing a driver)."""

from __future__ import annotations

import urllib.parse

SCHEMES = ("postgresql://", "postgres://")


def is_server(where: str) -> bool:
    """Does the state setting name a PostgreSQL database rather than an SQLite file?"""
    return str(where).startswith(SCHEMES)


def redacted(url: str) -> str:
    """The URL without its password, for logs and Slack."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
