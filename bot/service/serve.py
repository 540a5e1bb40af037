"""`runbot serve`: the Slack app over Socket Mode or HTTP, with start/stop hooks and a clean stop on SIGTERM (shell)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
import sys
import time
from typing import Any, Mapping

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier

from bot.service import health as health_of
from bot.service import monitoring, watchdog
from bot.service.app import Services, build_app, make_services
from bot.service.logs import JsonLines, to_stderr
from bot.service.slack_requests import MAX_BODY, SeenSignatures, body_fault, timestamp_fault
from bot.service.state_file import StateFile, StateFileError
from config.registry import ConfigError, Registry
from config.settings import Settings, check_tokens

log = logging.getLogger("runbot.serve")

EVENTS_PATH = "/slack/events"
HEADER_TIMEOUT_S = 10.0  # Slack sends a whole request at once; a connection that dawdles is not Slack
BODY_TIMEOUT_S = 10.0
DRAIN_S = 10.0  # on SIGTERM, answers already being worked on get this long to go out
EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2

# Started after the app is listening, stopped (in reverse) once it has stopped taking requests
# and the answers in flight are out. Each is an object or module with optional
# `on_start(services)` / `on_stop(services)` (plain or async): the watchdog runs its scheduler
# on this event loop. Monitoring starts first: the watchdog's on_start hands its observer to the Watchdog.
STARTUP_HOOKS: list[Any] = [monitoring, watchdog]


def serve(registry: Registry, settings: Settings, *, log_level: int = logging.INFO) -> int:
    """Run the bot until SIGTERM or SIGINT; the exit status for `runbot serve`."""
    setup_logging(log_level)
    try:
        return asyncio.run(serve_async(registry, settings))
    except ConfigError as exc:
        print(f"runbot: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except StateFileError as exc:  # a backstop: serve_async opens the state file first and says so itself
        print(f"runbot: {exc}", file=sys.stderr)
        return EXIT_CONFIG


async def serve_async(
    registry: Registry,
    settings: Settings,
    *,
    local_env: Mapping[str, str] | None = None,
    stop: asyncio.Event | None = None,
    host: str = "0.0.0.0",
) -> int:
    """Serve until `stop` is set (SIGTERM and SIGINT set it)."""
    check_tokens(settings)  # before any connection: a swapped token is a sentence, not a reconnect loop
    services = make_services(registry, settings, local_env=local_env)
    app = build_app(registry, settings, services)
    try:  # before Slack: a state file that cannot be used is a configuration problem, said in one line
        services.store = StateFile.open(registry.bot.state_db)
    except StateFileError as exc:
        print(f"runbot: {exc}", file=sys.stderr)
        await services.targets.close()
        return EXIT_CONFIG
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    started: list[Any] = []
    close = None
    try:
        if (fault := await _preflight(services, settings)) is not None:
            print(f"runbot: {fault}", file=sys.stderr)
            return EXIT_FAILED
        try:
            close = await (_socket_mode(app, settings) if settings.socket_mode else _http_mode(app, settings, host, health_of.of(services)))
        except OSError as exc:
            print(f"runbot: cannot listen on {host}:{settings.port}: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_FAILED
        for hook in STARTUP_HOOKS:
            try:
                await _call(hook, "on_start", services)
            except monitoring.StartError as exc:
                print(f"runbot: {exc}", file=sys.stderr)
                return EXIT_FAILED
            started.append(hook)
        store = services.store
        log.info("ready", extra={"runbot": {"event": "ready", "mode": "socket" if settings.socket_mode else "http",
                                            "port": None if settings.socket_mode else settings.port,
                                            "runs": len(registry.runs),
                                            # the state file as it started: a fault (read-only…), rows it could not read
                                            "state_fault": store.fault, "unreadable_rows": dict(store.unreadable)}})
        await stop.wait()
        log.info("stopping", extra={"runbot": {"event": "stopping", "in_flight": len(services.pending)}})
        return EXIT_OK
    finally:
        # No new requests, then the answers in flight go out (a /run mute still needs the
        # watchdog and its store), and only then the hooks stop what they started.
        if close is not None:
            await close()
        late = await services.drain(DRAIN_S)
        for hook in reversed(started):
            try:
                await _call(hook, "on_stop", services)
            except Exception:
                log.exception("on_stop hook failed")
        await services.targets.close()
        services.charts.close()
        if services.store is not None:
            services.store.close()  # the watchdog's on_stop may have closed it already: closing twice is harmless
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        log.info("stopped", extra={"runbot": {"event": "stopped", "cut_off": late}})


async def _preflight(services: Services, settings: Settings) -> str | None:
    """Ask Slack once whether the tokens work, so a bad one is one clear line at start-up rather
    than a 401 on the first command (HTTP) or a reconnect loop that never ends (Socket Mode)."""
    name = "SLACK_BOT_TOKEN"
    try:
        await services.chat.auth_test()
        if settings.socket_mode:
            name = "SLACK_APP_TOKEN"
            await services.chat.apps_connections_open(app_token=settings.slack_app_token.get_secret_value())
    except SlackApiError as exc:
        return f"Slack refused {name}: {exc.response.get('error')} (see docs/slack.md)"
    except Exception as exc:
        return f"cannot reach Slack's Web API at {services.chat.base_url}: {type(exc).__name__}: {exc}"
    return None


def http_runner(app: AsyncApp, settings: Settings, *, header_timeout: float = HEADER_TIMEOUT_S,
                body_timeout: float = BODY_TIMEOUT_S, health: health_of.Health = health_of.alive) -> web.AppRunner:
    """The HTTP mode server, ready for `setup()`: runbot's routes with its timeouts.

    A connection must send a whole request line and headers within `header_timeout` (aiohttp's
    keep-alive timer also runs before the first request) and its body within `body_timeout`, so
    slow or idle connections cannot pile up (slowloris)."""
    secret = settings.slack_signing_secret.get_secret_value() if settings.slack_signing_secret else ""
    # lingering_time: after an early answer (the 408), aiohttp would otherwise read what is left of
    # the body for 10 s before closing.
    return web.AppRunner(http_app(app, secret, body_timeout=body_timeout, health=health), access_log=None,
                         keepalive_timeout=header_timeout, lingering_time=min(body_timeout, 2.0))


def http_app(app: AsyncApp, signing_secret: str, *, body_timeout: float = BODY_TIMEOUT_S,
             health: health_of.Health = health_of.alive) -> web.Application:
    """POST /slack/events (signed requests only, within Slack's 5-minute window, each once) and GET /healthz.

    The signature is checked here, before anything parses the body: an unsigned request is a 401
    whatever it holds, a replayed one too, and a signed one that is not a request runbot serves is
    a 400, rather than reaching Bolt and failing inside it with a traceback.
    """
    verifier = SignatureVerifier(signing_secret)
    seen = SeenSignatures()

    async def events(request: web.Request) -> web.StreamResponse:
        timestamp = request.headers.get("X-Slack-Request-Timestamp")
        if fault := timestamp_fault(timestamp):
            return web.Response(status=401, text=fault)
        if (request.content_length or 0) > MAX_BODY:  # said up front: refused unread
            return await _refuse_and_close(request, 413, "body too large")
        try:
            body = await asyncio.wait_for(request.text(), body_timeout)
        except asyncio.TimeoutError:
            return await _refuse_and_close(request, 408, "body too slow")
        except (UnicodeDecodeError, ValueError):
            return web.Response(status=400, text="body is not text")
        signature = request.headers.get("X-Slack-Signature", "")
        if not verifier.is_valid(body, timestamp, signature):
            return web.Response(status=401, text="invalid signature or stale timestamp")
        fresh = seen.first_time(signature, int(timestamp), time.time())  # type: ignore[arg-type]
        if not fresh:
            log.warning("refused a signed request: %s", "replayed" if fresh is False else f"{len(seen)} requests in 5 min")
            return web.Response(status=401, text="replayed request") if fresh is False else \
                web.Response(status=429, text="too many requests")
        if fault := body_fault(body, request.content_type):
            log.info("refused a signed request: %s", fault)
            return web.Response(status=400, text=fault)
        bolt = AsyncBoltRequest(body=body, query=request.query_string, headers=request.headers)  # type: ignore[arg-type]
        return await to_aiohttp_response(await app.async_dispatch(bolt))

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response(health())

    web_app = web.Application(client_max_size=MAX_BODY)
    web_app.router.add_post(EVENTS_PATH, events)
    web_app.router.add_get("/healthz", healthz)
    return web_app


async def _refuse_and_close(request: web.Request, status: int, text: str) -> web.StreamResponse:
    """Answer at once and close the connection: no lingering read of a body that stalls or that is too large
    (aiohttp reads what is left of a body for a while after an early answer, unless the connection is closed)."""
    refused = web.Response(status=status, text=text)
    refused.force_close()
    await refused.prepare(request)
    await refused.write_eof()
    request.protocol.force_close()  # the answer is in the transport's buffer: closing sends it first
    return refused


async def _http_mode(app: AsyncApp, settings: Settings, host: str, health: health_of.Health):
    runner = http_runner(app, settings, health=health)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, settings.port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner.cleanup


async def _socket_mode(app: AsyncApp, settings: Settings):
    from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler

    handler = AsyncSocketModeHandler(app, settings.slack_app_token.get_secret_value(), web_client=app.client)
    try:
        await handler.connect_async()
    except BaseException:
        await handler.close_async()
        raise
    return handler.close_async


async def _call(hook: Any, name: str, services: Services) -> None:
    fn = getattr(hook, name, None)
    if fn is not None:
        result = fn(services)
        if inspect.isawaitable(result):
            await result


def setup_logging(level: int = logging.INFO) -> None:
    to_stderr(level, JsonLines())
