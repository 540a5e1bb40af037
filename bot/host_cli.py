"""`runbot discover HOST`, `runbot host HOST`, and the host's lines under `runbot gpus RUN` (shell: wiring only)."""

from __future__ import annotations

import asyncio
import sys

from bot.service.host_view import HostRefused, discover_lines, host_lines, look, ownership, viewable_host
from config.registry import Registry, Run

EXIT_OK, EXIT_USAGE, EXIT_UNREACHABLE = 0, 2, 3


def main(registry: Registry, command: str, host_name: str) -> int:
    """`runbot discover HOST` and `runbot host HOST`: print what the host says; never edit the config."""
    try:
        host = viewable_host(registry, host_name)
    except HostRefused as exc:
        print(f"runbot: {exc}", file=sys.stderr)
        return EXIT_USAGE
    view = asyncio.run(look(registry, host.name, discover=command == "discover"))
    lines = discover_lines(registry, view) if command == "discover" else host_lines(view, registry.runs.values())
    print("\n".join(lines))
    return EXIT_UNREACHABLE if view.failure is not None else EXIT_OK


def gpus_lines(registry: Registry, run: Run) -> list[str]:
    """`runbot gpus RUN`'s last lines: who holds the run's GPUs, or that the host view is off."""
    return asyncio.run(ownership(registry, run, registry.runs.values()))
