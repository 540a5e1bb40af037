"""Pure: the short phrases a headline is made of — progress, an error, a bar, a finding — from typed facts."""

from __future__ import annotations

import math
import re

from bot.core import humanize as hz
from bot.core.bars import Bar
from bot.core.crashes import SIGNAL_NAMES
from bot.core.facts import Crash, Kind, Step
from bot.core.progress import counter_word
from bot.core.verdict import Finding, Found


def _value(x: float | None) -> str:
    if x is None:
        return "?"
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return hz.number(x)


def counter(step: Step) -> str:
    """"step 1200/60000", "iteration 8/20", "epoch 3 · batch 450/1000", "epoch 299"."""
    parts = []
    # An epoch-based loop's epoch goes with its step; HF's fractional epoch (0.0833) would only clutter.
    whole = step.epoch is not None and step.epoch == int(step.epoch)
    if step.epoch is not None and (step.step is None or step.counter == "batch" or step.epoch_total or whole):
        epoch = f"epoch {hz.number(step.epoch)}" + (f"/{step.epoch_total}" if step.epoch_total else "")
        parts.append(epoch)
    if step.step is not None:
        parts.append(f"{_counter_word(step)} {step.step}" + (f"/{step.total}" if step.total else ""))
    if step.percent is not None:
        parts.append(f"{hz.number(step.percent)}%")
    return " · ".join(parts)


_STEP_WORDS = frozenset({"step", "steps", "iter", "batch", "updates", "timesteps"})
_A_WORD = re.compile(r"[a-z]{4,12}")


def _counter_word(step: Step) -> str:
    """The loop's own word for what it counts where it has one (`generation 20`, `trial 63`, `round 51`), else "step";
    "batch" within an epoch."""
    if step.counter == "batch" and step.epoch is not None:
        return "batch"
    if step.counter in ("iteration", "iters"):
        return "iteration"
    word = counter_word(step.counter).rsplit("_", 1)[-1] if step.counter else ""  # RLlib's `training_iteration`
    return word if _A_WORD.fullmatch(word) and word not in _STEP_WORDS else "step"


def progress(step: Step, previous: Step | None = None, *, place: bool = True, loss: bool = True) -> str:
    """"step 1200/60000 · 14.2K tok/s · loss 2.31" (the rate's change since the last check, when known).
    `place=False` / `loss=False` leave out the counter / the loss (said elsewhere): then "" may come back."""
    parts = [c] if place and (c := counter(step)) else []
    if step.rate is not None and math.isfinite(step.rate):
        rate = f"{hz.count(step.rate)} {step.rate_unit or 'it/s'}"
        old = previous.rate if previous is not None and previous.rate_unit == step.rate_unit else None
        if old and (change := hz.percent_change(step.rate, old)):
            rate += f" ({change} since last check)"
        parts.append(rate)
    if loss and step.loss is not None:
        parts.append(f"loss {_value(step.loss)}")
    if not (place and loss):
        return " · ".join(parts)
    return " · ".join(parts) or hz.trim(step.line, 60)


def first_sentences(message: str, limit: int) -> str:
    """As many whole sentences as fit: "CUDA out of memory. Tried to allocate 372.53 GiB." beats a cut mid-word."""
    sentences = re.split(r"(?<=[.!?])\s+", message.strip())
    text = sentences[0]
    for more in sentences[1:]:
        if len(text) + 1 + len(more) > limit:
            return text + " …"
        text += " " + more
    return hz.trim(text, limit)


def signal(code: int | None) -> str | None:
    if code is None:
        return None
    number = -code if code < 0 else code - 128 if 128 < code < 160 else 0
    return SIGNAL_NAMES.get(number)


# What a crash is, in words, where the log gave no exception or message of its own.
_KIND_WORDS = {Kind.TRACEBACK: "a Python exception", Kind.OOM: "out of memory", Kind.NCCL_TIMEOUT: "NCCL collective timeout",
               Kind.NCCL_ERROR: "NCCL error", Kind.CHILD_FAILED: "a worker failed", Kind.KILLED: "killed",
               Kind.SEGFAULT: "segmentation fault", Kind.SIGNAL: "ended by a signal", Kind.INTERRUPTED: "interrupted",
               Kind.ASSERT: "a device-side assertion failed", Kind.FATAL: "a fatal error", Kind.CANCELLED: "cancelled",
               Kind.HANG: "the run reported itself stuck", Kind.LOGGED: "an error was logged"}


def ended_by(c: Crash) -> str:
    """The headline's first word for a run a crash ended: someone's Ctrl-C or an interrupt handler is no error of the run's."""
    return "interrupted" if c.kind is Kind.INTERRUPTED or "SIGINT" in c.message else "crashed"


def crash(c: Crash, limit: int = 90) -> str:
    """What failed, in words, its cause first: "torch.OutOfMemoryError: CUDA out of memory. …", "rank 1 killed by
    SIGKILL (often the kernel's OOM killer), exit code -9", "rank 0: NCCL collective timeout: ALLREDUCE … ran for …"."""
    if c.kind is Kind.CHILD_FAILED:
        who = f"rank {c.rank}" if c.rank is not None else c.message or "a worker"
        sig = signal(c.exit_code)
        if sig and c.signal_hint:  # a signal ended the worker: that, and what usually sends it, is the cause
            code = "return code" if c.exc_type == "launcher" else "exit code"
            return hz.trim(f"{who} killed by {c.signal_hint}, {code} {c.exit_code}", limit)
        if c.exc_type and c.exc_type.endswith("CalledProcessError"):
            return hz.trim(f"{who} exited with status {c.exit_code} (the launcher's CalledProcessError)", limit)
        if c.exc_type == "launcher":  # DeepSpeed's and others' `exits with return code = 1`
            said = sig or c.signal_hint  # Windows' NTSTATUS codes have no signal, but a name
            return hz.trim(f"{who} exited with return code {c.exit_code}" + (f" ({said})" if said else ""), limit)
        code = f"exit code {c.exit_code}" + (f", {sig}" if sig else "")
        return hz.trim(f"ChildFailedError: {who} failed ({code})" if c.exit_code is not None
                       else f"ChildFailedError: {who} failed", limit)
    who = f"rank {c.rank}: " if c.rank is not None else ""
    if not c.exc_type or (c.kind is Kind.NCCL_TIMEOUT and c.message.startswith("NCCL collective timeout")):
        # no exception of its own, or one whose type only says which layer tore down (DistBackendError): the message is the cause
        text = c.message or _KIND_WORDS[c.kind]
        if c.signal_hint and "(" in c.signal_hint:  # the hint says what usually sends that signal
            name = c.signal_hint.split(" ", 1)[0]
            text = text.replace(name, c.signal_hint, 1) if name in text else f"{text} — {c.signal_hint}"
        return hz.trim(who + text, limit)
    head = c.exc_type
    if c.message and head.count(".") >= 2 and len(who) + len(head) + len(c.message) + 2 > limit:
        # a cut line keeps the message over a deep module path (`torch.multiprocessing.spawn.`); `torch.` stays
        head = head.rsplit(".", 1)[-1]
    text = f"{who}{head}: {first_sentences(c.message, limit - len(head) - len(who))}" if c.message else f"{who}{head}"
    return hz.trim(text, limit)


def bar(b: Bar) -> str:
    """"loading weights 15% (131/851)"."""
    desc = (b.desc or "progress").strip()
    desc = desc[0].lower() + desc[1:] if desc[:1].isupper() and not desc[1:2].isupper() else desc
    pct = f" {b.pct}%" if b.pct is not None else ""
    counts = f" ({b.n}/{b.total})" if b.n is not None and b.total is not None else (f" ({b.n})" if b.n is not None else "")
    return f"{desc}{pct}{counts}"


def finding(f: Found) -> str:
    if f.what is Finding.NAN_LOSS:
        since = f" since {f.unit} {f.step}" if f.step is not None else ""
        before = f" ({hz.number(f.before)} at {f.unit} {f.before_step})" if f.before is not None and f.before_step is not None else (
            f" (was {hz.number(f.before)})" if f.before is not None else "")
        return f"{f.detail}{since}{before}"
    if f.what is Finding.SLOW:  # "14.2K → 8.1K tok/s (-43 %) for 12 min"
        change = f" ({hz.percent_change(f.value, f.before)})" if f.value and f.before and hz.percent_change(f.value, f.before) else ""
        lasted = f" for {hz.duration(f.lasted)}" if f.lasted is not None else ""
        return f"slow: {hz.count(f.before or 0)} → {hz.count(f.value or 0)} {f.detail}{change}{lasted}"
    if f.what is Finding.LOSS_SPIKE:
        return f"loss spiking: {_value(f.value)} against {_value(f.before)} before" + (f" (step {f.step})" if f.step is not None else "")
    if f.what is Finding.LOSS_SCALE:
        return f"fp16 overflow on every step: loss scale {hz.number(f.value or 0)}, steps skipped (nothing learns)"
    if f.what is Finding.THREAD_DIED:
        return f"thread {f.detail} died"
    if f.what is Finding.IDLE_ROLE:
        return f"{f.detail} GPUs idle"
    if f.what is Finding.LOG_REPLACED:
        return f"log replaced; the job writes {f.detail}"
    return f.detail
