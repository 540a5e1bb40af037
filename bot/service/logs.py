"""Where log records go: one handler on stderr, JSON lines for the bot, plain lines for a person at a terminal."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any


class JsonLines(logging.Formatter):
    """Every log record as one JSON line; a record's `runbot` dict supplies its fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": round(record.created, 3), "level": record.levelname.lower(), "logger": record.name}
        fields = getattr(record, "runbot", None)
        if isinstance(fields, dict):
            out.update(fields)
        else:
            out["msg"] = record.getMessage()
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


class PlainLines(logging.Formatter):
    """"runbot: debug: runbot.cli: …": its level in the JSON lines' casing, for the CLI's --verbose."""

    def format(self, record: logging.LogRecord) -> str:
        text = f"runbot: {record.levelname.lower()}: {record.name}: {record.getMessage()}"
        return f"{text}\n{self.formatException(record.exc_info)}" if record.exc_info else text


def to_stderr(level: int, formatter: logging.Formatter) -> None:
    """Every record at `level` and above to stderr, through `formatter` (and no other handler)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
