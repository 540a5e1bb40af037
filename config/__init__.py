"""runbot's configuration: the TOML registry of hosts and runs, and the environment."""
