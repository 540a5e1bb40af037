"""A cluster on this machine: a loopback sshd with the `pct` stand-in, and Slack's Web API stand-in (demo and tests)."""
