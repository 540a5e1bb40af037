"""`runbot serve`'s start hook for the team's monitoring: GET /metrics on its own listener and the heartbeat,
both fed by the watchdog's one observer hook (services.observer), both off unless [bot] asks (shell)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiohttp import web

from bot.service import health as health_of
from bot.service.heartbeat import Heartbeat
from bot.service.metrics import Metrics
from bot.service.observe import Observers

log = logging.getLogger("runbot.monitoring")

# The classic text format, which every Prometheus (and VictoriaMetrics, Grafana Agent…) reads, and what
# generate_latest writes; runbot's names are plain [a-z_], so the newer formats would add nothing.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class StartError(Exception):
    """Monitoring asked for and impossible (the metrics port in use): one line, and `runbot serve` exits 1."""


class Monitoring(Observers):
    """The observers [bot] asks for, and what they need stopped."""

    def __init__(self, metrics: Metrics | None, heartbeat: Heartbeat | None) -> None:
        super().__init__([o for o in (metrics, heartbeat) if o is not None])
        self.metrics, self.heartbeat = metrics, heartbeat
        self.runner: web.AppRunner | None = None

    async def close(self) -> None:
        if self.heartbeat is not None:
            await self.heartbeat.stop()
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


def metrics_app(metrics: Metrics, health: health_of.Health = health_of.alive) -> web.Application:
    """GET /metrics, the Prometheus text format, and GET /healthz (as on the Slack port: the container's
    HEALTHCHECK asks it, in Socket Mode too, where no Slack port is open); nothing else is served here."""

    async def scrape(_: web.Request) -> web.Response:
        # In a thread: a few hundred runs take a good fraction of a second to write out, and the loop has
        # sweeps and Slack to serve meanwhile (prometheus-client's metrics take their own locks).
        return web.Response(body=await asyncio.to_thread(metrics.exposition), headers={"Content-Type": CONTENT_TYPE})

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response(health())

    app = web.Application()
    app.router.add_get("/metrics", scrape)
    app.router.add_get("/healthz", healthz)
    return app


async def listen(metrics: Metrics, host: str, port: int, health: health_of.Health = health_of.alive) -> web.AppRunner:
    """Serve `metrics` on host:port until the runner is cleaned up."""
    runner = web.AppRunner(metrics_app(metrics, health), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        raise StartError(f"cannot listen on {host}:{port} for /metrics ([bot] metrics_listen): {exc.strerror or exc}") from None
    return runner


async def on_start(services: Any) -> None:
    """Before the watchdog's own on_start, which hands services.observer to the Watchdog it makes."""
    bot = services.registry.bot
    if bot.metrics_listen is None and bot.heartbeat_url is None:
        return
    clock = getattr(services, "clock", None) or time.time
    metrics = Metrics(services.registry.runs.values(), clock=clock) if bot.metrics_listen is not None else None
    heartbeat = Heartbeat(bot.heartbeat_url) if bot.heartbeat_url is not None else None
    monitoring = Monitoring(metrics, heartbeat)
    if metrics is not None:
        host, port = bot.metrics_listen
        monitoring.runner = await listen(metrics, host, port, health_of.of(services))
        log.info("serving /metrics on %s:%d", host, port)
    if heartbeat is not None:
        heartbeat.start()
        log.info("pinging the heartbeat URL each sweep")  # never the URL: it is its check's key
    services.observer = monitoring


async def on_stop(services: Any) -> None:
    monitoring = getattr(services, "observer", None)
    if isinstance(monitoring, Monitoring):
        await monitoring.close()
