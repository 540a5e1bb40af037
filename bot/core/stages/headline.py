"""Pure: the last stage — the log's phase, the writer's life and the progress's age become the Verdict:
its phase and level (the worst of its findings), its concerns, and the one line a phone shows."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from bot.core import humanize as hz
from bot.core.evidence import Evidence
from bot.core.facts import Kind, Process, Step
from bot.core.gpus import GpuReport
from bot.core.grammar import strip_stamp
from bot.core.progress import announced_at, final_count
from bot.core.stages import findings as fd
from bot.core.stages import words
from bot.core.markers import Mark, end_reason
from bot.core.markers import words as announced
from bot.core.stages.activity import Doing, errors_before_end, last_result, logged_error, results_after, shard_of, summary_result
from bot.core.stages.freshness import Freshness, allowed_before_first_step, standing
from bot.core.stages.pace import phase_threshold
from bot.core.stages.schedule import at_schedule_end
from bot.core.stages.liveness import Life, Liveness, main_writer
from bot.core.verdict import (
    GRACE_PHASES,
    TAIL_MAX,
    Concern,
    Finding,
    Found,
    Level,
    Phase,
    Said,
    Trend,
    Verdict,
    Worry,
    worst,
)


# An end that says only that it ended adds nothing to "finished".
_GENERIC_END = re.compile(r"(?i)^(?:training )?(?:is )?(?:done|complete|completed|finished|all done)\.?!?$")


# What makes an end's words a reason worth showing: a figure, a setting reached, a stop, a count of processes.
_END_CAUSE = re.compile(r"(?i)[\d=]|\bstop|\breach|\blimit|\bbudget|\btime\b|\bpatience|\bconverge")


def _bare_end(reason: str) -> bool:
    """An end that says only that it ended, in however many words."""
    return not _END_CAUSE.search(reason)


def _base(ev: Evidence, run, gpu: GpuReport, **kw) -> dict:
    return {"run": run.name, "gpu": gpu, "tail": ev.lines[-TAIL_MAX:], "problems": ev.problems, "observed_at": ev.now,
            "silent_for": ev.silent_for, "log_size": ev.log.size, "hidden_processes": ev.hidden_processes, **kw}


def no_log(ev: Evidence, run, gpu: GpuReport) -> Verdict:
    where = "" if ev.log.dir_exists else " (its folder does not exist either)"
    process = None
    if ev.processes:
        # The likeliest "run" is one that names the log's folder, else the newest (a restart under way),
        # never a week-old system daemon that happens to be Python, nor a wrapper (timeout, bash) around it.
        folder = ev.log.path.rsplit("/", 1)[0]
        wrappers = ("timeout ", "bash ", "sh -c", "/bin/sh ", "nohup ", "env ")
        candidates = [p for p in ev.processes if not p.command.lstrip().startswith(wrappers)] or list(ev.processes)
        process = min(candidates, key=lambda p: (folder not in p.command, p.elapsed_s or 0))
        tail = f"{hz.trim(process.command, 50)} running for {hz.duration(process.elapsed_s)}"
    else:
        tail = "no training process seen"
    return Verdict(phase=Phase.NO_LOG, level=Level.CRIT, headline=f"log not found: {ev.log.path}{where} — {tail}",
                   process=process, concerns=(Concern(Worry.NO_LOG),), **_base(ev, run, gpu))


def unreadable(ev: Evidence, run, gpu: GpuReport) -> Verdict:
    why = ev.problems[0] if ev.problems else ev.log.path
    return Verdict(phase=Phase.NO_LOG, level=Level.CRIT, headline=f"cannot read the log: {why}",
                   concerns=(Concern(Worry.UNREADABLE),), **_base(ev, run, gpu))


def _at(step: Step | None) -> str:
    if step is None:
        return "before the first step"
    return f"at {c}" if (c := words.counter(step)) else "after training began"


def _last_line(ev: Evidence) -> str:
    from bot.core.redact import redact_lines

    last = next((x for x in reversed(redact_lines(ev.lines[-40:])) if x.strip()), "")
    return hz.trim(strip_stamp(last.strip()) or last, 60)  # a phone's 60 characters are for the words, not the clock


class Described(NamedTuple):
    """A phase's healthy-case line, and whether it names where the loop got to ("at epoch 24 · batch 250/371"):
    the rows under the headline then leave that out."""

    text: str
    counter: bool = False
    so_far: str = ""  # " — 12 s so far": how long the phase has run, said apart (a silent line says it its own way)

    @property
    def line(self) -> str:
        return self.text + self.so_far


def _phase_words(ev: Evidence, doing: Doing, step: Step | None, age: float | None, previous: Verdict | None,
                 writer: Process | None, trends: Trend = Trend()) -> Described:
    """The healthy-case line of a phase."""
    before = previous.step if previous is not None else None
    if doing.phase is Phase.TRAINING and doing.no_file_progress:
        return Described("no progress lines in the log — Lightning's rich progress bar writes nothing to files")
    if _says_progress(doing, step):
        eta = f" · ETA {hz.duration(trends.eta)}" if trends.eta is not None else ""
        return Described(words.progress(step, before) + eta + (f" · {hz.duration(age)} ago" if age is not None else ""))
    at = f" at {words.counter(step)}" if step is not None and words.counter(step) else ""
    lead = "no steps yet — " if step is None else ""
    if doing.bar is not None:
        bar = doing.bar.bar
        where = f" — {device}" if (device := ev.device_line(doing.bar.index)) else ""
        if doing.phase is Phase.SAVING:  # HF's `Writing model shards` bar, with or without its announcement
            so_far = _so_far(ev, doing.marker.index) if doing.marker is not None else ""
            return Described(f"saving checkpoint{at} — {words.bar(bar)}", bool(at), so_far)
        if bar.finished and doing.phase is Phase.LOADING:
            return Described(f"{lead}{words.bar(bar)} done, waiting for the first step")
        if doing.phase is Phase.EVALUATING:
            return Described(f"evaluating{at} — {words.bar(bar)}", bool(at))
        return Described(f"{lead}{words.bar(bar)}{where}")
    if doing.marker is not None:
        what = {Phase.SAVING: "saving checkpoint", Phase.EVALUATING: "evaluating", Phase.COMPILING: "compiling",
                Phase.LOADING: "loading", Phase.PREPARING: "preparing data", Phase.STARTING: "starting training"}[doing.phase]
        if doing.final_save:
            last = next(m.step for m in reversed(ev.markers) if m.index < doing.marker.index)
            return Described(f"saving the final model after the checkpoint at step {last}", so_far=_so_far(ev, doing.marker.index))
        if doing.phase is Phase.SAVING and (shard := shard_of(doing.marker)):
            return Described(f"saving checkpoint — shard {shard[0]}/{shard[1]} written", so_far=_so_far(ev, doing.marker.index))
        if doing.marker.kind is Mark.RESTARTING:
            after = f" after {words.crash(doing.restarted_after, 60)}" if doing.restarted_after is not None else ""
            return Described(f"restarting{after} — {announced(doing.marker, 80)}", so_far=_so_far(ev, doing.marker.index))
        if doing.phase is Phase.LOADING:
            what = f"{lead}{announced(doing.marker)}"
        elif doing.phase is Phase.PREPARING:
            what = f"{lead}preparing the dataset: {announced(doing.marker, 60)}"
        elif doing.phase is Phase.EVALUATING and re.search(r"\d|:", said := announced(doing.marker, 60)):
            what = f"evaluating: {said}"  # "Start inference on 5000 batches", ParlAI's "running eval: valid" (which split)
        # "checkpoint-1000" says more than an HF dict's "epoch 0.12"; `saving checkpoint at iteration 1000` more
        # than the last step line's 990.
        by_marker = doing.marker.step is not None and (step is None or step.step is None)
        marker_at = f" at step {doing.marker.step}" if by_marker else (
            f" at {words.counter(announced_at(step, doing.marker.text, doing.marker.step))}" if at else at)
        return Described(f"{what}{marker_at}", bool(at) and not by_marker, _so_far(ev, doing.marker.index))
    if not ev.lines:
        started = f"started {hz.duration(writer.elapsed_s)} ago, " if writer is not None and writer.elapsed_s is not None else ""
        return Described(f"{started}no output yet (importing?)")
    return Described(f"no steps yet — last line: {_last_line(ev)}")


def _says_progress(doing: Doing, step: Step | None) -> bool:
    """Whether a phase's healthy line is the loop's progress (and its ETA): then the rows need not repeat it."""
    return doing.phase is Phase.TRAINING and not doing.no_file_progress and step is not None


def _so_far(ev: Evidence, index: int) -> str:
    """" — 12 s so far", counted from the announcement's own stamp where it has one, else from the last write."""
    stamp = ev.stamps[index] if 0 <= index < len(ev.stamps) else None
    newest = max((s for s in ev.stamps[index:] if s is not None), default=None)
    if ev.silent_for is None:
        return ""
    took = ev.silent_for + (newest - stamp if stamp is not None and newest is not None else 0.0)
    return f" — {hz.duration(took)} so far"


def _passes_to_go(step: Step) -> bool:
    """The line says more epochs were planned (`72/1000`), or more of the loop's own passes (`iteration 71/75`; a
    count within an epoch restarts each epoch and says nothing of the run): its results are then no end of the run."""
    if step.epoch_total is not None and step.epoch is not None and step.epoch < step.epoch_total - 1:
        return True
    return (step.counter != "batch" and step.epoch is None and step.total is not None and step.step is not None
            and step.step < step.total - 1)


# Findings that make a verdict a warning and are said in its line.
_WARNS = frozenset({Finding.NAN_LOSS, Finding.THREAD_DIED, Finding.SLOW, Finding.LOSS_SPIKE, Finding.LOSS_SCALE})
# Before the first step, these may be silent only while their work moves (freshness.allowed_before_first_step);
# a compiler prints nothing until it is done, so compiling keeps the loading grace.
_BEFORE_FIRST_STEP = frozenset({Phase.STARTING, Phase.LOADING, Phase.PREPARING, Phase.BUSY})


def _concern(found: Found) -> Concern | None:
    return {Finding.NAN_LOSS: Concern(Worry.NAN_LOSS), Finding.THREAD_DIED: Concern(Worry.THREAD_DIED, found.detail),
            Finding.LOSS_SCALE: Concern(Worry.LOSS_SCALE),
            Finding.SLOW: Concern(Worry.SLOW), Finding.LOSS_SPIKE: Concern(Worry.LOSS_SPIKE),
            Finding.IDLE_ROLE: Concern(Worry.GPU_IDLE, found.detail),
            Finding.LOG_REPLACED: Concern(Worry.LOG_REPLACED, found.detail)}.get(found.what)


def judge(ev: Evidence, run, gpu: GpuReport, doing: Doing, life: Liveness, fresh: Freshness, steps: Sequence[Step],
          training_threshold: float, previous: Verdict | None, trends: Trend = Trend(),
          told: Sequence[Found] = ()) -> Verdict:
    """`trends` and `told`: what the run's memory says (its ETA, a throughput drop, a loss spike)."""
    step = steps[-1] if steps else None
    writer = life.writer or main_writer(ev.writers)
    found: list[Found] = [f for f in (fd.nan_loss(steps), fd.loss_scale(ev.lines, steps), fd.thread_died(doing.thread_crash),
                                      fd.replaced(ev)) if f]
    found += list(told)
    base = _base(ev, run, gpu, step=step, recent=tuple(steps), trend=trends, writer=writer, progress_age=fresh.age, progress_since=fresh.since,
                 crash=doing.crash, thread_crash=doing.thread_crash)

    def verdict(phase: Phase, level: Level, headline: str, concerns: Sequence[Concern] = (), *, alert: bool = True,
                said: Iterable[Said | Finding] = (), **extra) -> Verdict:
        """`alert`: the findings' own concerns go with it (a log rotated a second ago is no incident yet).
        `said`: the facts `headline` states, which the rows under it then leave out."""
        levels = [level] + [Level.WARN for f in found if f.what in _WARNS]
        own = list(concerns) + [c for f in found if alert and (c := _concern(f)) is not None and c not in concerns]
        return Verdict(phase=phase, level=worst(levels), headline=headline, findings=tuple(found),
                       concerns=tuple(own), said=frozenset(said), **{**base, **extra})

    def with_findings(text: str) -> str:
        """A slowdown is the news, so it leads (the rate it names is in the text after it); the rest follow."""
        lead = [words.finding(f) for f in found if f.what is Finding.SLOW]
        said = [words.finding(f) for f in found if f.what in _WARNS and f.what is not Finding.SLOW]
        # The progress may say it already (`epoch 1 · loss NaN`, with no onset to add): once is enough.
        return " · ".join([*lead, text]) + "".join(f" · {s}" for s in said if f" {s} " not in f" {text} ")

    def with_findings_said() -> set[Said | Finding]:
        """What with_findings() adds to a headline."""
        return {f.what for f in found if f.what in _WARNS}

    # "at step 1200", "last epoch 3": where a headline names the loop's place, the rows need not.
    at_said: set[Said | Finding] = {Said.COUNTER} if step is not None and words.counter(step) else set()

    def progress_said() -> set[Said | Finding]:
        """What _phase_words() states when its line is the progress."""
        return {Said.PROGRESS} | ({Said.ETA} if trends.eta is not None else set()) if _says_progress(doing, step) else set()

    if doing.phase is Phase.CRASHED and doing.crash.kind is Kind.HANG and life.alive:
        # The run says it is stuck; NCCL's monitor may abort it later. Until then it hangs.
        who = "process alive" if life.life in (Life.ALIVE, Life.NEAR) else "writer not visible to the probe"
        return verdict(Phase.SILENT, Level.CRIT, f"hung — {words.crash(doing.crash)} {_at(step)}; {who}",
                       [Concern(Worry.SILENT)], threshold=training_threshold, said={Said.CRASH} | at_said)
    if doing.phase is Phase.CRASHED:
        ending = "process gone" if not life.alive else (
            f"process {writer.pid} still alive (hung after the error?)" if writer else "process still alive?")
        return verdict(Phase.CRASHED, Level.CRIT, f"{words.ended_by(doing.crash)} — {words.crash(doing.crash)} {_at(step)}; {ending}",
                       [Concern(Worry.CRASHED)], said={Said.CRASH} | at_said)

    # A script that reloads its best checkpoint after the loop and tests it (`load model from …`, then `test acc ::
    # 0.390`): the results after that loading are the end's.
    tested = doing.phase is Phase.LOADING and doing.marker is not None and results_after(ev, step, doing.marker.index)
    finished = doing.phase is Phase.FINISHED or (not life.alive and (doing.reached_total or at_schedule_end(steps) or doing.final_save or (
        step is not None and (doing.phase in (Phase.TRAINING, Phase.EVALUATING, Phase.SAVING) or tested)
        and not _passes_to_go(step) and results_after(ev, step))))
    if finished:
        if step is not None:
            step = final_count(ev.lines, step)
        last = f"last {words.counter(step)}" if step is not None and words.counter(step) else ""
        told: set[Said | Finding] = {Said.COUNTER} if last else set()
        if not last and (saved := [m for m in ev.markers if m.step is not None and m.kind in (Mark.SAVING, Mark.SAVED)]):
            last = f"last checkpoint at step {saved[-1].step}"
        head = "finished" + (f" — {last}" if last else "")
        if step is not None and step.loss is not None and not any(f.what is Finding.NAN_LOSS for f in found):
            head += f" · loss {words._value(step.loss)}"
            told.add(Said.LOSS)
        reason = end_reason(doing.ended, ev.lines) if doing.ended is not None else ""
        # After an end that names no figure and no cause ("Training complete.", "🎉 pipeline completed
        # successfully"), the result the run printed says more: `Best validation Dice: 0.4603`.
        result = summary_result(ev, step, doing.ended) if _bare_end(reason) else None
        if reason and not result and not _GENERIC_END.match(reason):
            head += f" ({reason})"
        elif result or (result := last_result(ev, step, doing.ended.index if doing.ended is not None else -1)):
            head += f", then: {result}"
        if doing.crash is not None:  # done, then ended by the scheduler: it hung on its way out
            return verdict(Phase.FINISHED, Level.WARN, f"{head}, then {words.crash(doing.crash, 70)}",
                           [Concern(Worry.HUNG_ON_EXIT)], said={Said.CRASH} | told)
        if life.life in (Life.ALIVE, Life.NEAR) and doing.marker is not None and doing.marker.kind is Mark.SAVING and (
                ev.silent_for is None or ev.silent_for <= run.loading_grace):
            # The loop is over and its last save is under way: saving, with the grace every save has.
            ended = "training ended" + head[len("finished"):]
            return verdict(Phase.SAVING, Level.NOTE, f"saving the last checkpoint{_so_far(ev, doing.marker.index)} — {ended}",
                           threshold=run.loading_grace, said=told)
        if life.life in (Life.ALIVE, Life.NEAR):
            silent = ev.silent_for
            if silent is not None and silent > training_threshold:
                return verdict(Phase.FINISHED, Level.WARN, f"{head}, but process {writer.pid if writer else '?'} still "
                               f"alive {hz.duration(silent)} later (hung on exit?)", [Concern(Worry.HUNG_ON_EXIT)], said=told)
            return verdict(Phase.FINISHED, Level.OK, f"{head}; process exiting", said=told)
        errors, error = errors_before_end(ev, step, doing.ended.index) if doing.ended is not None else (0, None)
        if error is not None:  # it says it ended well, after saying that its work failed
            said = f"{errors} errors logged, the last" if errors > 1 else "an error logged"
            return verdict(Phase.FINISHED, Level.WARN, f"{head}, but {said}: {words.crash(error, 70)}", said={Said.CRASH} | told)
        if doing.thread_crash is not None:  # a clean exit hides that part of the work stopped on the way
            return verdict(Phase.FINISHED, Level.WARN, f"{head}, but thread {doing.thread_crash.thread} died on the way: "
                           f"{words.crash(doing.thread_crash, 60)}", said={Said.THREAD_CRASH} | told)
        return verdict(Phase.FINISHED, Level.OK, with_findings(head), said=with_findings_said() | told)

    if not life.alive and (error := logged_error(ev, step)) is not None:
        return verdict(Phase.CRASHED, Level.CRIT, f"crashed — {words.crash(error)} {_at(step)}; process gone",
                       [Concern(Worry.CRASHED)], crash=error, said={Said.CRASH} | at_said)
    if not life.alive:
        if not ev.lines:
            return verdict(Phase.STOPPED, Level.CRIT, "not running — the log is empty and no process writes it",
                           [Concern(Worry.STOPPED)])
        if step is not None:
            head = f"stopped — process gone {_at(step).replace('at ', 'after ', 1)}, no error and no normal end (killed?)"
        else:
            head = f"stopped before the first step — process gone, last line: {_last_line(ev)}"
        return verdict(Phase.STOPPED, Level.CRIT, head, [Concern(Worry.STOPPED)], said=at_said)

    if life.life is Life.PAUSED:
        return _paused(ev, doing, step, life, fresh.age, training_threshold, at_said, verdict)

    phase = doing.phase
    if life.life is Life.MOVED:
        moved = ev.moved
        since = hz.duration(ev.silent_for) if ev.silent_for is not None else "?"
        there = f" — {words.progress(step)} there" if step is not None else ""
        what = f"deleted {since} ago; pid {moved.process.pid} still writes its deleted" if moved.deleted else (
            f"replaced {since} ago; pid {moved.process.pid} still writes")
        head = f"log {what} {moved.name}{there}"
        phase = Phase.TRAINING if step is not None else Phase.STARTING
        age = fresh.age if step is not None and moved.mtime is None else (
            max(0.0, ev.now - moved.mtime) if ev.now is not None and moved.mtime is not None else fresh.age)
        told = {Said.PROGRESS} if step is not None else set()  # "— step 133 · … there"
        if age is not None and age > training_threshold and step is not None:
            return verdict(Phase.SILENT, Level.CRIT, f"silent {hz.duration(age)} — {head}", [Concern(Worry.SILENT)],
                           threshold=training_threshold, said=told)
        # Just rotated, it may be reopened; still empty after the silence allowed, runbot reads the wrong file.
        level = Level.NOTE if ev.silent_for is not None and ev.silent_for <= training_threshold else Level.WARN
        return verdict(phase, level, head, threshold=training_threshold, alert=level is Level.WARN, said=told)

    if phase is Phase.TRAINING and doing.no_file_progress and (told_by_gpu := _bar_off_file(
            ev, gpu, training_threshold, verdict)) is not None:
        return told_by_gpu
    grace = phase in GRACE_PHASES or (phase is Phase.TRAINING and doing.no_file_progress)
    threshold = phase_threshold(ev, doing, run.loading_grace, training_threshold) if grace else training_threshold
    age = fresh.age if phase is Phase.TRAINING and not doing.no_file_progress else ev.silent_for
    if step is None and phase in _BEFORE_FIRST_STEP:
        # The grace is for loading that moves: a frozen log before the first step is a hang within silence_after.
        bar = doing.bar.bar if doing.bar is not None else None
        threshold = allowed_before_first_step(bar, training_threshold, run.loading_grace)
        age = standing(ev, bar)
    described = _phase_words(ev, doing, step, fresh.age, previous, writer, trends)
    describe, counter_said = described.line, (at_said if described.counter else set())

    if age is not None and age > threshold:
        if phase is Phase.TRAINING and step is not None:
            # Where it stopped is the news; a rate from 12 minutes ago is not.
            what = f"last {words.counter(step) or words.progress(step)}"
            where_said = set(at_said or {Said.PROGRESS})
        else:
            # "silent 40 min — while evaluating: …" says how long already: not "— 40 min so far" again
            what, where_said = f"while {described.text}", set(counter_said)
        bits = []
        if stuck := fd.stuck_collective(gpu):
            bits.append(stuck.detail)
        elif gpu.gpus and not gpu.error:
            bits.append(gpu.summary())
            where_said.add(Said.GPUS)
        who = "process alive" if life.life in (Life.ALIVE, Life.NEAR) else "writer not visible to the probe"
        head = with_findings(f"silent {hz.duration(age)} — {what}") + f"; {who}" + "".join(f"; {b}" for b in bits)
        return verdict(Phase.SILENT, Level.CRIT, head, [Concern(Worry.SILENT)], threshold=threshold,
                       said=with_findings_said() | where_said)

    if doing.thread_crash is not None and phase is Phase.TRAINING:
        return verdict(Phase.THREAD_DIED, Level.WARN,
                       f"training, but thread {doing.thread_crash.thread} died: {words.crash(doing.thread_crash, 70)} — {describe}",
                       threshold=threshold, said={Said.THREAD_CRASH} | progress_said() | counter_said)
    level = Level.OK if phase is Phase.TRAINING and not doing.no_file_progress else Level.NOTE
    if doing.marker is not None and doing.marker.kind is Mark.RESTARTING:
        # A relaunch after a failure: the failure will likely come back; someone should know.
        return verdict(phase, Level.WARN, with_findings(describe), [Concern(Worry.RESTARTING)], threshold=threshold,
                       said=with_findings_said() | ({Said.CRASH} if doing.restarted_after else set()))
    if phase is Phase.TRAINING:
        idle = fd.idle_roles(gpu)
        found.extend(idle)
        if idle:
            level = Level.WARN
            describe += "; " + ", ".join(words.finding(f) for f in idle)
    return verdict(phase, level, with_findings(describe), threshold=threshold,
                   said=with_findings_said() | progress_said() | counter_said)


def _bar_off_file(ev: Evidence, gpu: GpuReport, silence_after: float, verdict: Callable[..., Verdict]) -> Verdict | None:
    """Lightning's rich bar draws on the terminal only: with its writer alive, the run's GPUs say what the log
    cannot. Busy in every sample: it trains. Idle in every sample past `silence_after`: it has stopped working.
    Anything else (no GPU seen, low, oscillating): None, the loading grace decides."""
    mine = [g for g in gpu.gpus if g.role is not None] if gpu.roles else list(gpu.gpus)
    if not mine or gpu.error:
        return None
    untouched = f" (untouched {hz.duration(ev.silent_for)})" if ev.silent_for is not None else ""
    if all(g.cls == "busy" for g in mine):
        return verdict(Phase.TRAINING, Level.NOTE, f"training — {fd.gpu_names(mine)} busy, Lightning's rich progress "
                       f"bar does not reach the log{untouched}", said={Said.GPUS})
    if all(g.cls == "idle" for g in mine) and ev.silent_for is not None and ev.silent_for > silence_after:
        held = " (memory held)" if all(g.holds_memory for g in mine) else ""
        return verdict(Phase.SILENT, Level.CRIT, f"silent {hz.duration(ev.silent_for)} — Lightning's rich progress bar "
                       f"writes nothing to the log and {fd.gpu_names(mine)} idle{held}; process alive",
                       [Concern(Worry.SILENT)], threshold=silence_after, said={Said.GPUS})
    return None


def _paused(ev: Evidence, doing: Doing, step: Step | None, life: Liveness, age: float | None, threshold: float,
            at_said: set[Said | Finding], verdict: Callable[..., Verdict]) -> Verdict:
    """The writer is stopped (state T: SIGSTOP, Ctrl-Z, a debugger): nothing it does moves until someone resumes
    it. Said at once (a warning), and alerted like silence once the log has been still past the threshold."""
    still = max(v for v in (age, ev.silent_for, 0.0) if v is not None)
    where = f"last {words.counter(step) or words.progress(step)}" if step is not None else "before the first step"
    head = (f"paused — process {life.writer.pid} is stopped (SIGSTOP, Ctrl-Z or a debugger; `kill -CONT "
            f"{life.writer.pid}` resumes it) · {where}")
    if still > threshold:
        return verdict(Phase.SILENT, Level.CRIT, f"{head} · silent {hz.duration(still)}", [Concern(Worry.SILENT)],
                       threshold=threshold, said=at_said)
    return verdict(doing.phase, Level.WARN, head, threshold=threshold,
                   alert=False, said=at_said)
