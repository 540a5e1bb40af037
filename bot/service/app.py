"""The Slack app: Services (what listeners need, handed over in Bolt's context) and the AsyncApp factory (shell)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from slack_bolt.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

from handlers import actions, commands, doctor, history, host, plot, watch
from bot.service.charts import ChartQueue
from bot.service.slack_http import web_api_retries
from bot.probe.scheduler import Priority, Scheduler
from bot.probe.targets import Targets
from bot.core.verdict import Verdict
from config.registry import ConfigError, Registry, Run
from config.settings import Settings

log = logging.getLogger("runbot.app")

# The listener modules, each with register(app); their subcommands are listed in /run help in this order.
LISTENERS = (commands, actions, watch, plot, history, host, doctor)

@dataclass
class Services:
    """Everything a listener (or the watchdog) needs; no globals."""

    targets: Targets
    registry: Registry
    chat: AsyncWebClient  # the Web API client (base_url and retry handlers already set)
    store: Any = None  # the watchdog's incident store
    watchdog: Any = None
    scheduler: Scheduler | None = None  # every probe goes through it (made from targets when not given)
    observer: Any = None  # told of each sweep (bot.service.observe): the metrics and heartbeat [bot] asks for
    clock: Callable[[], float] = time.time
    charts: ChartQueue = field(default_factory=ChartQueue)  # /run plot draws here, never in the default executor
    pending: set = field(default_factory=set, repr=False)  # listener tasks still working, for a clean stop

    def __post_init__(self) -> None:
        if self.scheduler is None:
            self.scheduler = Scheduler(self.registry, self.targets)

    @property
    def history(self) -> Any:
        """bot.service.history.History: each run's memory, which the scheduler adds every probe to (None: not kept)."""
        return self.scheduler.history  # type: ignore[union-attr]

    @history.setter
    def history(self, memory: Any) -> None:
        self.scheduler.history = memory  # type: ignore[union-attr]

    async def check(self, run: Run, *, wait: float | None = None) -> Verdict:
        """A person's question about one run: served before sweeps, shared with others asking (see Scheduler)."""
        return await self.scheduler.check(run, priority=Priority.ASK, wait=wait)  # type: ignore[union-attr]

    @contextlib.contextmanager
    def tracking(self) -> Iterator[None]:
        """Mark the current task as work a clean shutdown should wait for."""
        task = asyncio.current_task()
        if task is not None:
            self.pending.add(task)
        try:
            yield
        finally:
            self.pending.discard(task)

    async def drain(self, timeout: float) -> int:
        """Wait up to `timeout` for listeners still working; returns how many were cut off."""
        tasks = {t for t in self.pending if not t.done()}
        if not tasks:
            return 0
        _, late = await asyncio.wait(tasks, timeout=timeout)
        for task in late:
            task.cancel()
        return len(late)


def _quiet_token_warning(record: logging.LogRecord) -> bool:
    # Bolt reads SLACK_BOT_TOKEN itself and warns that the client's copy wins: it is the same token.
    return not str(record.msg).startswith("As you gave `client` as well")


def make_client(settings: Settings) -> AsyncWebClient:
    """The Web API client: the bot token, SLACK_API_BASE_URL if set, and runbot's retries (bot/slack_http.py:
    short 429s waited out, a dropped connection retried only where a repeat cannot post twice)."""
    token = settings.slack_bot_token.get_secret_value() if settings.slack_bot_token else None
    extra = {}
    if settings.slack_api_base_url:
        # urljoin drops a last path segment without a slash: ".../api" + "auth.test" -> "/auth.test".
        extra["base_url"] = settings.slack_api_base_url.rstrip("/") + "/"
    return AsyncWebClient(
        token=token,
        retry_handlers=web_api_retries(),
        **extra,
    )


def make_services(registry: Registry, settings: Settings, *, local_env: Mapping[str, str] | None = None) -> Services:
    return Services(targets=Targets(registry, local_env=local_env), registry=registry, chat=make_client(settings))


def build_app(registry: Registry, settings: Settings, services: Services) -> AsyncApp:
    """The Bolt app with runbot's listeners; Socket Mode skips signature checks (there is no HTTP)."""
    if not settings.slack_bot_token:
        raise ConfigError("environment", "SLACK_BOT_TOKEN", "not set (the xoxb-… token; see docs/slack.md)")
    secret = settings.slack_signing_secret.get_secret_value() if settings.slack_signing_secret else None
    if not settings.socket_mode and not secret:
        raise ConfigError("environment", "SLACK_SIGNING_SECRET",
                          "not set (HTTP mode checks every request with it; or set SLACK_APP_TOKEN for Socket Mode)")
    bolt_log = logging.getLogger("runbot.bolt")
    bolt_log.addFilter(_quiet_token_warning)
    app = AsyncApp(
        client=services.chat,
        signing_secret=secret,
        request_verification_enabled=not settings.socket_mode,
        name="runbot",
        logger=bolt_log,
    )

    async def inject_services(context, next):
        context["services"] = services
        await next()

    app.middleware(inject_services)
    for listener in LISTENERS:
        listener.register(app)
    return app
