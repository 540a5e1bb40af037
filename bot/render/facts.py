"""Pure: the short evidence rows under a headline (error, progress, writer, log, GPUs…), built from a
Verdict's typed fields; each renderer escapes and formats them its own way."""

from __future__ import annotations

from dataclasses import dataclass

from bot.core import humanize as hz
from bot.core.stages import words
from bot.core.verdict import Concern, Finding, Phase, Said, Verdict, Worry


@dataclass(frozen=True)
class Row:
    """One labelled fact. `at` is a time the renderer writes in its own way (a Slack date token, a clock):
    it comes after `text`, which is plain words and may hold log text."""

    label: str
    text: str
    at: float | None = None


def rows(v: Verdict, *, muted_until: float | None = None) -> list[Row]:
    """Most useful first: what failed, where the loop is, who writes the log, how fresh it is, the GPUs."""
    out: list[Row] = []
    if muted_until is not None:
        # A muted run is still probed; say so, or a quiet alert channel reads as "all well".
        out.append(Row("muted", "alerts muted until", muted_until))
    # Each fact once: what the headline states (v.said) is not repeated under it.
    if v.crash is not None and (Said.CRASH not in v.said or words.crash(v.crash, 200) != words.crash(v.crash)):
        out.append(Row("error", words.crash(v.crash, 200)))  # the error in full, when the headline had to cut it
    if (progress := _progress(v)) is not None:
        out.append(Row("progress", progress))
    out += _process_rows(v)
    if v.silent_for is not None:
        size = f" · {hz.size(v.log_size)}" if v.log_size is not None else ""
        out.append(Row("log", f"last write {hz.duration(v.silent_for)} ago{size}"))
    if v.thread_crash is not None and Said.THREAD_CRASH not in v.said:
        out.append(Row("thread", f"{v.thread_crash.thread} died: {words.crash(v.thread_crash, 70)}"))
    out += [Row("found", words.finding(f)) for f in v.findings
            if f.what in (Finding.NAN_LOSS, Finding.LOG_REPLACED, Finding.HUNG_ON_EXIT, Finding.NO_FILE_PROGRESS,
                          Finding.SLOW, Finding.LOSS_SPIKE) and f.what not in v.said]
    if (trend := _trend_row(v)) is not None:
        out.append(trend)
    out += _gpu_rows(v)
    return out


def _progress(v: Verdict) -> str | None:
    """The loop's progress, less what the headline already says of it ("at step 1200", "loss NaN since…")."""
    if v.step is None or Said.PROGRESS in v.said:
        return None
    text = words.progress(v.step, place=Said.COUNTER not in v.said,
                          loss=Said.LOSS not in v.said and Finding.NAN_LOSS not in v.said)
    return text or None


def _trend_row(v: Verdict) -> Row | None:
    """"ETA 14 h · -12 % vs last hour · rate ▃▅▇▇▆▂ · loss █▆▄▃▂▂": the run's memory, for a phone."""
    t = v.trend
    if t is None:
        return None
    parts = []
    if t.eta is not None and Said.ETA not in v.said:
        parts.append(f"ETA {hz.duration(t.eta)}")
    if t.vs_median is not None and abs(t.vs_median) >= 0.005:
        parts.append(f"{t.vs_median * 100:+.0f} % vs last hour")
    if t.rate_spark:
        parts.append(f"rate {t.rate_spark}")
    if t.loss_spark:
        parts.append(f"loss {t.loss_spark}")
    return Row("trend", " · ".join(parts)) if parts else None


def _process_rows(v: Verdict) -> list[Row]:
    if v.writer is not None:
        w = v.writer
        stopped = " · stopped (paused)" if w.paused else ""
        return [Row("writer", f"pid {w.pid} · up {hz.duration(w.elapsed_s)}{stopped} · {hz.command(w.command, 60)}")]
    if v.process is not None:
        return [Row("process", f"pid {v.process.pid} · {hz.command(v.process.command, 60)}")]
    if v.hidden_processes:
        return [Row("writer", f"not visible: {v.hidden_processes} processes hidden from the probe's user "
                              "(probe as root to see them)")]
    return []


def _gpu_rows(v: Verdict) -> list[Row]:
    gpu = v.gpu
    if gpu is None:
        return []
    if gpu.error:
        return [Row("GPUs", gpu.error)]
    if not gpu.gpus:
        return []
    summary = gpu.summary()
    if v.phase in (Phase.STARTING, Phase.LOADING, Phase.PREPARING) and gpu.idle():
        summary += " — idle is expected while loading"
    out = [Row("GPUs", summary)] if Said.GPUS not in v.said else []  # a silent run's headline names them
    # The summary already says "(memory held)" for idle GPUs; keep the findings that add to it.
    out += [Row("GPUs", f) for f in gpu.findings if not ("idle with" in f and "memory held" in summary)]
    out += [Row("GPUs", f.detail) for f in v.findings if f.what is Finding.STUCK_COLLECTIVE]
    return out


def tail_note(v: Verdict, shown: int) -> str | None:
    """What a tail says in place of lines it does not have (None when it has some, or the run was not
    reached and its headline says why): a log that does not exist is not an empty one."""
    if not v.reached or shown:
        return None
    if Concern(Worry.NO_LOG) in v.concerns:
        return "the log does not exist"
    if Concern(Worry.UNREADABLE) in v.concerns:
        return "the log cannot be read"
    return "the log is empty"
