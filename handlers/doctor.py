"""/run doctor: the install's checks (hosts, containers, logs, Slack) for runbot's admins, answered only to them."""

from __future__ import annotations

from bot.render import doctor as render_doctor
from bot.render import slack as render_slack
from bot.service.doctor import host_checks, slack_checks
from handlers.commands import CommandRequest, Reply, subcommand

NOT_ADMIN = "only runbot's admins may run /run doctor (its answer shows every host and path): [access] admins"


@subcommand("doctor", "doctor", "check the install: hosts, containers, logs, Slack (admins only)")
async def doctor(req: CommandRequest) -> Reply:
    if req.user_id not in req.registry.access.admins:
        return Reply.of(render_slack.error_message(NOT_ADMIN), outcome="refused")
    checks = [*await host_checks(req.registry, req.services.targets),
              *await slack_checks(req.services.chat, req.registry)]
    outcome = "ok" if render_doctor.passed(checks) else "failed"
    return Reply.of(render_doctor.slack_message(checks), outcome=outcome)  # ephemeral: only the admin sees it


def register(app) -> None:
    """Nothing to listen for beyond /run itself: importing this module registered `/run doctor`."""
