"""/run plot: a chart of a run's history, drawn off the event loop and uploaded to the channel it was asked in.

Like every subcommand it answers after the ack (handlers/commands.py acknowledges first, then runs the
handler and posts its Reply through response_url): the chart itself goes up with Slack's external upload
(files.getUploadURLExternal, the bytes to the URL it gives, files.completeUploadExternal), and the person
who asked gets a private line saying it is there, or why not.
"""

from __future__ import annotations

import functools
import re
import time
from typing import Awaitable, Callable

from slack_sdk.errors import SlackApiError, SlackRequestError

from bot.core import humanize
from bot.render import chart as render_chart
from bot.render import slack as render_slack
from config.durations import parse_duration
from config.registry import format_duration
from bot.render.history import ACTION_PLOT, CHART_ACTIONS
from bot.service.charts import ChartsBusy
from handlers import clicks
from handlers.commands import CommandRequest, Reply, Usage, log, log_event, say_privately, subcommand

NO_HISTORY = ("no history is kept here: the watchdog keeps each run's memory (`runbot serve` with a state file), "
              "and /run plot draws from it")
# What an upload's Slack error means for the person who asked.
UPLOAD_ERRORS = {
    "not_in_channel": "invite the bot to this channel (`/invite @runbot`)",
    "channel_not_found": "invite the bot to this channel (`/invite @runbot`)",
    "missing_scope": "the Slack app lacks the files:write scope: reinstall it from slack-app-manifest.yml",
    "not_allowed_token_type": "the bot token cannot upload files",
}


def parse_args(words: list[str]) -> tuple[str, float]:
    """The words after RUN -> (metric, window seconds): a metric name and a duration, each at most once,
    in either order ("loss 24h", "24h", "gpus"); anything else is a Usage error."""
    metric, window = None, None
    for word in words:
        if word.casefold() in render_chart.METRICS:
            if metric is not None:
                raise Usage("one metric at a time")
            metric = word.casefold()
            continue
        if not word[:1].isdigit() and not word.startswith(("-", ".")):
            raise Usage(f"“{word[:32]}” is neither a metric ({', '.join(render_chart.METRICS)}) "
                        "nor a duration (e.g. 90m, 6h, 2d)")
        if window is not None:
            raise Usage("one duration at a time")
        window = parse_window(word)
    return metric or "loss", window or render_chart.DEFAULT_WINDOW_S


def parse_window(word: str) -> float:
    """How far back a history or a chart looks: "90m", "6h", "2d" (at most the retention's 30 days)."""
    if re.fullmatch(r"[0-9.]+", word):  # "6": hours? minutes? say which
        raise Usage(f"a duration needs its unit: {word}h, {word}m")
    try:
        seconds = parse_duration(word, "")
    except ValueError as exc:
        raise Usage(str(exc)) from None
    if seconds > render_chart.MAX_WINDOW_S:
        raise Usage(f"at most {format_duration(render_chart.MAX_WINDOW_S)} back")
    return seconds


def _error(text: str, outcome: str = "error") -> Reply:
    return Reply.of(render_slack.error_message(text), outcome=outcome)


def _note(text: str) -> dict:
    line = render_slack.safe(text)
    return {"text": line, "blocks": [render_slack.section(line)]}


def queue_note(ahead: int) -> dict:
    """What the asker hears while their chart waits its turn."""
    charts = "1 chart" if ahead == 1 else f"{ahead} charts"
    return _note(f":hourglass_flowing_sand: {charts} ahead of yours; it will be posted here when drawn")


def _incidents(services, run_name: str) -> list[float]:
    """When the run's incidents opened, from the watchdog's ledger (none without a watchdog)."""
    ledger = getattr(services.store, "ledger", None)
    if ledger is None:
        return []
    return [i.opened_at for i in list(ledger.incidents.values()) if i.run == run_name]


@subcommand("plot", "plot RUN [loss|rate|gpus] [DURATION]", "a chart of the run's history, posted here")
async def plot(req: CommandRequest) -> Reply:
    metric, window = parse_args(req.args[1:])
    run = req.run(req.args[0])
    return await post_chart(req.services, req.channel_id, run.name, metric, window, tell=req.note)


async def post_chart(services, channel: str, run_name: str, metric: str, window: float,
                     tell: Callable[[dict], Awaitable[object]] | None = None) -> Reply:
    """Draw the run's chart in the charts' own queue and upload it to `channel`; the Reply says it is there,
    or why not. `tell` gets a private word first when the chart has to wait its turn."""
    history = services.history
    if history is None:
        return _error(NO_HISTORY)
    now = services.clock()
    points = await history.points(run_name, now - window)
    try:
        ahead, drawing = services.charts.submit(render_chart.chart, run_name, points, metric=metric, now=now,
                                                window=window, incidents=_incidents(services, run_name))
    except ChartsBusy as exc:
        log.warning("/run plot %s: refused, %s charts queued", run_name, exc)
        return _error("too many charts queued, try again in a minute", outcome="busy")
    if ahead >= services.charts.workers and tell is not None:
        await tell(queue_note(ahead))
    png = await drawing
    span = render_chart.span_words(window)
    what = {"loss": "loss", "rate": "rate", "gpus": "GPUs"}[metric]
    try:
        await services.chat.files_upload_v2(
            channel=channel,
            file=png,
            filename=f"{run_name}-{metric}.png",
            title=f"{run_name} · {what} · last {span}",
            alt_txt=f"chart of {run_name}'s {what} over the last {span}",
            initial_comment=render_slack.safe(f"{run_name}: {what}, last {span}"),
        )
    except SlackApiError as exc:
        code = str((exc.response.get("error") if exc.response is not None else None) or "error")
        log.warning("/run plot %s: upload refused: %s", run_name, code)
        hint = UPLOAD_ERRORS.get(code, "")
        return _error(f"cannot post the chart here ({code})" + (f"; {hint}" if hint else ""))
    except Exception as exc:  # noqa: BLE001 - the upload URL or the network failed: one line, never a traceback
        line = humanize.trim(f"{type(exc).__name__}: {exc}", 200)
        log.warning("/run plot %s: upload failed: %s", run_name, line)
        if isinstance(exc, SlackRequestError):  # the bytes were refused: nothing was shared
            return _error(f"cannot post the chart here: {line}")
        return _error(f"the upload broke off, the chart may or may not be in the channel: {line}")
    return Reply.of(_note(f":chart_with_upwards_trend: posted {run_name}'s {what} chart (last {span}, {len(points)} points) "
                          "in this channel"))


async def on_chart_button(ack, body: dict, action: dict, context) -> None:
    """A Chart button (on a /run history answer): the chart goes to the channel, the clicker hears how it went."""
    await ack()
    services = context["services"]
    started = time.monotonic()
    click = clicks.read(body, action)
    if click is None:
        return
    name, metric, window = _button_value(click.value)
    run = clicks.clicked_run(services.registry, click.user, click.channel, name)
    if metric is None and not isinstance(run, clicks.Refused):  # a value no chart button carries: as unknown
        run = clicks.Refused(clicks.not_known(name), "unknown_run")
    tell = functools.partial(say_privately, click.response_url) if click.response_url else None
    with services.tracking():
        if isinstance(run, clicks.Refused):
            reply, outcome = _error(run.text), run.outcome
        else:
            reply = await post_chart(services, click.channel, run.name, metric, window, tell=tell)
            outcome = reply.outcome
        if tell is not None:
            await tell(reply.payload())
    log_event("button", user=click.user, channel=click.channel, command="plot", run=name[:64], outcome=outcome,
              ms=round((time.monotonic() - started) * 1000))


def _button_value(value: str) -> tuple[str, str | None, float]:
    """"RUN METRIC SECONDS" (what bot.render.history puts on the button) -> its parts; metric None when malformed."""
    words = value.split()
    if len(words) != 3 or words[1] not in render_chart.METRICS or not words[2].isdigit():
        return (words[0] if words else ""), None, 0.0
    return words[0], words[1], min(float(words[2]), render_chart.MAX_WINDOW_S) or render_chart.DEFAULT_WINDOW_S


def register(app) -> None:
    """`/run plot` is registered by importing this module; the Chart buttons of /run history listen here (one
    action_id per metric, and the one they all shared before, for answers already in channels)."""
    for action_id in (*CHART_ACTIONS, ACTION_PLOT):
        app.action(action_id)(on_chart_button)
