"""Pure: verdicts and alerts rendered for a terminal and for Slack's Block Kit."""
