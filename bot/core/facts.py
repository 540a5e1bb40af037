"""Value objects shared by every layer: steps, crashes, processes, GPU readings."""

from __future__ import annotations

import enum
from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    """One progress line of a training loop, with whatever numbers it carried."""

    line: str  # the line as shown to users (ANSI stripped)
    step: int | None = None  # step / iteration number
    total: int | None = None  # planned steps, when the format says (Megatron, Lightning)
    loss: float | None = None
    rate: float | None = None  # throughput
    rate_unit: str | None = None  # "tok/s", "it/s", "samples/s"…
    epoch: float | None = None
    elapsed: float | None = None  # seconds since the run started, when printed (step=… elapsed=3.4s)
    fmt: str = "custom"  # how it was read: "structure" (a recurring template), "bar" (the loop's own bar), "custom",
    # "announced" (the epoch the loop said it began after its last progress line)
    epoch_total: int | None = None  # "epoch 3/10": 10
    counter: str | None = None  # the key the counter was read from: "iteration", "s", "batch", "step"
    loss_key: str | None = None  # "lm loss", "train_loss", "trl"
    step_time: float | None = None  # seconds a step took, when the line says (iter time, elapsed per iteration)
    index: int = -1  # the line's place in the window; negative: found further back
    stamp: float | None = None  # the line's own timestamp, on the log's clock (only differences mean anything)
    non_finite: tuple[str, ...] = ()  # keys whose value is nan or inf on this line ("loss", "grad_norm")
    lr: float | None = None  # the learning rate the line prints (its schedule says where the run plans to end)
    percent: float | None = None  # how far the loop says it is, in percent (gensim's `PROGRESS: at 24.71% examples`)


class Kind(str, enum.Enum):
    """What a Crash is (a str, so a Crash compares equal to its kind's word)."""

    TRACEBACK = "traceback"
    OOM = "oom"
    NCCL_TIMEOUT = "nccl_timeout"
    NCCL_ERROR = "nccl_error"
    CHILD_FAILED = "child_failed"  # a launcher's report that a worker failed (torchrun, DeepSpeed)
    KILLED = "killed"  # SIGKILL: `Killed`, the kernel's OOM killer
    SEGFAULT = "segfault"
    SIGNAL = "signal"  # a death signal the launcher or shell reports: SIGTERM, SIGHUP, SIGINT
    INTERRUPTED = "interrupted"  # KeyboardInterrupt
    ASSERT = "assert"  # a CUDA kernel's device-side assertion
    FATAL = "fatal"  # Floating point exception, Bus error, Aborted, Illegal instruction
    CANCELLED = "cancelled"  # the job scheduler ended it (SLURM time limit, preemption)
    HANG = "hang"  # the run says it is stuck (NCCL's heartbeat monitor): hung while alive, crashed once gone
    LOGGED = "logged"  # an ERROR-level log line was the run's last word before it exited


@dataclass(frozen=True)
class Crash:
    """A traceback or fatal signature found near the end of the log."""

    kind: Kind
    exc_type: str | None = None  # "torch.OutOfMemoryError"
    message: str = ""  # first line of the exception message, trimmed
    thread: str | None = None  # "drafter-1" for `Exception in thread drafter-1:`
    rank: int | None = None  # failing rank ([rank3]: prefix or torchrun Root Cause)
    exit_code: int | None = None  # torchrun Root Cause exitcode (-9 SIGKILL, -6 SIGABRT)
    signal_hint: str | None = None  # "SIGKILL (often the kernel's OOM killer)"
    line_index: int = -1  # index of the signature's first line in the scanned lines

    @property
    def in_thread(self) -> bool:
        return self.thread is not None


@dataclass(frozen=True)
class Process:
    """A process seen by the probe (a writer of the log, or a likely training process)."""

    pid: int
    elapsed_s: int | None  # seconds since it started
    command: str
    state: str | None = None  # ps's STAT ("Sl", "R+", "T"); None where the probe did not ask

    @property
    def paused(self) -> bool:
        """Stopped by a signal (SIGSTOP, Ctrl-Z: T) or by a debugger (t): alive, but it runs no code."""
        return self.state is not None and self.state[:1] in ("T", "t")


@dataclass(frozen=True)
class FolderUse:
    """How a process working in the log's folder holds its files (bot/probe/script.py's `uses`): what tells
    the run that writes there from a TensorBoard that only reads there."""

    pid: int
    ppid: int
    reads: int  # descriptors on files under the folder opened read-only
    writes: int  # … opened for writing
    gpu: int  # descriptors on the GPU's device files (/dev/nvidia*)


@dataclass(frozen=True)
class GpuSample:
    """One nvidia-smi reading of one GPU."""

    index: int
    util_pct: float | None  # None when nvidia-smi printed [N/A]
    mem_used_mib: float | None
    mem_total_mib: float | None = None
    bus_id: str | None = None  # "0:0:6.0": pci.bus_id normalised (bot.core.gpu_window.bus_key), when queried


class GpuMethod(enum.Enum):
    """How a probe read the GPUs' utilisation."""

    WINDOW = "window"  # the driver's own sample buffer (`nvidia-smi -q -d UTILIZATION`), ~14 s
    READINGS = "readings"  # the probe's own `--query-gpu` readings, gpu_samples of them over about a second


class WindowGap(str, enum.Enum):
    """Why the driver's window could not stand in for readings (the value is what users read)."""

    FAILED = "nvidia-smi -q failed"  # exit status not 0: an old nvidia-smi, or a driver that fails it
    MISSING = "not in nvidia-smi -q"  # no GPU Utilization Samples block (or no GPU at all) in the output
    NOT_AVAILABLE = "N/A"  # the driver keeps no samples for this GPU
    UNREADABLE = "unreadable"  # values that are not numbers, or Min > Avg > Max
    ABSURD_DURATION = "absurd duration"  # 0 s, or 18446744073709 sec (an unsigned -1 in microseconds)
    NO_SAMPLES = "no samples"
    MIG = "MIG"  # a partitioned GPU: the whole card's utilisation says nothing of one instance
    VGPU = "vGPU"
    UNMATCHED = "bus ids do not match"  # a GPU of the reading has no block of its bus id


@dataclass(frozen=True)
class UtilWindow:
    """One GPU's `GPU Utilization Samples` from the driver: Max, Min and Avg over its last Duration."""

    duration_s: float
    samples: int
    max_pct: float
    min_pct: float
    avg_pct: float


@dataclass(frozen=True)
class GpuReadings:
    """All samples of all GPUs from one probe, the driver's window when it could be used, or why there are none."""

    samples: tuple[tuple[GpuSample, ...], ...] = ()  # one tuple per sampling round
    error: str | None = None  # "nvidia-smi not found", "NVIDIA driver not loaded"…
    windows: tuple[tuple[int, UtilWindow], ...] = ()  # (index, window) for every GPU read, or none
    gap: WindowGap | None = None  # why there are no windows, when the probe asked the driver for them
    span_s: float | None = None  # first reading to last, from the rounds' own t= stamps

    @property
    def indices(self) -> list[int]:
        return sorted({g.index for round_ in self.samples for g in round_})

    @property
    def method(self) -> GpuMethod:
        return GpuMethod.WINDOW if self.windows else GpuMethod.READINGS
