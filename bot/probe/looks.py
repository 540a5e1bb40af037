"""The bot's memory of each run's last look, in this process only: what it saw of the log (so the next probe sends
only what changed) and its parse of the log's text (so an unchanged log is not parsed again)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Protocol

from bot.core.evidence import LogFile, LogText, read_log_text, text_key
from bot.core.learned import Learned
from bot.core.sections import Sections
from bot.core.window_cache import Seen

# Runs remembered at most (the least recently looked at goes first): each holds at most a window and its step
# lines (bot.core.window_cache.Seen, <= 128 KiB) and that window's parse.
MOST_RUNS = 4096


class Looked(Protocol):
    name: str
    log: str
    step_pattern: str | None


class Look:
    """One run's last look: its Seen (None: the next probe reads the log in full) and its last parse of the log's text."""

    def __init__(self) -> None:
        self.seen: Seen | None = None
        self._key: tuple | None = None
        self._text: LogText | None = None

    def read_text(self, sections: Sections, log: LogFile, custom: Any, learned: Learned | None) -> LogText:
        """read_log_text, kept while everything it reads is unchanged (bot.core.evidence.text_key)."""
        key = text_key(sections, log, learned)
        if self._text is None or self._key != key:
            self._text, self._key = read_log_text(sections, log, custom, learned), key
        return self._text


class Looks:
    """Every run's Look, keyed by run name and dropped when the run's log or step pattern changes (what its bytes and
    parse depend on). Questions, the watchdog and `runbot status` share one, through the scheduler; a restart of the
    bot starts with full looks."""

    def __init__(self, most: int = MOST_RUNS) -> None:
        self.most = most
        self._runs: OrderedDict[str, tuple[tuple[str, str | None], Look]] = OrderedDict()

    def of(self, run: Looked) -> Look:
        config = (run.log, run.step_pattern)
        held = self._runs.pop(run.name, None)
        look = held[1] if held is not None and held[0] == config else Look()
        self._runs[run.name] = (config, look)
        while len(self._runs) > self.most:
            self._runs.popitem(last=False)
        return look

    def __len__(self) -> int:
        return len(self._runs)
