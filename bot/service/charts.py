"""Charts are drawn in a pool of their own behind a bounded queue, never in the event loop's default executor (shell).

The default executor is also where aiohttp resolves Slack's host name: 50 charts queued there once held
every other answer back past its 10 s (issue 19.8). matplotlib's Agg holds the GIL for most of a chart and
bot.render.chart draws one at a time under a lock, so one worker thread draws as fast as several would.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Callable

QUEUE_LIMIT = 50  # charts drawing or waiting; one takes ~0.1-0.5 s, so the last of 50 waits well under a minute
WORKERS = 1


def thread_pool(workers: int) -> concurrent.futures.Executor:
    return concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="runbot-chart")


class ChartsBusy(Exception):
    """The queue is full: the asker is told to come back, nothing is drawn."""


class ChartQueue:
    """At most `limit` charts drawing or waiting, `workers` at a time, first come first drawn."""

    def __init__(self, *, workers: int = WORKERS, limit: int = QUEUE_LIMIT,
                 make_pool: Callable[[int], concurrent.futures.Executor] = thread_pool) -> None:
        self.workers, self.limit = workers, limit
        self._make_pool = make_pool  # bench/plot_storm.py passes a process pool, to compare
        self._pool: concurrent.futures.Executor | None = None  # made on the first chart
        self._queued = 0  # drawing or waiting; changed on the event loop only

    @property
    def queued(self) -> int:
        return self._queued

    def submit(self, draw: Callable[..., bytes], *args: Any, **kwargs: Any) -> tuple[int, asyncio.Future]:
        """Queue one drawing: (how many charts are ahead of it, the future of its result); ChartsBusy when full."""
        if self._queued >= self.limit:
            raise ChartsBusy(self._queued)
        if self._pool is None:
            self._pool = self._make_pool(self.workers)
        loop = asyncio.get_running_loop()
        ahead = self._queued
        job = self._pool.submit(draw, *args, **kwargs)
        self._queued += 1
        # Counted out when the drawing itself ends (or is cancelled before it starts), not when its asker
        # stops waiting: a chart still being drawn still holds the worker.
        job.add_done_callback(lambda _: self._release_from(loop))
        return ahead, asyncio.wrap_future(job)

    def _release_from(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            loop.call_soon_threadsafe(self._release)
        except RuntimeError:  # the loop has closed (shutdown): nobody is counting any more
            pass

    def _release(self) -> None:
        self._queued -= 1

    def close(self, *, wait: bool = False) -> None:
        """Drop the charts still waiting (their askers are being cut off anyway) and let the workers go."""
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=True)
