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
    fmt: str = "custom"  # how it was read: "structure" (a recurring template), "bar" (the loop's own bar), "custom"
    epoch_total: int | None = None  # "epoch 3/10": 10
    counter: str | None = None  # the key the counter was read from: "iteration", "s", "batch", "step"
    loss_key: str | None = None  # "lm loss", "train_loss", "trl"
    step_time: float | None = None  # seconds a step took, when the line says (iter time, elapsed per iteration)
    index: int = -1  # the line's place in the window; negative: found further back
    stamp: float | None = None  # the line's own timestamp, on the log's clock (only differences mean anything)
    non_finite: tuple[str, ...] = ()  # keys whose value is nan or inf on this line ("loss", "grad_norm")
    lr: float | None = None  # the learning rate the line prints (its schedule says where the run plans to end)


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


@dataclass(frozen=True)
class GpuSample:
    """One nvidia-smi reading of one GPU."""

    index: int
    util_pct: float | None  # None when nvidia-smi printed [N/A]
    mem_used_mib: float | None
    mem_total_mib: float | None = None


@dataclass(frozen=True)
class GpuReadings:
    """All samples of all GPUs from one probe, or why there are none."""

    samples: tuple[tuple[GpuSample, ...], ...] = ()  # one tuple per sampling round
    error: str | None = None  # "nvidia-smi not found", "NVIDIA driver not loaded"…

    @property
    def indices(self) -> list[int]:
        return sorted({g.index for round_ in self.samples for g in round_})
