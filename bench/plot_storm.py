"""50 `/run plot` at once: how long does `/run help` wait meanwhile, and how long do the charts take?

The real Bolt app on a local port (tests/test_slack_app.py's Bot) gets N signed `/run plot` requests at
once, then a signed `/run help` every `--every` seconds until the last chart is posted. The Slack stand-in
is reached by the name "localhost", so every call to it resolves a host name in the event loop's default
executor, as a call to slack.com does. Only 127.0.0.1 is ever contacted.

    .venv/bin/python bench/plot_storm.py [--n 50] [--pool queue|process|default] [--workers 1] [--hours 6]

`queue` is runbot's (bot/service/charts.py: a thread pool of its own, `--workers` threads); `process` the
same queue over a process pool (spawn); `default` the old way, the charts in the loop's default executor.
Prints a table and a last line `RESULT name=value ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import multiprocessing
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.service.charts import ChartQueue  # noqa: E402
from tests.slack_stub import SlackStub  # noqa: E402
from tests.test_plot import bot_with_memory, history, last_word  # noqa: E402


def pool(kind: str, workers: int, loop: asyncio.AbstractEventLoop) -> ChartQueue:
    if kind == "process":
        spawn = multiprocessing.get_context("spawn")
        return ChartQueue(workers=workers, limit=10_000,
                          make_pool=lambda n: concurrent.futures.ProcessPoolExecutor(max_workers=n, mp_context=spawn))
    if kind == "default":  # what /run plot did before: asyncio.to_thread, in the pool aiohttp resolves names in
        shared = concurrent.futures.ThreadPoolExecutor(max_workers=min(32, (os.cpu_count() or 1) + 4))
        loop.set_default_executor(shared)
        return ChartQueue(workers=shared._max_workers, limit=10_000, make_pool=lambda n: shared)
    return ChartQueue(workers=workers, limit=10_000)


async def storm(args: argparse.Namespace, tmp: Path, stub: SlackStub) -> dict:
    bot = bot_with_memory(tmp, stub, {"dflash": history(now=time.time(), hours=args.hours)}, [])
    bot.services.charts = pool(args.pool, args.workers, asyncio.get_running_loop())
    helps: list[float] = []
    async with bot:
        await bot.ask("help")  # auth.test, imports
        started = time.monotonic()
        plots = await asyncio.gather(*(bot.command(f"plot dflash {args.hours:g}h") for _ in range(args.n)))
        acks = [took for _, _, took in plots]
        done: dict[str, float] = {}

        async def watch() -> None:
            deadline = started + args.deadline  # a chart whose answer was lost is never posted: stop waiting
            while len(done) < len(plots) and time.monotonic() < deadline:
                for name, _, _ in plots:
                    if name not in done and last_word(stub, name):
                        done[name] = time.monotonic() - started
                await asyncio.sleep(0.02)

        watcher = asyncio.create_task(watch())
        lost = 0
        while not watcher.done():
            asked = time.monotonic()
            try:
                await bot.ask("help")
                helps.append(time.monotonic() - asked)
            except (AssertionError, aiohttp.ClientError):  # no answer within 15 s, or the request failed: lost
                lost += 1
            await asyncio.sleep(args.every)
        await watcher
    bot.services.charts.close(wait=True)  # the workers' memory counts in the table
    return {"acks": acks, "charts": sorted(done.values()), "helps": helps, "lost": lost,
            "charts_lost": len(plots) - len(done)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--pool", choices=("queue", "process", "default"), default="queue")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--every", type=float, default=0.5, help="seconds between /run help during the storm")
    ap.add_argument("--deadline", type=float, default=240, help="seconds after which an unanswered chart counts as lost")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, SlackStub(host="localhost") as stub:
        got = asyncio.run(storm(args, Path(tmp), stub))
    charts, helps = got["charts"] or [float("nan")], got["helps"] or [float("nan")]
    own, child = (resource.getrusage(who).ru_maxrss / 1024 for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    print(f"{args.n} × /run plot ({args.hours:g} h of points), pool={args.pool} workers={args.workers}, "
          f"{os.cpu_count()} CPUs")
    print(f"{'what':<28} {'p50 s':>8} {'max s':>8} {'n':>4}")
    print(f"{'ack of a /run plot':<28} {statistics.median(got['acks']):8.3f} {max(got['acks']):8.3f} {len(got['acks']):>4}")
    print(f"{'chart posted (from start)':<28} {statistics.median(charts):8.2f} {max(charts):8.2f} {len(charts):>4}")
    print(f"{'/run help answered':<28} {statistics.median(helps):8.3f} {max(helps):8.3f} {len(got['helps']):>4}")
    workers = f", {child:.0f} MiB per worker process" if args.pool == "process" else ""
    print(f"help answers lost: {got['lost']}, chart answers lost: {got['charts_lost']}; peak RSS {own:.0f} MiB here{workers}")
    print(f"RESULT pool={args.pool} workers={args.workers} charts_s={max(charts):.1f} help_p50_s={statistics.median(helps):.3f} "
          f"help_max_s={max(helps):.3f} help_lost={got['lost']} charts_lost={got['charts_lost']} "
          f"ok={got['lost'] == 0 and got['charts_lost'] == 0 and max(helps) < 2.0}")


if __name__ == "__main__":
    main()
