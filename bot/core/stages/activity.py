"""Pure: what the log says the run is doing now — the latest of its progress, an open bar, an announcement,
a fatal error or a normal end — read by position, never by whether a bar happens to be open."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from bot.core.bars import Bar, Role
from bot.core.evidence import BarLine, Evidence
from bot.core.facts import Crash, Kind, Step
from bot.core.grammar import message, template
from bot.core.markers import Mark, Marker
from bot.core.progress import counter_word
from bot.core.redact import redact_secrets
from bot.core.verdict import Phase

_BAR_PHASES = {Role.LOADING: Phase.LOADING, Role.PREPARING: Phase.PREPARING, Role.EVALUATING: Phase.EVALUATING,
               Role.SAVING: Phase.SAVING, Role.OTHER: Phase.BUSY, Role.TRAINING: Phase.TRAINING}
_MARK_PHASES = {Mark.SAVING: Phase.SAVING, Mark.EVALUATING: Phase.EVALUATING, Mark.COMPILING: Phase.COMPILING,
                Mark.LOADING: Phase.LOADING, Mark.PREPARING: Phase.PREPARING, Mark.TRAINING: Phase.STARTING,
                Mark.RESTARTING: Phase.STARTING}
_CLOSES = {Mark.SAVING: Mark.SAVED, Mark.EVALUATING: Mark.EVALUATED}
_SEPARATOR = re.compile(r"[-=_*#~]{10,}\Z")  # a rule line: the section above it is over
# Crashes that are the launcher tearing the others down, not a failure of their own.
_TEARDOWN = re.compile(r"(?i)SIGTERM|closing signal|death signal|terminat")
# Lightning's start-up lines; its rich progress bar (the default with `rich` installed) writes nothing to a file.
_LIGHTNING = re.compile(r"LOCAL_RANK: \d+ - CUDA_VISIBLE_DEVICES|GPU available: (?:True|False)|┃ Name +┃ Type|"
                        r"\| Name +\| Type +\| Params|lightning[./](?:pytorch|fabric)")
_RICH_TABLE = re.compile(r"[┏┃┡]")


@dataclass(frozen=True)
class Doing:
    """The phase the log shows and the event that decides it."""

    phase: Phase
    step: Step | None = None  # the loop's latest progress
    bar: BarLine | None = None  # the bar the phase comes from (an open eval / loading bar…)
    marker: Marker | None = None  # the announcement it comes from ("Saving model checkpoint to …")
    crash: Crash | None = None  # the fatal error after the last progress
    ended: Marker | None = None  # a normal end after the last progress
    thread_crash: Crash | None = None  # a thread that died (the run may go on)
    restarted_after: Crash | None = None  # the error a relaunch followed (the launcher restarts its workers)
    reached_total: bool = False  # the loop's counter reached its total
    no_file_progress: bool = False  # Lightning's rich bar: it trains, but nothing reaches the file
    final_save: bool = False  # the save it does is the final model's, after the loop's last checkpoint


def _position(step: Step | None) -> int:
    return step.index if step is not None else -(1 << 30)


# Fatal texts that can be glued after a progress bar's last frame (stderr written onto stdout's open line):
# on the progress line itself only these count, never the line's own words.
# A traceback too: its header starts a line of its own (crashes reads the text glued after a frame), never a bar's words.
_GLUED = frozenset({Kind.SEGFAULT, Kind.KILLED, Kind.ASSERT, Kind.SIGNAL, Kind.FATAL, Kind.NCCL_TIMEOUT, Kind.HANG,
                    Kind.TRACEBACK})
# A rank's NCCL error that only says the watchdog tore its communicator down: the consequence of a timeout.
_ABORTED = re.compile(r"(?i)communicator was aborted|watchdog thread terminated|taking the entire process down")


def _fatal(ev: Evidence, after: int) -> Crash | None:
    """The error that ended the run, named by its cause, not by the launcher's echo of it.

    The workers' own errors come before the launcher's report (its ChildFailedError, CalledProcessError or
    exit code only repeats a child's error when that error is in the log), and the others' SIGTERM is the
    launcher's teardown. A traceback cut before its exception line names nothing: any other report says
    more. A collective's timeout is the cause of the other ranks' aborted communicators. With several ranks
    failing, the first in the log failed first; one process failing again and again (a retry loop), its
    last error is the one that ended it. A rank torchrun names as the root cause that died of a signal (SIGKILLed:
    no error of its own) is the cause: the other ranks' errors only say they lost it."""
    glued = any(b.index == after and b.after for b in ev.bars)  # a message written after the last frame, on its line
    fatal = [c for c in ev.crashes if not c.in_thread and (c.line_index > after or (c.line_index == after and (
        c.kind in _GLUED or glued))) and not _handled(ev, c)]
    if not fatal:
        return None
    named = [c for c in fatal if not _unnamed(c)] or fatal
    own = [c for c in named if c.kind not in ("child_failed", "signal") and not _TEARDOWN.search(f"{c.exc_type or ''} {c.message}")]
    reports = [c for c in named if c.kind == "child_failed" and (c.rank is not None or c.exit_code is not None)]
    if not own:
        return reports[0] if reports else named[-1]
    root = next((c for c in reports if c.exc_type == "ChildFailedError" and c.rank is not None), None)
    if root is not None and (root.exit_code or 0) < 0 and all(c.rank is not None and c.rank != root.rank for c in own):
        return root  # torchrun's root cause died of a signal, no error of its own: the others' errors are only its loss
    if any(c.kind is Kind.NCCL_TIMEOUT for c in own):
        own = [c for c in own if not (c.kind is Kind.NCCL_ERROR and _ABORTED.search(c.message))]
    ranks = {c.rank for c in own}
    chosen = own[0] if len(ranks) > 1 else own[-1]
    return _cause_of(chosen, own)


# What a program prints when it caught the error and goes on (a batch-size search's `CUDA out of memory at
# batch_size=8192; retrying with 4096`, a loader's `falling back to …`): the traceback it printed was no end.
_HANDLED = re.compile(r"(?i)\b(?:retrying|will retry|trying again|falling back|skipping (?:this|the) (?:batch|step|sample))\b")
HANDLED_WITHIN = 400  # lines after the traceback's start: a traceback and the program's word about it


def _handled(ev: Evidence, crash: Crash) -> bool:
    """Did the program say, after the error and before any other, that it caught it and goes on? A line of its own
    (not a traceback's indented frame, not the exception's message, which may itself say `Max retries exceeded`)."""
    later = [c.line_index for c in ev.crashes if c.line_index > crash.line_index]
    stop = min(len(ev.lines), crash.line_index + HANDLED_WITHIN, *(later[:1] or [len(ev.lines)]))
    for text in ev.lines[crash.line_index + 1:stop]:
        if text[:1] not in " \t" and _HANDLED.search(text) and crash.message[:40] not in text:
            return True
    return False


ECHO_LINES = 3  # an end's echo: the loop's last frame printed this close after it

# What a process does once an error has doomed it: abort (a failed `assert(0)`, SIGABRT) — the symptom.
_SYMPTOMS = frozenset({Kind.FATAL, Kind.ASSERT})
CAUSE_WITHIN = 10  # lines: an abort this close after another error is that error's end


def _cause_of(chosen: Crash, crashes: Sequence[Crash]) -> Crash:
    """darknet's `CUDA Error: out of memory`, then `Assertion '0' failed`, then `Aborted (core dumped)`: the
    out-of-memory is what ended the run; the abort only says how."""
    if chosen.kind not in _SYMPTOMS:
        return chosen
    before = [c for c in crashes if c.kind not in _SYMPTOMS and c.rank == chosen.rank
              and 0 < chosen.line_index - c.line_index <= CAUSE_WITHIN]
    return before[-1] if before else chosen


# torchrun's agent names the workers it stops and the one that failed: `Sending process 1917 closing signal SIGTERM`,
# `failed (exitcode: 1) local_rank: 1 (pid: 1918) of binary: …`.
_WORKER_PID = re.compile(r"Sending process (\d+) closing signal|failed \(exitcode: -?\d+\) local_rank: \d+ \(pid: (\d+)\)")
_LAUNCHER = re.compile(r"torch\.distributed\.(?:run|launch)\b|\btorchrun\b")


def new_workers(ev: Evidence, crash: Crash) -> tuple[int, ...]:
    """The pids of a worker group the launcher started after this error, where the log or the processes show one:
    the agent's later lines name workers it had not named at the error, or, while it lives, workers it never named
    write the log. Empty when it stopped the group and nothing replaced it."""
    named = [(i, int(m[1] or m[2]), bool(m[2])) for i, x in enumerate(ev.lines[crash.line_index:], crash.line_index)
             if "closing signal" in x or "local_rank" in x for m in [_WORKER_PID.search(x)] if m]
    if not named:
        return ()
    group: set[int] = set()
    reported = False  # the agent's `failed (exitcode …)` line closes the group's teardown
    for i, pid, failed in named:
        if reported and pid not in group:
            return tuple(p for j, p, _ in named if j >= i and p not in group)  # a later group's teardown
        group.add(pid)
        reported = reported or failed
    alive = [w.pid for w in ev.writers if w.pid not in group and not _LAUNCHER.search(w.command)]
    return tuple(alive)


def _unnamed(c: Crash) -> bool:
    """A traceback the log cut before its exception line: it says something failed, not what."""
    return c.kind is Kind.TRACEBACK and not c.exc_type and not c.message


def _restarted(ev: Evidence, crash: Crash) -> bool:
    """A new attempt after the error: a loading bar or an announcement of work, or the run's start-up
    printed again (a relaunch repeats its first lines; a dying process's last words and the launcher's
    teardown do not look like the run's start)."""
    later = crash.line_index + 3
    if any(m.index > crash.line_index and m.kind is Mark.RESTARTING for m in ev.markers):
        return True  # the launcher says so
    if (any(m.index > later and m.kind in (Mark.LOADING, Mark.PREPARING, Mark.TRAINING, Mark.COMPILING) for m in ev.markers)
            or any(b.index > later and b.bar.role in (Role.LOADING, Role.PREPARING) for b in ev.bars)):
        return True
    if ev.window_truncated:
        return False  # the window's first lines are then no run's start
    # The window's first lines that are no error's (a window may open on an earlier attempt's traceback);
    # pdsh's bare "192.168.205.202: " lines are no start-up either.
    opening = [template(x) for x in ev.lines[:crash.line_index] if message(x) and not _NOISE.search(x)][:4]
    after = [template(x) for x in ev.lines[later:] if message(x)]
    # The window's own first lines, printed again in their order after the error.
    found, k = 0, 0
    for t in after:
        if k < len(opening) and t == opening[k]:
            found, k = found + 1, k + 1
    return len(opening) >= 2 and found >= 2


_NOISE = re.compile(r"(?i)warn|error|exception|traceback|^\s|wandb|^\W*$|frame #\d|0x[0-9a-f]{6,}|nccl")


def _open_marker(ev: Evidence, after: int) -> Marker | None:
    """The latest announcement after the last progress that nothing has closed since."""
    current: Marker | None = None
    glued = {b.index: b.after for b in ev.bars if b.after}  # a message written after a bar's frame came after it
    for m in ev.markers:
        if m.index < after or (m.index == after and glued.get(m.index) != m.text):
            continue
        if current is not None and _CLOSES.get(current.kind) is m.kind:
            current = None
        elif m.kind in _MARK_PHASES:
            current = m
    if current is not None and current.kind in _CLOSES and any(_SEPARATOR.match(message(x)) for x in ev.lines[current.index + 1:]):
        return None  # a separator drawn after it closes its section (flair: `saving best model`, then `-----`)
    return current


_SAVES = (Mark.SAVING, Mark.SAVED)


def _unfinished_save(ev: Evidence, after: int) -> Marker | None:
    """A save the run's own last save says is not over: since the last progress only save lines, opening as
    its previous save opened, but fewer of them (accelerate's `save_state`: model weights, optimizer, scheduler,
    scaler, random states, then `Saved state to …`; a log that stops after the weights' line is still saving)."""
    now = [m for m in ev.markers if m.index > after]
    if not now or any(m.kind not in _SAVES for m in now):
        return None
    opening = template(message(now[0].text))
    earlier = [m for m in ev.markers if m.index <= after and m.kind in _SAVES]
    start = next((k for k in range(len(earlier) - 1, -1, -1) if template(message(earlier[k].text)) == opening), None)
    if start is None:
        return None
    resumed = next((s.index for s in ev.steps if s.index > earlier[start].index), after + 1)  # the loop went on
    before = [m for m in earlier[start:] if m.index < resumed]
    return replace(now[-1], kind=Mark.SAVING) if len(before) > len(now) else None


_SHARD = re.compile(r"(?<!\d)(\d{1,6})-of-(\d{1,6})(?!\d)")  # `ft-model-00013-of-00030.safetensors`


def shard_of(marker: Marker) -> tuple[int, int] | None:
    """The shard a save's line names, out of how many (`ft-model-00013-of-00030.safetensors`: 13 of 30)."""
    return (int(m[1]), int(m[2])) if (m := _SHARD.search(marker.text)) else None


def _sharded_save(ev: Evidence, after: int) -> Marker | None:
    """A save written shard by shard, one line each, its last shard short of the count its file names give
    (torchtune's `… saved to …/epoch_0/ft-model-00013-of-00030.safetensors`): the save goes on."""
    now = [m for m in ev.markers if m.index > after]
    if not now or any(m.kind is not Mark.SAVED for m in now) or not (shard := shard_of(now[-1])):
        return None
    return replace(now[-1], kind=Mark.SAVING) if shard[0] < shard[1] else None


def _routine_save(ev: Evidence, marker: Marker) -> bool:
    """A save the loop makes as it goes, not a phase it stops in: the run announced saves before (at least
    two) and went on with its next step after each, with no closing line and no stamp to time them by
    (TF's Supervisor: `Saving checkpoint to path training/model.ckpt` between `global step 672` and `673`).
    Its latest announcement is then the loop's, and the loop's silence rule holds. (Saves a stamp can time
    are paced by what they took: bot.core.stages.pace.)"""
    earlier = [m for m in ev.markers if m.kind is Mark.SAVING and m.index < marker.index]
    if len(earlier) < 2 or any(m.kind is Mark.SAVED for m in ev.markers) or ev.stamps[marker.index] is not None:
        return False
    after = [m.index for m in ev.markers if m.kind is not Mark.SAVING] + [marker.index]
    for m in earlier:
        nxt = next((s.index for s in ev.steps if s.index > m.index), None)
        if nxt is None or any(m.index < i < nxt for i in after):
            return False
    return True


def _loop_preamble(ev: Evidence, marker: Marker) -> bool:
    """An evaluation the loop announces at the start of each of its passes, the next line naming the loop's counter
    every time (a metaheuristic search's `Evaluating new candidates...` above each iteration's `iter:67 indv:3
    fitness:…` lines): the loop's work, not a pass beside it, so the loop's silence rule holds. A validation
    pass prints its own results first."""
    shape = template(message(marker.text))
    earlier = [m for m in ev.markers if m.kind is marker.kind and m.index < marker.index
               and template(message(m.text)) == shape]
    if len(earlier) < 2 or any(m.kind is Mark.EVALUATED for m in ev.markers):
        return False
    counted = [s for s in ev.steps if s.fmt != "announced" and s.counter]
    if not counted:
        return False
    names = re.compile(rf"(?i)(?<![a-z]){re.escape(counter_word(counted[-1].counter))}\W{{0,3}}\d")  # `iter:67`
    for m in earlier:
        following = next((x for x in ev.lines[m.index + 1:m.index + 6] if x.strip()), None)
        if following is None or not names.search(following):
            return False
    return True


def _final_save(ev: Evidence, marker: Marker, at: int) -> bool:
    """The final model's save: a save naming no checkpoint right after the save of a numbered one, with no
    progress between (ColossalAI's DreamBooth: `Saving model checkpoint to …/checkpoint-1000`, then `… to
    …/weight_output on rank 0`). The loop is over; a process gone after it, with no error, ended."""
    before = [m for m in ev.markers if m.index < marker.index]
    return (marker.step is None and bool(before) and before[-1].kind is Mark.SAVING and before[-1].step is not None
            and before[-1].index > at)


def _loop_line(ev: Evidence, marker: Marker) -> bool:
    """An end's words on one of the loop's own progress lines, short of its total, end a unit of work, not the
    run (DLRM's `Finished training it 1000/2000 of epoch 0, 115.30 ms/it, loss 0.517118` every report). A bar's
    frame is no such line: messages are glued onto it (Keras' `… - loss: 44.41Batch 3: Invalid loss, terminating training`)."""
    step = next((s for s in ev.steps if s.index == marker.index and s.fmt != "bar"), None)
    return step is not None and step.total is not None and step.step is not None and step.step < step.total


def _last_move(steps) -> int:
    """Where the counter took its current value (the first of the trailing lines that repeat it)."""
    if not steps:
        return -(1 << 30)
    k = len(steps) - 1
    while k > 0 and steps[k - 1].step == steps[-1].step and steps[k - 1].step is not None:
        k -= 1
    return steps[k].index


# What a loop prints once it is over: results of a final test or evaluation, the best value, a last save. The number
# stands on its own: one inside a name (`Result for DQN_shogi_96499_00000:`, Ray Tune's every report) is no figure.
_RESULT = re.compile(r"(?i)\b(?:test|val(?:id(?:ation)?)?|eval(?:uation)?|final|best|results?|top-?[15]|acc(?:uracy)?|"
                     r"mAP|mIoU|dice|bleu|rouge|f1|auc|score|ppl|perplexity)\w*\b[^\n]{0,40}?[:=]?[ \t]*(?<![\w.])-?\d"
                     r"|^\W*best [\w ]{1,30}:[ \t]*[A-Za-z]\w")  # a search's winner, by name: `Best model: AutoGluonTabular`


_AGGREGATE = re.compile(r"(?i)\b(?:avg|average|mean|total|overall)\b[^\n]{0,40}?[:=][ \t]*-?\d")


def results_after(ev: Evidence, step: Step | None, after: int = -1) -> bool:
    """Did the log print results, or save, after the loop's last progress line (or after `after`)? A process killed
    in the middle of its loop stops at a step; one that reached its end evaluates, reports, saves, then exits."""
    at = max(_position(step), after)
    if any(m.index > at and m.kind in (Mark.EVALUATED, Mark.SAVED, Mark.ENDED) for m in ev.markers):
        return True
    after = [x for x in ev.lines[max(at + 1, len(ev.lines) - 12):] if x.strip()]
    if any(_RESULT.search(x) for x in after):
        return True
    # A run's summary: an aggregate over the whole run (`Avg epoch time: 19.61`), printed once, after the loop.
    summaries = {template(x) for x in after if _AGGREGATE.search(x)}
    return bool(summaries) and not any(template(x) in summaries for x in ev.lines[:at + 1] if _AGGREGATE.search(x))


# A measured figure with its name (`Best score: 0.024`, `Loss=0.4886`, `acc: 91.2%`): where a result line's news is.
# A whole number is a setting or a count as often as a result (`num_episodes=100`, `Test size: 20`).
_FIGURE = re.compile(r"\b[A-Za-z][\w/.-]*[ \t]*[:=][ \t]*-?(?:\d*\.\d|\d+%)")
_RESULT_LIMIT = 60


def last_result(ev: Evidence, step: Step | None, after: int = -1) -> str | None:
    """The last result line after the loop, or after `after` (what a finished run's headline can end with)."""
    at = max(_position(step), after)
    for x in reversed(ev.lines[max(at + 1, len(ev.lines) - 12):]):
        if x.strip() and _RESULT.search(x):
            return _quoted(x)
    return None


def summary_result(ev: Evidence, step: Step | None, ended: Marker | None) -> str | None:
    """The run's result, printed once after its loop with a named figure (`Best validation Dice: 0.4603`,
    `Final Results: Loss=0.4886`): what a finished run's headline says after an end that says only that it ended.
    A line the loop printed before too (`train Loss: 0.0898 …` every epoch) is the loop's, not its summary; with no
    step known, only the end's line and those after it count (a dataset split's `Test size: 20` came before)."""
    at = _position(step) if step is not None else (ended.index - 1 if ended is not None else len(ev.lines))
    loop = {template(x) for x in ev.lines[:max(at + 1, 0)] if _RESULT.search(x)}
    for x in reversed(ev.lines[max(at + 1, len(ev.lines) - 12):]):
        if x.strip() and _RESULT.search(x) and _FIGURE.search(x) and template(x) not in loop:
            return _quoted(x)
    return None


def _quoted(line: str) -> str:
    """A result line in its own words (no stamp or logger before them), redacted before the cut; a long one from
    the sentence that holds its first named figure, so the cut keeps it (`… did not improve in the last 5
    records. Best score: 0.024. Signaling Trainer to stop.`)."""
    text = re.sub(r"[ \t]{2,}", "  ", redact_secrets(message(line).strip() or line.strip()))
    if len(text) > _RESULT_LIMIT and (figure := _FIGURE.search(text)):
        text = text[_sentence_start(text, figure.start()):]
    return text[:_RESULT_LIMIT] + ("…" if len(text) > _RESULT_LIMIT else "")


def _sentence_start(text: str, at: int) -> int:
    """Where the sentence holding position `at` begins (after the last ". " or "; " before it)."""
    return max((m.end() for m in re.finditer(r"[.;!?] +", text) if m.end() <= at), default=0)


def _reached(step: Step | None) -> bool:
    """The loop's counter at its total. A counter that restarts each epoch (`Epoch 54: 2950/2950`) at its
    total ends an epoch, not the run: that takes the last epoch, where the line says which one is last."""
    if step is None or step.total is None or step.step is None or step.step < step.total:
        return False
    if step.counter == "batch" and step.epoch is not None:
        # the last epoch's last batch: a one-batch epoch too (Keras' `Epoch 1000/1000` over `1/1 [====]`)
        return step.epoch_total is not None and step.epoch >= step.epoch_total - 1
    return step.total > 1  # a lone `1/1` is a bar of one item, no loop


def activity(ev: Evidence) -> Doing:
    step = ev.steps[-1] if ev.steps else None
    at = _position(step)
    threads = [c for c in ev.crashes if c.in_thread]
    thread_crash = threads[-1] if threads else None
    # An error counts after the counter's last move, not after its last redraw: tqdm draws its bar once more as
    # the process unwinds (`0/1000 [00:29<?]` below a CUDA OOM), and that frame is no progress past the error.
    crash = _fatal(ev, min(at, _last_move(ev.steps)))
    restarted_after = None
    regrouped = None
    while crash is not None and (_restarted(ev, crash) or (regrouped := new_workers(ev, crash))):
        # the relaunch may fail in its turn (torchrun's agent raising while it re-rendezvouses): its error ends the run;
        # the first error is what the relaunch followed (the others' lost peers came after it)
        crash, restarted_after = _fatal(ev, max(at, crash.line_index + 3)), restarted_after or crash
    if crash is None and regrouped:
        # torchrun's agent restarted its worker group, at its default log level without a word: the new workers
        # write the log, no progress has come from them yet (once it has, the loop's lines say what it does)
        marker = Marker(Mark.RESTARTING, len(ev.lines) - 1, f"new workers started (pid {', '.join(map(str, regrouped))})")
        return Doing(Phase.STARTING, step=step, marker=marker, restarted_after=restarted_after, thread_crash=thread_crash)
    # Lightning prints `Trainer.fit stopped` and then redraws its bar: an end counts after the counter's
    # last move, not after its last redraw.
    # Keras prints its last batch's frame after a callback's `terminating training`, and HF's tqdm its bar's last state
    # after the train metrics (a dict a terminal may wrap over two lines): one step just after an end is its echo.
    moved = _last_move(ev.steps)
    ends = [m for m in ev.markers if m.kind is Mark.ENDED and not _loop_line(ev, m) and (
        m.index >= moved or (moved - ECHO_LINES <= m.index and sum(s.index > m.index and s.fmt != "announced" for s in ev.steps) == 1))]
    base = {"step": step, "thread_crash": thread_crash, "reached_total": _reached(step), "restarted_after": restarted_after}
    if crash is not None and crash.kind is Kind.CANCELLED and base["reached_total"]:
        # The loop reached its total, then the scheduler ended the job at its time limit: the work is done and the
        # process hung on its way out (Megatron-Bridge's 50/50 iterations, then Slurm's `CANCELLED … DUE TO TIME LIMIT`).
        return Doing(Phase.FINISHED, crash=crash, **base)
    if crash is not None:
        return Doing(Phase.CRASHED, crash=crash, **base)
    # An evaluation bar at its total is an evaluation done: the loop goes on (YOLO's per-epoch validation).
    bars = [b for b in ev.bars if b.index > at and (b.bar.role is not Role.TRAINING or b.bar.nested) and not b.after
            and not (b.bar.role is Role.EVALUATING and b.bar.finished)]
    bar = bars[-1] if bars else None
    marker = _open_marker(ev, at) or _unfinished_save(ev, at) or _sharded_save(ev, at)
    if marker is not None and marker.kind is Mark.SAVING and step is not None and _routine_save(ev, marker):
        marker = None
    if marker is not None and marker.kind is Mark.EVALUATING and step is not None and _loop_preamble(ev, marker):
        marker = None
    # An end, unless the run went on after it (HF's final evaluation after `Training completed`); the final
    # model's save after it is part of ending.
    if ends and not ((bar is not None and bar.index > ends[-1].index and not bar.bar.finished)
                     or (marker is not None and marker.index > ends[-1].index and marker.kind is not Mark.SAVING)):
        # The last save after the end (TRL's `Save last checkpoint of the model`) goes with it: while the
        # process lives, that save is what it does.
        after = marker if marker is not None and marker.index > ends[-1].index and marker.kind is Mark.SAVING else None
        return Doing(Phase.FINISHED, ended=ends[-1], marker=after, **base)
    if bar is not None and (marker is None or bar.index >= marker.index):
        if bar.bar.finished and bar.bar.role is Role.SAVING and marker is not None and marker.kind is Mark.SAVING:
            return Doing(Phase.SAVING, bar=bar, marker=marker, **base)  # shards written; the optimizer state follows
        return Doing(_BAR_PHASES[bar.bar.role], bar=bar, marker=marker, **base)
    if marker is not None:
        final = marker.kind is Mark.SAVING and _final_save(ev, marker, at)
        return Doing(_MARK_PHASES[marker.kind], marker=marker, final_save=final, **base)
    if step is not None:
        return Doing(Phase.TRAINING, **base)
    text = "\n".join(ev.lines[-200:])
    if _LIGHTNING.search(text) and _RICH_TABLE.search(text):
        return Doing(Phase.TRAINING, no_file_progress=True, **base)
    return Doing(Phase.STARTING, **base)


_LOGGED_ERROR = re.compile(r"\[(?:ERROR|CRITICAL|FATAL)\]|(?:^|[ \t|\]])(?:ERROR|CRITICAL|FATAL)(?:[ \t]*[:|\]-]|[ \t]+\S)")


def logged_error(ev: Evidence, step: Step | None) -> Crash | None:
    """An ERROR-level log line among the last words of a run that exited with no traceback (Hydra's `Error
    executing job`, a logger's `[ERROR] - …`): why it stopped, in its own words. Only asked of a gone run:
    while a run lives, an error line is often a hiccup it survives."""
    at = _position(step)
    last = [(i, x) for i, x in enumerate(ev.lines) if x.strip() and i > at][-5:]
    for i, text in reversed(last):
        if _LOGGED_ERROR.search(text):
            return Crash(Kind.LOGGED, None, redact_secrets(message(text))[:200], line_index=i)
    return None


def errors_before_end(ev: Evidence, step: Step | None, ended: int) -> tuple[int, Crash | None]:
    """ERROR-level lines between the loop's last progress and the end's line (every ablation of a study `failed:`,
    then `Ablation study completed!`): how many, and the last in its own words (after its level). A run that ends
    well after errors did part of its work, or none."""
    found = [(i, m) for i, x in enumerate(ev.lines[_position(step) + 1:ended], _position(step) + 1)
             if (m := _LOGGED_ERROR.search(x))]
    if not found:
        return 0, None
    i, m = found[-1]
    said = m.string[m.end():].strip(" \t:|-]") or message(m.string)
    return len(found), Crash(Kind.LOGGED, None, redact_secrets(said)[:200], line_index=i)


def bar_of(doing: Doing) -> Bar | None:
    return doing.bar.bar if doing.bar is not None else None
