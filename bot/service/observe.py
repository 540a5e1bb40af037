"""What the watchdog tells whoever watches it (the metrics, a dead-man's switch): the observer seam, a fan-out
that keeps an observer's fault out of the sweep, and a Chat that reports each Slack call's outcome (shell)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

from bot.core.verdict import Verdict

log = logging.getLogger("runbot.observe")

# A Slack call's outcome, as the metrics label it (bot.service.chat.ChatError says which).
SLACK_OUTCOMES = ("ok", "rate_limited", "transient", "refused")
SLACK_METHODS = ("post", "update", "find")  # the Chat calls the watchdog makes


class SweepObserver(Protocol):
    """Told, in order: a sweep started, each run judged (its name, its verdict), the sweep's report (or that
    it failed); and each Slack call's outcome. Plain calls on the event loop: an observer must not block."""

    def sweep_started(self) -> None: ...

    def judged(self, run: str, verdict: Verdict) -> None: ...

    def sweep_finished(self, report: Any) -> None: ...  # bot.service.watchdog.SweepReport

    def sweep_failed(self, reason: str) -> None: ...

    def slack_call(self, method: str, outcome: str) -> None: ...


class Observers:
    """Several observers as one; one that raises is logged and skipped, never the sweep's problem."""

    def __init__(self, observers: Sequence[Any] = ()) -> None:
        self.observers = list(observers)

    def _tell(self, name: str, *args: Any) -> None:
        for observer in self.observers:
            try:
                getattr(observer, name)(*args)
            except Exception:  # noqa: BLE001 - a metric's bug must not cost an alert
                log.exception("observer %s failed on %s", type(observer).__name__, name)

    def sweep_started(self) -> None:
        self._tell("sweep_started")

    def judged(self, run: str, verdict: Verdict) -> None:
        self._tell("judged", run, verdict)

    def sweep_finished(self, report: Any) -> None:
        self._tell("sweep_finished", report)

    def sweep_failed(self, reason: str) -> None:
        self._tell("sweep_failed", reason)

    def slack_call(self, method: str, outcome: str) -> None:
        self._tell("slack_call", method, outcome)


def slack_outcome(exc: BaseException | None) -> str:
    """One of SLACK_OUTCOMES for a call that raised `exc` (None: it went through)."""
    if exc is None:
        return "ok"
    if getattr(exc, "retry_after", None) is not None:
        return "rate_limited"
    return "transient" if getattr(exc, "transient", True) else "refused"


class ObservedChat:
    """The watchdog's Chat, each post, update and find told to the observer with its outcome; everything
    else (channel_id, …) is the wrapped Chat's own."""

    def __init__(self, chat: Any, observer: SweepObserver) -> None:
        self._chat, self._observer = chat, observer
        if not hasattr(chat, "find"):  # the watchdog asks hasattr-style: a Chat without find stays without
            self.find = None  # type: ignore[assignment]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._chat, name)

    async def _observed(self, method: str, call: Any) -> Any:
        try:
            result = await call
        except Exception as exc:
            self._observer.slack_call(method, slack_outcome(exc))
            raise
        self._observer.slack_call(method, "ok")
        return result

    async def post(self, *args: Any, **kwargs: Any) -> str:
        return await self._observed("post", self._chat.post(*args, **kwargs))

    async def update(self, *args: Any, **kwargs: Any) -> None:
        return await self._observed("update", self._chat.update(*args, **kwargs))

    async def find(self, *args: Any, **kwargs: Any) -> str | None:  # type: ignore[no-redef]
        return await self._observed("find", self._chat.find(*args, **kwargs))
