"""A dead-man's switch pinged each sweep (healthchecks.io's convention): `/start`, the URL itself on success,
`/fail` with a short reason — fire and forget, through a bounded queue, so a slow checker never slows a sweep (shell)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import aiohttp

from bot import __version__
from bot.core.outages import is_host_key, unreached
from bot.core.redact import clean_line
from bot.core.verdict import Verdict

log = logging.getLogger("runbot.heartbeat")

PING_TIMEOUT_S = 10.0  # one ping, connection included (healthchecks answers in milliseconds)
QUEUE_SIZE = 8  # pings waiting to go out; past it the oldest is dropped (the newest news matters)
REASON_CHARS = 200  # healthchecks keeps a ping's body; a reason is a sentence
STOP_S = 2.0  # on shutdown, what is queued gets this long to go


class Heartbeat:
    """A SweepObserver that pings `url`. Bodies are runbot's own words and counts (never log text, a host's
    answer or a token), and the URL — its check's key — is never logged."""

    def __init__(self, url: str, *, timeout: float = PING_TIMEOUT_S, queue_size: int = QUEUE_SIZE) -> None:
        self.url, self.timeout = url.rstrip("/"), timeout
        self.queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue(maxsize=queue_size)
        self.dropped = 0
        self._judged: list[Verdict] = []
        self._worker: asyncio.Task | None = None

    # --- the observer -----------------------------------------------------------------------------

    def sweep_started(self) -> None:
        self._judged = []
        self.ping("start", "")

    def judged(self, run: str, verdict: Verdict) -> None:
        if not is_host_key(run):  # a host's own verdict repeats what its runs' said
            self._judged.append(verdict)

    def sweep_finished(self, report: Any) -> None:
        why = unreached(self._judged, len(report.still_running))
        if why is not None:
            self.ping("fail", why)
        else:
            self.ping("", f"swept {report.probed} runs in {report.seconds:.2f} s")

    def sweep_failed(self, reason: str) -> None:
        self.ping("fail", reason)

    def slack_call(self, method: str, outcome: str) -> None:
        """Slack's health is the metrics' to count: the switch watches the sweeps."""

    # --- sending ----------------------------------------------------------------------------------

    def ping(self, kind: str, body: str) -> None:
        """Queue a ping ("start", "fail", or "" for success); never waits. A full queue drops its oldest."""
        if self.queue.full():
            with contextlib.suppress(asyncio.QueueEmpty):
                self.queue.get_nowait()
                self.queue.task_done()
                self.dropped += 1
        text = clean_line(body)  # runbot's own words already; cleaned anyway, as every text that leaves
        self.queue.put_nowait((kind, text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 1] + "…"))

    def start(self) -> None:
        """Start the sender on the running loop."""
        self._worker = asyncio.get_running_loop().create_task(self._send_all(), name="heartbeat")

    async def stop(self, timeout: float = STOP_S) -> None:
        """Let what is queued go out for `timeout`, then stop the sender."""
        if self._worker is None:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.queue.join(), timeout)
        self._worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._worker
        self._worker = None

    async def _send_all(self) -> None:
        headers = {"User-Agent": f"runbot/{__version__}", "Content-Type": "text/plain; charset=utf-8"}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout), headers=headers) as session:
            while True:
                kind, body = await self.queue.get()
                try:
                    await self._send(session, kind, body)
                finally:
                    self.queue.task_done()

    async def _send(self, session: aiohttp.ClientSession, kind: str, body: str) -> None:
        url = f"{self.url}/{kind}" if kind else self.url
        try:
            async with session.post(url, data=body.encode()) as answer:
                if answer.status >= 400:
                    log.warning("heartbeat %s: the checker answered HTTP %d", kind or "success", answer.status)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:  # a missed ping is what the checker notices
            log.warning("heartbeat %s not sent: %s", kind or "success", type(exc).__name__)
