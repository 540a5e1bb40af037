"""Pure: when every run of one host fails to answer in the same way, that is one outage of the host, not N incidents."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from bot.core.verdict import Concern, Level, Phase, Verdict, Worry

HOST_GROUP_MIN = 2  # runs a host must have for its outage to be told as one incident
# How a probe fails when the host itself is away; a stopped container ("container") is the run's own news.
HOST_FAILURES = frozenset({"unreachable", "timeout", "auth", "hostkey"})
NAMES_SHOWN = 8
# How one probe came back, as the metrics count it: reached, or its failure's kind; any other kind is "other",
# so the label stays a fixed set whatever a transport reports.
PROBE_OUTCOMES = ("ok", "unreachable", "timeout", "auth", "hostkey", "container", "local", "busy", "other")


@dataclass(frozen=True)
class HostRun:
    """A host as the incident machine sees it: a name, and where its news goes."""

    name: str  # "host pve1": cannot clash with a run's name, which has no spaces
    host: str
    alert_channel: str | None


def host_key(host: str) -> str:
    return f"host {host}"


def is_host_key(name: str) -> bool:
    """Whether an incident's name is a host's (host_key), not a run's: a host has no run's buttons to press."""
    return name.startswith("host ")


def outage(host: str, verdicts: Sequence[Verdict]) -> Verdict | None:
    """The host's own verdict when all its runs' probes failed as a host failure, else None."""
    if len(verdicts) < HOST_GROUP_MIN or not all(
            v.phase is Phase.UNREACHABLE and v.failure_kind in HOST_FAILURES for v in verdicts):
        return None
    names = sorted(v.run for v in verdicts)
    shown = ", ".join(names[:NAMES_SHOWN]) + (f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else "")
    why = verdicts[0].headline
    return Verdict(run=host_key(host), phase=Phase.UNREACHABLE, level=Level.CRIT,
                   headline=f"{len(names)} runs on {host} unreachable ({shown}) — {why}",
                   concerns=(Concern(Worry.UNREACHABLE),), failure_kind=verdicts[0].failure_kind)


def answering(host: str, verdicts: Sequence[Verdict]) -> Verdict:
    """The host's verdict when at least one of its runs was probed."""
    reached = sum(v.reached for v in verdicts)
    return Verdict(run=host_key(host), phase=Phase.TRAINING, level=Level.OK,
                   headline=f"{host} answers again: {reached} of {len(verdicts)} runs probed")


def probe_outcome(v: Verdict) -> str:
    """One of PROBE_OUTCOMES."""
    if v.reached:
        return "ok"
    return v.failure_kind if v.failure_kind in PROBE_OUTCOMES else "other"


def unreached(verdicts: Sequence[Verdict], still_out: int) -> str | None:
    """Why a sweep reached nothing, in fixed words and counts (a dead-man's switch's /fail body; no log text,
    no host, no secret), or None when it reached a run — or had none to reach."""
    if verdicts and not any(v.reached for v in verdicts):
        kinds = Counter(probe_outcome(v) for v in verdicts)
        return (f"no run reached: {len(verdicts)} unreachable ("
                + ", ".join(f"{kind} {n}" for kind, n in sorted(kinds.items())) + ")")
    if not verdicts and still_out:
        return f"no probe came back: {still_out} runs still being probed since an earlier sweep"
    return None
