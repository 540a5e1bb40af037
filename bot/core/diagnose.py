"""Pure: Evidence + a run's policy -> Verdict. Time comes in through the evidence, never from a clock."""

from __future__ import annotations

import re
import statistics
from typing import Mapping, Protocol, Sequence

from bot.core import humanize as hz
from bot.core.evidence import Evidence
from bot.core.facts import Bar, Crash, Process, Step
from bot.core.gpus import GpuReport, classify, format_indices
from bot.core.redact import redact_lines
from bot.core.verdict import GRACE_PHASES, TAIL_MAX, Level, Phase, Verdict

# A log that grew this recently is being written even when no writer was seen (a logger that
# reopens the file, a probe without permission to read /proc/*/fd).
RECENT_WRITE_S = 30.0
# silence_after = "auto": several times the median gap between step lines, within bounds.
AUTO_FACTOR, AUTO_FLOOR_S, AUTO_CAP_S, AUTO_DEFAULT_S = 8.0, 120.0, 1800.0, 600.0

_END = re.compile(
    r"training (is )?(done|complete|completed|finished)|finished training|done training|train_runtime"
    r"|training completed|run finished|all done|^done\.?$|saving final|final checkpoint saved",
    re.I,
)
_EVAL = re.compile(r"eval|valid|test|generat|sampl|bench", re.I)
_SAVE = re.compile(r"sav|checkpoint|writ|upload|export", re.I)
_LOAD = re.compile(r"load|shard|weight|download|fetch|map|token|preprocess|prepar", re.I)


class RunPolicy(Protocol):
    """What the diagnosis needs from a run's configuration (config.registry.Run satisfies it)."""

    name: str
    log: str
    silence_after: float | None  # None: "auto"
    loading_grace: float

    @property
    def roles(self) -> Mapping[str, Sequence[int]]: ...


def unreachable(run: RunPolicy, failure: str, kind: str | None = None) -> Verdict:
    """The verdict for a probe that never ran: the failure says what and where."""
    return Verdict(
        run=run.name,
        phase=Phase.UNREACHABLE,
        level=Level.CRIT,
        headline=failure,
        concerns=("unreachable",),
        failure_kind=kind,
    )


def learned_threshold(steps: Sequence[Step]) -> float | None:
    """Silence allowed for a loop, learned from the gaps between its step lines' `elapsed` values."""
    times = [s.elapsed for s in steps if s.elapsed is not None]
    gaps = [b - a for a, b in zip(times, times[1:]) if b > a]
    if len(gaps) < 2:
        return None
    return min(AUTO_CAP_S, max(AUTO_FLOOR_S, AUTO_FACTOR * statistics.median(gaps)))


def _after(index: int | None, than: int | None) -> bool:
    """Is the line at `index` later in the log than the line at `than` (None: there is none)?"""
    return index is not None and index >= 0 and (than is None or index > than)


def _main_writer(writers: Sequence[Process]) -> Process | None:
    if not writers:
        return None
    training = [p for p in writers if re.search(r"python|torchrun|deepspeed|accelerate", p.command)]
    return max(training or writers, key=lambda p: p.elapsed_s or 0)


def _step_words(step: Step, previous: Verdict | None = None) -> str:
    parts = []
    if step.step is not None:
        parts.append(f"step {step.step}" + (f"/{step.total}" if step.total else ""))
    if step.rate is not None:
        rate = f"{hz.count(step.rate)} {step.rate_unit or 'it/s'}"
        old = previous.step.rate if previous and previous.step and previous.step.rate else None
        if old and step.rate_unit == previous.step.rate_unit and (change := hz.percent_change(step.rate, old)):  # type: ignore[union-attr]
            rate += f" ({change} since last check)"
        parts.append(rate)
    if step.loss is not None:
        parts.append(f"loss {hz.number(step.loss)}")
    if step.epoch is not None and step.step is None:
        parts.append(f"epoch {hz.number(step.epoch)}")
    return " · ".join(parts) or hz.trim(step.line, 60)


def _crash_words(crash: Crash, limit: int = 90) -> str:
    if crash.kind == "child_failed":
        what = f"rank {crash.rank} exited with {crash.exit_code}" if crash.rank is not None else "a worker failed"
        return what + (f" ({crash.signal_hint})" if crash.signal_hint else "")
    if crash.kind in ("killed", "segfault") and not crash.exc_type:
        return {"killed": "killed", "segfault": "segmentation fault"}[crash.kind] + (
            f" ({crash.signal_hint})" if crash.signal_hint else ""
        )
    head = crash.exc_type or crash.kind
    text = f"{head}: {_first_sentences(crash.message, limit - len(head))}" if crash.message else head
    if crash.rank is not None and crash.kind != "child_failed":
        text = f"[rank {crash.rank}] {text}"
    return hz.trim(text, limit)


def _first_sentences(message: str, limit: int) -> str:
    """As many whole sentences as fit: "CUDA out of memory. Tried to allocate 372.53 GiB." beats a cut mid-word."""
    sentences = re.split(r"(?<=[.!?])\s+", message.strip())
    text = sentences[0]
    for more in sentences[1:]:
        if len(text) + 1 + len(more) > limit:
            return text + " …"
        text += " " + more
    return hz.trim(text, limit)


def _at_step(step: Step | None) -> str:
    if step is None:
        return "before the first step"
    return f"at step {step.step}" if step.step is not None else "after training began"


def _bar_words(bar: Bar) -> str:
    desc = (bar.desc or "progress").strip()
    desc = desc[0].lower() + desc[1:] if desc[:1].isupper() and not desc[1:2].isupper() else desc
    pct = f" {bar.pct}%" if bar.pct is not None else ""
    counts = f" ({bar.n}/{bar.total})" if bar.n is not None and bar.total is not None else (f" ({bar.n})" if bar.n is not None else "")
    return f"{desc}{pct}{counts}"


def _bar_phase(bar: Bar, has_steps: bool) -> Phase:
    if _EVAL.search(bar.desc or ""):
        return Phase.EVALUATING
    if _SAVE.search(bar.desc or ""):
        return Phase.SAVING
    if not has_steps or _LOAD.search(bar.desc or ""):
        return Phase.LOADING
    return Phase.BUSY


def _ended_cleanly(ev: Evidence) -> bool:
    last = [line.strip() for line in ev.lines if line.strip()][-5:]
    if any(_END.search(line) for line in last):
        return True
    step = ev.steps[-1] if ev.steps else None
    return bool(step and step.total and step.step is not None and step.step >= step.total)


def _gpu_fact(gpu: GpuReport, phase: Phase) -> str | None:
    if gpu.error:
        return gpu.error
    if not gpu.gpus:
        return None
    summary = gpu.summary()
    if phase in (Phase.STARTING, Phase.LOADING) and gpu.idle():
        summary += " — idle is expected while loading"
    return summary


def _stuck_collective(gpu: GpuReport) -> str | None:
    """Busy in every sample while the log is silent: a rank spinning in a collective, waiting for a
    peer whose GPU sits idle (or whose process is gone). Names both sides."""
    spinning = [g for g in gpu.gpus if g.cls == "busy" and g.utils and all((u or 0) >= 90 for u in g.utils)]
    if not spinning:
        return None
    idle = [g for g in gpu.gpus if g.cls == "idle"]
    text = f"{_gpu_names(spinning)} at 100 % with no new steps (stuck in a collective?)"
    return text + (f", waiting on idle {_gpu_names(idle)}" if idle else "")


def _gpu_names(states) -> str:
    """"target GPU 0", "drafter GPUs 5–7", or "GPU 0" when no role is configured."""
    roles = {g.role for g in states}
    role = f"{roles.pop()} " if len(roles) == 1 and None not in roles else ""
    return f"{role}GPU{'s' if len(states) > 1 else ''} {format_indices(g.index for g in states)}"


def diagnose(
    ev: Evidence,
    run: RunPolicy,
    *,
    previous: Verdict | None = None,
) -> Verdict:
    """Decide the phase and write the one-line verdict with its evidence."""
    gpu = classify(ev.gpus, run.roles)
    writer = _main_writer(ev.writers)
    silent = ev.silent_for
    step = ev.steps[-1] if ev.steps else None
    tail = ev.lines[-TAIL_MAX:]
    facts: list[tuple[str, str]] = []
    concerns: list[str] = []

    def verdict(phase: Phase, level: Level, headline: str, **extra) -> Verdict:
        return Verdict(
            run=run.name, phase=phase, level=level, headline=headline, facts=tuple(facts), step=step,
            silent_for=silent, writer=writer, gpu=gpu, tail=tail, concerns=tuple(concerns),
            problems=ev.problems, observed_at=ev.now, **extra,
        )

    if writer:
        facts.append(("writer", f"pid {writer.pid} · up {hz.duration(writer.elapsed_s)} · {hz.trim(writer.command, 60)}"))

    if not ev.log.exists:
        where = "" if ev.log.dir_exists else " (its folder does not exist either)"
        if ev.processes:
            # The likeliest "run" is one that names the log's folder, else the newest (a restart
            # under way), never a week-old system daemon that happens to be Python.
            folder = ev.log.path.rsplit("/", 1)[0]
            p = min(ev.processes, key=lambda p: (folder not in p.command, p.elapsed_s or 0))
            tail_words = f"{hz.trim(p.command, 50)} running for {hz.duration(p.elapsed_s)}"
            facts.append(("process", f"pid {p.pid} · {hz.trim(p.command, 60)}"))
        else:
            tail_words = "no training process seen"
        concerns.append("no_log")
        return verdict(Phase.NO_LOG, Level.CRIT, f"log not found: {ev.log.path}{where} — {tail_words}")
    if not ev.log.readable or (ev.problems and not ev.lines and ev.log.size):
        concerns.append("unreadable")
        return verdict(Phase.NO_LOG, Level.CRIT, f"cannot read the log: {ev.problems[0] if ev.problems else ev.log.path}")

    last_step = ev.last_step_index
    fatal = [c for c in ev.crashes if not c.in_thread and _after(c.line_index, last_step)]
    thread_deaths = [c for c in ev.crashes if c.in_thread]
    crash = fatal[-1] if fatal else None
    thread_crash = thread_deaths[-1] if thread_deaths else None
    ended = _ended_cleanly(ev)
    # No writer seen means "gone" only when the probe could see every process's open files.
    writer_visible = ev.hidden_processes == 0
    alive = bool(writer) or (crash is None and not ended and (
        not writer_visible or (silent is not None and silent < RECENT_WRITE_S)))
    if not writer and not writer_visible:
        facts.append(("writer", f"not visible: {ev.hidden_processes} processes hidden from the probe's user "
                                "(probe as root to see them)"))
    training_threshold = run.silence_after if run.silence_after is not None else (
        learned_threshold(ev.steps) or AUTO_DEFAULT_S)
    if step:
        facts.insert(0, ("progress", _step_words(step, previous)))
    if silent is not None:
        facts.append(("log", f"last write {hz.duration(silent)} ago · {hz.size(ev.log.size)}"))
    if thread_crash:
        facts.append(("thread", f"{thread_crash.thread} died: {_crash_words(thread_crash, 70)}"))

    # A traceback after the last step: the run is over, or hung in its error path.
    if crash:
        concerns.append("crashed")
        facts.insert(0, ("error", _crash_words(crash, 200)))
        ending = "process gone" if not writer else f"process {writer.pid} still alive (hung after the error?)"
        if gpu_line := _gpu_fact(gpu, Phase.CRASHED):
            facts.append(("GPUs", gpu_line))
        return verdict(Phase.CRASHED, Level.CRIT, f"crashed — {_crash_words(crash)} {_at_step(step)}; {ending}",
                       crash=crash, thread_crash=thread_crash)

    # Which phase the log's last lines announce.
    bar_open = ev.bar is not None and _after(ev.bar_index, last_step) and not ev.bar.finished
    activity = ev.activity if ev.activity and _after(ev.activity.line_index, last_step) else None
    if bar_open:
        phase = _bar_phase(ev.bar, step is not None)  # type: ignore[arg-type]
    elif activity:
        phase = {"saving": Phase.SAVING, "evaluating": Phase.EVALUATING, "compiling": Phase.COMPILING}.get(activity.kind, Phase.BUSY)
    elif step:
        phase = Phase.TRAINING
    elif ev.bar is not None and ev.bar.finished:
        phase = Phase.LOADING  # the bar closed, the first step has not come yet
    else:
        phase = Phase.STARTING

    if gpu_line := _gpu_fact(gpu, phase):
        facts.append(("GPUs", gpu_line))
    # The summary already says "(memory held)" for idle GPUs; keep the findings that add to it.
    facts.extend(("GPUs", f) for f in gpu.findings if not ("idle with" in f and "memory held" in (gpu_line or "")))

    if not alive:
        if ended:
            head = f"finished — last step {step.step}" if step and step.step is not None else "finished"
            if thread_crash:  # a clean exit hides that part of the work stopped on the way
                concerns.append(f"thread_died:{thread_crash.thread}")
                return verdict(Phase.FINISHED, Level.WARN,
                               f"{head}, but thread {thread_crash.thread} died on the way: {_crash_words(thread_crash, 60)}",
                               thread_crash=thread_crash)
            return verdict(Phase.FINISHED, Level.OK, head)
        concerns.append("stopped")
        if not ev.lines:
            return verdict(Phase.STOPPED, Level.CRIT, "not running — the log is empty and no process writes it")
        last_line = _last_line(ev)
        if step:
            head = f"stopped — process gone after step {step.step}, no traceback (killed?)"
        else:
            head = f"stopped before the first step — process gone, last line: {hz.trim(last_line, 60)}"
        return verdict(Phase.STOPPED, Level.CRIT, head, thread_crash=thread_crash)

    if ended and phase is Phase.TRAINING:
        # The loop said it is done but the process has not exited yet: normal for a few
        # seconds (saving, tearing down NCCL), a hang on exit if it lasts.
        last = f"last step {step.step}" if step and step.step is not None else "training done"
        if silent is not None and silent > training_threshold:
            concerns.append("hung_on_exit")
            return verdict(Phase.FINISHED, Level.WARN,
                           f"finished — {last}, but process {writer.pid if writer else '?'} still alive "
                           f"{hz.duration(silent)} later (hung on exit?)")
        return verdict(Phase.FINISHED, Level.OK, f"finished — {last}; process exiting")

    threshold = run.loading_grace if phase in GRACE_PHASES else training_threshold
    describe = _describe(phase, ev, step, writer, silent, activity, previous)

    if silent is not None and silent > threshold:
        concerns.append("silent")
        if phase is Phase.TRAINING and step:
            what = f"last step {step.step}" if step.step is not None else f"last: {hz.trim(step.line, 50)}"
        else:
            what = f"while {describe}"
        gpu_bits = []
        if stuck := _stuck_collective(gpu):
            gpu_bits.append(stuck)
        elif gpu.gpus and not gpu.error:
            gpu_bits.append(gpu.summary())
        who = "process alive" if writer else "writer not visible to the probe"
        head = f"silent {hz.duration(silent)} — {what}; {who}" + "".join(f"; {b}" for b in gpu_bits)
        return verdict(Phase.SILENT, Level.CRIT, head, threshold=threshold, thread_crash=thread_crash)

    level = Level.OK if phase is Phase.TRAINING else Level.NOTE
    headline = describe
    if thread_crash and phase is Phase.TRAINING:
        concerns.append(f"thread_died:{thread_crash.thread}")
        return verdict(Phase.THREAD_DIED, Level.WARN,
                       f"training, but thread {thread_crash.thread} died: {_crash_words(thread_crash, 70)} — {describe}",
                       threshold=threshold, thread_crash=thread_crash)
    if phase is Phase.TRAINING:
        # An idle role is a finding only beside a role that works ("idle drafters while the target
        # steps"); every GPU idle with a fresh log is a pause between steps, or silence on its way.
        idle_roles = [role for role, idx in gpu.roles if idx and gpu.in_role(role)
                      and all(g.cls == "idle" for g in gpu.in_role(role))]
        if len(idle_roles) == len([r for r, idx in gpu.roles if idx and gpu.in_role(r)]):
            idle_roles = []
        for role in idle_roles:
            concerns.append(f"gpu_idle:{role}")
        if idle_roles:
            level = Level.WARN
            headline += "; " + ", ".join(f"{r} GPUs idle" for r in idle_roles)
    return verdict(phase, level, headline, threshold=threshold, thread_crash=thread_crash)


def _describe(phase: Phase, ev: Evidence, step: Step | None, writer: Process | None, silent: float | None,
              activity, previous: Verdict | None) -> str:
    """The healthy-case headline of a phase."""
    if phase is Phase.TRAINING and step:
        age = f" · {hz.duration(silent)} ago" if silent is not None else ""
        return _step_words(step, previous) + age
    if phase in (Phase.LOADING, Phase.EVALUATING, Phase.SAVING, Phase.BUSY) and ev.bar is not None and _after(ev.bar_index, ev.last_step_index):
        if ev.bar.finished:
            return f"no steps yet — {_bar_words(ev.bar)} done, waiting for the first step"
        where = f" — {ev.device_line}" if ev.device_line else ""
        lead = "no steps yet — " if step is None else ""
        return f"{lead}{_bar_words(ev.bar)}{where}"
    if activity is not None:
        since = f" — {hz.duration(silent)} so far" if silent is not None else ""
        what = {"saving": "saving checkpoint", "evaluating": "evaluating", "compiling": "compiling"}.get(activity.kind, activity.kind)
        at = f" at step {activity.step}" if activity.step is not None else (f" after step {step.step}" if step and step.step is not None else "")
        return f"{what}{at}{since}"
    started = f"started {hz.duration(writer.elapsed_s)} ago" if writer and writer.elapsed_s is not None else "starting"
    if not ev.lines:
        return f"{started}, no output yet (importing?)"
    return f"{started}, no steps yet — last line: {hz.trim(_last_line(ev), 60)}"


def _last_line(ev: Evidence) -> str:
    """The last non-blank line, for a headline to quote: redacted together with the lines above
    it, so that a log ending inside a private key quotes "-----BEGIN …-----[redacted]", not base64."""
    return next((line.strip() for line in reversed(redact_lines(ev.lines[-TAIL_MAX:])) if line.strip()), "")
