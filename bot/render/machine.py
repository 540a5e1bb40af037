"""Pure: a Verdict (and a run's history) as JSON-ready dicts for `--json`, versioned; docs/json.md is their schema."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from bot.core.facts import Crash, Process
from bot.core.gpus import GpuReport, GpuState
from bot.core.history import role_load
from bot.core.ledger import Incident
from bot.core.redact import clean_line
from bot.core.timeline import Span
from bot.core.verdict import Concern, Phase, Verdict, worst_first

# "name/MAJOR": the major goes up only when a field is removed, renamed, or changes its type or unit;
# new fields come without a bump, so a reader ignores the keys it does not know (docs/json.md).
STATUS, GPUS, RUNS, HISTORY = "runbot.status/1", "runbot.gpus/1", "runbot.runs/1", "runbot.history/1"

COMMAND_CHARS = 500  # a process's command line, redacted first and cut after
GPU_CLASSES = ("busy", "oscillating", "low", "idle", "unknown")  # bot.core.gpus' classes, each a key of a role

Json = dict[str, Any]


def text(value: str | None) -> str | None:
    """Text from a log, a process or nvidia-smi made safe to show, exactly as the terminal shows it."""
    return None if value is None else clean_line(value)


def number(x: float | int | None) -> float | int | None:
    """JSON has no NaN or infinity: a number that is not finite is not there (docs/json.md says where to look)."""
    if x is None or isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    return x if math.isfinite(x) else None


def phase_id(phase: Phase) -> str:
    """A phase as a machine reads it: its name, not its words ("no_log", "busy"), stable across wordings."""
    return phase.name.lower()


def status(v: Verdict, *, where: str = "") -> Json:
    """`runbot status RUN --json`."""
    return {"schema": STATUS, **_run(v, where)}


def runs(rows: Iterable[tuple[str, Verdict]], where: dict[str, str] | None = None) -> Json:
    """`runbot runs --json`: every run as `status` has it (without its schema), the worst first, then by name."""
    where = where or {}
    return {"schema": RUNS, "runs": [_run(v, where.get(name, ""), name) for name, v in worst_first(rows)]}


def gpus(v: Verdict, *, where: str = "") -> Json:
    """`runbot gpus RUN --json`: the verdict's gist, then each GPU and role, and what the classes rest on."""
    return {"schema": GPUS, **_gist(v, where), "gpu": _gpu(v, detail=True)}


def history(run: str, spans: Sequence[Span], incidents: Sequence[Incident], now: float, window: float) -> Json:
    """`runbot history RUN --json`: the run's phases and incidents over the window, oldest first."""
    return {"schema": HISTORY, "run": run, "now": now, "since": now - window,
            "spans": [_span(s) for s in spans], "incidents": [_incident(i) for i in incidents]}


def _gist(v: Verdict, where: str, name: str | None = None) -> Json:
    return {"run": name if name is not None else v.run, "where": text(where), "reached": v.reached,
            "level": v.level.word, "phase": phase_id(v.phase), "headline": text(v.headline),
            "observed_at": number(v.observed_at)}


def _run(v: Verdict, where: str, name: str | None = None) -> Json:
    step, trend = v.step, v.trend
    return {
        **_gist(v, where, name),
        "step": step.step if step else None,
        "total": step.total if step else None,
        "epoch": number(step.epoch) if step else None,
        "loss": number(step.loss) if step else None,
        "non_finite": list(step.non_finite) if step else [],
        "rate": number(step.rate) if step else None,
        "rate_unit": text(step.rate_unit) if step else None,
        "eta_s": number(trend.eta) if trend else None,
        "rate_vs_median": number(trend.vs_median) if trend else None,
        "progress_age_s": number(v.progress_age),
        "log_silent_s": number(v.silent_for),
        "log_bytes": v.log_size,
        "silence_allowed_s": number(v.threshold),
        "writer": _process(v.writer),
        "process": _process(v.process),
        "hidden_processes": v.hidden_processes,
        "crash": _crash(v.crash),
        "thread_crash": _crash(v.thread_crash),
        "findings": [{"what": f.what.value, "detail": text(f.detail)} for f in v.findings],
        "concerns": [_concern(c) for c in v.concerns],
        "gpu": _gpu(v, detail=False),
        "problems": [text(p) for p in v.problems],
        "failure_kind": v.failure_kind,
    }


def _process(p: Process | None) -> Json | None:
    if p is None:
        return None
    command = clean_line(p.command)  # redact first, cut after: a cut could leave half a token unrecognised
    return {"pid": p.pid, "up_s": p.elapsed_s, "paused": p.paused,
            "command": command if len(command) <= COMMAND_CHARS else command[: COMMAND_CHARS - 1] + "…"}


def _crash(c: Crash | None) -> Json | None:
    if c is None:
        return None
    return {"kind": c.kind.value, "type": text(c.exc_type), "message": text(c.message), "thread": text(c.thread),
            "rank": c.rank, "exit_code": c.exit_code}


def _concern(c: Concern | None) -> Json | None:
    return None if c is None else {"kind": c.kind.value, "subject": text(c.subject)}


def _gpu(v: Verdict, *, detail: bool) -> Json | None:
    """The GPUs by role; with `detail`, each GPU too and what the classes rest on. None when not read."""
    report = v.gpu
    if report is None or not v.reached:
        return None
    out: Json = {"error": text(report.error), "roles": _roles(report),
                 "findings": [text(f) for f in report.findings]}
    if detail:
        basis = report.basis
        out["basis"] = {"method": basis.method.value, "seconds": number(basis.seconds), "count": basis.count,
                        "gap": basis.gap.name.lower() if basis.gap is not None else None}
        out["gpus"] = [_one_gpu(g) for g in report.gpus]
    return out


def _roles(report: GpuReport) -> list[Json]:
    """Each configured role in file order, then the GPUs of no role (role null), with their classes and load."""
    reported = {g.index for g in report.gpus}
    groups: list[tuple[str | None, list[int]]] = [(role, list(idx)) for role, idx in report.roles]
    placed = {i for _, idx in groups for i in idx}
    if others := [g.index for g in report.gpus if g.index not in placed]:
        groups.append((None, others))
    out = []
    for role, indices in groups:
        states = [g for i in indices if (g := report.by_index(i)) is not None]
        load = role_load(role or "", states)
        out.append({"role": role, "gpus": indices,
                    **{cls: [g.index for g in states if g.cls == cls] for cls in GPU_CLASSES},
                    "memory_held": [g.index for g in states if g.cls == "idle" and g.holds_memory],
                    "not_reported": [i for i in indices if i not in reported] if report.gpus else [],
                    "busy_share": load.busy if load is not None else None,
                    "mem_used_gib": load.mem_gib if load is not None else None})
    return out


def _one_gpu(g: GpuState) -> Json:
    return {"index": g.index, "role": g.role, "class": g.cls, "busy_share": number(g.busy_share),
            "util_now_pct": number(g.now_pct), "util_floor_pct": number(g.floor),
            "mem_used_mib": number(g.mem_used_mib), "mem_total_mib": number(g.mem_total_mib),
            "holds_memory": g.holds_memory}


def _span(s: Span) -> Json:
    return {"start": s.start, "end": s.end, "phase": phase_id(s.phase), "segment": s.segment,
            "first_step": s.first_step, "last_step": s.last_step, "rate": number(s.rate), "unit": text(s.unit),
            "restarted": s.restarted}


def _incident(i: Incident) -> Json:
    return {"opened_at": i.opened_at, "closed_at": i.closed_at, "concern": _concern(i.concern),
            "finished": i.concern is None}
