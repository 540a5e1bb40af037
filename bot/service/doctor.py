"""`runbot doctor` and `/run doctor`: every piece a working install needs, each checked for real (shell)."""

from __future__ import annotations

import asyncio
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Iterable

from bot.core import humanize as hz
from bot.core.redact import printable
from bot.probe.targets import Targets
from bot.render.doctor import Check, Outcome, passed, report
from config.registry import LOCAL, ConfigError, Registry, Run, faults_of, load_registry
from config.settings import Settings, check_tokens

PASS, FAIL, SKIP = Outcome.PASS, Outcome.FAIL, Outcome.SKIP

# The bot scopes slack-app-manifest.yml asks for (tests/test_doctor.py holds the two together).
MANIFEST_SCOPES = ("commands", "chat:write", "chat:write.public", "channels:history", "groups:history",
                   "files:write", "channels:read", "groups:read")
CHECK_TIMEOUT_S = 20.0  # one remote check (connect included)
_SMI_TIMEOUT_S = 10  # a wedged driver makes nvidia-smi hang: that is an answer too
SMI_SAID_CHARS = 160  # of nvidia-smi's failure, shown
ANSWER_BYTES = 1 << 20  # a check's answer: a word per log (a CT flooding it is cut here)

# How a failed connection's kind (bot.probe.ssh_errors) maps onto the three steps of getting in:
# the steps before the failed one passed.
_STEPS = ("reachable", "host key known and matching", "authentication")
_FAILED_STEP = {"unreachable": 0, "timeout": 0, "hostkey": 1, "auth": 2}


def main(path: Path, settings: Settings) -> int:
    """`runbot doctor`: print every check's line; exit 0 only when none failed."""
    started = time.monotonic()
    checks = asyncio.run(install_checks(path, settings))
    print(report(checks))
    print(f"(took {time.monotonic() - started:.1f} s)", file=sys.stderr)
    return 0 if passed(checks) else 1


async def install_checks(path: Path, settings: Settings) -> list[Check]:
    """The configuration, then every host, container and log it names, then Slack."""
    checks, registry = config_checks(path, settings)
    if registry is not None:
        checks += await state_checks(registry.bot.state_db)
        targets = Targets(registry)
        try:
            checks += await host_checks(registry, targets)
        finally:
            await targets.close()
    if settings.slack_bot_token is None:
        return [*checks, Check("Slack", SKIP, "SLACK_BOT_TOKEN is not set: token, scopes and alert channels not checked")]
    checks += token_checks(settings)
    if not all(c.ok for c in checks if c.name.startswith("SLACK_")):
        return checks  # a token in the wrong variable is not sent to Slack
    from bot.service.app import make_client  # noqa: PLC0415 - Slack libraries only when there is a token

    return [*checks, *await slack_checks(make_client(settings), registry)]


def config_checks(path: Path, settings: Settings) -> tuple[list[Check], Registry | None]:
    """The file valid, or one ✗ per fault (every fault at once, as check-config lists them)."""
    try:
        registry = load_registry(path, env_state_db=settings.runbot_state_db)
    except ConfigError as exc:
        return [Check("configuration valid", FAIL, str(f)) for f in faults_of(exc)], None
    runs, hosts = len(registry.runs), len(registry.hosts)
    return [Check("configuration valid", PASS, f"{registry.path}: {runs} run{'s' * (runs != 1)}, "
                                              f"{hosts} host{'s' * (hosts != 1)}")], registry


# --- the shared state --------------------------------------------------------------------------


async def state_checks(state_db: str) -> list[Check]:
    """With a PostgreSQL state: the database answers, and how many replicas it sees and which one leads. (An SQLite
    file is the bot's own: `runbot serve` says at start what it cannot do with it.)"""
    from config.state_where import is_server, redacted  # noqa: PLC0415

    if not is_server(state_db):
        return []
    from bot.service.leadership import AdvisoryLock  # noqa: PLC0415

    where = redacted(state_db)
    try:
        import psycopg  # noqa: PLC0415

        await asyncio.to_thread(_ping, psycopg, state_db)
    except ImportError:
        return [Check("state database reachable", FAIL, f"{where}: psycopg is not installed",
                      "pip install 'runbot[postgresql]'")]
    except Exception as exc:  # noqa: BLE001 - psycopg's errors, said as they are
        return [Check("state database reachable", FAIL, f"{where}: {str(exc).strip()[:200]}",
                      "check the URL, the server, and that it accepts this host")]
    replicas = await AdvisoryLock(state_db).replicas()
    leaders = [r.name for r in replicas if r.leads]
    said = (f"{len(replicas)} replica{'s' * (len(replicas) != 1)} connected; "
            + (f"{leaders[0]} leads" if leaders else "none leads (no runbot serve is running)"))
    return [Check("state database reachable", PASS, where), Check("replicas", PASS, said)]


def _ping(psycopg: Any, url: str) -> None:
    with psycopg.connect(url, connect_timeout=5) as conn:
        conn.execute("SELECT 1")


# --- hosts, containers, logs ------------------------------------------------------------------


async def host_checks(registry: Registry, targets: Targets) -> list[Check]:
    """Every host (and this machine, when a run lives here), in file order, checked side by side."""
    names = [*registry.hosts, *([LOCAL] if any(r.is_local for r in registry.runs.values()) else [])]
    found = await asyncio.gather(*(_host(name, [r for r in registry.runs.values() if r.host == name], targets)
                                   for name in names))
    return [c for checks in found for c in checks]


async def _host(name: str, runs: list[Run], targets: Targets) -> list[Check]:
    checks: list[Check] = []
    pct = True
    if name != LOCAL:
        got = await targets.runner_on(name).run("command -v pct >/dev/null", timeout=CHECK_TIMEOUT_S)
        failed_at = _FAILED_STEP.get(got.failure_kind or "", 0) if got.failure else len(_STEPS)
        checks += [Check(f"{name}: {step}", PASS) for step in _STEPS[:failed_at]]
        if got.failure:
            return [*checks, Check(f"{name}: {_STEPS[failed_at]}", FAIL, got.failure),
                    Check(f"{name}: pct, containers and logs", SKIP, "not checked: no connection")]
        pct = got.exit_status == 0
        if any(r.container is not None for r in runs):
            checks.append(Check(f"{name}: pct present", PASS) if pct else Check(
                f"{name}: pct present", FAIL, f"`pct` is not on {name}'s PATH",
                f"runs with `container` need a Proxmox VE node; point `address` at one, or drop `container`"))
    places: dict[int | None, list[Run]] = {}
    for run in runs:
        places.setdefault(run.container, []).append(run)
    for ct, inside in places.items():
        checks += await _place(name, ct, inside, targets) if pct or ct is None else [
            Check(_where(name, ct), SKIP, "not checked: no pct")]
    return checks


def _where(host: str, ct: int | None) -> str:
    place = "this machine" if host == LOCAL else host
    return place if ct is None else f"{place} CT {ct}"


def _place_script(logs: Iterable[str]) -> str:
    """nvidia-smi, then each log, one word each: typed below; the one thing shown (nvidia-smi's failure) is
    made printable and redacted before it is cut."""
    paths = " ".join(shlex.quote(p) for p in logs)  # from the config file, never from Slack
    return (
        "if ! command -v nvidia-smi >/dev/null 2>&1; then echo smi-missing; "
        f"elif n=$(timeout {_SMI_TIMEOUT_S} nvidia-smi -L 2>&1); then echo \"smi-ok $(printf '%s\\n' \"$n\" | grep -c '^GPU ')\"; "
        # Its first line as it came (bounded): runbot makes it printable and redacts it before cutting it.
        "else echo \"smi-failed $(printf '%s' \"$n\" | head -n1 | head -c 4096)\"; fi\n"
        f"for p in {paths}; do "
        "if [ ! -e \"$p\" ]; then echo log-missing; elif [ ! -f \"$p\" ]; then echo log-notfile; "
        "elif head -c1 -- \"$p\" >/dev/null 2>&1; then echo log-ok; else echo log-unreadable; fi; done\n"
    )


async def _place(host: str, ct: int | None, runs: list[Run], targets: Targets) -> list[Check]:
    """One host or container: running (pct's verdict), nvidia-smi answering, each run's log readable."""
    where = _where(host, ct)
    logs = list(dict.fromkeys(r.log for r in runs))
    # A CT's root controls what answers there (its bash, its nvidia-smi): read a bounded answer.
    got = await targets.runner_on(host, ct).run(_place_script(logs), timeout=CHECK_TIMEOUT_S, limit=ANSWER_BYTES)
    checks = []
    if ct is not None:
        if got.failure:
            return [Check(f"{where}: running", FAIL, got.failure, f"`pct start {ct}` on {_where(host, None)}, or fix `container` "
                                                                     f"of {', '.join(r.name for r in runs)}")]
        checks.append(Check(f"{where}: running", PASS))
    elif got.failure:
        return [Check(f"{where}: commands run", FAIL, got.failure)]
    words = got.stdout.decode(errors="replace").split("\n")  # not splitlines(): a U+2028 is inside its line
    smi, answers = (words[0].split(" ", 1) + [""])[:2] if words else ("", "")
    if smi == "smi-ok":
        checks.append(Check(f"{where}: nvidia-smi answering", PASS, f"{answers} GPU{'s' * (answers != '1')}"))
    elif smi == "smi-missing":
        checks.append(Check(f"{where}: nvidia-smi answering", FAIL, f"nvidia-smi is not on the PATH in {where}",
                            "install the NVIDIA driver's user-space tools there (the host's driver version)"))
    else:
        said = hz.trim(printable(answers), SMI_SAID_CHARS) or "no output"  # trim redacts, then cuts
        checks.append(Check(f"{where}: nvidia-smi answering", FAIL, f"nvidia-smi failed: {said}",
                            "check the GPU devices (/dev/nvidia*) are passed into it and the driver versions match"))
    states = dict(zip(logs, words[1:]))
    for log in logs:
        names = ", ".join(r.name for r in runs if r.log == log)
        checks.append(_log_check(where, log, names, states.get(log, "")))
    return checks


_LOG_FAULTS = {
    "log-missing": ("does not exist", "check `log` of {runs} (a path inside the container, when it has one); "
                                      "a run that has not started yet writes it later"),
    "log-notfile": ("is not a file", "point `log` of {runs} at the log file itself"),
    "log-unreadable": ("cannot be read", "let the SSH user read it (chmod o+r), or log in as one who can"),
}


def _log_check(where: str, log: str, runs: str, state: str) -> Check:
    name = f"{where}: log {log} readable"
    if state == "log-ok":
        return Check(name, PASS)
    detail, fix = _LOG_FAULTS.get(state, ("was not checked (the check's output was cut short)", "run doctor again"))
    return Check(name, FAIL, f"{log} {detail}", fix.format(runs=runs))


# --- Slack ----------------------------------------------------------------------------------


def token_checks(settings: Settings) -> list[Check]:
    """The tokens' shapes, before any is sent: the one fault check_tokens finds, or what each token is."""
    try:
        check_tokens(settings)
    except ConfigError as exc:
        # The fault names the token's kind, never the token.
        return [Check(f"{exc.key} shape", FAIL, exc.fault, "SLACK_BOT_TOKEN=xoxb-… and SLACK_APP_TOKEN=xapp-…, "
                                                          "each in its own variable, on one line (docs/slack.md)")]
    if settings.slack_app_token is None:
        return [Check("Socket Mode (SLACK_APP_TOKEN)", SKIP, "not set, HTTP mode (SLACK_SIGNING_SECRET signs requests)")]
    # Worded so that the line's own words never read as `token: value` to the redaction every line goes through.
    return [Check("Socket Mode (SLACK_APP_TOKEN)", PASS, "set, an xapp- app-level token")]


async def slack_checks(client: Any, registry: Registry | None) -> list[Check]:
    """The bot token accepted, the manifest's scopes granted, each alert channel there with the bot in it."""
    from slack_sdk.errors import SlackApiError  # noqa: PLC0415 - Slack libraries only when there is a token

    name = "SLACK_BOT_TOKEN accepted (auth.test)"
    try:
        auth = await client.auth_test()
    except SlackApiError as exc:
        return [Check(name, FAIL, f"Slack said {exc.response.get('error')}",
                      "copy the Bot User OAuth Token (xoxb-…) from api.slack.com/apps → OAuth & Permissions "
                      "(reinstall the app if it was revoked)")]
    except Exception as exc:  # noqa: BLE001 - the network's failures are a line, not a traceback
        return [Check(name, FAIL, f"cannot reach Slack's Web API at {client.base_url}: {type(exc).__name__}",
                      "check this machine's network or proxy (SLACK_API_BASE_URL)")]
    bot = auth.get("user") or "runbot"
    checks = [Check(name, PASS, f"@{bot} in {auth.get('team')}")]
    header = next((v for k, v in (auth.headers or {}).items() if k.lower() == "x-oauth-scopes"), "")
    header = header[0] if isinstance(header, (list, tuple)) else header
    granted = {s.strip() for s in str(header).split(",") if s.strip()}
    missing = [s for s in MANIFEST_SCOPES if s not in granted]
    checks.append(Check("scopes granted", PASS, f"all {len(MANIFEST_SCOPES)} the manifest asks for") if not missing
                  else Check("scopes granted", FAIL, f"missing {', '.join(missing)}",
                             "add them in OAuth & Permissions → Scopes (or paste slack-app-manifest.yml again), "
                             "then reinstall the app"))
    for channel in _alert_channels(registry):
        checks.append(await _channel_check(client, channel, bot, SlackApiError))
    return checks


def _alert_channels(registry: Registry | None) -> list[str]:
    if registry is None:
        return []
    return list(dict.fromkeys(c for c in [registry.bot.alert_channel, *(r.alert_channel for r in registry.runs.values())] if c))


async def _channel_check(client: Any, channel: str, bot: str, api_error: type[Exception]) -> Check:
    name = f"alert channel {channel} reachable, bot in it"
    if channel.startswith("#"):
        return Check(name, SKIP, "named, not an id: Slack looks channels up by id (C…); set it to check this")
    try:
        info = (await client.conversations_info(channel=channel)).get("channel") or {}
    except api_error as exc:
        error = exc.response.get("error")  # type: ignore[attr-defined]
        fix = ("grant channels:read and groups:read, then reinstall the app" if error == "missing_scope" else
               "check the id (the channel's details, at the bottom), and that the bot was invited to a private one")
        return Check(name, FAIL, f"Slack said {error}", fix)
    except Exception as exc:  # noqa: BLE001
        return Check(name, FAIL, f"cannot ask Slack: {type(exc).__name__}", "check this machine's network")
    label = f"#{info['name']}" if info.get("name") else channel
    if not info.get("is_member"):
        return Check(name, FAIL, f"@{bot} is not in {label}", f"`/invite @{bot}` in {label}")
    return Check(name, PASS, label)
