"""/run discover HOST and /run host HOST: the Proxmox host's own view, for people in [access]."""

from __future__ import annotations

from bot.render import slack as render_slack
from bot.service.host_view import HostRefused, discover_lines, host_lines, look, viewable_host
from config.registry import Host
from handlers.commands import CommandRequest, NotAllowed, Reply, Usage, subcommand


def _host(req: CommandRequest) -> Host:
    # The global [access] list, not a run's own: the host's view shows every CT on it, not one run.
    if not req.allowed():
        raise NotAllowed(req.command)
    try:
        return viewable_host(req.registry, req.args[0])
    except HostRefused as exc:
        raise Usage(str(exc)) from None


@subcommand("discover", "discover HOST", "the training runs on a Proxmox host, as [runs.NAME] blocks to paste")
async def discover(req: CommandRequest) -> Reply:
    host = _host(req)
    view = await look(req.registry, host.name, discover=True, scheduler=req.services.scheduler)
    lines = discover_lines(req.registry, view, visible={r.name for r in req.allowed_runs()})
    # Only to the asker, `here` or not (as /run doctor): it lists every CT's command lines and paths.
    message = render_slack.discover_message(f"discovered on {host.name} (paste into runs.toml)", lines,
                                            asked_here=req.here)
    return Reply.of(message, outcome="unreachable" if view.failure else "ok")


@subcommand("host", "host HOST", "every GPU of a host: the CT and run holding it, memory, utilisation")
async def host(req: CommandRequest) -> Reply:
    host = _host(req)
    view = await look(req.registry, host.name, discover=False, scheduler=req.services.scheduler)
    lines = host_lines(view, req.allowed_runs())
    return req.reply(render_slack.host_message(f"{host.name}: who holds each GPU", lines),
                     outcome="unreachable" if view.failure else "ok")


def register(app) -> None:
    """The subcommands register themselves on import; /run's one listener (handlers.commands) answers them."""
