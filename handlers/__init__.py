"""Slack listeners: each module has register(app); bot.app registers commands, actions and EXTRA."""

# Modules (dotted names) that bot.app.build_app imports and registers after commands and
# actions, in this order: e.g. "handlers.watch" appends itself here to add watch/mute/unmute.
EXTRA: list[str] = ["handlers.watch"]
