"""Pure: what ended a run, read from the log — tracebacks with their causes, launchers' reports and exit codes,
signals, kills, kernel assertions, a scheduler's cancel — each stream of a multi-rank log read on its own."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from bot.core.facts import Crash, Kind
from bot.core.grammar import RANK_PREFIX, last_frame, message, split_rank_prefix, strip_host_prefix
from bot.core.redact import redact_secrets, strip_ansi


_HEADER = "Traceback (most recent call last)"
# IPython/Jupyter's header names the exception first (`KeyboardInterrupt      Traceback (most recent call last)`),
# its frames are `----> 12 call` arrows under unindented `file.py in func(...)` lines.
# A copy that lost its spacing glues the two: `NanLossDuringTrainingErrorTraceback (most recent call last)`.
_IPYTHON_HEADER = re.compile(r"^(?P<type>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:[ \t]{2,}|(?<=Error)|(?<=Exception)|(?<=Interrupt))"
                             r"Traceback \(most recent call last\)")
# Markdown emphasis a paste wraps an exception line in (`**RuntimeError: CUDA out of memory.** Tried …`).
_EMPHASIS = re.compile(r"^\*{1,2}(?=[A-Za-z_])|(?<=\S)\*{1,2}(?=\s|$)|^`+|`+$")
# An exception line; a wrapper names the exception it carries (Ray's `ray.exceptions.RayTaskError(RuntimeError): …`,
# whose remote traceback follows it).
_EXC_LINE = re.compile(r"^(?P<type>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*(?:\([A-Za-z_]\w*\))?)(?::[ \t]?(?P<msg>.*))?$")
# A message that lists what may have happened, naming no cause: Ray's `There are some potential root causes. (1) The
# process is killed by SIGKILL by OOM killer … (3) The worker is crashed unexpectedly due to SIGSEGV …`.
_HEDGED = re.compile(r"(?i)\b(?:potential|possible|probable) (?:root )?causes?\b|\bmay (?:have been|be) caused by\b")
_EXC_WORD = re.compile(r"(?i)error|exception|interrupt|exit|timeout|iteration|warning|abort")
_CHAIN = ("During handling of the above exception", "The above exception was the direct cause")
_THREAD = re.compile(r"^Exception in thread (.+?):[ \t]*$")
_WATCHDOG = re.compile(r"Watchdog caught collective operation timeout")
_STUCK = re.compile(r"watchdog got stuck for (\d+) seconds?")
# srun's report of a task's end: `srun: error: node12: task 6: Aborted`
_SRUN_TASK = re.compile(r"^srun: error: \S+: tasks? ([\d,-]+): (Aborted|Killed|Segmentation fault|Bus error|Exited with exit code (\d+))")
# A C++ exception nobody caught: libstdc++'s words, and libc++'s (clang, macOS: MLX's `[METAL] Command buffer …`).
_TERMINATE = re.compile(r"terminate called after throwing an instance of '([^']+)'"
                        r"|libc\+\+abi: terminating due to uncaught exception of type ((?:\w+::)*\w+(?:<[^>]*>)?)(?::[ \t]*(.*))?")
_KILLED = re.compile(r"(?i)^Killed(?::? 9)?[ \t]*$|^\S.*?:[ \t]+(?:line[ \t]+)?\d+:[ \t]+(?:\d+[ \t]+)?Killed\b"
                     # the shell's `Killed` glued to a last line the process never ended (a spinner's `…time)Killed`)
                     r"|(?<=[^\sA-Za-z])Killed[ \t]*$"
                     r"|^\w+: killed[ \t]|oom[_-]kill|\bOut of memory: Killed process"
                     # bash's own `Killed` in a Chinese (zh_CN) locale: DreamerV3 under the OOM killer
                     r"|^已杀死[ \t]*$")
_SEGFAULT = re.compile(r"(?i)segmentation fault(?: \(core dumped\))?|\bSIGSEGV\b")
_FATAL = re.compile(r"(?i)floating point exception(?: \(core dumped\))?|\bbus error(?: \(core dumped\))?"
                    r"|\baborted \(core dumped\)|\billegal instruction(?: \(core dumped\))?")
# bash's job-control report: `script.sh: line 44: 367038 Hangup   deepspeed …`
_JOB = re.compile(r"line \d+:[ \t]+\d+[ \t]+(Hangup|Terminated|Interrupt|Quit|Killed|Aborted|Segmentation fault|Bus error)\b"
                  # zsh's: `[1]    24608 abort      python -m mlx_lm.lora …`
                  r"|^\[\d+\][ \t]+[+-]?[ \t]*\d+[ \t]+(hangup|terminated|interrupt|quit|killed|abort|segmentation fault|bus error)[ \t]")
_JOB_NAMES = {"abort": "Aborted"}  # zsh's lower-case words, as bash says them
_SIGNAL = re.compile(r"(?i)Main process received (SIG\w+)|Received (\d+) death signal|received signal (SIG\w+)"
                     r"|Signal (\d+) \((SIG\w+)\) received|Received (?:Signals\.)?(SIG\w+) death signal"
                     # abseil's failure-signal handler (Ray, TensorFlow, JAX): `*** SIGTERM received at time=… ***`
                     r"|\*\*\* (SIG\w+) received at time=")
# A run's own handler saying it got a termination signal and what it does about it, as preemptible jobs have
# (`received SIGTERM: saving a checkpoint … and exiting`, `Caught SIGUSR1, requeueing`). Not the bare notice of
# Lightning's handler, `Received SIGTERM: 15`: NeMo under SLURM prints it at start-up and trains on. Like every
# crash it counts only after the loop's last move.
_OWN_SIGNAL = re.compile(r"(?i)\b(?:received|caught|got|handling)[ \t]+(?:signal[ \t]+)?(SIG(?:TERM|INT|HUP|USR1|USR2|QUIT|XCPU))\b"
                         r"(?![ \t]*:?[ \t]*\d*[ \t]*$)")
# A process's own report of the signal that kills it (Open MPI's and libSegFault's handlers), indented under its
# `*** Process received signal ***`: `  [m2301007135:374576] Signal: Segmentation fault (11)`.
_PROCESS_SIGNAL = re.compile(r"^[ \t]*(?:\[[\w.-]+:\d+\][ \t]*)?Signal: ([A-Z][\w ]+?) \((\d+)\)[ \t]*$")
# An out-of-memory said as a line, not an exception: darknet's `CUDA Error: out of memory`.
_OOM_LINE = re.compile(r"(?i)^CUDA (?:status )?Error: out of memory\b")
# A C++ program's fatal report, capitalised as a sentence (Marian's `Error: CUDA error 2 'out of memory' - …`),
# not a logger's level (`ERROR:`): like every crash it counts after the loop's last move.
_C_ERROR = re.compile(r"^Error: (\S.{3,})$")
# Hydra's report of a job that failed (the error follows on the next line): `Error executing job with overrides: []`.
_HYDRA = re.compile(r"^Error executing job with overrides:")
# Not Lightning's `[rank: 0] Received SIGTERM: 15`: NeMo under SLURM prints it at start-up and trains on.
_ASSERT = re.compile(r"Assertion `(.{1,200}?)` failed")
# LSF's account of why it ended a job, above its `Exited with exit code N.`: `TERM_RUNLIMIT: job killed after
# reaching LSF run time limit.` (TERM_MEMLIMIT, TERM_OWNER, TERM_ADMIN… — every reason has the prefix).
_LSF_TERM = re.compile(r"^TERM_([A-Z_]+): (.{1,200}?)\.?[ \t]*$")
# glog's fatal severity (LOG(FATAL), CHECK failures: Paddle, Caffe, MXNet, TensorFlow's C++): the process aborts
# after printing it. `F0109 01:49:19.022586   845 hl_cuda_device.cc:273] Check failed: … Cuda Error: out of memory`
_GLOG_FATAL = re.compile(r"^F\d{4} \d\d:\d\d:\d\d(?:\.\d+)?[ \t]+\d+[ \t]+([\w./-]+:\d+)\][ \t]*(.+)$")
_CANCELLED = re.compile(r"\*{3} (?:JOB|STEP) [\w.]+ ON \S+ CANCELLED AT \S+(?: DUE TO ([A-Z ]+?))?[ \t]*\*{3}")
# argparse's refusal of a command line (it exits with status 2): `train_bash.py: error: argument --fp16: …` below
# the `usage: train_bash.py [-h] …` block it prints first.
_ARGPARSE = re.compile(r"^([\w.-]{1,80}): error: (.+)$")
USAGE_LINES = 400  # a long usage block (one line per option) is printed above the error
# Launchers' reports of a worker's exit: torchrun's agent and DeepSpeed's launcher.
_AGENT = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")
# CNTK's end of a run it stops itself: `EXCEPTION occurred: The training criterion is not a number (NAN). Stop`
_CNTK_EXCEPTION = re.compile(r"^EXCEPTION occurred: (.+)")
# A trainer's own statement of what failed, printed just before the traceback: Chainer's `Exception in main training
# loop: cudaErrorMemoryAllocation: out of memory` (a traceback the log cuts before its exception line takes it).
_STATED = re.compile(r"^Exception in (?!thread\b)[A-Za-z][\w ]{0,40}: (.+)$")
# The process's exit as whatever ran it reports it: PyCharm's run console (`Process finished with exit code
# -1073741819 (0xC0000005)`), LSF's job report (`Exited with exit code 1.`).
# A runner's report of its child's exit (PyCharm's `Process finished with exit code 1`, NVFlare's `process finished
# with execution code: -9`).
_EXIT_LINE = re.compile(r"(?i)^(?:(?:the )?(?:child )?process (?:finished|exited|ended)|exited) with (?:exit|execution|return) code:?[ \t]*(-?\d+)\b")
_DS_EXIT = re.compile(r"exits with return code = (-?\d+)")
_DS_RANK = re.compile(r"--local_rank=(\d+)")
_FIELD = re.compile(r"^[ \t]*(rank|exitcode|local_rank)[ \t]*:[ \t]*(-?\d{1,9})\b")
# The signals a run dies of: their names, and what usually sends them (one table: the hints and the names
# every message uses).
SIGNAL_NAMES = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 7: "SIGBUS", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}
_LIKELY = {9: "often the kernel's OOM killer", 6: "e.g. after an NCCL timeout", 7: "often too little shared memory in /dev/shm"}
_SIGNALS = {n: f"{name} ({_LIKELY[n]})" if n in _LIKELY else name for n, name in SIGNAL_NAMES.items()}
# The launcher's report of a child's end (accelerate's simple_launcher, DeepSpeed's and torch.distributed.launch's
# old launchers, autotrain): `subprocess.CalledProcessError: Command '[...]' died with <Signals.SIGKILL: 9>.`
# or `... returned non-zero exit status -9.`
_CALLED = re.compile(r"died with <Signals\.(SIG\w+): (\d+)>|returned non-zero exit status (-?\d+)")
# A build tool the launcher ran (torch.utils.cpp_extension's ninja, a setup's make): its failure is a build's, named
# by what was being built (`Building extension module fused_adam...`, cpp_extension's announcement).
_BUILD_TOOL = re.compile(r"""Command '\[?['"]?(ninja|make|cmake|nvcc|gcc|g\+\+|c\+\+|cc)['"\s,\]]""")
_BUILDING = re.compile(r"Building extension module ([\w.-]+?)\.*[ \t]*$")
_PROGRAM = re.compile(r"""['"]([^'"\s]*?([\w.-]+\.py))['"]""")
# torchrun's agent raising on the signal it received: `SignalException: Process 46660 got signal: 1`.
_GOT_SIGNAL = re.compile(r"got signal: (\d+)")
# A DataLoader worker's death, as the main process reports it: the signal is the cause, not the RuntimeError.
_WORKER = re.compile(r"DataLoader worker \(pid\(?s?\)? ?([\d, ]+)\) is killed by signal: ([A-Z][\w ]*?)\.")
_WORKER_KINDS = {"Killed": (Kind.KILLED, 9), "Bus error": (Kind.FATAL, 7), "Segmentation fault": (Kind.SEGFAULT, 11),
                 "Aborted": (Kind.FATAL, 6)}
# What an interrupt looks like when a handler caught it and the script went on (a summary, a test, a save
# may follow: they are no normal end). One table; where each comes from:
_INTERRUPTS = re.compile(
    r"\bExiting from training early\b"  # PyTorch examples' word_language_model, Transformer-XL, AWD-LSTM: `except KeyboardInterrupt`
    r"|Detected KeyboardInterrupt, attempting graceful shutdown"  # PyTorch Lightning: fit() returns and the script goes on
)
# A terminal's echo of Ctrl-C at the start of the line the process wrote next (DeepSpeed's launcher then kills its
# workers: `^C[2024-05-26 15:06:40,046] [INFO] [launch.py:315:sigkill_handler] Killing subprocess 22523`).
_CTRL_C = re.compile(r"^\^C(.*)$")
# DataLoader's own word for a worker's bus error (torch/utils/data/_utils/signal_handling.py).
_WORKER_BUS = re.compile(r"Unexpected bus error encountered in worker")
# In a chain of exceptions the cause is often the first: these say what really happened.
_CAUSES = re.compile(r"(?i)out of memory|killed by signal|CUDA error|NCCL|No space left|device-side assert|"
                     r"Segmentation fault|cannot allocate memory")


def _trim(text: str, limit: int = 200) -> str:
    """Redacted, then cut: a credential across the cut would otherwise keep a head no rule recognises."""
    text = redact_secrets(text.strip())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# Windows' NTSTATUS codes a process dies with, as a signed 32-bit exit code (PyCharm prints `-1073741819
# (0xC0000005)`): the ones a training process meets.
_NTSTATUS = {0xC0000005: "0xC0000005, access violation", 0xC00000FD: "0xC00000FD, stack overflow",
             0xC0000409: "0xC0000409, stack buffer overrun", 0xC000001D: "0xC000001D, illegal instruction"}


def _signal_hint(code: int | None) -> str | None:
    """-N is torchrun's "killed by signal N"; 128+N is a shell's; a large negative one is Windows' NTSTATUS."""
    if code is None:
        return None
    if code < -(1 << 24) and (status := _NTSTATUS.get(code & 0xFFFFFFFF)):
        return status
    return _SIGNALS.get(-code if code < 0 else code - 128 if 128 < code < 160 else 0)


def _exception(text: str) -> tuple[str, str] | None:
    """`pkg.Type: message` (or a bare `KeyboardInterrupt`), not log chatter such as `INFO: x`; markdown's
    emphasis around it is a paste's, not the line's."""
    if not (m := _EXC_LINE.match(_EMPHASIS.sub("", text))):
        return None
    name, last = m["type"], m["type"].rsplit(".", 1)[-1]
    camel = last[:1].isupper() and not last.isupper() and any(c.islower() for c in last)
    if not (camel or _EXC_WORD.search(last)) or (m["msg"] is None and not _EXC_WORD.search(last) and last == name):
        return None
    return name, m["msg"] or ""


def _carried(exc_type: str) -> str | None:
    """The exception a wrapper carries (`RayTaskError(RuntimeError)` → `RuntimeError`), or None for a plain one."""
    return exc_type[exc_type.index("(") + 1:-1] if exc_type.endswith(")") and "(" in exc_type else None


def _exc_kind(exc_type: str, message: str) -> Kind:
    exc_type = _carried(exc_type) or exc_type  # a wrapper is the kind of what it carries
    if exc_type.endswith("CalledProcessError") and _CALLED.search(message):
        return Kind.CHILD_FAILED  # the launcher's report: the child's own error, when in the log, is the cause
    if m := _WORKER.search(message):
        return _WORKER_KINDS.get(m[2], (Kind.FATAL, None))[0]
    if exc_type.endswith("OutOfMemoryError") or "CUDA out of memory" in message:
        return Kind.OOM
    if _WATCHDOG.search(message):
        return Kind.NCCL_TIMEOUT
    if exc_type.endswith("DistBackendError") or "NCCL error" in message or "NCCL communicator was aborted" in message:
        return Kind.NCCL_ERROR
    if "out of memory" in message.lower():  # "CUDA error: out of memory", "HIP out of memory"
        return Kind.OOM
    if exc_type.endswith("KeyboardInterrupt"):
        return Kind.INTERRUPTED
    if "device-side assert" in message:
        return Kind.ASSERT
    return Kind.CHILD_FAILED if exc_type.endswith("ChildFailedError") else Kind.TRACEBACK


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
            entries[-1].setdefault("rank" if m[1] in ("rank", "local_rank") else m[1], int(m[2]))
    best = (next((e for e in entries if e["root"]), None)
            or next((e for e in entries if e.get("exitcode") not in (None, -15)), None) or (entries or [{}])[0])
    return best.get("rank"), best.get("exitcode")


def exception_crash(exc_type: str, message: str, rank: int | None, index: int, thread: str | None = None,
                    building: str | None = None) -> Crash:
    """The crash an exception line stands for, named by its cause: a launcher's CalledProcessError by the child's
    exit (a signal: the kernel's OOM killer sends SIGKILL) or, a build tool's, by what was being built; a
    DataLoader worker's death by its signal."""
    kind = _exc_kind(exc_type, message)
    if kind is Kind.CHILD_FAILED and (m := _CALLED.search(message)):
        code = -int(m[2]) if m[2] else int(m[3])
        if building and (tool := _BUILD_TOOL.search(message[:m.start()])):
            return Crash(Kind.TRACEBACK, None, f"building {building} failed ({tool[1]} exit status {code})", thread,
                         rank, exit_code=code, line_index=index)
        program = _PROGRAM.findall(message[:m.start()])
        local = _DS_RANK.search(message)
        return Crash(Kind.CHILD_FAILED, exc_type, program[0][1] if program else "", thread,
                     int(local[1]) if local else rank, exit_code=code, signal_hint=_signal_hint(code), line_index=index)
    if exc_type.endswith("SignalException") and (m := _GOT_SIGNAL.search(message)):
        return _launcher_signal(SIGNAL_NAMES.get(int(m[1]), f"signal {m[1]}"), rank, index, thread)
    if m := _WORKER.search(message):
        number = _WORKER_KINDS.get(m[2], (None, None))[1]
        name = SIGNAL_NAMES.get(number, m[2].lower()) if number else m[2].lower()
        return Crash(kind, None, f"DataLoader worker (pid {m[1].strip()}) killed by signal {name}", thread, rank,
                     signal_hint=_SIGNALS.get(number) if number else None, line_index=index)
    if kind in (Kind.NCCL_TIMEOUT, Kind.NCCL_ERROR):
        rank = _rank_in(message, rank)
    if kind is Kind.NCCL_TIMEOUT and _WATCHDOG.search(message):
        # "NCCL communicator was aborted on rank 1. Original reason for failure was: [Rank 1] Watchdog caught
        # collective operation timeout: …": the timeout is the news, the abort its consequence.
        return Crash(kind, exc_type, _watchdog_message(message), thread, rank, line_index=index)
    if m := _ERRNO_TAIL.search(message):  # the errno the long sentence ends on is the news: said first
        message = f"{m['name']}: {m['said']} — {message[:m.start()].strip()}"
    return Crash(kind, exc_type, _trim(message), thread, rank, line_index=index)


# c10d's socket errors end on the errno: `… failed to listen on any local network address. useIpv6: 0, code: -98,
# name: EADDRINUSE, message: address already in use`.
_ERRNO_TAIL = re.compile(r"[ \t,.]*(?:useIpv6: \d+, )?(?:code: -?\d+, )?name: (?P<name>E[A-Z0-9]{2,}), message: (?P<said>[^,]{3,80})$")


def _launcher_signal(name: str, rank: int | None, index: int, thread: str | None = None) -> Crash:
    return Crash(Kind.SIGNAL, None, f"the launcher received {name} and stopped its workers", thread, rank, line_index=index)


def _child_failed(texts: Sequence[str], index: int, rank: int | None = None, code: int | None = None) -> Crash:
    found_rank, found_code = _root_cause(texts)
    rank = found_rank if found_rank is not None else rank
    code = found_code if found_code is not None else code
    return Crash(Kind.CHILD_FAILED, "ChildFailedError", "", rank=rank, exit_code=code,
                 signal_hint=_signal_hint(code), line_index=index)


def _watchdog_message(text: str) -> str:
    parts = {k: m[1] for k, p in (("op", r"OpType=(\w+)"), ("seq", r"SeqNum=(\d+)"), ("ran", r"ran for (\d+) milli"),
                                   ("limit", r"Timeout\(ms\)=(\d+)")) if (m := re.search(p, text))}
    if "op" not in parts or "ran" not in parts:
        return _trim(text[text.find("Watchdog"):])
    seq = f" (SeqNum={parts['seq']})" if "seq" in parts else ""
    limit = f", timeout {parts['limit']} ms" if "limit" in parts else ""
    return f"NCCL collective timeout: {parts['op']}{seq} ran for {parts['ran']} ms{limit}"


def _rank_in(text: str, rank: int | None) -> int | None:
    m = re.search(r"\[(?:PG [^\]]*)?Rank (\d{1,6})\]", text)
    return rank if rank is not None or not m else int(m[1])


@dataclass
class _Traceback:
    """One traceback, or one chain of them, being read."""

    start: int
    rank: int | None
    thread: str | None
    ignored: bool
    group: bool
    excs: list[tuple[str, str]]
    child: Crash | None = None
    closed: bool = False  # its exception line was read (a chain may still follow)
    named: str | None = None  # the exception its header names (IPython's), for a traceback cut before its last line
    header: int = -1  # its header's place in its stream
    framed: bool = False  # its first frame was read
    building: str | None = None  # the extension being built when it began (`Building extension module fused_adam...`)

    def crash(self) -> Crash:
        if self.child is not None:
            return replace(self.child, line_index=self.start, thread=self.thread)
        if not self.excs and self.named:  # cut short, but IPython's header said what it was
            return exception_crash(self.named, "", self.rank, self.start, self.thread, self.building)
        if not self.excs:  # the log ends inside the traceback
            return Crash(Kind.TRACEBACK, thread=self.thread, rank=self.rank, line_index=self.start)
        # The last exception names the crash; one lower in the chain that says what really happened
        # (an OOM, a worker killed by a signal, a CUDA error) is its cause and is named instead.
        exc_type, message = self.excs[-1]
        kinds = [_exc_kind(t, m) for t, m in self.excs]
        specific = [i for i, k in enumerate(kinds) if k is not Kind.TRACEBACK]
        if specific:
            i = specific[-1]
        elif kinds[-1] is Kind.TRACEBACK and (cause := [i for i, (t, m) in enumerate(self.excs) if _CAUSES.search(m)]):
            i = cause[0]
        else:
            i = len(self.excs) - 1
        exc_type, message = self.excs[i]
        return exception_crash(exc_type, message, self.rank, self.start, self.thread, self.building)


def _building(builds: Sequence[tuple[int, str]], at: int) -> str | None:
    """The extension whose build was announced last before line `at` (its ninja output may run long)."""
    return next((name for i, name in reversed(builds) if i < at and at - i <= 400), None)


# A paste's emphasis around a line, or opened on an earlier line and closed on this one (`**Training …` … `Killed**`).
_BOLD_LINE = re.compile(r"^\*{0,2}(\w[^*]*?)\*{1,2}[ \t]*$")
_SIGNAL_KINDS = {11: Kind.SEGFAULT, 9: Kind.KILLED, 6: Kind.FATAL, 7: Kind.FATAL, 8: Kind.FATAL, 4: Kind.FATAL}


def _process_signal(name: str, number: int, rank: int | None, i: int) -> Crash:
    """`Signal: Segmentation fault (11)`: the kind its number says, in the handler's words."""
    kind = _SIGNAL_KINDS.get(number, Kind.SIGNAL)
    return Crash(kind, None, f"{name} (signal {number})", rank=rank, signal_hint=_SIGNALS.get(number), line_index=i)


def _one_line_crash(text: str, i: int, rank: int | None, following: Sequence[str]) -> Crash | None:
    """Fatal text that is not a traceback: kills, signals, assertions, a scheduler's cancel, launchers' exits."""
    if bold := _BOLD_LINE.match(text):  # a paste's `**Killed**`
        text = bold[1]
    if _WATCHDOG.search(text):
        return Crash(Kind.NCCL_TIMEOUT, None, _watchdog_message(text), rank=_rank_in(text, rank), line_index=i)
    if m := _STUCK.search(text):
        return Crash(Kind.HANG, None, f"NCCL watchdog stuck for {m[1]} s (a collective or CUDA call hangs)",
                     rank=_rank_in(text, rank), line_index=i)
    if m := _SRUN_TASK.search(text):
        task = int(m[1]) if m[1].isdigit() else rank
        code = int(m[3]) if m[3] else None
        if code == 0:
            return None
        what = m[2] if code is None else f"exit code {code}"
        return Crash(Kind.CHILD_FAILED, "launcher", "", rank=task, exit_code=code if code is not None else
                     {"Aborted": -6, "Killed": -9, "Segmentation fault": -11, "Bus error": -7}[m[2]],
                     signal_hint=_SIGNALS.get(9) if what == "Killed" else None, line_index=i)
    if m := _TERMINATE.search(text):  # C++ abort: no Python traceback follows
        name = m[1] or m[2]
        what = m[3] or next((w for t in following[:3] if (w := t.partition("what():")[2])), "")
        kind = _exc_kind(name, what)
        return Crash(kind, name, _trim(what.strip()), rank=_rank_in(what, rank) if kind in (Kind.NCCL_TIMEOUT, Kind.NCCL_ERROR)
                     else rank, line_index=i)
    if m := _CNTK_EXCEPTION.match(text):
        return Crash(_exc_kind("", m[1]), None, _trim(m[1]), rank=rank, line_index=i)
    if _OOM_LINE.search(text):
        return Crash(Kind.OOM, None, _trim(text), rank=rank, line_index=i)
    if "Error: " in text and (m := _C_ERROR.match(message(text))):  # the substring first: message() is this loop's cost
        return Crash(Kind.OOM if "out of memory" in m[1].lower() else Kind.FATAL, None, _trim(m[1]), rank=rank, line_index=i)
    if _HYDRA.search(text):
        said = next((t.strip() for t in following[:3] if t.strip()), "")
        return Crash(Kind.TRACEBACK, None, _trim(said or text), rank=rank, line_index=i)
    if m := _LSF_TERM.match(text):
        return Crash(Kind.CANCELLED, None, f"killed by LSF (TERM_{m[1]}): {m[2]}", rank=rank, line_index=i)
    if m := _GLOG_FATAL.match(text):
        said = m[2].strip()
        kind = Kind.OOM if "out of memory" in said.lower() else Kind.FATAL
        return Crash(kind, None, _trim(f"{said} ({m[1]})"), rank=rank, line_index=i)
    if m := _CANCELLED.search(text):
        why = (m[1] or "").strip().lower()
        return Crash(Kind.CANCELLED, None, f"cancelled by the job scheduler{f' due to {why}' if why else ''} ({m[0].strip('* ')})",
                     rank=rank, line_index=i)
    if m := _JOB.search(text):
        name = m[1] or _JOB_NAMES.get(m[2], m[2].capitalize())
        kind = {"Killed": Kind.KILLED, "Segmentation fault": Kind.SEGFAULT, "Bus error": Kind.FATAL,
                "Aborted": Kind.FATAL}.get(name, Kind.SIGNAL)
        sig = {"Hangup": "SIGHUP", "Terminated": "SIGTERM", "Interrupt": "SIGINT", "Quit": "SIGQUIT"}.get(name)
        return Crash(kind, None, f"{name}{f' ({sig})' if sig else ''} — the shell's report of the job's end",
                     rank=rank, signal_hint=_SIGNALS[9] if kind is Kind.KILLED else None, line_index=i)
    if m := _INTERRUPTS.search(text):
        return Crash(Kind.INTERRUPTED, None, _trim(m[0]), rank=rank, line_index=i)
    if m := _CTRL_C.match(text):
        said = message(m[1]) if m[1].strip() else ""
        return Crash(Kind.INTERRUPTED, None, _trim(f"Ctrl-C — {said}" if said else "Ctrl-C"), rank=rank, line_index=i)
    if _WORKER_BUS.search(text):
        return Crash(Kind.FATAL, None, "DataLoader worker bus error", rank=rank, signal_hint=_SIGNALS[7], line_index=i)
    if _HEDGED.search(text):
        return None  # a message listing what might have happened names no cause (Ray: `(1) … killed by SIGKILL …`)
    if m := _KILLED.search(text):
        return Crash(Kind.KILLED, None, _trim(m[0]), rank=rank, signal_hint=_SIGNALS[9], line_index=i)
    if m := _SEGFAULT.search(text):
        said = m[0] if "segmentation" in m[0].lower() else f"segmentation fault ({m[0]})"  # `*** SIGSEGV (@0x0) received`
        return Crash(Kind.SEGFAULT, None, said, rank=rank, signal_hint=_SIGNALS[11], line_index=i)
    if m := _FATAL.search(text):
        return Crash(Kind.FATAL, None, m[0], rank=rank, line_index=i)
    if m := _SIGNAL.search(text):
        groups = [g for g in m.groups() if g]
        name = next((g for g in groups if g.startswith("SIG")), None)
        if name is None and groups and groups[0].isdigit():
            name = SIGNAL_NAMES.get(int(groups[0]), f"signal {groups[0]}")
        return _launcher_signal(name or "a death signal", rank, i)
    if m := _OWN_SIGNAL.search(text):
        name = m[1].upper()
        return Crash(Kind.SIGNAL, None, _trim(message(text)), rank=rank,
                     signal_hint=_SIGNALS[15] if name == "SIGTERM" else None, line_index=i)
    if m := _AGENT.search(text):
        code, local = int(m[1]), int(m[2])
        return _child_failed(following[:40], i, local, code)
    if "code" in text.lower() and (m := _EXIT_LINE.match(message(text))):
        code = int(m[1])
        return None if code == 0 else Crash(Kind.CHILD_FAILED, "launcher", "the process", rank=rank, exit_code=code,
                                            signal_hint=_signal_hint(code), line_index=i)
    if m := _DS_EXIT.search(text):
        code = int(m[1])
        if code == 0:
            return None
        local = _DS_RANK.search(text)
        return Crash(Kind.CHILD_FAILED, "launcher", "", rank=int(local[1]) if local else rank, exit_code=code,
                     signal_hint=_signal_hint(code), line_index=i)
    if m := _ASSERT.search(text):
        return Crash(Kind.ASSERT, "device-side assertion", f"`{_trim(m[1], 120)}` failed", rank=rank, line_index=i)
    return None


def _scan(entries: list[tuple[int, int | None, str]], builds: Sequence[tuple[int, str]] = ()) -> list[Crash]:
    """One stream's crashes. States: idle, frames (waiting for an exception line), after, chain.

    Tracebacks of processes sharing a stream interleave (sixteen ranks writing one stdout): an
    exception line closes the oldest traceback still waiting for one."""
    crashes: list[Crash] = []
    tbs: list[_Traceback] = []
    open_tbs: list[_Traceback] = []  # headers read, exception line not yet
    mode, since = "idle", 0
    threads: list[tuple[str, int]] = []  # `Exception in thread X:` lines waiting for their traceback (FIFO)
    texts = [e[2] for e in entries]
    frame_at = -10  # the last `  File "…", line N` frame seen: a traceback whose header fell before the window
    for pos, (i, rank, text) in enumerate(entries):
        bare = text.lstrip(" +|│╭─")
        if bare.startswith('File "') and text[:1] in " \t":
            frame_at = pos
        ipython = _IPYTHON_HEADER.match(text) if _HEADER in text else None
        if _HEADER in text and (ipython or bare.startswith(("Traceback", "Exception Group Traceback"))):
            chained = mode == "chain" and tbs and tbs[-1].closed
            if chained:
                open_tbs.append(tbs[-1])
            else:
                threads = [(name, at) for name, at in threads if pos - at <= 8]  # a header this close is theirs
                name, at = threads.pop(0) if threads else (None, -1)
                thread = name if name != "\0ignored" else None
                tb = _Traceback(entries[at][0] if thread else i, rank, thread, name == "\0ignored",
                                bare.startswith("Exception"), [], named=ipython["type"] if ipython else None,
                                header=pos, building=_building(builds, i))
                tbs.append(tb)
                open_tbs.append(tb)
            mode = "frames"
            continue
        if open_tbs:
            tb = open_tbs[0]
            if frame_at == pos and not tb.framed:
                # A header glued onto stderr's open bar line was written when its frames were, not when that
                # line began: other lines between the two mean the traceback starts at its first frame.
                tb.framed = True
                tb.start = i if tb.thread is None and pos - tb.header > 1 else tb.start
            line = re.sub(r"^[ \t]*\|[ \t]?", "", text) if tb.group else text
            if line[:1].strip() and (exc := _exception(line)):
                tb.excs.append(exc)
                tb.closed = True
                open_tbs.pop(0)
                mode, since = ("frames" if open_tbs else "after"), 0
                if exc[0].endswith("ChildFailedError"):
                    tb.child = _child_failed(texts[pos + 1: pos + 80], i)
                continue
            # other unindented lines fall through: a traceback cut short by `Killed` is still both
        elif mode != "idle":
            since += 1
            if text.startswith(_CHAIN):
                mode, since = "chain", 0
            mode = "idle" if since > 40 else mode
        if m := _PROCESS_SIGNAL.match(text):  # indented under its handler's banner, yet the process's own end
            crashes.append(_process_signal(m[1], int(m[2]), rank, i))
            continue
        if not text[:1].strip() and not _AGENT.search(text):
            continue  # indented: frames, message continuations, torchrun's report fields (rich logging indents the agent's line)
        if m := _THREAD.match(text):
            threads.append((m[1], pos))
            mode = "idle" if not open_tbs else mode
        elif text.startswith("Exception ignored in"):
            threads.append(("\0ignored", pos))
        elif ": error: " in text and (m := _ARGPARSE.match(text)) and any(t.startswith("usage: ") for t in texts[max(0, pos - USAGE_LINES):pos]):
            crashes.append(Crash(Kind.FATAL, None, _trim(f"{m[1]}: error: {m[2]}"), rank=rank, line_index=i))
        elif (crash := _one_line_crash(text, i, rank, texts[pos + 1:pos + 41])) is not None:
            same = crashes and crashes[-1].kind == crash.kind and i - crashes[-1].line_index <= 20
            if not (same and crash.kind in (Kind.KILLED, Kind.SEGFAULT, Kind.ASSERT, Kind.FATAL)):  # one event, many lines
                crashes.append(crash)
        elif mode == "idle" and (exc := _exception(text)) and (
                _exc_kind(*exc) is not Kind.TRACEBACK or pos - frame_at <= 3 or _carried(exc[0])):
            # the exception line of a traceback whose start fell before the scanned window (its kind says
            # so, or the frames above it do), or a wrapper's, whose traceback follows it (Ray's RayTaskError(…))
            if exc[0].endswith("ChildFailedError"):
                crashes.append(_child_failed(texts[pos + 1: pos + 80], i))
            else:
                crashes.append(exception_crash(exc[0], exc[1], rank, i, building=_building(builds, i)))
            mode, since = "after", 0
    # `Exception in thread X:` as the stream's last words, its traceback never written (the log cut, the paste
    # ended): a thread died, what of is unknown.
    cut = [Crash(Kind.TRACEBACK, thread=name, rank=entries[at][1], line_index=entries[at][0]) for name, at in threads
           if name != "\0ignored" and len(entries) - at <= 3 and not any(_HEADER in e[2] for e in entries[at:])]
    return crashes + [t.crash() for t in tbs if not t.ignored] + cut


# Every signature above contains one of these words. Checking the whole window once lets the
# common case, a window of step lines, skip the line-by-line scan: it was half a probe's Python
# time, and the watchdog parses hundreds of probes a sweep. Plain substring tests on the
# lower-cased text: a case-insensitive regex alternation took 11 ms on a 64 KiB window.
_CRASH_WORDS = ("traceback (most recent call last)", "watchdog caught", "watchdog got stuck", "srun: error", "terminate called", "kill", "segmentation fault",
                "sigsegv", "sigterm", "sigint", "sighup", "sigusr", "sigquit", "sigxcpu", "outofmemoryerror", "out of memory", "distbackenderror", "nccl", "childfailederror",
                "exitcode", "return code", "signal", "hangup", "terminated", "floating point", "bus error", "aborted",
                "illegal instruction", "assertion", "cancelled", "keyboardinterrupt", "calledprocesserror",
                "term_", "check failed", "check failure stack trace",
                "training early", ": error: ", "\nerror: ", "] error: ", "execution code", "^c", "uncaught exception", "exception in thread", "exit code", "exception occurred", "已杀死", " abort ", "received at time", "error executing job",
                # a traceback's frame: a long traceback's header falls before the window, its frames and
                # exception line (`ValueError: …`, no crash word of its own) do not
                'file "')


def _mentions(words: Sequence[str], lines: Sequence[str]) -> bool:
    text = "\n".join(lines).lower()
    return any(word in text for word in words)


def find_crashes(lines: Sequence[str]) -> list[Crash]:
    """Every crash signature in `lines`, in order of the line where each starts."""
    if not _mentions(_CRASH_WORDS, lines):
        return []
    streams: dict[str, list[tuple[int, int | None, str]]] = {}
    for i, raw in enumerate(lines):
        text = strip_host_prefix(last_frame(strip_ansi(raw)).rstrip())
        prefix = m[0].strip() if (m := RANK_PREFIX.match(text)) else ""
        rank, text = split_rank_prefix(text)
        streams.setdefault(prefix, []).append((i, rank, text.rstrip()))
    # Announced on the launcher's stream, failed on a rank's: builds are read across the streams.
    builds = [(i, m[1]) for i, raw in enumerate(lines) if "Building ext" in raw and (m := _BUILDING.search(raw.rstrip()))]
    crashes = sorted((c for entries in streams.values() for c in _scan(entries, builds)), key=lambda c: c.line_index)
    seen: set[tuple] = set()  # a watchdog timeout is reported up to three times per rank
    unique = []
    for c in crashes:
        key = (c.rank, (re.search(r"SeqNum=(\d+)", c.message) or [c.message])[0]) if c.kind is Kind.NCCL_TIMEOUT else None
        if key is None or key not in seen:
            unique.append(c)
            seen.add(key)
    return [_named(c, lines) for c in unique]


_BARE_EXCEPTION = re.compile(r"^[A-Z]\w*(?:Error|Exception)$")


def _named(c: Crash, lines: Sequence[str]) -> Crash:
    """A traceback cut before its exception line (a paste, a full disk) takes the bare exception name Python
    printed just before it, when it could not print more (`MemoryError`), or the trainer's own statement of the
    error above it (_STATED)."""
    if c.kind is not Kind.TRACEBACK or c.exc_type is not None or c.message:
        return c
    for text in reversed(lines[max(0, c.line_index - 8):c.line_index]):
        if _BARE_EXCEPTION.match(name := split_rank_prefix(text.strip())[1].strip()):
            return replace(c, exc_type=name)
    for text in lines[max(0, c.line_index - 2):c.line_index + 1]:
        if m := _STATED.match(split_rank_prefix(text.strip())[1].strip()):
            said = m[1].strip()
            exc = _exception(said)
            return replace(c, kind=_exc_kind(*exc) if exc else _exc_kind("", said), exc_type=exc[0] if exc else None,
                           message=_trim(exc[1] if exc else said))
    return c

