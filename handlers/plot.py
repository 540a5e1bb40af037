"""/run plot: a chart of a run's history, drawn off the event loop and uploaded to the channel it was asked in.

Like every subcommand it answers after the ack (handlers/commands.py acknowledges first, then runs the
handler and posts its Reply through response_url): the chart itself goes up with Slack's external upload
(files.getUploadURLExternal, the bytes to the URL it gives, files.completeUploadExternal), and the person
who asked gets a private line saying it is there, or why not.
"""

from __future__ import annotations

import asyncio
import re

from slack_sdk.errors import SlackApiError, SlackRequestError

from bot.core import humanize
from bot.render import chart as render_chart
from bot.render import slack as render_slack
from config.durations import parse_duration
from config.registry import format_duration
from handlers.commands import CommandRequest, Reply, Usage, log, subcommand

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
        if re.fullmatch(r"[0-9.]+", word):  # "6": hours? minutes? say which
            raise Usage(f"a duration needs its unit: {word}h, {word}m")
        try:
            seconds = parse_duration(word, "")
        except ValueError as exc:
            raise Usage(str(exc)) from None
        if window is not None:
            raise Usage("one duration at a time")
        if seconds > render_chart.MAX_WINDOW_S:
            raise Usage(f"at most {format_duration(render_chart.MAX_WINDOW_S)} back")
        window = seconds
    return metric or "loss", window or render_chart.DEFAULT_WINDOW_S


def _error(text: str, outcome: str = "error") -> Reply:
    return Reply.of(render_slack.error_message(text), outcome=outcome)


def _incidents(req: CommandRequest, run_name: str) -> list[float]:
    """When the run's incidents opened, from the watchdog's ledger (none without a watchdog)."""
    ledger = getattr(req.services.store, "ledger", None)
    if ledger is None:
        return []
    return [i.opened_at for i in list(ledger.incidents.values()) if i.run == run_name]


@subcommand("plot", "plot RUN [loss|rate|gpus] [DURATION]", "a chart of the run's history, posted here")
async def plot(req: CommandRequest) -> Reply:
    metric, window = parse_args(req.args[1:])
    run = req.run(req.args[0])
    history = req.services.history
    if history is None:
        return _error(NO_HISTORY)
    now = req.services.clock()
    points = await history.points(run.name, now - window)
    png = await asyncio.to_thread(render_chart.chart, run.name, points, metric=metric, now=now, window=window,
                                  incidents=_incidents(req, run.name))
    span = render_chart.span_words(window)
    what = {"loss": "loss", "rate": "rate", "gpus": "GPUs"}[metric]
    try:
        await req.services.chat.files_upload_v2(
            channel=req.channel_id,
            file=png,
            filename=f"{run.name}-{metric}.png",
            title=f"{run.name} · {what} · last {span}",
            alt_txt=f"chart of {run.name}'s {what} over the last {span}",
            initial_comment=render_slack.safe(f"{run.name}: {what}, last {span}"),
        )
    except SlackApiError as exc:
        code = str((exc.response.get("error") if exc.response is not None else None) or "error")
        log.warning("/run plot %s: upload refused: %s", run.name, code)
        hint = UPLOAD_ERRORS.get(code, "")
        return _error(f"cannot post the chart here ({code})" + (f"; {hint}" if hint else ""))
    except Exception as exc:  # noqa: BLE001 - the upload URL or the network failed: one line, never a traceback
        line = humanize.trim(f"{type(exc).__name__}: {exc}", 200)
        log.warning("/run plot %s: upload failed: %s", run.name, line)
        if isinstance(exc, SlackRequestError):  # the bytes were refused: nothing was shared
            return _error(f"cannot post the chart here: {line}")
        return _error(f"the upload broke off, the chart may or may not be in the channel: {line}")
    note = f":chart_with_upwards_trend: posted {run.name}'s {what} chart (last {span}, {len(points)} points) in this channel"
    line = render_slack.safe(note)
    return Reply.of({"text": line, "blocks": [render_slack.section(line)]})


def register(app) -> None:
    """Nothing to listen for beyond /run itself: importing this module registered `/run plot`."""
