"""Slack listeners: each module has register(app); bot.service.app.LISTENERS names them, in help order."""
