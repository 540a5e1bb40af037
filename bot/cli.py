"""The `runbot` command line: argument parsing and wiring, nothing clever (shell).

Each command imports what it needs when it runs (the imports inside the functions below): a person's
`runbot status` is Python's start, a probe and a diagnosis, not the whole bot loading (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
import urllib.parse
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from bot import __version__
from bot.render import chart as render_chart  # its limits for the help; matplotlib only when it draws
from bot.service.logs import PlainLines, to_stderr
from bot.core.timeline import HISTORY_WINDOW_S
from bot.core.verdict import TAIL_DEFAULT, TAIL_MAX, Phase, Verdict, tail_lines
from config.durations import parse_duration
from config.registry import (ConfigError, Registry, Run, UnknownRun, config_warnings, faults_of, format_duration,
                             load_registry)
from config import environment

if TYPE_CHECKING:
    from bot.service.history import History
    from config.settings import Settings

EXIT_OK, EXIT_USAGE, EXIT_UNREACHABLE = 0, 2, 3

log = logging.getLogger("runbot.cli")

# What each exit status means, said in every --help that can end with it.
_PROBED = ("0  the run was probed and diagnosed, whatever the verdict",
           "2  bad arguments, a bad configuration or an unknown run (the message lists the known runs)",
           "3  the run could not be reached (the first line says which host and why)")
_LISTED = ("0  the configuration was read (each line says what its run's probe found)", "2  bad arguments or configuration")
_ENVIRONMENT = """environment (or a .env file in the working directory):
  RUNBOT_CONFIG     the runs file when --config is not given (else config/runs.toml)
  RUNBOT_STATE_DB   the watchdog's state file; set, CLI probes add to each run's memory
  RUNBOT_LOG_LEVEL  debug, info, warning or error (default: info for serve, warning otherwise)
  SLACK_*, PORT     for `runbot serve` (see `runbot serve --help`)"""
_SERVE = """Slack tokens and modes (environment, or a .env file in the working directory):
  Socket Mode, when SLACK_APP_TOKEN is set: runbot connects out to Slack, so no
  public URL is needed (the usual choice behind a cluster's firewall).
    SLACK_BOT_TOKEN       xoxb-...  the Bot User OAuth Token (OAuth & Permissions)
    SLACK_APP_TOKEN       xapp-...  an App-Level Token with connections:write
  HTTP mode, when SLACK_APP_TOKEN is not set: runbot listens on PORT (default 3000)
  for POST /slack/events (signed requests only) and GET /healthz.
    SLACK_BOT_TOKEN       xoxb-...
    SLACK_SIGNING_SECRET  Basic Information -> App Credentials
  The tokens' shapes are checked before anything is sent, then Slack is asked once
  whether they work. Setup: docs/slack.md.
Monitoring, in either mode, when [bot] asks (docs/metrics.md):
  metrics_listen = "127.0.0.1:9464"   GET /metrics (Prometheus) and /healthz on their own listener
  heartbeat_url = "https://hc-ping.com/<uuid>"   pinged each sweep (/start, success, /fail)"""


_CHECK = """--check, for Nagios, Icinga, cron or a CI step (the Monitoring Plugins' conventions):
  one line, `RUNBOT CRIT - <headline> | step=1200;;;0;50000 rate=14213;;;; loss=2.31;;;; age=4s;;;;`
  exit 0 OK (training, finished; also loading, saving, evaluating: normal work)
       1 WARN (degraded: a thread died, a GPU role idle, slow, loss NaN)
       2 CRIT (silent, crashed, stopped, no log)
       3 UNKNOWN (the run could not be reached, or the check could not run: bad config, unknown run)"""


class UsageError(Exception):
    """Bad arguments: exit 2 with the message."""


def _exits(*lines: str) -> str:
    return "exit status:\n" + "\n".join(f"  {line}" for line in lines)


def _global_options() -> argparse.ArgumentParser:
    """The global options, accepted before or after the subcommand (as git, kubectl and docker take theirs).

    Their defaults are SUPPRESS in both places, so a value given on one side is not overwritten by the
    other side's default; main() fills in what was given nowhere."""
    parent = argparse.ArgumentParser(add_help=False)
    g = parent.add_argument_group("global options (before or after the command)")
    g.add_argument("--config", metavar="PATH", default=argparse.SUPPRESS,
                   help="runs file (default: $RUNBOT_CONFIG, else config/runs.toml)")
    g.add_argument("--save-probe", metavar="DIR", type=Path, default=argparse.SUPPRESS,
                   help="keep each probe's raw output in DIR, for replays and bug reports (raw: NOT redacted)")
    g.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="log what runbot does to stderr, at debug level (RUNBOT_LOG_LEVEL sets a level too)")
    return parent


_GLOBAL_DEFAULTS = {"config": None, "save_probe": None, "verbose": False}


def _parser() -> argparse.ArgumentParser:
    common = _global_options()
    p = argparse.ArgumentParser(
        prog="runbot", description="What are my training runs doing? One line each.", parents=[common],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"`runbot COMMAND --help` says what a command takes and how it exits.\n\n{_ENVIRONMENT}")
    # sys.version's first word is what platform.python_version() says, without importing platform
    p.add_argument("--version", action="version", version=f"runbot {__version__} (Python {sys.version.split()[0]})")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, summary: str, description: str, *exits: str, epilog: str = "") -> argparse.ArgumentParser:
        return sub.add_parser(name, help=summary, description=description, parents=[common],
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog="\n\n".join(e for e in (_exits(*exits) if exits else "", epilog) if e))

    def run_arg(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run", metavar="RUN", help="a run's name, or any unique prefix of it (case-insensitive)")

    def json_flag(parser: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup) -> None:
        parser.add_argument("--json", action="store_true",
                            help="print one JSON object instead (versioned: its schema is in docs/json.md)")

    st = command("status", "the verdict and its evidence",
                 "Probe one run and say what it is doing: the verdict on the first line (what a\n"
                 "notification would show), then its evidence: progress, the writing process, the\n"
                 "log's last write, the GPUs.", *_PROBED, epilog=_CHECK)
    run_arg(st)
    answer = st.add_mutually_exclusive_group()
    json_flag(answer)
    answer.add_argument("--check", action="store_true",
                        help="answer as a monitoring plugin: one line with perfdata, exit 0 OK, 1 WARN, 2 CRIT, 3 UNKNOWN")
    g = command("gpus", "per-GPU classification, by role",
                "Probe one run and classify each GPU over several nvidia-smi samples (busy,\n"
                "oscillating, low, idle, memory held), grouped by the run's GPU roles. With\n"
                "host_view = true on its host, also which CT (and run) holds each of its GPUs.", *_PROBED)
    run_arg(g)
    json_flag(g)
    t = command("tail", "the last lines of the log, cleaned",
                "The run's verdict, then the last N lines of its log: progress bars collapsed to\n"
                "their last frame, colours stripped, secrets redacted. `tail RUN 50` and\n"
                "`tail RUN -n 50` are the same (as /run tail RUN 50 in Slack).", *_PROBED)
    run_arg(t)
    t.add_argument("lines", nargs="?", metavar="N", help=f"lines (default {TAIL_DEFAULT}, at most {TAIL_MAX})")
    t.add_argument("-n", "--lines", dest="n", metavar="N", help="the same, as an option")
    for name, summary, description in (
            ("discover", "find the training runs on a Proxmox host, as [runs.NAME] blocks to paste",
             "One round trip to the host: `pct list`, then in each running CT the processes that\n"
             "look like training and the files they write, and the GPUs they use. Prints a\n"
             "ready-to-paste [runs.NAME] block for each run not configured yet; never edits the\n"
             "config. Needs host_view = true under [hosts.HOST]."),
            ("host", "the whole box: every GPU, the CT (and run) holding it, memory, utilisation",
             "Ask the Proxmox host itself (outside the CTs) which process holds each GPU, map\n"
             "each to its CT through /proc/PID/cgroup, and name the configured runs. Needs\n"
             "host_view = true under [hosts.HOST].")):
        h = command(name, summary, description, "0  the host answered", "2  bad arguments, an unknown host, or host_view off",
                    "3  the host could not be reached (the line says why)")
        h.add_argument("host", metavar="HOST", help="a [hosts.*] name")
    json_flag(command("runs", "every run with its one-line verdict",
                      "Probe every configured run in parallel and print one line each: name, level\n"
                      "(crit, warn, note, ok) and verdict, the worst first, then by name.", *_LISTED))
    hi = command("history", "what a run did lately: its phases, restarts and incidents",
                 "Read the run's memory from the watchdog's state file ([bot] state_db) and say\n"
                 f"what it did over the last DURATION (default {format_duration(HISTORY_WINDOW_S)}): its phases, newest first,\n"
                 "restarts and steps, then its incidents, as /run history does. No probe runs.",
                 "0  the history was read (one that says \"nothing remembered\" included)",
                 "2  bad arguments, an unknown run, or no state file to read")
    run_arg(hi)
    hi.add_argument("since", nargs="?", metavar="DURATION", default=format_duration(HISTORY_WINDOW_S),
                    help=f"how far back (default {format_duration(HISTORY_WINDOW_S)}, at most {format_duration(render_chart.MAX_WINDOW_S)})")
    json_flag(hi)
    command("check-config", "validate the configuration and say what it found",
            "Read the runs file and check every key. Faults are all listed at once, numbered,\n"
            "each with its file, key and fault; a file with no runs is valid but warned about.\n"
            "Nothing is probed.",
            "0  the file is valid (warnings, if any, on stderr)", "2  the file has faults (each one listed)")
    i = command("init", "write a commented starter configuration",
                "Write runbot's commented example configuration (every key, a run over SSH in a\n"
                "Proxmox container and a run on this machine) where you ask, to edit from there.\n"
                "PATH defaults to the file the other commands read: --config, else $RUNBOT_CONFIG,\n"
                "else config/runs.toml; a folder gets a runs.toml inside it.",
                "0  written", "2  the file exists (use --force) or cannot be written")
    i.add_argument("path", nargs="?", metavar="PATH", help="where to write it; - prints it instead")
    i.add_argument("--force", action="store_true", help="replace a file that is already there")
    command("doctor", "check every piece a working install needs",
            "Check the configuration, then each host (reachable, host key, authentication, pct),\n"
            "each container (running, nvidia-smi answering), each log (there and readable), and\n"
            "Slack (the tokens, auth.test, the manifest's scopes, each alert channel with the bot\n"
            "in it; skipped without SLACK_BOT_TOKEN). One line per check: ✓, or ✗ with its fix.",
            "0  every check passed (or was skipped, saying why)", "1  a check failed (its line says the fix)")
    command("serve", "run the Slack bot and its watchdog",
            "Answer /run in Slack and run the watchdog, which probes every run each\n"
            "check_every and posts alerts, until SIGTERM or SIGINT. Logs are JSON lines on stderr.",
            "0  stopped by SIGTERM or SIGINT, after the answers in flight went out",
            "1  Slack refused a token, or a port is in use (PORT, or [bot] metrics_listen)",
            "2  a bad configuration, environment or state file", epilog=_SERVE)
    pv = command("preview", "a run's Slack answer as Block Kit JSON, with a Block Kit Builder link",
                 "Probe one run and print the Block Kit message /run would post, and a link that\n"
                 "opens it in Slack's Block Kit Builder. No token needed.", *_PROBED)
    run_arg(pv)
    pv.add_argument("--view", choices=("status", "gpus", "tail"), default="status", help="which answer (default status)")
    r = command("replay", "re-diagnose probes saved with --save-probe (no probe runs)",
                "Diagnose saved probes again, oldest first, each with the one before: what this\n"
                "runbot says of what a probe saw then. Runs not in the config replay with\n"
                "runbot's defaults.", "0  replayed", "2  bad arguments, or a file that is not a saved probe")
    r.add_argument("probes", nargs="+", type=Path, metavar="PROBE", help="saved .probe (or .json) files, or folders of them")
    r.add_argument("--later", metavar="DURATION", help="read them this much later, as if nothing changed (10m, 2h)")
    r.add_argument("--view", choices=("status", "gpus", "tail"), default="status", help="which answer (default status)")
    pl = command("plot", "a chart of a run's history (PNG), from the watchdog's state file",
                 "Draw a run's loss, rate or GPU use over a window from the state file the\n"
                 "watchdog keeps ([bot] state_db), restarts and incidents marked. No probe runs.",
                 "0  the picture was written (one that says \"no history yet\" included)",
                 "2  bad arguments, an unknown run, or no state file to read")
    run_arg(pl)
    pl.add_argument("--metric", choices=render_chart.METRICS, default="loss", help="what to draw (default loss)")
    pl.add_argument("--since", metavar="DURATION", default="6h",
                    help=f"how far back (default 6h, at most {format_duration(render_chart.MAX_WINDOW_S)})")
    pl.add_argument("-o", "--output", metavar="FILE.png", type=Path, required=True, help="where to write the PNG")
    d = command("demo", "the whole product on this machine, no Slack, no cluster",
                "Start a simulated training job here and show what runbot says of each of its\n"
                "phases, and the watchdog's alert thread as it happens. About 40 seconds.",
                "0  the demo ran through")
    d.add_argument("--cluster", action="store_true",
                   help="a Proxmox node (a loopback sshd), two CTs and Slack (stand-ins) on this machine: init, doctor, "
                        "discover, status and serve with an alert thread; needs openssh-server; about a minute")
    d.add_argument("--fast", action="store_true", help=argparse.SUPPRESS)  # shorter phases, for tests
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(words)
    except SystemExit as exc:  # argparse already printed its message (or the help, or the version)
        if exc.code != 0 and "--check" in words:  # a plugin that cannot run says UNKNOWN, on stdout, exit 3
            from bot.render import plugin as render_plugin  # noqa: PLC0415 - each command imports what it answers with

            print(render_plugin.unknown("bad arguments (see stderr)"))
            return render_plugin.UNKNOWN
        return EXIT_OK if exc.code == 0 else EXIT_USAGE
    for name, default in _GLOBAL_DEFAULTS.items():
        if not hasattr(args, name):
            setattr(args, name, default)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    if args.command == "demo":
        if args.cluster:
            from bot.demo.cluster import run_cluster_demo  # noqa: PLC0415 - only the demo needs it

            return run_cluster_demo(fast=args.fast)
        from bot.demo import run_demo  # noqa: PLC0415 - only the demo needs it

        return run_demo(fast=args.fast)
    try:
        # Only serve and doctor read a Slack secret; the others may reuse the last validated answer (no pydantic).
        settings = environment.load(secrets=args.command in ("serve", "doctor"))
        path = environment.config_path(args.config, settings)
        if args.command == "init":
            return _init(Path(args.path).expanduser() if args.path else path, default=path, force=args.force)
        if args.command == "doctor":  # reads the file itself: its faults are checks, not an exit 2
            from bot.service.doctor import main as doctor  # noqa: PLC0415

            return doctor(path, settings)
        if args.command == "replay":  # a capture from elsewhere replays with runbot's defaults
            registry = load_registry(path, env_state_db=settings.runbot_state_db) if args.config or path.exists() else None
            return _replay(args, registry)
        registry = load_registry(path, env_state_db=settings.runbot_state_db)
    except ConfigError as exc:
        print(_faults_text(exc, numbered=args.command == "check-config"), file=sys.stderr)
        return _usage_fault(args, f"bad configuration: {faults_of(exc)[0]}")
    except UsageError as exc:
        print(f"runbot: {exc}", file=sys.stderr)
        return _usage_fault(args, str(exc))
    if args.command != "serve":  # serve writes JSON lines, at info unless told otherwise
        to_stderr(settings.log_level(logging.WARNING, verbose=args.verbose), PlainLines())
        log.debug("read %s: %d runs, %d hosts", registry.path, len(registry.runs), len(registry.hosts))
    try:
        return _dispatch(args, registry, settings)
    except (UnknownRun, UsageError) as exc:
        print(f"runbot: {exc}", file=sys.stderr)
        return _usage_fault(args, str(exc))


def _usage_fault(args: argparse.Namespace, why: str) -> int:
    """Exit 2 — or, for a --check, the plugin's UNKNOWN line on stdout and exit 3: a monitor reads only those."""
    if getattr(args, "check", False):
        from bot.render import plugin as render_plugin  # noqa: PLC0415 - each command imports what it answers with

        print(render_plugin.unknown(why))
        return render_plugin.UNKNOWN
    return EXIT_USAGE


def _tail_count(args: argparse.Namespace) -> int:
    """`tail RUN 50` or `tail RUN -n 50` (both, if they agree); the default when neither."""
    given = [x for x in (args.lines, args.n) if x is not None]
    if len(set(given)) > 1:
        raise UsageError(f"tail: N given twice ({args.lines} and -n {args.n}); say it once")
    try:
        return tail_lines(given[0]) if given else TAIL_DEFAULT
    except ValueError as exc:
        raise UsageError(f"tail: {exc}") from None


def _init(path: Path, *, default: Path, force: bool) -> int:
    """Write the commented example where the user asks (`-`: print it); an existing file stays unless --force."""
    from config.example import text as example_config  # noqa: PLC0415 - only init writes it

    text = example_config()
    if str(path) == "-":
        sys.stdout.write(text)
        return EXIT_OK
    if path.is_dir():
        path = path / "runs.toml"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w" if force else "x", encoding="utf-8") as out:  # "x": never replace a file by accident
            out.write(text)
    except FileExistsError:
        raise UsageError(f"{path} exists; `runbot init --force {path}` replaces it") from None
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
    flag = "" if path.resolve() == default.resolve() else f" --config {path}"
    print(f"wrote {path}: a commented example (a run over SSH, a run on this machine) — "
          f"edit it, then `runbot{flag} check-config`")
    return EXIT_OK


def _dispatch(args: argparse.Namespace, registry: Registry, settings: Settings | environment.Remembered) -> int:
    if args.save_probe is not None:
        try:  # say so now, not as a traceback after the probe
            args.save_probe.mkdir(parents=True, exist_ok=True)
            if not os.access(args.save_probe, os.W_OK):
                raise PermissionError("not writable")
        except OSError as exc:
            raise UsageError(f"--save-probe {args.save_probe}: {exc.strerror or exc}") from None
    if args.command == "check-config":
        print(_describe_config(registry))
        for warning in config_warnings(registry):
            print(f"runbot: warning: {registry.path}: {warning}", file=sys.stderr)
        return EXIT_OK
    if args.command == "serve":
        from bot.service.serve import serve  # noqa: PLC0415 - Slack libraries only for the bot

        return serve(registry, settings, log_level=settings.log_level(logging.INFO, verbose=args.verbose))
    if args.command == "runs":
        rows = _check_all(registry, args.save_probe, settings.runbot_state_db)
        if args.json:
            from bot.render import machine as render_machine  # noqa: PLC0415 - each command imports what it answers with

            _print_json(render_machine.runs(rows, {name: run.where for name, run in registry.runs.items()}))
        else:
            from bot.render import text as render_text  # noqa: PLC0415 - each command imports what it answers with

            print(render_text.runs(rows))
        return EXIT_OK
    if args.command == "plot":
        return _plot(args, registry)
    if args.command == "history":
        return _history(args, registry)
    if args.command in ("discover", "host"):
        from bot import host_cli  # noqa: PLC0415 - the host view only for the commands that show it

        return host_cli.main(registry, args.command, args.host)
    lines = _tail_count(args) if args.command == "tail" else TAIL_DEFAULT
    run = registry.resolve(args.run)
    verdict = _check_one(registry, run, args.save_probe, settings.runbot_state_db)
    if args.command == "preview":
        print(_preview(verdict, run, args.view))
    elif args.command == "status" and args.check:
        from bot.render import plugin as render_plugin  # noqa: PLC0415 - each command imports what it answers with

        status, line = render_plugin.check(verdict)
        print(line)
        return status
    elif args.command in ("status", "gpus") and args.json:  # the host's view (who holds each GPU) stays in gpus' text
        from bot.render import machine as render_machine  # noqa: PLC0415 - each command imports what it answers with

        _print_json(render_machine.status(verdict, where=run.where) if args.command == "status"
                    else render_machine.gpus(verdict, where=run.where))
    else:
        print(_text_answer(args.command, registry, run, verdict, lines))
    return EXIT_UNREACHABLE if verdict.phase is Phase.UNREACHABLE else EXIT_OK


def _text_answer(command: str, registry: Registry, run: Run, verdict: Verdict, lines: int) -> str:
    """`status`, `gpus` (with the host's lines under it) or `tail`, as text."""
    from bot.render import text as render_text  # noqa: PLC0415 - each command imports what it answers with

    if command == "status":
        return render_text.status(verdict, where=run.where)
    if command == "gpus":
        from bot import host_cli  # noqa: PLC0415 - the host view only for the commands that show it

        return "\n".join([render_text.gpus(verdict), *(f"  {line}" for line in host_cli.gpus_lines(registry, run))])
    return render_text.tail(verdict, lines)


def _check_one(registry: Registry, run: Run, save: Path | None, state_db: str | None = None) -> Verdict:
    [(_, verdict)] = _check_all(registry, save, state_db, [run])
    return verdict


def _check_all(registry: Registry, save: Path | None, state_db: str | None = None,
               runs: list[Run] | None = None) -> list[tuple[str, Verdict]]:
    """Probe `runs` (every run when None) and wait for the verdicts."""
    import asyncio  # noqa: PLC0415 - an event loop only for the commands that probe

    return asyncio.run(_check(registry, list(registry.runs.values()) if runs is None else runs, save, state_db))


async def _check(registry: Registry, runs: list[Run], save: Path | None, state_db: str | None) -> list[tuple[str, Verdict]]:
    """Probe the runs through the one scheduler (its caps bound `runs`); with RUNBOT_STATE_DB set, read their
    memory for trends and add what this probe saw to it."""
    import asyncio  # noqa: PLC0415 - the probing commands' own imports: the scheduler and the diagnosis behind it

    from bot.probe.scheduler import Scheduler  # noqa: PLC0415
    from bot.probe.targets import Targets  # noqa: PLC0415

    targets = Targets(registry)
    memory = _memory(state_db)
    scheduler = Scheduler(registry, targets, history=memory, save_probe=save)

    async def one(run: Run) -> tuple[str, Verdict]:
        started = time.monotonic()
        verdict = await scheduler.check(run, wait=math.inf)  # every run answers, however many there are
        log.debug("probed %s (%s) in %.2f s: %s", run.name, run.where, time.monotonic() - started, verdict.phase.value)
        return run.name, verdict

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
    from bot.service.history import History  # noqa: PLC0415 - SQLite only when RUNBOT_STATE_DB asks for the memory
    from bot.service.state_file import StateFile, StateFileError  # noqa: PLC0415

    try:
        return History(StateFile.open(state_db))  # no runs given: a CLI call never forgets the bot's other runs
    except StateFileError as exc:
        print(f"runbot: {exc} (answering without the runs' memory)", file=sys.stderr)
        return None


def _replay(args: argparse.Namespace, registry: Registry | None) -> int:
    from bot.core.redact import printable  # noqa: PLC0415 - each command imports what it answers with
    from bot.probe import replay  # noqa: PLC0415
    from bot.render import text as render_text  # noqa: PLC0415

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
        head = f"# {printable(capture.path.name)}" + (f" · {args.later} later" if later else "")
        print(("\n" if n else "") + head + "\n" + answer)
    return EXIT_OK


def _window(text: str, flag: str) -> float:
    """How far back a chart or a history looks, as typed: "6h", at most the charts' longest window."""
    try:
        window = parse_duration(text, flag)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if window > render_chart.MAX_WINDOW_S:
        raise UsageError(f"{flag}: at most {format_duration(render_chart.MAX_WINDOW_S)}, not {text}")
    return window


def _remembered(registry: Registry, run: Run, since: float) -> tuple[list, list, Counter[str]]:
    """The run's points and incidents since `since`, and the rows of the state file it could not read (by
    table), from the state file the bot keeps; no probe runs."""
    import sqlite3  # noqa: PLC0415 - SQLite only for the commands that read the memory

    from bot.service.store import NotReadable, Store, StoreError  # noqa: PLC0415

    path = Path(registry.bot.state_db)
    if not path.is_file():  # Store() would create an empty one
        raise UsageError(f"no state file at {path}: the watchdog writes it while `runbot serve` runs "
                         "([bot] state_db says where)")
    try:
        try:  # a read: it works on a file runbot cannot write (a read-only disk) as well
            store = Store(path, read_only=True)
        except NotReadable:  # an older runbot's file: upgraded first, as the bot would
            store = Store(path)
        try:
            points = store.points(run.name, since)
            incidents = [i for i in store.load().incidents.values() if i.run == run.name]
            return points, incidents, store.skipped  # rows runbot never writes (bot.core.state_rows): left out, and said
        finally:
            store.close()
    except (StoreError, sqlite3.Error) as exc:
        raise UsageError(f"{path}: {exc}") from None


def _plot(args: argparse.Namespace, registry: Registry) -> int:
    """Draw a run's history from the state file the bot keeps; no probe runs."""
    from bot.service.state_file import unreadable_words  # noqa: PLC0415 - SQLite only for the commands that read it

    window = _window(args.since, "--since")
    run = registry.resolve(args.run)
    now = time.time()
    points, incidents, skipped = _remembered(registry, run, now - window)
    png = render_chart.chart(run.name, points, metric=args.metric, now=now, window=window,
                             incidents=[i.opened_at for i in incidents])
    try:
        args.output.write_bytes(png)
    except OSError as exc:
        raise UsageError(f"-o {args.output}: {exc.strerror or exc}") from None
    unread = f"; skipped {unreadable_words(skipped)} it could not read" if skipped else ""
    print(f"wrote {args.output} ({len(points)} points, since {format_duration(window)} ago{unread})")
    return EXIT_OK


def _history(args: argparse.Namespace, registry: Registry) -> int:
    """`runbot history RUN [DURATION]`: /run history's answer from the state file, as text or JSON."""
    from bot.core.timeline import incidents_between, spans  # noqa: PLC0415 - each command imports what it answers with
    from bot.render import machine as render_machine  # noqa: PLC0415
    from bot.render import text as render_text  # noqa: PLC0415
    from bot.service.state_file import unreadable_words  # noqa: PLC0415 - SQLite only for the commands that read it

    window = _window(args.since, "DURATION")
    run = registry.resolve(args.run)
    now = time.time()
    points, incidents, skipped = _remembered(registry, run, now - window)
    if skipped:
        print(f"runbot: {registry.bot.state_db}: skipped {unreadable_words(skipped)} it could not read", file=sys.stderr)
    folded, told = spans(points), incidents_between(incidents, run.name, now - window)
    if args.json:
        _print_json(render_machine.history(run.name, folded, told, now, window))
    else:
        print(render_text.history(run.name, folded, told, now, window))
    return EXIT_OK


def _print_json(answer: dict) -> None:
    # allow_nan=False: the renderer turned every non-finite number into null; a NaN slipping through is a bug,
    # better a traceback in a test than output no JSON parser reads.
    print(json.dumps(answer, indent=2, ensure_ascii=False, allow_nan=False))


def _preview(verdict: Verdict, run: Run, view: str) -> str:
    from bot.render import slack as render_slack  # noqa: PLC0415 - Block Kit only for the preview

    message = {
        "status": lambda: render_slack.status_message(verdict, run.name, run.where),
        "gpus": lambda: render_slack.gpus_message(verdict, run.name, run.where),
        "tail": lambda: render_slack.tail_message(verdict, TAIL_DEFAULT, run.name),
    }[view]()
    return f"{json.dumps(message, indent=2, ensure_ascii=False)}\n\n{render_slack.builder_url(message)}"


def _faults_text(exc: ConfigError, *, numbered: bool) -> str:
    """One fault as one line; several (or any, for check-config) as a numbered list, each with file, key and fault."""
    faults = faults_of(exc)
    if len(faults) == 1 and not numbered:
        return f"runbot: {faults[0]}"
    head = f"runbot: {exc.source}: {len(faults)} fault{'s' if len(faults) > 1 else ''}"
    return "\n".join([head, *(f"  {n}. {fault}" for n, fault in enumerate(faults, 1))])


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _describe_config(registry: Registry) -> str:
    said = "OK" if registry.runs else "valid, but nothing to watch"  # the warning on stderr says what to add
    lines = [f"{registry.path}: {said} — {_count(len(registry.runs), 'run')}, {_count(len(registry.hosts), 'host')}"]
    for host in registry.hosts.values():
        lines.append(f"  host {host.name}: {host.user}@{host.address}:{host.port}" + (f" via {host.jump}" if host.jump else ""))
    for run in registry.runs.values():
        roles = ", ".join(f"{r}={list(i)}" for r, i in run.roles.items())
        silence = ("auto (learned from elapsed= in step lines, else 10m)" if run.silence_after is None
                   else format_duration(run.silence_after))
        node = " (pct exec on this machine)" if run.is_local and run.container is not None else ""
        lines.append(f"  run {run.name}: {run.where}{node} · silent after {silence}" + (f" · roles {roles}" if roles else ""))
    lines.append(f"  watchdog: every {format_duration(registry.bot.check_every)} · alerts to {registry.bot.alert_channel or '(none set)'}")
    lines.append(f"  state: {registry.bot.state_db}")
    if (listen := registry.bot.metrics_listen) is not None:
        lines.append(f"  metrics: GET /metrics on {listen[0]}:{listen[1]} while `runbot serve` runs")
    if registry.bot.heartbeat_url is not None:  # the host only: the path is the check's key
        lines.append(f"  heartbeat: each sweep pings {urllib.parse.urlsplit(registry.bot.heartbeat_url).hostname}")
    return "\n".join(lines)
