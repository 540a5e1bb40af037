"""What GET /healthz answers, on the Slack port and the metrics port alike: alive, and this replica's role."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from config.state_where import is_server

Health = Callable[[], dict[str, Any]]


def alive() -> dict[str, Any]:
    return {"ok": True}


def of(services: Any) -> Health:
    """`{"ok": true, "role": "leader" | "standby" | "starting", "state": "sqlite" | "postgresql"}` for these services:
    a load balancer or an operator tells the replica that sweeps from the ones that stand by."""

    def health() -> dict[str, Any]:
        watchdog = getattr(services, "watchdog", None)
        role = watchdog.leadership.role.value if watchdog is not None else "starting"
        state = "postgresql" if is_server(services.registry.bot.state_db) else "sqlite"
        return {"ok": True, "role": role, "state": state}

    return health
