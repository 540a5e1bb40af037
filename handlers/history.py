"""/run history: what a run did over the last day (or DURATION) — its phases, restarts and incidents — with chart buttons."""

from __future__ import annotations

from bot.core.timeline import HISTORY_WINDOW_S, incidents_between, spans
from bot.render import slack as render_slack
from bot.render.history import history_message
from handlers.commands import CommandRequest, Reply, subcommand
from handlers.plot import parse_window

NO_HISTORY = ("no history is kept here: the watchdog keeps each run's memory (`runbot serve` with a state file), "
              "and /run history reads from it")

DEFAULT_WINDOW_S = HISTORY_WINDOW_S  # one default with `runbot history`


@subcommand("history", "history RUN [DURATION]", "what the run did lately: phases, restarts, incidents")
async def history(req: CommandRequest) -> Reply:
    window = parse_window(req.args[1]) if len(req.args) > 1 else DEFAULT_WINDOW_S
    run = req.run(req.args[0])
    memory = req.services.history
    if memory is None:
        return Reply.of(render_slack.error_message(NO_HISTORY), outcome="error")
    now = req.services.clock()
    points = await memory.points(run.name, now - window)
    ledger = getattr(req.services.store, "ledger", None)
    incidents = incidents_between(list(ledger.incidents.values()) if ledger is not None else [], run.name, now - window)
    return req.reply(history_message(run.name, spans(points), incidents, now, window))


def register(app) -> None:
    """Nothing to listen for beyond /run itself: importing this module registered `/run history`."""
