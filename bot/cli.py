"""The `runbot` command line: argument parsing and wiring, nothing clever (shell)."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Sequence

from bot.render import chart as render_chart
from bot.render import slack as render_slack
from bot.render import text as render_text
from bot.probe import replay
from bot.probe.scheduler import Scheduler
from bot.probe.targets import Targets
from bot.service.history import History
from bot.service.state_file import StateFile, StateFileError
from bot.core.verdict import TAIL_DEFAULT, TAIL_MAX, Phase, Verdict
from config.durations import parse_duration
from config.registry import ConfigError, Registry, Run, UnknownRun, format_duration, load_registry
from config.settings import Settings, config_path, load_settings

EXIT_OK, EXIT_USAGE, EXIT_UNREACHABLE = 0, 2, 3


class UsageError(Exception):
    """Bad arguments: exit 2 with the message."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="runbot", description="What are my training runs doing? One line each.")
    p.add_argument("--config", metavar="PATH", help="runs file (default: $RUNBOT_CONFIG, else config/runs.toml)")
    p.add_argument("--save-probe", metavar="DIR", type=Path,
                   help="keep each probe's raw output in DIR, for replays and bug reports (raw: NOT redacted)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, text in (("status", "the verdict and its evidence"), ("gpus", "per-GPU classification, by role")):
        sub.add_parser(name, help=text).add_argument("run", help="run name or a unique prefix")
    t = sub.add_parser("tail", help="the last lines of the log, cleaned")
    t.add_argument("run", help="run name or a unique prefix")
    t.add_argument("-n", type=int, default=TAIL_DEFAULT, help=f"lines (default {TAIL_DEFAULT}, at most {TAIL_MAX})")
    sub.add_parser("runs", help="every run with its one-line verdict")
    sub.add_parser("check-config", help="validate the configuration and say what it found")
    sub.add_parser("serve", help="run the Slack bot and its watchdog")
    pv = sub.add_parser("preview", help="a run's Slack answer as Block Kit JSON, with a Block Kit Builder link")
    pv.add_argument("run", help="run name or a unique prefix")
    pv.add_argument("--view", choices=("status", "gpus", "tail"), default="status", help="which answer (default status)")
    r = sub.add_parser("replay", help="re-diagnose probes saved with --save-probe (no probe runs)")
    r.add_argument("probes", nargs="+", type=Path, metavar="PROBE", help="saved .probe (or .json) files, or folders of them")
    r.add_argument("--later", metavar="DURATION", help="read them this much later, as if nothing changed (10m, 2h)")
    r.add_argument("--view", choices=("status", "gpus", "tail"), default="status", help="which answer (default status)")
    pl = sub.add_parser("plot", help="a chart of a run's history (PNG), from the watchdog's state file")
    pl.add_argument("run", help="run name or a unique prefix")
    pl.add_argument("--metric", choices=render_chart.METRICS, default="loss", help="what to draw (default loss)")
    pl.add_argument("--since", metavar="DURATION", default="6h",
                    help=f"how far back (default 6h, at most {format_duration(render_chart.MAX_WINDOW_S)})")
    pl.add_argument("-o", "--output", metavar="FILE.png", type=Path, required=True, help="where to write the PNG")
    d = sub.add_parser("demo", help="the whole product on this machine, no Slack, no cluster")
    d.add_argument("--fast", action="store_true", help=argparse.SUPPRESS)  # shorter phases, for tests
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed its message
        return EXIT_OK if exc.code == 0 else EXIT_USAGE
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    if args.command == "demo":
        from bot.demo import run_demo  # noqa: PLC0415 - only the demo needs it

        return run_demo(fast=args.fast)
    try:
        settings = load_settings()
        path = config_path(args.config, settings)
        if args.command == "replay":  # a capture from elsewhere replays with runbot's defaults
            registry = load_registry(path, env_state_db=settings.runbot_state_db) if args.config or path.exists() else None
            return _replay(args, registry)
        registry = load_registry(path, env_state_db=settings.runbot_state_db)
    except ConfigError as exc:
        print(f"runbot: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except UsageError as exc:
        print(f"runbot: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return _dispatch(args, registry, settings)
    except UnknownRun as exc:
        print(f"runbot: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except UsageError as exc:
        print(f"runbot: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _dispatch(args: argparse.Namespace, registry: Registry, settings: Settings) -> int:
    if args.save_probe is not None:
        try:  # say so now, not as a traceback after the probe
            args.save_probe.mkdir(parents=True, exist_ok=True)
            if not os.access(args.save_probe, os.W_OK):
                raise PermissionError("not writable")
        except OSError as exc:
            raise UsageError(f"--save-probe {args.save_probe}: {exc.strerror or exc}") from None
    if args.command == "check-config":
        print(_describe_config(registry))
        return EXIT_OK
    if args.command == "serve":
        from bot.service.serve import serve  # noqa: PLC0415 - Slack libraries only for the bot

        return serve(registry, settings)
    if args.command == "runs":
        rows = asyncio.run(_check_all(registry, args.save_probe, settings.runbot_state_db))
        print(render_text.runs(rows))
        return EXIT_OK
    if args.command == "plot":
        return _plot(args, registry)
    if args.command == "tail" and not 1 <= args.n <= TAIL_MAX:
        raise UsageError(f"tail -n takes 1 to {TAIL_MAX} lines, not {args.n}")
    run = registry.resolve(args.run)
    verdict = asyncio.run(_check_one(registry, run, args.save_probe, settings.runbot_state_db))
    if args.command == "preview":
        print(_preview(verdict, run, args.view))
    elif args.command == "status":
        print(render_text.status(verdict, where=run.where))
    elif args.command == "gpus":
        print(render_text.gpus(verdict))
    else:
        print(render_text.tail(verdict, args.n))
    return EXIT_UNREACHABLE if verdict.phase is Phase.UNREACHABLE else EXIT_OK


async def _check_one(registry: Registry, run: Run, save: Path | None, state_db: str | None = None) -> Verdict:
    [(_, verdict)] = await _check(registry, [run], save, state_db)
    return verdict


async def _check_all(registry: Registry, save: Path | None, state_db: str | None = None) -> list[tuple[str, Verdict]]:
    return await _check(registry, list(registry.runs.values()), save, state_db)


async def _check(registry: Registry, runs: list[Run], save: Path | None, state_db: str | None) -> list[tuple[str, Verdict]]:
    """Probe the runs through the one scheduler (its caps bound `runs`); with RUNBOT_STATE_DB set, read their
    memory for trends and add what this probe saw to it."""
    targets = Targets(registry)
    memory = _memory(state_db)
    scheduler = Scheduler(registry, targets, history=memory, save_probe=save)

    async def one(run: Run) -> tuple[str, Verdict]:
        return run.name, await scheduler.check(run, wait=math.inf)  # every run answers, however many there are

    try:
        return list(await asyncio.gather(*(one(r) for r in runs)))
    finally:
        await targets.close()
        if memory is not None and memory.state_file is not None:
            if not await memory.state_file.flush():
                print(f"runbot: could not add this probe to {state_db}: {memory.state_file.fault}", file=sys.stderr)
            memory.state_file.close()


def _memory(state_db: str | None) -> History | None:
    """The runs' memory in the state file RUNBOT_STATE_DB names (the bot's own, shared); None when unset or unusable."""
    if not state_db:
        return None
    try:
        return History(StateFile.open(state_db))  # no runs given: a CLI call never forgets the bot's other runs
    except StateFileError as exc:
        print(f"runbot: {exc} (answering without the runs' memory)", file=sys.stderr)
        return None


def _replay(args: argparse.Namespace, registry: Registry | None) -> int:
    try:
        later = parse_duration(args.later, "--later") if args.later else 0.0
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    files = [f for p in args.probes for f in (sorted(p.glob("*.probe")) if p.is_dir() else [p])]
    if not files:
        raise UsageError(f"no saved probes in {', '.join(map(str, args.probes))}")
    try:
        captures = [replay.load(f) for f in files]
    except replay.CaptureError as exc:
        raise UsageError(str(exc)) from None
    runs = dict(registry.runs) if registry is not None else {}
    for n, (capture, verdict) in enumerate(replay.replay(captures, runs, later=later)):
        where = runs[capture.run].where if capture.run in runs else ""
        answer = {"status": lambda: render_text.status(verdict, where=where), "gpus": lambda: render_text.gpus(verdict),
                  "tail": lambda: render_text.tail(verdict)}[args.view]()
        head = f"# {capture.path.name}" + (f" · {args.later} later" if later else "")
        print(("\n" if n else "") + head + "\n" + answer)
    return EXIT_OK


def _plot(args: argparse.Namespace, registry: Registry) -> int:
    """Draw a run's history from the state file the bot keeps; no probe runs."""
    import sqlite3  # noqa: PLC0415 - SQLite only for this command

    from bot.service.store import Store, StoreError  # noqa: PLC0415

    try:
        window = parse_duration(args.since, "--since")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if window > render_chart.MAX_WINDOW_S:
        raise UsageError(f"--since: at most {format_duration(render_chart.MAX_WINDOW_S)}, not {args.since}")
    run = registry.resolve(args.run)
    path = Path(registry.bot.state_db)
    if not path.is_file():  # Store() would create an empty one
        raise UsageError(f"no state file at {path}: the watchdog writes it while `runbot serve` runs "
                         "([bot] state_db says where)")
    now = time.time()
    try:
        store = Store(path)
        try:
            points = store.points(run.name, now - window)
            incidents = [i.opened_at for i in store.load().incidents.values() if i.run == run.name]
        finally:
            store.close()
    except (StoreError, sqlite3.Error) as exc:
        raise UsageError(f"{path}: {exc}") from None
    png = render_chart.chart(run.name, points, metric=args.metric, now=now, window=window, incidents=incidents)
    try:
        args.output.write_bytes(png)
    except OSError as exc:
        raise UsageError(f"-o {args.output}: {exc.strerror or exc}") from None
    print(f"wrote {args.output} ({len(points)} points, since {format_duration(window)} ago)")
    return EXIT_OK


def _preview(verdict: Verdict, run: Run, view: str) -> str:
    message = {
        "status": lambda: render_slack.status_message(verdict, run.name, run.where),
        "gpus": lambda: render_slack.gpus_message(verdict, run.name, run.where),
        "tail": lambda: render_slack.tail_message(verdict, TAIL_DEFAULT, run.name),
    }[view]()
    return f"{json.dumps(message, indent=2, ensure_ascii=False)}\n\n{render_slack.builder_url(message)}"


def _describe_config(registry: Registry) -> str:
    lines = [f"{registry.path}: OK — {len(registry.runs)} run(s), {len(registry.hosts)} host(s)"]
    for host in registry.hosts.values():
        lines.append(f"  host {host.name}: {host.user}@{host.address}:{host.port}" + (f" via {host.jump}" if host.jump else ""))
    for run in registry.runs.values():
        roles = ", ".join(f"{r}={list(i)}" for r, i in run.roles.items())
        silence = ("auto (learned from elapsed= in step lines, else 10m)" if run.silence_after is None
                   else format_duration(run.silence_after))
        lines.append(f"  run {run.name}: {run.where} · silent after {silence}" + (f" · roles {roles}" if roles else ""))
    lines.append(f"  watchdog: every {format_duration(registry.bot.check_every)} · alerts to {registry.bot.alert_channel or '(none set)'}")
    lines.append(f"  state: {registry.bot.state_db}")
    return "\n".join(lines)
