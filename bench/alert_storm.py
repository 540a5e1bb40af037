"""An hour of flapping runs, a crash in the middle of the storm, and a state disk that freezes: what reaches Slack, and how fast.

Simulated time (the watchdog's clock moves 22/3 s a sweep), real diagnosis of canned probe output,
the real slack_sdk client against the local Slack stand-in (127.0.0.1 only). Three setups:
flap folding and the crash reserve on (as shipped), the reserve off, and both off (as before).
Then `/run status` and `/run mute` answer times while every state-file write hangs.

Each storm also measures how long news waits for Slack (simulated seconds from the decision to the
call that shows it): p50 and p99 over every post and reply decided, the slowest first alert, and
what is still unsent at the end. The review's storm: `--runs 100 --minutes 8`.

Usage: .venv/bin/python bench/alert_storm.py [--runs 20] [--minutes 60] [--quick]
(`--quick`: the shipped setup only, no frozen disk). Prints a table and a last line `RESULT name=value ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bot.core import budget  # noqa: E402
from bot.core.ledger import Ledger  # noqa: E402
from bot.service.app import Services, make_client  # noqa: E402
from bot.service.chat import SlackChat  # noqa: E402
from bot.service.state_file import StateFile  # noqa: E402
from bot.service.store import Store  # noqa: E402
from bot.service.watchdog import Watchdog  # noqa: E402
from config.registry import parse_registry  # noqa: E402
from config.settings import Settings  # noqa: E402
from handlers.commands import dispatch  # noqa: E402
from tests.builders import CannedRunner, sections  # noqa: E402
from tests.slack_stub import BOT_TOKEN, SlackStub  # noqa: E402

STEPS = "".join(f"step={i} loss=2.{i} tok/s=14200\n" for i in range(1, 6))
CRASH = STEPS + "Traceback (most recent call last):\n  File \"train.py\", line 9\ntorch.OutOfMemoryError: CUDA out of memory.\n"
EVERY_S = 22 / 3


def steps(last: int) -> str:
    return "".join(f"step={i} loss=2.{i % 10} tok/s=14200\n" for i in range(max(1, last - 4), max(1, last) + 1))

CRASH_AT = 7


def config(runs: int, flap_changes: int) -> str:
    text = (f'[bot]\ncheck_every = "7s"\nalert_channel = "C0ALERTS"\nflap_changes = {flap_changes}\n'
            '[defaults]\ngpu_samples = 1\nsilence_after = "5s"\n')
    text += "".join(f'[runs.flap{i}]\nhost = "local"\nlog = "/x/flap{i}.log"\n' for i in range(runs))
    return text + '[runs.crasher]\nhost = "local"\nlog = "/x/crasher.log"\n'


def make(folder: Path, stub: SlackStub, text: str, runner_for, clock) -> Watchdog:
    (folder / "runs.toml").write_text(text)
    registry = parse_registry(text, folder / "runs.toml")
    settings = Settings(_env_file=None, slack_bot_token=BOT_TOKEN, slack_api_base_url=stub.api_url)
    targets = type("Targets", (), {"runner_for": lambda self, run: runner_for(run)})()
    wd = Watchdog(registry, targets, StateFile.open(folder / "state.sqlite3"), SlackChat(make_client(settings)),
                  clock=clock)
    wd.probes.group_max = 1  # the canned runners answer for one run: each run its own probe
    return wd


async def storm(stub: SlackStub, runs: int, minutes: float, *, fold: bool, reserve: bool) -> dict:
    stub.reset()
    now, sweep = [time.time()], [0]

    def runner_for(run):
        if run.name == "crasher":
            crashed = sweep[0] >= CRASH_AT
            return CannedRunner(lambda: sections(CRASH if crashed else STEPS, age=1.0,
                                                 writers=() if crashed else ((7, 60, "python3 train.py"),)))
        # Every third sweep silent for a minute, else a new step: the step must advance to count as progress
        # (runbot compares it with the last probe's), so a healthy sweep prints one more.
        return CannedRunner(lambda: sections(steps(sweep[0] - 1 if sweep[0] % 3 == 0 else sweep[0]),
                                             age=60.0 if sweep[0] % 3 == 0 else 1.0))

    queued: dict[int, tuple[str, str, float]] = {}  # every row decided: id -> (run, op, when)
    real_queue = Ledger._queue

    def queue(self, run, seq, m, at, concern=None):
        row_id = real_queue(self, run, seq, m, at, concern)
        queued[row_id] = (run, m.op, at)
        return row_id

    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(budget, "RESERVED", budget.RESERVED if reserve else 0.0), \
            mock.patch("bot.service.watchdog.RESERVED", budget.RESERVED if reserve else 0.0), \
            mock.patch.object(Ledger, "_queue", queue):
        wd = make(Path(tmp), stub, config(runs, 6 if fold else 1000), runner_for, lambda: now[0])
        for sweep[0] in range(int(minutes * 60 / EVERY_S)):
            await wd.sweep()
            now[0] += EVERY_S
        await wd.stop()
        crash = next(m for m in wd.ledger.messages.values() if m.run == "crasher" and m.op == "post")
        lags = news_lags(wd.ledger, queued)
        wd.state_file.close()
    hours = minutes / 60
    posts = [p for m, p in stub.calls if m == "chat.postMessage" and "crasher" not in p["text"]]
    edits = [p for m, p in stub.calls if m == "chat.update" and "crasher" not in p["text"]]
    return {"posts": len(posts) / runs / hours, "edits": len(edits) / runs / hours,
            "crash_lag": crash.sent_at - crash.created_at if crash.sent_at else float("inf"),
            "calls": sum(1 for m, _ in stub.calls if m in ("chat.postMessage", "chat.update")), **lags}


def news_lags(ledger: Ledger, queued: dict[int, tuple[str, str, float]]) -> dict:
    """How long each post and reply decided waited for the Slack call that showed it (simulated seconds).

    A row sent on its own: its sent_at. A row folded into a channel digest (gone from the outbox, never
    sent itself): the first digest call at or after it was decided. Unsent at the end: counted apart."""
    digests = sorted(m.sent_at for m in ledger.messages.values() if m.run.startswith("digest ") and m.sent_at is not None)
    lags, first, unsent, unsent_first = [], [], 0, 0
    for row_id, (run, op, at) in queued.items():
        if op == "update" or run.startswith("digest "):
            continue
        m = ledger.messages.get(row_id)
        if m is not None:
            done = m.sent_at
        else:
            done = next((t for t in digests if t >= at), None)
        if done is None:
            unsent += 1
            unsent_first += op == "post"
            continue
        lags.append(done - at)
        if op == "post":
            first.append(done - at)
    lags.sort()
    pick = lambda q: lags[min(len(lags) - 1, int(q * len(lags)))] if lags else float("nan")  # noqa: E731
    return {"queued": len(queued), "news": len(lags) + unsent, "lag_p50": pick(0.5), "lag_p99": pick(0.99),
            "first_max": max(first, default=float("nan")), "unsent": unsent, "unsent_first": unsent_first}


async def frozen_disk(stub: SlackStub) -> dict:
    """Answer times of /run status and /run mute while every write of the state file hangs."""
    stub.reset()
    thaw = threading.Event()
    with tempfile.TemporaryDirectory() as tmp, \
            mock.patch.object(Store, "apply", lambda self, *changes: thaw.wait(60)), \
            mock.patch.object(Store, "dump", lambda self, ledger: thaw.wait(60)):
        folder = Path(tmp)
        log = folder / "train.log"
        log.write_text(STEPS)
        text = (f'[bot]\nalert_channel = "C0ALERTS"\n[runs.alpha]\nhost = "local"\nlog = "{log}"\n'
                'gpu_samples = 1\nsilence_after = "5s"\n')
        wd = make(folder, stub, text, lambda run: CannedRunner(lambda: sections(STEPS, age=60.0)), time.time)
        wd.state_file.deadline = 1.0
        services = Services(targets=wd.targets, registry=wd.registry, chat=None, store=wd.state_file, watchdog=wd)
        status, mutes = [], []
        await wd.sweep()  # the first write hangs: the disk counts as failing from here
        for _ in range(20):
            t = time.perf_counter()
            await dispatch(services, "U1", "C0TEAM", "status alpha")
            status.append(time.perf_counter() - t)
            t = time.perf_counter()
            await dispatch(services, "U1", "C0TEAM", "mute alpha 1h")
            mutes.append(time.perf_counter() - t)
            await asyncio.sleep(0.05)
        thaw.set()
        await wd.stop()
        wd.state_file.close()
    return {"status_p50": statistics.median(status), "status_max": max(status),
            "mute_p50": statistics.median(mutes), "mute_max": max(mutes)}


async def main(args) -> None:
    setups = (("as shipped", True, True), ("no crash reserve", True, False), ("no folding, no reserve (before)", False, False))
    with SlackStub() as stub:
        rows = [(name, await storm(stub, args.runs, args.minutes, fold=fold, reserve=reserve))
                for name, fold, reserve in setups[:1 if args.quick else 3]]
        disk = None if args.quick else await frozen_disk(stub)
    print(f"{args.runs} runs flapping every ~22 s for {args.minutes:g} simulated min, one crash at sweep {CRASH_AT}")
    print(f"{'setup':<34} {'posts/run/h':>12} {'edits/run/h':>12} {'crash lag s':>12} {'queued':>6} {'news':>6} {'calls':>6} "
          f"{'lag p50':>8} {'lag p99':>8} {'1st max':>8} {'unsent':>7}")
    for name, r in rows:
        print(f"{name:<34} {r['posts']:>12.1f} {r['edits']:>12.1f} {r['crash_lag']:>12.1f} {r['queued']:>6} {r['news']:>6} {r['calls']:>6} "
              f"{r['lag_p50']:>8.1f} {r['lag_p99']:>8.1f} {r['first_max']:>8.1f} {r['unsent']:>3} ({r['unsent_first']} 1st)")
    shipped = rows[0][1]
    lag = (f"queued={shipped['queued']} news={shipped['news']} calls={shipped['calls']} lag_p50_s={shipped['lag_p50']:.1f} "
           f"lag_p99_s={shipped['lag_p99']:.1f} first_alert_max_s={shipped['first_max']:.1f} "
           f"unsent={shipped['unsent']} unsent_first={shipped['unsent_first']}")
    if args.quick:
        print(f"RESULT crash_lag_s={shipped['crash_lag']:.1f} {lag}")
        return
    print(f"state disk frozen: /run status p50 {disk['status_p50'] * 1000:.0f} ms (max {disk['status_max'] * 1000:.0f}), "
          f"/run mute p50 {disk['mute_p50'] * 1000:.0f} ms (max {disk['mute_max'] * 1000:.0f})")
    before = rows[2][1]
    print(f"RESULT posts_per_run_hour={shipped['posts']:.1f} edits_per_run_hour={shipped['edits']:.1f} "
          f"crash_lag_s={shipped['crash_lag']:.1f} before_posts_per_run_hour={before['posts']:.1f} "
          f"before_edits_per_run_hour={before['edits']:.1f} no_reserve_crash_lag_s={rows[1][1]['crash_lag']:.1f} "
          f"frozen_status_p50_ms={disk['status_p50'] * 1000:.0f} frozen_mute_max_ms={disk['mute_max'] * 1000:.0f} {lag}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--quick", action="store_true", help="the shipped setup only, no frozen disk")
    asyncio.run(main(ap.parse_args()))
