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

from handlers import actions, commands, history, plot, watch
from bot.probe.checkup import check_within
from bot.service.slack_http import web_api_retries
from bot.probe.targets import Targets
from bot.core.verdict import Verdict
from config.registry import ConfigError, Registry, Run
from config.settings import Settings

log = logging.getLogger("runbot.app")

# The listener modules, each with register(app); their subcommands are listed in /run help in this order.
LISTENERS = (commands, actions, watch, plot, history)

# A probe that overruns its own timeout by this much is abandoned (the runner should have stopped it).
# Probes running at once; more wait their turn. A local probe costs ~85 ms of CPU in bash and its
# children and ~20-40 ms of parsing in this process: on 2 cores, 50 at once pushed the ack p99 to
# 1.2 s, 16 to 280 ms, 8 to 70 ms (bench/slack_ack.py --runs 50). Acks come first: Slack drops a
# command it has not heard back about in 3 s.
PROBES_AT_ONCE = max(8, 4 * (os.cpu_count() or 2))
# A verdict this young answers anyone else who asks about the run: 200 `/run runs` in 10 s over
# 20 runs are then a probe of each run every few seconds, not one per command (answer p99 2.7 s
# -> see bench/slack_ack.py --command runs). Short enough that "4 s ago" is still true.
FRESH_S = 3.0


@dataclass
class Services:
    """Everything a listener (or the watchdog) needs; no globals."""

    targets: Targets
    registry: Registry
    chat: AsyncWebClient  # the Web API client (base_url and retry handlers already set)
    store: Any = None  # the watchdog's incident store
    watchdog: Any = None
    history: Any = None  # bot.service.history.History: each run's memory (None: not kept, a CLI call)
    clock: Callable[[], float] = time.time
    pending: set = field(default_factory=set, repr=False)  # listener tasks still working, for a clean stop
    probes: int = PROBES_AT_ONCE
    _inflight: dict = field(default_factory=dict, repr=False)  # run name -> the probe running for it
    _recent: dict = field(default_factory=dict, repr=False)  # run name -> (verdict, time.monotonic() it came)
    _gate: asyncio.Semaphore | None = field(default=None, repr=False)

    async def check(self, run: Run, previous: Verdict | None = None) -> Verdict:
        """Probe one run; whatever goes wrong comes back as a verdict, never as an exception.

        Everyone who asks about a run while a probe of it is running, or within FRESH_S of its
        answer, gets that probe's answer (a team pressing Refresh after an alert costs the training
        host one probe, not twenty). A caller with a `previous` verdict (the watchdog) always gets
        a probe of its own.
        """
        if previous is not None:
            return await self._probe(run, previous)
        recent = self._recent.get(run.name)
        if recent is not None and time.monotonic() - recent[1] < FRESH_S:
            return recent[0]
        running = self._inflight.get(run.name)
        if running is None:
            running = self._inflight[run.name] = asyncio.ensure_future(self._probe(run, None))
            running.add_done_callback(lambda done: self._settled(run.name, done))
        return await asyncio.shield(running)  # a caller that gives up must not cancel the others' probe

    def _settled(self, name: str, done: asyncio.Future) -> None:
        self._inflight.pop(name, None)
        if not done.cancelled() and done.exception() is None:
            self._recent[name] = (done.result(), time.monotonic())

    async def _probe(self, run: Run, previous: Verdict | None) -> Verdict:
        if self._gate is None:
            self._gate = asyncio.Semaphore(self.probes)
        async with self._gate:
            recent = self.history.recent(run.name) if self.history is not None else ()
            verdict = await check_within(run, self.targets.runner_for, timeout=self.registry.bot.probe_timeout,
                                         previous=previous, history=recent)
        if self.history is not None:
            self.history.record(run.name, verdict)
        return verdict

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
