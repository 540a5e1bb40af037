"""The /run slash command: parse, check access, acknowledge at once, answer through response_url."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Awaitable, Callable

from slack_sdk.webhook.async_client import AsyncWebhookClient

from bot.render import slack as render_slack
from bot.service.host_view import ownership
from bot.service.slack_http import response_url_retries
from bot.core.verdict import TAIL_DEFAULT, TAIL_MAX, Phase, Verdict, tail_lines
from config.registry import Registry, Run, UnknownRun

if TYPE_CHECKING:
    from bot.service.app import Services

log = logging.getLogger("runbot.commands")

RESPONSE_TIMEOUT_S = 10  # one response_url post (slack_sdk's timeout is per HTTP attempt)
NOT_ALLOWED = "not allowed: ask an admin to add you (and this channel) to runbot's [access] list"


class Usage(Exception):
    """The words do not fit the subcommand: the answer is its usage line, and nothing runs."""


class NotAllowed(Exception):
    """The user or channel is outside [access] (or the run's own lists)."""


@dataclass(frozen=True)
class Reply:
    """What a subcommand answers: a fallback text, Block Kit blocks, and where it goes."""

    text: str
    blocks: list = field(default_factory=list)
    in_channel: bool = False  # False: ephemeral, only the user sees it
    outcome: str = "ok"  # for the command log: "ok", "unreachable", "usage", "refused"…

    @classmethod
    def of(cls, message: dict, *, in_channel: bool = False, outcome: str = "ok") -> Reply:
        return cls(message["text"], message.get("blocks", []), in_channel, outcome)

    def payload(self) -> dict:
        return {"response_type": "in_channel" if self.in_channel else "ephemeral", "text": self.text, "blocks": self.blocks}


@dataclass
class CommandRequest:
    """One /run invocation, as a subcommand's handler sees it."""

    user_id: str
    channel_id: str
    args: list[str]  # the words after the subcommand, `here` removed
    here: bool  # post the answer in the channel
    registry: Registry
    services: Services
    command: str = ""  # the subcommand as typed, lower-cased
    run_name: str | None = None  # set by run(), for the command log
    response_url: str = ""  # where the answer goes; note() may say a word there first

    async def note(self, message: dict) -> None:
        """A private word to the asker before the answer (a chart's place in the queue); none without a response_url."""
        if self.response_url:
            await say_privately(self.response_url, message)

    def allowed(self, run: Run | None = None) -> bool:
        return self.registry.access.allows(self.user_id, self.channel_id, run)

    def allowed_runs(self) -> list[Run]:
        return [r for r in self.registry.runs.values() if self.allowed(r)]

    def run(self, query: str) -> Run:
        """The run a name or prefix means among the runs this user may see (else UnknownRun).

        A run the user may not see is unknown, exactly: no "not allowed", no listing, no
        "matches several" that names it, so nobody outside [access] learns which runs exist.
        """
        run = self.registry.resolve(query, among=[r.name for r in self.allowed_runs()])
        self.run_name = run.name
        return run

    def reply(self, message: dict, *, outcome: str = "ok") -> Reply:
        return Reply.of(message, in_channel=self.here, outcome=outcome)


Handler = Callable[[CommandRequest], Awaitable[Reply]]


@dataclass(frozen=True)
class Subcommand:
    """A word after /run. `usage` is what follows /run: UPPERCASE words are required arguments,
    [BRACKETED] ones optional; the listener refuses any other count before the handler runs.
    `prepare` rewrites the words first (tail's `-n 50` into its N)."""

    name: str
    usage: str
    help: str
    handler: Handler
    prepare: Callable[[list[str]], list[str]] | None = None

    @property
    def arity(self) -> tuple[int, int]:
        words = self.usage.split()[1:]
        optional = sum(w.startswith("[") for w in words)
        return len(words) - optional, len(words)


SUBCOMMANDS: dict[str, Subcommand] = {}


def subcommand(name: str, usage: str, help: str,
               prepare: Callable[[list[str]], list[str]] | None = None) -> Callable[[Handler], Handler]:
    """Register `async def handler(req: CommandRequest) -> Reply` as `/run <name>`."""

    def register(handler: Handler) -> Handler:
        SUBCOMMANDS[name] = Subcommand(name, usage, help, handler, prepare)
        return handler

    return register


def listed() -> list[Subcommand]:
    """The registered subcommands in help order (help itself last)."""
    return sorted(SUBCOMMANDS.values(), key=lambda s: s.name == "help")


def _probe_outcome(verdict: Verdict) -> str:
    return "unreachable" if verdict.phase is Phase.UNREACHABLE else "ok"


# -- the subcommands ------------------------------------------------------------------------


@subcommand("status", "status RUN", "the verdict and its evidence")
async def status(req: CommandRequest) -> Reply:
    run = req.run(req.args[0])
    verdict = await req.services.check(run)
    watchdog = req.services.watchdog
    until = watchdog.muted_until(run.name) if watchdog is not None else None
    message = render_slack.status_message(verdict, run.name, run.where, muted_until=until)
    return req.reply(message, outcome=_probe_outcome(verdict))


@subcommand("gpus", "gpus RUN", "each GPU over several samples, by role")
async def gpus(req: CommandRequest) -> Reply:
    run = req.run(req.args[0])
    verdict, held = await asyncio.gather(req.services.check(run), ownership(req.registry, run, req.allowed_runs(),
                                                                             req.services.scheduler))
    return req.reply(render_slack.gpus_message(verdict, run.name, run.where, host_lines=held),
                     outcome=_probe_outcome(verdict))


def n_option(words: list[str]) -> list[str]:
    """`-n 50`, `-n50`, `--lines 50` or `--lines=50` among the words become a plain N after the others,
    so `/run tail RUN -n 50` reads as `/run tail RUN 50` (and as `runbot tail RUN -n 50` does)."""
    rest, n = [], []
    words = iter(words)
    for word in words:
        if word in ("-n", "--lines"):
            n.append(next(words, ""))
        elif word.startswith("--lines="):
            n.append(word.removeprefix("--lines="))
        elif word.startswith("-n") and word[2:].isdigit():
            n.append(word[2:])
        else:
            rest.append(word)
    return rest + n


@subcommand("tail", "tail RUN [N]", f"the last N log lines (default {TAIL_DEFAULT}, at most {TAIL_MAX}; "
            "`-n N` works too), cleaned", prepare=n_option)
async def tail(req: CommandRequest) -> Reply:
    n = TAIL_DEFAULT
    if len(req.args) > 1:
        try:
            n = tail_lines(req.args[1])
        except ValueError as exc:
            raise Usage(str(exc)) from None
    run = req.run(req.args[0])
    verdict = await req.services.check(run)
    return req.reply(render_slack.tail_message(verdict, n, run.name), outcome=_probe_outcome(verdict))


@subcommand("runs", "runs", "every run you may see, with its one-line verdict")
async def runs(req: CommandRequest) -> Reply:
    allowed = req.allowed_runs()
    if req.registry.runs and not allowed:
        raise NotAllowed("runs")

    async def one(run: Run) -> tuple[str, Verdict]:  # the scheduler bounds how many run at once
        return run.name, await req.services.check(run, wait=math.inf)  # every run answers, however long the list

    rows = await asyncio.gather(*(one(r) for r in allowed))
    return req.reply(render_slack.runs_message(rows))


@subcommand("help", "help", "this list")
async def help_(req: CommandRequest) -> Reply:
    return req.reply(render_slack.help_message(listed()))


# -- the listener ---------------------------------------------------------------------------


def parse(text: str) -> tuple[str, list[str], bool]:
    """'/run tail dflash 50 here' text -> ("tail", ["dflash", "50"], True). Nothing -> runs."""
    words = text.split()
    here = bool(words) and words[-1].casefold() == "here"
    if here:
        words.pop()
    if not words:
        return "runs", [], here
    return words[0].casefold(), words[1:], here


async def dispatch(services: Services, user_id: str, channel_id: str, text: str,
                   response_url: str = "") -> tuple[Reply, CommandRequest, str]:
    """Run one /run command to (its Reply, the request, the subcommand word). Refusals and
    mistakes come back as ephemeral replies, never raised."""
    name, args, here = parse(text)
    req = CommandRequest(user_id, channel_id, args, here, services.registry, services, command=name,
                         response_url=response_url)
    return await _answer(req), req, name


def may_use(registry: Registry, user: str, channel: str) -> bool:
    """Whether someone may use runbot in this channel at all: allowed globally, or for one run at least."""
    return registry.access.allows(user, channel) or any(registry.access.allows(user, channel, r)
                                                        for r in registry.runs.values())


async def _answer(req: CommandRequest) -> Reply:
    # Someone allowed nowhere (not globally, not for any run) gets nothing, not even help.
    if not may_use(req.registry, req.user_id, req.channel_id):
        return Reply.of(render_slack.error_message(NOT_ALLOWED), outcome="refused")
    sub = SUBCOMMANDS.get(req.command)
    if sub is None:
        note = f"unknown command “{req.command}”"
        if _is_run(req, req.command):
            note += f" — did you mean /run status {req.command}?"
        return Reply.of(render_slack.help_message(listed(), note=note), outcome="unknown_command")
    if sub.prepare is not None:
        req.args = sub.prepare(req.args)
    low, high = sub.arity
    if not low <= len(req.args) <= high:
        return _usage(sub)
    try:
        return await sub.handler(req)
    except Usage as exc:
        return _usage(sub, str(exc))
    except UnknownRun as exc:
        return Reply.of(render_slack.error_message(str(exc)), outcome="unknown_run")
    except NotAllowed:
        return Reply.of(render_slack.error_message(NOT_ALLOWED), outcome="refused")
    except Exception as exc:  # errors are data: the user gets a sentence, the log the traceback
        log.exception("/run %s failed", req.command)
        return Reply.of(render_slack.error_message(f"/run {req.command} failed: {type(exc).__name__}: {exc}"[:300]),
                        outcome="error")


def _is_run(req: CommandRequest, word: str) -> bool:
    """Whether `word` names a run this user may see (a hidden run is never suggested)."""
    try:
        req.run(word)
    except UnknownRun:
        return False
    finally:
        req.run_name = None
    return True


def _usage(sub: Subcommand, why: str = "") -> Reply:
    text = f"usage: /run {sub.usage} — {sub.help}" + (f" ({why})" if why else "")
    return Reply.of(render_slack.error_message(text), outcome="usage")


async def send_response(response_url: str, payload: dict) -> bool:
    """POST to a response_url within RESPONSE_TIMEOUT_S; True when Slack took it.

    A short 429 is waited out and a connection never made is tried again; a dropped one is not
    (the answer may have landed, and a second copy in a channel is worse than none)."""
    client = AsyncWebhookClient(response_url, timeout=RESPONSE_TIMEOUT_S, retry_handlers=response_url_retries())
    try:
        result = await asyncio.wait_for(client.send_dict(payload), RESPONSE_TIMEOUT_S)
    except Exception as exc:  # a network error must not kill the listener
        log.warning("response_url post failed: %s: %s", type(exc).__name__, exc)
        return False
    if result.status_code != 200:
        log.warning("response_url post refused: HTTP %s %s", result.status_code, result.body[:200])
    return result.status_code == 200


async def say_privately(response_url: str, message: dict) -> bool:
    """A message for the asker or clicker alone, beside whatever they clicked or asked (never in its place)."""
    return await send_response(response_url, {**message, "response_type": "ephemeral", "replace_original": False})


def log_event(event: str, **fields) -> None:
    """One structured line per command or click (bot.service.serve formats records as JSON)."""
    log.info("%s %s", event, json.dumps(fields, ensure_ascii=False), extra={"runbot": {"event": event, **fields}})


async def on_run(ack, command: dict, context) -> None:
    await ack()  # first, whatever comes next: Slack gives up after 3 seconds
    services: Services = context["services"]
    started = time.monotonic()
    user, channel = command.get("user_id", ""), command.get("channel_id", "")
    with services.tracking():
        reply, req, _ = await dispatch(services, user, channel, command.get("text", ""), command["response_url"])
        delivered = await send_response(command["response_url"], reply.payload())
    log_event("command", user=user, channel=channel, command=req.command[:32], args=[a[:64] for a in req.args[:5]],
              run=req.run_name, here=req.here, outcome=reply.outcome, delivered=delivered,
              ms=round((time.monotonic() - started) * 1000))


def register(app) -> None:
    app.command("/run")(on_run)
