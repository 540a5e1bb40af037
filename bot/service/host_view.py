"""The host's view for the CLI and Slack alike: which host may be asked, one probe of it, what it says (shell)."""

from __future__ import annotations

from collections.abc import Iterable

from bot.core.host_view import HostView, discovered, runs_by_ct
from bot.probe.scheduler import Priority, Scheduler
from bot.probe.targets import Targets
from bot.render import host as render_host
from config.registry import LOCAL, Host, Registry, Run


class HostRefused(Exception):
    """The host is not one runbot may probe directly: not configured, or host_view is off. `str()` says which."""


def viewable_host(registry: Registry, name: str) -> Host:
    """The configured host called `name` whose host view is on (else HostRefused, saying how to fix it)."""
    host = registry.hosts.get(name.strip())
    if host is None:
        known = ", ".join(registry.hosts) or "none configured"
        raise HostRefused(f"unknown host {name.strip()[:64]!r} (known: {known})")
    if not host.host_view:
        raise HostRefused(render_host.view_off(host.name))
    return host


async def look(registry: Registry, host: str, *, discover: bool, scheduler: Scheduler | None = None) -> HostView:
    """One probe of the host through the scheduler: the bot's own in Slack, a fresh one for a CLI call."""
    if scheduler is not None:
        return await scheduler.host_view(host, discover=discover, priority=Priority.ASK)
    targets = Targets(registry)
    try:
        return await Scheduler(registry, targets).host_view(host, discover=discover)
    finally:
        await targets.close()


def discover_lines(registry: Registry, view: HostView, visible: set[str] | None = None) -> list[str]:
    """Discovery's answer. Every configured run counts (a hidden one must not be offered again under a new
    name), but only `visible` ones (None: all) are named."""
    configured = [(r.name, r.host, r.container, r.log) for r in registry.runs.values()]
    return render_host.discover_lines(view, discovered(view, configured), visible=visible)


def host_lines(view: HostView, runs: Iterable[Run]) -> list[str]:
    """The whole box, naming only `runs` (those the asker may see)."""
    return render_host.host_lines(view, runs_by_ct(runs, view.host))


async def ownership(registry: Registry, run: Run, runs: Iterable[Run], scheduler: Scheduler | None = None) -> list[str]:
    """What the host says of who holds the run's GPUs, naming only `runs`; that the view is off; nothing for a
    run on this machine."""
    if run.host == LOCAL:
        return []
    host = registry.hosts.get(run.host)
    if host is None or not host.host_view:
        return [render_host.view_off(run.host)]
    view = await look(registry, host.name, discover=False, scheduler=scheduler)
    indices = [i for _, idx in run.gpus for i in idx]
    return render_host.ownership(view, indices, run.container, runs_by_ct(runs, run.host))
