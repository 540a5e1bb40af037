"""Pure: crash signatures (tracebacks, OOM, NCCL, torchrun root causes, kills) and phase announcements."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Sequence

from bot.core.facts import Activity, Crash
from bot.core.logtext import RANK_PREFIX, last_frame, parse_int, split_rank_prefix
from bot.core.redact import strip_ansi


# Crashes. Lines from different ranks interleave, so each `[rankN]:` stream is read on its own.
_HEADER = "Traceback (most recent call last)"
_EXC_LINE = re.compile(r"^(?P<type>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?::[ \t]?(?P<msg>.*))?$")
_EXC_WORD = re.compile(r"(?i)error|exception|interrupt|exit|timeout|iteration|warning")
_CHAIN = ("During handling of the above exception", "The above exception was the direct cause")
_THREAD = re.compile(r"^Exception in thread (.+?):[ \t]*$")
_WATCHDOG = re.compile(r"Watchdog caught collective operation timeout")
_TERMINATE = re.compile(r"terminate called after throwing an instance of '([^']+)'")
_KILLED = re.compile(r"(?i)^Killed(?::? 9)?[ \t]*$|^\S.*?:[ \t]+(?:line[ \t]+)?\d+:[ \t]+(?:\d+[ \t]+)?Killed\b"
                     r"|^\w+: killed[ \t]|oom[_-]kill|\bOut of memory: Killed process")
_SEGFAULT = re.compile(r"(?i)segmentation fault|\bSIGSEGV\b")
_FIELD = re.compile(r"^[ \t]*(rank|exitcode)[ \t]*:[ \t]*(-?\d{1,9})\b")
_SIGNALS = {9: "SIGKILL (often the kernel's OOM killer)", 6: "SIGABRT (e.g. after an NCCL timeout)",
            11: "SIGSEGV", 7: "SIGBUS (often /dev/shm too small)", 15: "SIGTERM", 2: "SIGINT", 1: "SIGHUP"}


def _trim(text: str, limit: int = 200) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _signal_hint(code: int | None) -> str | None:
    """-N is torchrun's "killed by signal N"; 128+N is a shell's."""
    if code is None:
        return None
    return _SIGNALS.get(-code if code < 0 else code - 128 if 128 < code < 160 else 0)


def _exception(text: str) -> tuple[str, str] | None:
    """`pkg.Type: message` (or a bare `KeyboardInterrupt`), not log chatter such as `INFO: x`."""
    if not (m := _EXC_LINE.match(text)):
        return None
    name, last = m["type"], m["type"].rsplit(".", 1)[-1]
    camel = last[:1].isupper() and not last.isupper() and any(c.islower() for c in last)
    if not (camel or _EXC_WORD.search(last)) or (m["msg"] is None and not _EXC_WORD.search(last) and last == name):
        return None
    return name, m["msg"] or ""


def _exc_kind(exc_type: str, message: str) -> str:
    if exc_type.endswith("OutOfMemoryError") or "CUDA out of memory" in message:
        return "oom"
    if _WATCHDOG.search(message):
        return "nccl_timeout"
    if exc_type.endswith("DistBackendError") or "NCCL error" in message or "NCCL communicator was aborted" in message:
        return "nccl_error"
    if "out of memory" in message.lower():  # "CUDA error: out of memory", "HIP out of memory"
        return "oom"
    return "child_failed" if exc_type.endswith("ChildFailedError") else "traceback"


def _root_cause(texts: Sequence[str]) -> tuple[int | None, int | None]:
    """torchrun's failure report: the Root Cause entry wins; the others' SIGTERM is only teardown."""
    entries: list[dict] = []
    section = ""
    for text in texts:
        s = text.strip()
        if s.startswith("Traceback"):
            break
        if s.startswith(("Root Cause", "Failures")):
            section = s[0]
        elif re.fullmatch(r"\[\d+\]:", s):
            entries.append({"root": section == "R"})
        elif m := _FIELD.match(text):
            if not entries:
                entries.append({"root": section == "R"})
            entries[-1].setdefault(m[1], int(m[2]))
    best = (next((e for e in entries if e["root"]), None)
            or next((e for e in entries if e.get("exitcode") not in (None, -15)), None) or (entries or [{}])[0])
    return best.get("rank"), best.get("exitcode")


def _child_failed(texts: Sequence[str], index: int) -> Crash:
    rank, code = _root_cause(texts)
    who = f"rank {rank} exited" if rank is not None else "a worker exited"
    return Crash("child_failed", "ChildFailedError", f"{who} with {code}" if code is not None else "",
                 rank=rank, exit_code=code, signal_hint=_signal_hint(code), line_index=index)


def _watchdog_message(text: str) -> str:
    parts = {k: m[1] for k, p in (("op", r"OpType=(\w+)"), ("seq", r"SeqNum=(\d+)"), ("ran", r"ran for (\d+) milli"),
                                   ("limit", r"Timeout\(ms\)=(\d+)")) if (m := re.search(p, text))}
    if "op" not in parts or "ran" not in parts:
        return _trim(text[text.find("Watchdog"):])
    seq = f" (SeqNum={parts['seq']})" if "seq" in parts else ""
    limit = f", timeout {parts['limit']} ms" if "limit" in parts else ""
    return f"collective operation timeout: {parts['op']}{seq} ran for {parts['ran']} ms{limit}"


def _rank_in(text: str, rank: int | None) -> int | None:
    m = re.search(r"\[(?:PG [^\]]*)?Rank (\d{1,6})\]", text)
    return rank if rank is not None or not m else int(m[1])


class _Traceback:
    """One traceback, or one chain of them, being read."""

    def __init__(self, start: int, rank: int | None, thread: str | None, ignored: bool, group: bool) -> None:
        self.start, self.rank, self.thread, self.ignored, self.group = start, rank, thread, ignored, group
        self.excs: list[tuple[str, str]] = []
        self.child: Crash | None = None

    def crash(self) -> Crash:
        if self.child is not None:
            return replace(self.child, line_index=self.start, thread=self.thread)
        if not self.excs:  # the log ends inside the traceback
            return Crash("traceback", thread=self.thread, rank=self.rank, line_index=self.start)
        exc_type, message = self.excs[-1]
        kinds = [_exc_kind(t, m) for t, m in reversed(self.excs)]  # the last exception names the crash…
        kind = next((k for k in kinds if k != "traceback"), "traceback")  # …an OOM below it explains it
        rank = _rank_in(message, self.rank) if kind.startswith("nccl") else self.rank
        return Crash(kind, exc_type, _trim(message), self.thread, rank, line_index=self.start)


def _scan(entries: list[tuple[int, int | None, str]]) -> list[Crash]:
    """One stream's crashes. States: idle, frames (waiting for the exception line), after, chain."""
    crashes: list[Crash] = []
    tbs: list[_Traceback] = []
    tb: _Traceback | None = None
    mode, since, pending, pending_at = "idle", 0, None, -9
    for pos, (i, rank, text) in enumerate(entries):
        bare = text.lstrip(" +|│╭─")
        if _HEADER in text and bare.startswith(("Traceback", "Exception Group Traceback")):
            if mode != "chain" or tb is None:
                fresh = pos - pending_at <= 3 and pending is not None
                thread = pending if fresh and pending != "\0ignored" else None
                tb = _Traceback(entries[pending_at][0] if thread else i, rank, thread,
                                fresh and pending == "\0ignored", bare.startswith("Exception"))
                tbs.append(tb)
            mode, pending = "frames", None
            continue
        if mode == "frames" and tb is not None:
            line = re.sub(r"^[ \t]*\|[ \t]?", "", text) if tb.group else text
            if line[:1].strip() and (exc := _exception(line)):
                tb.excs.append(exc)
                mode, since = "after", 0
                if exc[0].endswith("ChildFailedError"):
                    tb.child = _child_failed([e[2] for e in entries[pos + 1: pos + 80]], i)
                continue
            # other unindented lines fall through: a traceback cut short by `Killed` is still both
        elif mode != "idle":
            since += 1
            if text.startswith(_CHAIN):
                mode, since = "chain", 0
            mode = "idle" if since > 40 else mode
        if not text[:1].strip():
            continue  # indented: frames, message continuations, torchrun's report fields
        if m := _THREAD.match(text):
            pending, pending_at, mode = m[1], pos, "idle"
        elif text.startswith("Exception ignored in"):
            pending, pending_at = "\0ignored", pos
        elif _WATCHDOG.search(text):
            crashes.append(Crash("nccl_timeout", None, _watchdog_message(text), rank=_rank_in(text, rank), line_index=i))
        elif m := _TERMINATE.search(text):  # C++ abort: no Python traceback follows
            what = next((w for _, _, t in entries[pos + 1: pos + 4] if (w := t.partition("what():")[2])), "")
            kind = _exc_kind(m[1], what)
            rank = _rank_in(what, rank) if kind.startswith("nccl") else rank
            crashes.append(Crash(kind, m[1], _trim(what), rank=rank, line_index=i))
        elif _KILLED.search(text) or _SEGFAULT.search(text):
            kind = "killed" if _KILLED.search(text) else "segfault"
            if not crashes or crashes[-1].kind != kind or i - crashes[-1].line_index > 20:  # one event, many lines
                hint = _SIGNALS[9] if kind == "killed" else _SIGNALS[11]
                crashes.append(Crash(kind, None, _trim(text), rank=rank, signal_hint=hint, line_index=i))
        elif mode == "idle" and (exc := _exception(text)) and _exc_kind(*exc) != "traceback":
            # the exception line of a traceback whose start fell before the scanned window
            if exc[0].endswith("ChildFailedError"):
                crashes.append(_child_failed([e[2] for e in entries[pos + 1: pos + 80]], i))
            else:
                crashes.append(Crash(_exc_kind(*exc), exc[0], _trim(exc[1]), rank=rank, line_index=i))
            mode, since = "after", 0
    return crashes + [t.crash() for t in tbs if not t.ignored]


# Every signature above contains one of these words. Checking the whole window once lets the
# common case, a window of step lines, skip the line-by-line scan: it was half a probe's Python
# time, and the watchdog parses hundreds of probes a sweep. Plain substring tests on the
# lower-cased text: a case-insensitive regex alternation took 11 ms on a 64 KiB window.
_CRASH_WORDS = ("traceback (most recent call last)", "watchdog caught", "terminate called", "kill",
                "segmentation fault", "sigsegv", "outofmemoryerror", "out of memory", "distbackenderror", "nccl",
                "childfailederror")
_ACTIVITY_WORDS = ("sav", "checkpoint", "writing", "evaluat", "validat", "test", "sanity", "dynamo", "inductor",
                   "compil", "autotun", "extension module", "ninja")


def _mentions(words: Sequence[str], lines: Sequence[str]) -> bool:
    text = "\n".join(lines).lower()
    return any(word in text for word in words)


def find_crashes(lines: Sequence[str]) -> list[Crash]:
    """Every crash signature in `lines`, in order of the line where each starts."""
    if not _mentions(_CRASH_WORDS, lines):
        return []
    streams: dict[str, list[tuple[int, int | None, str]]] = {}
    for i, raw in enumerate(lines):
        text = last_frame(strip_ansi(raw)).rstrip()
        prefix = m[0].strip() if (m := RANK_PREFIX.match(text)) else ""
        rank, text = split_rank_prefix(text)
        streams.setdefault(prefix, []).append((i, rank, text.rstrip()))
    crashes = sorted((c for entries in streams.values() for c in _scan(entries)), key=lambda c: c.line_index)
    seen: set[tuple] = set()  # a watchdog timeout is reported up to three times per rank
    unique = []
    for c in crashes:
        key = (c.rank, (re.search(r"SeqNum=(\d+)", c.message) or [c.message])[0]) if c.kind == "nccl_timeout" else None
        if key is None or key not in seen:
            unique.append(c)
            seen.add(key)
    return unique


# Phases that may keep a healthy run silent for minutes.
# "saving" must name what it saves: "gradient checkpointing, saving memory" is not a save.
_SAVE = re.compile(r"(?i)\bsaving\b[^.;]{0,40}?\b(?:checkpoints?|ckpts?|models?|weights|state(?:_dict)?|optimizer|adapters?)\b"
                   r"|checkpoint\w*\]?[ \t:-]*saving|\bis about to be saved|\bwriting (?:the )?checkpoint")
_SAVE_DONE = re.compile(r"(?i)successfully saved|finished saving|done saving|saving took|checkpoint saved|is ready now"
                        r"|\bsaved (?:the )?(?:checkpoint|model|state)\b")
_EVAL = re.compile(r"(?i)\*+[ \t]*Running Evaluation|\bRunning (?:evaluation|validation)\b|^(?:Evaluating|Validating)\b"
                   r"|^(?:Evaluation|Validation|Testing|Test|Sanity Checking)(?:[ \t]+DataLoader[ \t]+\d+)?"
                   r"[ \t]*(?::|\.\.\.|…|$)")  # a bar or a banner, not "Validation loss: 2.3"
_EVAL_DONE = re.compile(r"""(?i)^\{['"]eval_|\*+ eval metrics \*+|validation loss at iteration""")
_COMPILE = re.compile(r"(?i)torch\._dynamo|torch\._inductor|\bcompiling\b|\bautotun"
                      r"|building extension module|emitting ninja build file")  # torch.compile, JIT-built CUDA ops
_ACT_STEP = re.compile(r"(?i)checkpoint[-_](\d+)|global[_ ]?step[ _=:]*(\d+)|iteration[ \t]+(\d+)|\bstep[ _=:-]*(\d+)"
                      r"|\biter_0*(\d+)")  # checkpoint-1000, global_step1000, iteration 1000, step=1000, iter_0001000
_NOT_ANNOUNCEMENT = re.compile(r'^(?:[ \t]{4}|\t)|^[ \t]*File "|^[A-Za-z_][\w.]*(?:Error|Exception|Unsupported|Failed)\b:')


def find_activity(lines: Sequence[str]) -> Activity | None:
    """The last saving/evaluating/compiling announcement, unless a later line says it ended."""
    if not _mentions(_ACTIVITY_WORDS, lines):
        return None
    current: Activity | None = None
    for i, raw in enumerate(lines):
        shown = last_frame(strip_ansi(raw))
        text = split_rank_prefix(shown)[1]
        if not text.strip() or _NOT_ANNOUNCEMENT.search(text):
            continue  # traceback frames and code mention torch._dynamo without compiling anything
        text = text.strip()
        done = {"saving": _SAVE_DONE, "evaluating": _EVAL_DONE}.get(current.kind) if current else None
        if done is not None and done.search(text):
            current = None
            continue
        kind = ("saving" if _SAVE.search(text) and not _SAVE_DONE.search(text)
                else "evaluating" if _EVAL.search(text) else "compiling" if _COMPILE.search(text) else None)
        if kind:
            step = next((g for g in m.groups() if g), None) if (m := _ACT_STEP.search(text)) else None
            current = Activity(kind, shown.strip(), parse_int(step), i)
    return current
