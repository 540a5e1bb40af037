"""The running bot: the Slack app, serve, the watchdog, its state file and store, the chat seam."""
